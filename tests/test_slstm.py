"""S-LSTM (MODELS.md 2.1, 2.2) and DA-GRN (2.3, 2.4): per-word references, the copy rule, compute
skipping, depth selection, gradient paths and the encoder contract."""

import math

import pytest
import torch
from numerics import assert_close_to_float64
from torch.func import functional_call

import seqzoo.encoders.slstm as slstm_module
from seqzoo.encoders.base import build_encoder
from seqzoo.encoders.dagrn import DAGRN
from seqzoo.encoders.slstm import SLSTM
from seqzoo.testing import assert_contract

pytestmark = pytest.mark.usefixtures("single_thread")

LENGTHS = [5, 3, 1, 4]


def padded_batch(size: int, lengths=LENGTHS, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(len(lengths), max(lengths), size, generator=gen, dtype=torch.float64)
    mask = torch.arange(max(lengths)).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
    return x.masked_fill(~mask.unsqueeze(-1), float("nan")), mask


def gate(weight: torch.Tensor, k: int, hidden: int) -> torch.Tensor:
    """Rows of gate group k of a fused weight (or bias)."""
    return weight[k * hidden : (k + 1) * hidden]


def reference_global(cell, hs, cs, g, c_g):
    """The global node's step of MODELS.md 2.1, word by word (lists of (H,) vectors)."""
    hidden = g.shape[0]
    wg, wo, wf = (gate(cell.global_gates.weight, k, hidden) for k in range(3))
    ug, uo = (gate(cell.mean_gates.weight, k, hidden) for k in range(2))
    bg, bo = (gate(cell.mean_gates.bias, k, hidden) for k in range(2))
    uf, bf = cell.word_forget.weight, cell.word_forget.bias
    mean = torch.stack(hs).mean(0)
    f_g = torch.sigmoid(wg @ g + ug @ mean + bg)
    o = torch.sigmoid(wo @ g + uo @ mean + bo)
    f_words = [torch.sigmoid(wf @ g + uf @ h + bf) for h in hs]
    weights = torch.softmax(torch.stack([*f_words, f_g]), dim=0)  # per dimension over n + 1 items
    new_c = sum(weights[i] * cs[i] for i in range(len(hs))) + weights[-1] * c_g
    return o * torch.tanh(new_c), new_c


def run_reference(model: SLSTM, x: torch.Tensor, lengths, initial, word) -> tuple[torch.Tensor, torch.Tensor]:
    """The synchronous recurrence one row, one step and one word at a time (no dropout): ``initial(xs)``
    gives a row's starting ``(hs, cs, g, c_g)`` from its inputs; ``word(i, xs, hs, cs, g, c_g)`` word i's
    new ``(h, c)`` from the previous step's states; the global node as :func:`reference_global`."""
    out, finals = torch.zeros(x.shape[0], x.shape[1], model.hidden_size, dtype=x.dtype), []
    for b, n in enumerate(lengths):
        xs = [x[b, i] for i in range(n)]
        hs, cs, g, c_g = initial(xs)
        for _ in range(model.num_steps):
            new_g, new_c_g = reference_global(model.cell, hs, cs, g, c_g)
            updated = [word(i, xs, hs, cs, g, c_g) for i in range(n)]  # every word from the previous step
            hs, cs = [h for h, _ in updated], [c for _, c in updated]
            g, c_g = new_g, new_c_g
        out[b, :n] = torch.stack(hs)
        finals.append(g)
    return out, torch.stack(finals)


def reference_official(model: SLSTM, x: torch.Tensor, lengths) -> tuple[torch.Tensor, torch.Tensor]:
    """MODELS.md 2.2 as written: h⁰ = c⁰ = x, g⁰ = c_g⁰ = the mean of x; summed window neighbours."""
    cell, hidden, w = model.cell, model.hidden_size, model.window
    wx = [gate(cell.input.weight, k, hidden) for k in range(6)]
    bx = [gate(cell.input.bias, k, hidden) for k in range(6)]
    wr = [gate(cell.recurrent.weight, k, hidden) for k in range(6)]  # columns: h_i, Σ left h, Σ right h
    wd = [gate(cell.global_input.weight, k, hidden) for k in range(6)]

    def initial(xs):
        mean = torch.stack(xs).mean(0)
        return list(xs), list(xs), mean, mean

    def word(i, xs, hs, cs, g, c_g):
        n = len(xs)
        left = [j for j in range(i - w, i) if j >= 0]
        right = [j for j in range(i + 1, i + w + 1) if j < n]
        lh = sum((hs[j] for j in left), torch.zeros(hidden, dtype=g.dtype))
        rh = sum((hs[j] for j in right), torch.zeros(hidden, dtype=g.dtype))
        lc = sum((cs[j] for j in left), torch.zeros(hidden, dtype=g.dtype))
        rc = sum((cs[j] for j in right), torch.zeros(hidden, dtype=g.dtype))
        window = torch.cat([hs[i], lh, rh])
        pre = [wr[k] @ window + wx[k] @ xs[i] + wd[k] @ g + bx[k] for k in range(6)]
        f1, f2, f3, f4, ig = torch.softmax(torch.sigmoid(torch.stack(pre[:5])), dim=0)
        c = f1 * lc + f2 * rc + f3 * xs[i] + f4 * c_g + ig * cs[i]
        return torch.sigmoid(pre[5]) * torch.tanh(c), c

    return run_reference(model, x, lengths, initial, word)


def reference_paper(model: SLSTM, x: torch.Tensor, lengths) -> tuple[torch.Tensor, torch.Tensor]:
    """MODELS.md 2.1 as written: zero initial states, the concatenated window, candidate u."""
    cell, hidden, w = model.cell, model.hidden_size, model.window
    wx = [gate(cell.input.weight, k, hidden) for k in range(7)]  # i, l, r, f, s, o, u
    bx = [gate(cell.input.bias, k, hidden) for k in range(7)]
    wr = [gate(cell.recurrent.weight, k, hidden) for k in range(7)]  # columns: h_{i-w} .. h_{i+w}
    wd = [gate(cell.global_input.weight, k, hidden) for k in range(7)]
    zero = torch.zeros(hidden, dtype=x.dtype)

    def initial(xs):
        return [zero] * len(xs), [zero] * len(xs), zero, zero

    def word(i, xs, hs, cs, g, c_g):
        n = len(xs)
        xi = torch.cat([hs[j] if 0 <= j < n else zero for j in range(i - w, i + w + 1)])
        pre = [wr[k] @ xi + wx[k] @ xs[i] + wd[k] @ g + bx[k] for k in range(7)]
        ig, lg, rg, fg, sg = torch.softmax(torch.sigmoid(torch.stack(pre[:5])), dim=0)
        u = torch.tanh(pre[6])
        c_left = cs[i - 1] if i > 0 else zero
        c_right = cs[i + 1] if i + 1 < n else zero
        c = lg * c_left + fg * cs[i] + rg * c_right + sg * c_g + ig * u
        return torch.sigmoid(pre[5]) * torch.tanh(c), c

    return run_reference(model, x, lengths, initial, word)


@pytest.mark.parametrize(("window", "lengths"), [(1, LENGTHS), (2, LENGTHS), (2, [4, 4])])  # padded, or none
@pytest.mark.parametrize(("variant", "reference"), [("official", reference_official), ("paper", reference_paper)])
def test_slstm_matches_per_word_reference(variant, reference, window, lengths):
    torch.manual_seed(0)
    model = SLSTM(4, 4, num_steps=3, window=window, variant=variant).double().eval()
    x, mask = padded_batch(4, lengths)
    out, (g, _) = model(x, mask)
    expected, expected_g = reference(model, x, lengths)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(g, expected_g, rtol=0, atol=1e-12)
    assert model.global_state((g, None)) is g and model.global_size == 4


@pytest.mark.parametrize("variant", ["paper", "official"])
def test_slstm_float32_close_to_float64(variant):
    torch.manual_seed(0)
    model = SLSTM(8, 8, num_steps=4, variant=variant).double().eval()
    x, mask = padded_batch(8)
    exact, _ = model(x, mask)
    single, _ = model.float()(x.float(), mask)
    scale = exact.abs().max().item() + 1
    # each of ~4 steps x ~30 float32 roundings per value, amplified at most ~10x by the softmax and matmuls
    bound = 4 * 30 * 10 * torch.finfo(torch.float32).eps * scale
    assert (single.double() - exact).abs().max().item() <= bound


@pytest.mark.parametrize("variant", ["paper", "official"])
def test_slstm_contract_and_dropout(variant):
    torch.manual_seed(0)
    model = build_encoder("slstm", 6, hidden_size=6, num_steps=2, window=2, variant=variant, dropout=0.3)
    assert (model.causal, model.stateful) == (False, False)
    assert_contract(model.double(), atol=1e-12)
    x, mask = padded_batch(6)
    model.eval()
    assert torch.equal(model(x, mask)[0], model(x, mask)[0])  # no dropout at evaluation
    model.train()
    out, _ = model(x, mask)
    assert not torch.equal(out, model.eval()(x, mask)[0])
    assert (out[~mask] == 0).all()


def _gradcheck(model, names, x, mask):
    """float64 gradcheck of the outputs and the global state with respect to ``x`` and the named parameters."""
    params = [model.get_parameter(name).detach().clone().requires_grad_(True) for name in names]

    def run(x, *params):
        out, (g, _) = functional_call(model, dict(zip(names, params, strict=True)), (x, mask))
        return out, g

    assert torch.autograd.gradcheck(run, (x, *params))


@pytest.mark.parametrize("variant", ["paper", "official"])
def test_slstm_gradcheck(variant):
    torch.manual_seed(0)
    model = SLSTM(2, 2, num_steps=2, window=1, variant=variant).double()
    x, mask = padded_batch(2, lengths=[3, 2])
    x = x.nan_to_num(0.0).requires_grad_(True)
    _gradcheck(model, [name for name, _ in model.named_parameters()], x, mask)


def test_slstm_rejects_bad_arguments():
    with pytest.raises(ValueError, match="input_size"):
        SLSTM(4, 6, variant="official")
    with pytest.raises(ValueError, match="variant"):
        SLSTM(4, 4, variant="other")
    with pytest.raises(ValueError, match="stateful"):
        SLSTM(4, 4)(torch.zeros(1, 2, 4), state=torch.zeros(1, 4))


# --- DA-GRN -----------------------------------------------------------------------------------


def dagrn(**kwargs) -> DAGRN:
    torch.manual_seed(0)
    kwargs = {"num_layers": 4, "depth_size": 2, "window": 1, "inner_dropout": 0.0, **kwargs}
    return DAGRN(4, 6, **kwargs).double()


def forcing(model: DAGRN, index: torch.Tensor) -> None:
    """Make ``model`` select depth index ``index`` (B, T) (huge logits on it)."""
    model.depth_logits = lambda inner: 1e6 * torch.nn.functional.one_hot(index, model.num_layers).to(inner.dtype)


def capture_run(model: DAGRN) -> dict:
    """Record the arguments of the model's S-LSTM run."""
    seen = {}
    run = model.cell.run

    def recording(*args, **kwargs):
        seen["args"], seen["kwargs"] = args, kwargs
        return run(*args, **kwargs)

    model.cell.run = recording
    return seen


@pytest.mark.parametrize("variant", ["official", "paper"])
def test_copy_rule_word_keeps_its_state_from_its_depth(variant):
    """A word with depth d ends with the state it had after d updates, though the stack runs L steps."""
    model = dagrn(depth_mode="hard", variant=variant).eval()
    x, mask = padded_batch(4)
    seen = capture_run(model)
    out, _ = model(x, mask)
    depths = model.last_depths
    assert depths[mask].min() >= 1 and depths[mask].max() <= 4 and (depths[~mask] == 0).all()
    x_pre, x_cell, _, start = seen["args"][:4]
    updates = seen["kwargs"]["updates"]
    assert torch.equal(updates, depths)
    for steps in range(1, model.num_layers + 1):
        h, *_ = model.cell.run(x_pre, x_cell, mask, start, steps, updates=updates)
        at_depth = mask & (depths == steps)
        torch.testing.assert_close(out[at_depth], h[at_depth], rtol=0, atol=0)


def test_copy_rule_with_forced_depths():
    x, mask = padded_batch(4)
    # all words at depth L equal the full-depth ablation (same weights)
    model = dagrn(depth_mode="hard").eval()
    forcing(model, torch.full(mask.shape, model.num_layers - 1))
    deep, (g_deep, _) = model(x, mask)
    model.full_depth = True
    full, (g_full, _) = model(x, mask)
    torch.testing.assert_close(deep, full, rtol=0, atol=0)
    torch.testing.assert_close(g_deep, g_full, rtol=0, atol=0)
    # depth_offset 0: depth index 0 means no update; the word keeps h⁰ = W_3 m
    model = dagrn(depth_mode="hard", depth_offset=0).eval()
    index = torch.zeros(mask.shape, dtype=torch.long)
    index[0, 1] = 2  # one word of row 0 is updated twice, the others never
    forcing(model, index)
    seen = capture_run(model)
    out, _ = model(x, mask)
    start = seen["args"][3][0]
    keep = mask.clone()
    keep[0, 1] = False
    torch.testing.assert_close(out[keep], start[keep], rtol=0, atol=0)
    assert not torch.allclose(out[0, 1], start[0, 1])


def test_frozen_words_cost_no_compute():
    """Word rows reaching the recurrent matmul: Σ_i d_i (gathered), not L · Σ_i 1."""
    model = dagrn(depth_mode="hard").eval()
    x, mask = padded_batch(4)
    rows = []
    model.cell.recurrent.register_forward_hook(lambda m, inputs, out: rows.append(inputs[0].shape[0]))
    model(x, mask)
    assert sum(rows) == int(model.last_depths.sum()) < model.num_layers * int(mask.sum())
    assert len(rows) == model.num_layers


def test_inference_scatters_in_place_with_the_same_values():
    model = dagrn(depth_mode="hard", window=2).eval()
    x, mask = padded_batch(4)
    seen = capture_run(model)
    with_grad, _ = model(x, mask)
    with torch.no_grad():
        without, _ = model(x, mask)
        torch.testing.assert_close(without, with_grad, rtol=0, atol=1e-12)  # (the Bi-LSTM packs without grad)
        x_pre, x_cell, _, state, steps = seen["args"]
        kept = [t.clone() for t in state]
        model.cell.run(x_pre, x_cell, mask, state, steps, **seen["kwargs"])
    assert all(torch.equal(a, b) for a, b in zip(state, kept, strict=True))  # the caller's state is left alone


@pytest.mark.parametrize(
    "kwargs",
    [
        {"variant": "official", "window": 1},
        {"variant": "official", "window": 2, "depth_offset": 0},
        {"variant": "paper", "window": 1},
        {"variant": "paper", "window": 2, "full_depth": True},
    ],
)
def test_inference_forward_equals_the_autograd_forward(kwargs):
    """DAGRN.forward_compact (no autograd: the real words only, the first layer in the rank-d_e space of h⁰,
    the kernels) against the padded autograd forward: float64, an empty row, NaN at the pads."""
    model = dagrn(depth_mode="hard", **kwargs).eval()
    x, mask = padded_batch(4, lengths=[5, 3, 0, 1, 4])
    want, (g_want, c_want) = model(x, mask)
    depths = model.last_depths
    assert len(depths[mask].unique()) > 1 or kwargs.get("full_depth")  # the words stop at different depths
    with torch.no_grad():
        got, (g_got, c_got) = model(x, mask)
    assert torch.equal(model.last_depths, depths)
    for a, b in ((got, want), (g_got, g_want), (c_got, c_want)):
        torch.testing.assert_close(a, b.detach(), rtol=0, atol=1e-12)
    assert (got[~mask] == 0).all()


@pytest.mark.parametrize("variant", ["official", "paper"])
def test_gathered_path_equals_full_computation(variant):
    """Gathering the active words equals computing every word and keeping the frozen ones:
    values and gradients, float64."""
    model = dagrn(variant=variant)
    cell = model.cell
    gen = torch.Generator().manual_seed(1)
    batch, time, hidden = 3, 5, 6
    mask = torch.arange(time).unsqueeze(0) < torch.tensor([5, 2, 4]).unsqueeze(1)
    real = mask.unsqueeze(-1)
    words = (torch.randn(batch, time, hidden, generator=gen, dtype=torch.float64) * real).requires_grad_(True)
    start = (torch.randn(batch, time, hidden, generator=gen, dtype=torch.float64) * real).requires_grad_(True)
    glob = torch.randn(batch, hidden, generator=gen, dtype=torch.float64)
    updates = torch.randint(0, 5, (batch, time), generator=gen) * mask
    results = []
    for gather in (True, False):
        x_cell = words if variant == "official" else None
        h, c, g, c_g = cell.run(cell.input(words), x_cell, mask, (start, start, glob, glob), 4, updates, gather)
        loss = (h * torch.linspace(-1, 1, hidden, dtype=h.dtype)).sum() + g.pow(2).sum() + c.sum()
        grads = torch.autograd.grad(loss, [words, start, *cell.parameters()])
        results.append((h, c, g, c_g, *grads))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-13)


