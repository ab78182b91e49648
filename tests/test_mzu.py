import copy
import math

import pytest
import torch

from seqzoo import build_encoder
from seqzoo.encoders.mzu import (
    MZU,
    MFunction,
    MZUCell,
    MZUTransition,
    RegularTransform,
    StackedHeads,
    capsule_routing,
    graph_conv_zones,
    self_attention_zones,
    squash,
    zone_disagreement,
)
from seqzoo.testing import assert_contract

pytestmark = pytest.mark.usefixtures("single_thread")


def _cos(a, b):
    return (a @ b / (a.norm() * b.norm())).item()


# --- direct, loop-by-loop transcriptions of the paper's equations -----------------------------


def _sat_loops(z, qkv):
    n, d = z.shape
    q = [z[i] @ qkv[i, :, :d] for i in range(n)]
    k = [z[i] @ qkv[i, :, d : 2 * d] for i in range(n)]
    v = [z[i] @ qkv[i, :, 2 * d :] for i in range(n)]
    out = []
    for i in range(n):
        scores = torch.tensor([(q[i] @ k[j]).item() / math.sqrt(d) for j in range(n)], dtype=z.dtype)
        weights = torch.softmax(scores, 0)
        out.append(sum(weights[j] * v[j] for j in range(n)))
    return torch.stack(out)


def _gcn_loops(z, w_g):
    n = z.shape[0]
    a = torch.tensor([[_cos(z[i], z[j]) + (i == j) for j in range(n)] for i in range(n)], dtype=z.dtype)
    degree = [sum(abs(a[i, j]) for j in range(n)) for i in range(n)]
    a_hat = torch.tensor([[a[i, j] / math.sqrt(degree[i] * degree[j]) for j in range(n)] for i in range(n)])
    zw = z @ w_g.t()
    return torch.relu(torch.stack([sum(a_hat[i, j] * zw[j] for j in range(n)) for i in range(n)]))


def _cap_loops(z, w_c, capsules, iterations):
    n = z.shape[0]
    d_o = w_c.shape[0] // capsules
    pred = [[z[i] @ w_c[j * d_o : (j + 1) * d_o].t() for j in range(capsules)] for i in range(n)]  # eq. 10
    b = [[0.0] * capsules for _ in range(n)]
    for _ in range(iterations):
        c = [[math.exp(b[i][j]) / sum(math.exp(v) for v in b[i]) for j in range(capsules)] for i in range(n)]
        s = [sum(c[i][j] * pred[i][j] for i in range(n)) for j in range(capsules)]
        o = [(sj.norm() ** 2 / (1 + sj.norm() ** 2)) * sj / sj.norm() for sj in s]
        b = [[b[i][j] + (pred[i][j] @ o[j]).item() for j in range(capsules)] for i in range(n)]
    return torch.stack(o)


def test_compositions_match_equations():
    torch.manual_seed(0)
    z = torch.randn(3, 4, 5, dtype=torch.float64)
    z[1, 2] *= -1  # some negative cosines for the degree guard
    qkv = torch.randn(4, 5, 15, dtype=torch.float64)
    w_g = torch.randn(5, 5, dtype=torch.float64)
    w_c = torch.randn(2 * 6, 5, dtype=torch.float64)
    sat, gcn, cap = self_attention_zones(z, qkv), graph_conv_zones(z, w_g), capsule_routing(z, w_c, 2, 3)
    for b in range(3):
        torch.testing.assert_close(sat[b], _sat_loops(z[b], qkv))
        torch.testing.assert_close(gcn[b], _gcn_loops(z[b], w_g))
        torch.testing.assert_close(cap[b], _cap_loops(z[b], w_c, 2, 3))


@pytest.mark.parametrize(("capsules", "iterations"), [(1, 2), (3, 1), (3, 4)])
def test_capsule_routing_matches_equations_for_any_capsules_and_iterations(capsules, iterations):
    torch.manual_seed(1)
    z = torch.randn(2, 4, 5, dtype=torch.float64)
    w_c = torch.randn(capsules * 6, 5, dtype=torch.float64)
    cap = capsule_routing(z, w_c, capsules, iterations)
    for b in range(2):
        torch.testing.assert_close(cap[b], _cap_loops(z[b], w_c, capsules, iterations))