@pytest.mark.parametrize("window", [1, 2])
@pytest.mark.parametrize("variant", ["official", "paper"])
def test_compact_inference_equals_the_masked_full_computation(variant, window, monkeypatch):
    """Inference (no autograd) runs the real words only, deepest first, and skips the word update in
    steps where no word is updated: float64, padded batch with an empty row, the same values as
    computing every position and keeping the frozen ones, for every depth pattern."""
    cell, steps = dagrn(variant=variant, window=window).cell, 4
    gen = torch.Generator().manual_seed(2)
    batch, time, hidden = 5, 6, 6
    mask = torch.arange(time).unsqueeze(0) < torch.tensor([6, 2, 0, 4, 1]).unsqueeze(1)
    real, ones = mask.unsqueeze(-1), mask.long()
    words = torch.randn(batch, time, hidden, generator=gen, dtype=torch.float64) * real
    start = torch.randn(batch, time, hidden, generator=gen, dtype=torch.float64) * real
    glob = torch.randn(batch, hidden, generator=gen, dtype=torch.float64)
    x_cell = words if variant == "official" else None
    patterns = {
        "all at depth 1": ones,
        "all at depth L": steps * ones,
        "none updated": 0 * ones,
        "mixed": torch.randint(0, steps + 1, (batch, time), generator=gen) * ones,
        "one deep word": ones + (torch.arange(time) == 3) * (steps - 1),
        "beyond L": (steps + 2) * ones,
        "every word": None,
    }
    steps_run = []

    def counting(update):  # the words each step of the compact path updates
        def counted(pre, *args, **kwargs):
            steps_run.append(pre.shape[0])
            return update(pre, *args, **kwargs)

        return counted

    for name in ("word_cells", "word_cells_reference"):
        monkeypatch.setattr(slstm_module, name, counting(getattr(slstm_module, name)))

    for name, updates in patterns.items():
        with torch.no_grad():
            state = (start, start, glob, glob)
            full = cell.run(cell.input(words), x_cell, mask, state, steps, updates, gather=False)
            at_words = cell.run(cell.project_input(words, mask), x_cell, mask, state, steps, updates, gather=False)
            steps_run.clear()
            compact = cell.run(cell.project_input(words, mask), x_cell, mask, state, steps, updates)
        for got, same, want in zip(compact, at_words, full, strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-12, msg=name)
            torch.testing.assert_close(same, want, rtol=0, atol=1e-12, msg=name)  # x_pre at the real words only
        depth = (steps * ones if updates is None else updates.clamp(max=steps)) * ones
        assert steps_run == [int((depth > step).sum()) for step in range(int(depth.max()))], name


def test_inference_bilstm_matches_the_packed_one():
    """DA-GRN's CPU inference Bi-LSTM (the recurrence kernel over the real words, or its fallback)
    against the packed one, float32 within the float64 bound, an empty row included."""
    model = dagrn().float().eval()
    x, mask = padded_batch(4, lengths=[5, 3, 0, 1, 4])
    x = x.nan_to_num(0.0)
    with torch.no_grad():
        fast = model.sequential_rows(x.float(), mask)  # (M, H) at the real words
        packed = model.sequential(x.float(), mask)[0]
        ref64 = model.double().sequential(x, mask)[0]
    assert (packed[~mask] == 0).all()
    assert_close_to_float64(fast, ref64[mask], packed[mask])


def test_training_paths_agree():
    """The training forward gathers or computes all words (``gather_in_training``): same values."""
    model = dagrn(depth_mode="hard").train()
    x, mask = padded_batch(4)
    x = x.nan_to_num(0.0)
    gathered, _ = model(x, mask)
    model.gather_in_training = False
    full, _ = model(x, mask)
    torch.testing.assert_close(gathered, full, rtol=0, atol=1e-13)


def test_depth_selection_modes():
    model = dagrn(depth_mode="hard", num_layers=5)
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 7, 5, generator=gen, dtype=torch.float64)
    p = torch.softmax(logits, -1)
    index, mixing = model.select_depths(logits)
    assert torch.equal(index, p.argmax(-1)) and mixing is None
    model.depth_mode = "soft"  # ⌊Σ_j j p_j⌋
    index, _ = model.select_depths(logits)
    expected = [[math.floor(sum(j * p[b, t, j].item() for j in range(5))) for t in range(7)] for b in range(4)]
    assert index.tolist() == expected
    model.depth_mode = "gumbel"
    model.eval()  # no noise at evaluation: the argmax
    assert torch.equal(model.select_depths(logits)[0], p.argmax(-1))
    model.train()  # Gumbel-Max samples follow p
    torch.manual_seed(0)
    one = logits[0, 0].expand(20000, 1, 5)
    index, mixing = model.select_depths(one)
    assert mixing is None
    freq = torch.bincount(index.flatten(), minlength=5).double() / 20000
    assert (freq - p[0, 0]).abs().max() < 0.02  # 4.5 standard errors at most