def test_gcn_degree_guard_with_negative_cosines():
    z = torch.tensor([[[1.0, 0.0], [-1.0, 0.0], [-1.0, 0.1]]])  # row 0 cosines sum to < 0
    out = graph_conv_zones(z, torch.eye(2))
    assert torch.isfinite(out).all()


def test_zone_disagreement_equals_formula():
    torch.manual_seed(0)
    z = torch.randn(2, 4, 3, dtype=torch.float64)
    expected = [-sum(_cos(z[b, i], z[b, j]) for i in range(4) for j in range(4)) / 16 for b in range(2)]
    torch.testing.assert_close(zone_disagreement(z), torch.tensor(expected, dtype=torch.float64))


# --- shapes, structure -------------------------------------------------------------------------


@pytest.mark.parametrize("composition", ["sat", "gcn", "cap"])
@pytest.mark.parametrize("zones", [2, 4, 8, 16])
def test_shapes(composition, zones):
    m = MFunction(3, 16, composition, num_zones=zones, filter_size=7, capsules=2)
    z = torch.randn(5, zones, 16 // zones)
    out_zones, out_size = (2, 8) if composition == "cap" else (zones, 16 // zones)
    assert m.compose(z).shape == (5, out_zones, out_size)
    assert m(torch.randn(5, 19)).shape == (5, 16)
    enc = MZU(3, 16, composition=composition, num_zones=zones, transition_depth=1, disagreement=1.0)
    out, state = enc(torch.randn(2, 4, 3))
    assert out.shape == (2, 4, 16) and state.shape == (1, 2, 16)
    assert enc.auxiliary_loss().shape == ()


def test_invalid_configurations():
    with pytest.raises(ValueError, match="divisible"):
        MZU(3, 10, num_zones=4)
    with pytest.raises(ValueError, match="num_zones must be >= 1, got 0"):
        MZU(3, 8, num_zones=0)
    with pytest.raises(ValueError, match="composition"):
        MZU(3, 8, composition="rnn")
    with pytest.raises(ValueError, match="capsules"):
        MZU(3, 8, composition="cap", capsules=3)
    for size in (0, -3):  # 0 used to mean hidden_size silently
        with pytest.raises(ValueError, match=rf"filter_size must be >= 1 \(None: hidden_size\), got {size}"):
            MZU(3, 8, filter_size=size)
    for lam in (float("nan"), float("inf")):  # would make the auxiliary loss, and so training, NaN
        with pytest.raises(ValueError, match=r"disagreement \(λ\) must be a finite number"):
            MZU(3, 8, disagreement=lam)


def test_ablations_replace_the_m_functions():
    gate = MZU(3, 8, regular_gate=True).cells[0].transitions[0]
    assert isinstance(gate.gate, RegularTransform) and isinstance(gate.candidate, MFunction)
    assert gate.gate.generate.in_features == 3 + 8 and gate.gate.generate.out_features == 8
    trans = MZU(3, 8, regular_trans=True).cells[0].transitions[0]
    assert isinstance(trans.candidate, RegularTransform) and isinstance(trans.gate, MFunction)
    both = MZU(3, 8, regular_gate=True, regular_trans=True, disagreement=1.0)
    both(torch.randn(1, 2, 3))
    assert both.auxiliary_loss() is None  # no zones, nothing to disagree
    smaller = sum(p.numel() for p in MZU(3, 8, regular_gate=True).parameters())
    assert smaller < sum(p.numel() for p in MZU(3, 8).parameters())


def test_transition_sharing():
    shared = MZU(3, 8, transition_depth=2, share_transition=True).cells[0]
    own = MZU(3, 8, transition_depth=2).cells[0]
    assert len(shared.transitions) == 1 and len(own.transitions) == 3
    assert own.transitions[1].candidate.generate.in_features == 8  # t-MZU: state only


def test_shared_deep_transition_is_the_shallow_mzu_reading_a_zero_after_each_input():
    """With one M for all depths, a t-MZU step is the MZU cell's step on x = 0 (eqs. 15–17), so
    MZU+DT (L = 2, shared) over x equals the shallow MZU over x_1, 0, 0, x_2, 0, 0, ...,
    read at every third step: the deep transition triples the recurrence the gradient crosses."""
    torch.manual_seed(0)
    deep = MZU(5, 8, composition="cap", transition_depth=2, share_transition=True).double().eval()
    shallow = MZU(5, 8, composition="cap").double().eval()
    shallow.load_state_dict(deep.state_dict())
    x = torch.randn(3, 4, 5, dtype=torch.double)
    interleaved = torch.zeros(3, 12, 5, dtype=torch.double)
    interleaved[:, ::3] = x
    out_deep, state_deep = deep(x)
    out_shallow, state_shallow = shallow(interleaved)
    torch.testing.assert_close(out_deep, out_shallow[:, 2::3])
    torch.testing.assert_close(state_deep, state_shallow)


# --- contract, fast path vs reference, gradients ------------------------------------------------


@pytest.mark.parametrize("composition", ["sat", "gcn", "cap"])
@pytest.mark.parametrize(("depth", "share", "bidirectional"), [(0, False, False), (2, False, True), (1, True, False)])
def test_contract(composition, depth, share, bidirectional):
    torch.manual_seed(0)
    enc = build_encoder(
        "mzu",
        5,
        hidden_size=8,
        composition=composition,
        num_zones=2,
        filter_size=6,
        transition_depth=depth,
        share_transition=share,
        bidirectional=bidirectional,
        dropout=0.2,
    )
    # float64 shows the logic to rounding's size; float32's batch-dependent matmul blocking alone
    # reaches 2.4e-5 on some row lengths, so its tolerance leaves room for that
    assert_contract(enc.double(), atol=1e-10)
    assert_contract(enc.float())  # atol: float32's rounding error on it, from float64 (seqzoo.testing)


@pytest.mark.parametrize("composition", ["sat", "gcn", "cap"])
@pytest.mark.parametrize("layer_norm", [True, False])
def test_stacked_heads_equal_each_function_alone(composition, layer_norm):
    torch.manual_seed(0)
    kwargs = {"composition": composition, "num_zones": 4, "filter_size": 5, "capsules": 4, "routing_iters": 2}
    functions = [MFunction(3, 8, layer_norm=layer_norm, **kwargs).double() for _ in range(3)]
    for m in functions:  # LN at its initial gain 1 / offset 0 would hide a mix-up of the functions'
        for p in m.norm.parameters():
            torch.nn.init.normal_(p)
    zones = torch.randn(3, 2, 8, dtype=torch.float64, requires_grad=True)
    stacked = StackedHeads(functions)(zones)
    alone = torch.stack([m.head(z) for m, z in zip(functions, zones, strict=True)])
    torch.testing.assert_close(stacked, alone)
    weights = torch.randn_like(alone)
    params = [zones] + [p for m in functions for p in m.parameters() if p is not m.generate.weight]
    grads = torch.autograd.grad((stacked * weights).sum(), params)
    expected = torch.autograd.grad((alone * weights).sum(), params)
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want)


def test_stacked_heads_refuse_functions_of_different_structure():
    with pytest.raises(ValueError, match="one structure"):
        StackedHeads([MFunction(3, 8, layer_norm=False), MFunction(3, 8, layer_norm=True)])
    with pytest.raises(ValueError, match="one structure"):
        StackedHeads([MFunction(3, 8, composition="cap", routing_iters=2), MFunction(3, 8, composition="cap")])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"composition": "cap", "transition_depth": 1, "share_transition": True},
        {"composition": "sat", "transition_depth": 2},
        {"composition": "gcn", "transition_depth": 1, "layer_norm": False},
        {"composition": "gcn", "transition_depth": 2, "regular_gate": True},
        {"composition": "sat", "transition_depth": 1, "regular_trans": True, "layer_norm": False},
    ],
)
def test_fast_path_equals_reference_and_disagreement(kwargs):
    torch.manual_seed(0)
    enc = MZU(4, 8, num_zones=4, disagreement=-0.5, **kwargs).double()
    x = torch.randn(3, 5, 4, dtype=torch.float64)
    mask = torch.arange(5) < torch.tensor([5, 2, 4]).unsqueeze(1)
    out, state = enc(x, mask)
    cell = enc.cells[0]
    h = torch.zeros(3, 8, dtype=torch.float64)
    expected, total = [], 0.0
    for t in range(5):
        h_new, d_zone = cell.reference(x[:, t], h)
        h = torch.where(mask[:, t : t + 1], h_new, h)
        expected.append(h_new * mask[:, t : t + 1])
        total = total + (d_zone * mask[:, t]).sum()
    torch.testing.assert_close(out, torch.stack(expected, 1))
    torch.testing.assert_close(state[0], h)
    aux = enc.auxiliary_loss()
    torch.testing.assert_close(aux, 0.5 * total / 11)  # −λ · D, D averaged over 11 tokens
    weights = torch.randn_like(out)
    params = list(enc.parameters())
    fast_grads = torch.autograd.grad((out * weights).sum() + aux, params)
    reference_grads = torch.autograd.grad((torch.stack(expected, 1) * weights).sum() + 0.5 * total / 11, params)
    for fast, reference in zip(fast_grads, reference_grads, strict=True):
        torch.testing.assert_close(fast, reference)