def test_straight_through_is_one_hot_forward():
    model = dagrn(depth_mode="gumbel", straight_through=True, temperature=1.0).train()
    logits = torch.randn(3, 4, 4, dtype=torch.float64, requires_grad=True)
    index, mixing = model.select_depths(logits)
    torch.testing.assert_close(mixing, torch.nn.functional.one_hot(index, 4).double(), rtol=0, atol=1e-15)
    (grad,) = torch.autograd.grad((mixing * torch.arange(4.0, dtype=torch.float64)).sum(), logits)
    assert grad.abs().sum() > 0
    with pytest.raises(ValueError, match="straight_through"):
        dagrn(depth_mode="hard", straight_through=True)


@pytest.mark.parametrize(
    ("kwargs", "through_logits"),
    [
        ({"depth_mode": "hard"}, False),
        ({"depth_mode": "soft"}, False),
        ({"depth_mode": "gumbel"}, False),
        ({"depth_mode": "gumbel", "straight_through": True, "temperature": 1.0}, True),
    ],
)
def test_gradient_paths(kwargs, through_logits):
    """MODELS.md 2.3: without straight-through the depth softmax gets no gradient, so with W_3 = 0
    nothing reaches W_1, b_1 or the Bi-LSTM, and E only through its selected rows."""
    model = dagrn(**kwargs).train()
    x, mask = padded_batch(4)
    x = x.nan_to_num(0.0)
    out, (g, _) = model(x, mask)
    grads = torch.autograd.grad(out.sum() + g.sum(), [model.restore.weight, model.inner.weight])
    assert grads[0].abs().sum() > 0 and grads[1].abs().sum() > 0  # h⁰ = W_3 m trains W_3 and W_1
    with torch.no_grad():
        model.restore.weight.zero_()
    torch.manual_seed(0)
    out, (g, _) = model(x, mask)
    upstream = [model.inner.weight, model.inner.bias, *model.sequential.parameters()]
    *grads, grad_e = torch.autograd.grad(out.sum() + g.sum(), [*upstream, model.depth_embedding])
    assert any(grad.abs().sum() > 0 for grad in grads) == through_logits
    selected = torch.zeros(model.num_layers, dtype=torch.bool)
    selected[model.last_depths[mask] - model.depth_offset] = True
    assert (grad_e[selected].abs().sum(-1) > 0).all()
    if not through_logits:  # E's other rows are reached only through the logits
        assert (grad_e[~selected] == 0).all()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"depth_mode": "hard"},
        {"depth_mode": "soft", "depth_offset": 0},
        {"depth_mode": "gumbel", "variant": "paper", "window": 2},
        {"depth_mode": "gumbel", "straight_through": True},
        {"depth_mode": "hard", "full_depth": True},
    ],
)
def test_dagrn_contract(kwargs):
    model = build_encoder("dagrn", 4, hidden_size=6, num_layers=3, depth_size=2, dropout=0.2, **kwargs).double()
    assert (model.causal, model.stateful, model.global_size) == (False, False, 6)
    assert_contract(model, atol=1e-12)


def test_dagrn_gradcheck():
    model = dagrn(depth_mode="hard", num_layers=3).train()
    x, mask = padded_batch(4, lengths=[3, 2])
    x = x.nan_to_num(0.0).requires_grad_(True)
    # the depth machinery and one S-LSTM bias (all the weights would take long)
    names = ["inner.weight", "inner.bias", "restore.weight", "depth_embedding", "cell.word_forget.bias"]
    _gradcheck(model, names, x, mask)


def test_dagrn_rejects_bad_arguments():
    with pytest.raises(ValueError, match="hidden_size"):
        DAGRN(4, 8, depth_size=2)
    with pytest.raises(ValueError, match="depth_mode"):
        DAGRN(4, 6, depth_size=2, depth_mode="other")
    with pytest.raises(ValueError, match="depth_offset"):
        DAGRN(4, 6, depth_size=2, depth_offset=2)