def test_disagreement_sums_over_m_functions():
    torch.manual_seed(0)
    cell = MZUCell(3, 8, transition_depth=1, composition="sat", num_zones=4).double()  # the formula, not rounding
    cell.track_disagreement = True
    x, h = torch.randn(2, 3, dtype=torch.float64), torch.randn(2, 8, dtype=torch.float64)
    _, d_zone = cell.reference(x, h)
    t0, t1 = cell.transitions
    terms = [zone_disagreement(m.generate(torch.cat([x, h], -1)).view(2, 4, 2)) for m in (t0.candidate, t0.gate)]
    h1 = cell.transitions[0].reference(torch.cat([x, h], -1), h)[0]
    terms += [zone_disagreement(m.generate(h1).view(2, 4, 2)) for m in (t1.candidate, t1.gate)]
    torch.testing.assert_close(d_zone, sum(terms))


def test_disagreement_on_by_default_and_gradient_sign():
    torch.manual_seed(0)
    enc = MZU(3, 8, disagreement=0.0)
    enc(torch.randn(2, 3, 3))
    assert enc.auxiliary_loss() is None
    assert MZU(3, 8).disagreement == 1.0  # MODELS.md 4.4: lambda = 1.0 by default
    enc.disagreement = 1.0
    enc(torch.randn(2, 3, 3))
    loss = enc.auxiliary_loss()
    assert loss.item() == pytest.approx(-enc.aux_per_token.item())  # = λ · mean cosine ≥ 0 shrinks cosines
    loss.backward()
    assert enc.cells[0].transitions[0].candidate.generate.weight.grad.abs().sum() > 0


def test_deepcopy_after_a_forward_with_disagreement():
    """The last forward's auxiliary term is a graph node, which deepcopy refuses; copies leave it out."""
    torch.manual_seed(0)
    enc = MZU(3, 8, disagreement=1.0)
    enc(torch.randn(2, 3, 3))
    clone = copy.deepcopy(enc)
    assert clone.aux_per_token is None and enc.aux_per_token is not None
    for a, b in zip(enc.state_dict().values(), clone.state_dict().values(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("composition", ["sat", "gcn", "cap"])
def test_gradcheck_cell(composition):
    torch.manual_seed(0)
    cell = MZUCell(2, 4, transition_depth=1, composition=composition, num_zones=2, filter_size=3).double()
    cell.track_disagreement = True
    x = torch.randn(2, 2, dtype=torch.float64, requires_grad=True)
    h = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)

    def fast(x, h):
        inputs, step = cell.prepare(x.unsqueeze(0))
        h_new, d_zone = step(inputs[0], h)
        return h_new, d_zone

    assert torch.autograd.gradcheck(fast, (x, h))
    assert torch.autograd.gradcheck(lambda x, h: cell.reference(x, h), (x, h))


def test_backward_direction_ignores_padding():
    torch.manual_seed(0)
    enc = MZU(4, 8, composition="cap", bidirectional=True).eval()
    x = torch.randn(1, 6, 4)
    garbage = x.clone()
    garbage[:, 4:] = 100.0
    mask = torch.tensor([[True] * 4 + [False] * 2])
    torch.testing.assert_close(enc(x, mask)[0], enc(garbage, mask)[0], rtol=0, atol=0)


def test_squash_is_finite_at_zero():
    s = torch.zeros(2, 3, requires_grad=True)
    squash(s).sum().backward()
    assert torch.isfinite(s.grad).all()
    assert torch.isfinite(capsule_routing(torch.zeros(1, 2, 3), torch.zeros(4, 3), 2, 3)).all()


@pytest.mark.parametrize(("depth", "share"), [(0, False), (2, False), (1, True)])
def test_trace_states_equal_forward(depth, share):
    torch.manual_seed(0)
    enc = MZU(5, 8, num_layers=2, composition="cap", transition_depth=depth, share_transition=share).double().eval()
    x, state = torch.randn(3, 6, 5, dtype=torch.float64), torch.randn(2, 3, 8, dtype=torch.float64)
    candidates, states = enc.trace(x, state)  # (float64: the two paths round differently in float32)
    assert candidates.shape == (3, 6, depth + 1, 8)
    torch.testing.assert_close(states, enc(x, state=state)[0])


def test_trace_candidate_is_what_the_state_moves_towards():
    """h_t − h_{t−1} = g ⊙ (h̃_t − h_{t−1}) with 0 < g < 1: both differences have the same signs."""
    torch.manual_seed(0)
    enc = MZU(5, 8, composition="gcn").eval()
    candidates, states = enc.trace(torch.randn(2, 7, 5))
    previous = torch.cat([torch.zeros(2, 1, 8), states[:, :-1]], dim=1)
    step, towards = states - previous, candidates[:, :, 0] - previous
    assert torch.equal(step.sign(), towards.sign())
    assert torch.all((step.abs() < towards.abs()) | (towards == 0))


def test_trace_refuses_bidirectional():
    with pytest.raises(ValueError, match="unidirectional"):
        MZU(4, 8, bidirectional=True).trace(torch.randn(1, 2, 4))


def test_m_function_biases_start_at_zero_so_outputs_depend_on_the_input():
    """With torch's random biases the constant path through the FFN and the output linear made
    every input's M output nearly the same vector after LN (mean cosine 0.98 at the brown_char
    size); the biases start at zero, as the GRU baselines' do."""
    torch.manual_seed(0)
    m = MZU(64, 192, composition="cap", transition_depth=1, share_transition=True).cells[0].transitions[0].candidate
    assert all(not linear.bias.any() for linear in (m.ffn[0], m.ffn[2], m.out))
    inputs = torch.rand(2, 256, 64 + 192) * 2 - 1
    with torch.no_grad():
        a, b = (m(u) for u in inputs)  # LN(M([x; h]))
    assert torch.cosine_similarity(a, b, dim=-1).mean() < 0.6


CUDA = pytest.param(
    "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
)


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_autocast_projects_the_input_in_bfloat16_and_runs_the_recurrence_in_float32(monkeypatch, bidirectional, device):
    """Under autocast (``train.precision: bf16``, CPU or CUDA) only the hoisted input projection runs in
    bfloat16; every step runs in float32 with autocast off (under autocast each of its dozens of
    small ops would pay a cast, and the capMZU+DT's training step was 1.2-1.3x slower than in
    float32). So the autocast run, values and gradients, equals a float32 run whose input
    projection alone is computed in bfloat16 by hand."""
    by_hand = False
    original = MZUCell.prepare
    projections = []

    def spy(cell, x):
        inputs, step = original(cell, x)
        if by_hand:
            w_x, _, bias = cell.transitions[0].fused_weights()
            half = [t.bfloat16() if t is not None else None for t in (x, w_x, bias)]
            inputs = torch.nn.functional.linear(*half).float()
        projections.append(inputs.dtype)
        return inputs, step

    step_dtypes = set()
    transition_step = MZUTransition.step

    def step_spy(cell, pre, h, *args):
        step_dtypes.add((pre.dtype, h.dtype, torch.is_autocast_enabled(device)))
        return transition_step(cell, pre, h, *args)

    monkeypatch.setattr(MZUCell, "prepare", spy)
    monkeypatch.setattr(MZUTransition, "step", step_spy)
    torch.manual_seed(0)
    encoder = MZU(6, 16, composition="cap", num_layers=2, transition_depth=1, bidirectional=bidirectional)
    encoder = encoder.to(device).eval()
    x = torch.randn(3, 40, 6).to(device).requires_grad_(True)
    mask = (torch.arange(40) < torch.tensor([40, 17, 1]).unsqueeze(1)).to(device)
    results = []
    for autocast in (True, False):
        by_hand = not autocast
        with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
            out, final = encoder(x, mask)
        assert out.dtype == final.dtype == torch.float32
        grads = torch.autograd.grad(out.square().sum() + encoder.auxiliary_loss(), [x, *encoder.parameters()])
        results.append([out, final, *grads])
    assert set(projections[: len(projections) // 2]) == {torch.bfloat16}
    assert step_dtypes == {(torch.float32, torch.float32, False)}
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)
    by_hand = False
    assert not torch.equal(encoder(x, mask)[0], results[0][0])  # bfloat16 did run


def test_mzu_candidate_dropout_acts_in_training_on_the_candidate():
    """Candidate dropout: at t = 0 from h = 0 the trained candidate is either 0 or the evaluation
    candidate / (1 - p) (inverted dropout), and both cases occur."""
    torch.manual_seed(0)
    enc = MZU(3, 8, dropout=0.5, composition="sat", disagreement=0.0).double()
    x = torch.randn(4, 2, 3, dtype=torch.float64)
    with torch.no_grad():
        cand_eval = enc.eval().trace(x)[0][:, 0, 0]
        cand_train = enc.train().trace(x)[0][:, 0, 0]
    dropped = cand_train == 0
    assert bool(dropped.any()) and bool((~dropped).any())
    torch.testing.assert_close(cand_train[~dropped], 2 * cand_eval[~dropped])
    assert bool((cand_eval[dropped] != 0).all())


def test_mzu_step_is_eqs_1_to_3():
    """h_t = (1 − g) ⊙ h + g ⊙ tanh(M_h(u)), g = σ(M_g(u)),
    u = [x; h], with the M-functions called as modules (MODELS.md 4.1). The fast path and the
    reference share MZUTransition.activations, so comparing them cannot catch an activation swap."""
    torch.manual_seed(0)
    enc = MZU(3, 8, composition="sat", disagreement=0.0).double().eval()
    x = torch.randn(2, 1, 3, dtype=torch.float64)
    h0 = torch.randn(1, 2, 8, dtype=torch.float64)
    cell = enc.cells[0].transitions[0]
    with torch.no_grad():
        out, _ = enc(x, state=h0)
        u = torch.cat([x[:, 0], h0[0]], -1)
        g = torch.sigmoid(cell.gate(u))
        expected = (1 - g) * h0[0] + g * torch.tanh(cell.candidate(u))
    torch.testing.assert_close(out[:, 0], expected)
