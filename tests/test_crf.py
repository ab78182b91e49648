"""The linear-chain CRF head against brute-force enumeration of every tag path (float64), its
per-step reference, gradcheck and pytorch-crf."""

import itertools
import math

import pytest
import torch
from numerics import assert_all_close_to_float64

import seqzoo.heads.crf as crf_module
from seqzoo.heads.crf import (
    CRF,
    DISALLOWED,
    _Lattice,
    _max_plus,
    log_partition,
    log_partition_reference,
    path_score,
    viterbi,
    viterbi_batched,
    viterbi_reference,
)
from seqzoo.kernels.crf_forward import (
    compiled_partition_available,
    log_partition_backward_compiled,
    log_partition_compiled,
)
from seqzoo.kernels.crf_viterbi import compiled_viterbi_available, viterbi_compiled

pytestmark = pytest.mark.usefixtures("single_thread")

BIO = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


def _crf(num_tags: int, seed: int = 0, scale: float = 1.0, **kwargs) -> CRF:
    torch.manual_seed(seed)
    crf = CRF(num_tags, **kwargs).double()
    for p in crf.parameters():
        torch.nn.init.normal_(p, std=scale)
    return crf


def _batch(lengths: list[int], num_tags: int, seed: int = 1, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    seq_len = max(lengths)
    emissions = torch.randn(len(lengths), seq_len, num_tags, generator=gen, dtype=dtype)
    mask = torch.arange(seq_len).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
    tags = torch.randint(num_tags, (len(lengths), seq_len), generator=gen)
    return emissions, tags, mask


def _all_paths(crf: CRF, emissions: torch.Tensor, length: int) -> dict[tuple[int, ...], float]:
    """s(y) of every path of one row (emissions (T, K)), by the definition."""
    start, trans, end = (x.detach() for x in crf.scores(torch.float64))
    scores = {}
    for path in itertools.product(range(crf.num_tags), repeat=length):
        s = start[path[0]] + end[path[-1]] + sum(emissions[t, y] for t, y in enumerate(path))
        s = s + sum(trans[a, b] for a, b in itertools.pairwise(path))
        scores[path] = float(s)
    return scores


def _log_sum_exp(values) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


LENGTHS = [4, 3, 1, 2]


@pytest.mark.parametrize("constraints", [None, "BIO", "IOBES"])
def test_log_likelihood_matches_brute_force(constraints):
    tags_names = BIO if constraints == "BIO" else ["O", "B-A", "I-A", "E-A", "S-A"]
    crf = _crf(5, constraints=constraints, tags=tags_names if constraints else None)
    emissions, tags, mask = _batch(LENGTHS, 5)
    llh = crf(emissions, tags, mask)
    for b, length in enumerate(LENGTHS):
        paths = _all_paths(crf, emissions[b], length)
        gold = tuple(tags[b, :length].tolist())
        assert llh[b].item() == pytest.approx(paths[gold] - _log_sum_exp(paths.values()), abs=1e-9)
    assert crf(emissions, tags, mask, reduction="sum").item() == pytest.approx(llh.sum().item())
    assert crf(emissions, tags, mask, reduction="mean").item() == pytest.approx(llh.mean().item())
    token_mean = crf(emissions, tags, mask, reduction="token_mean").item()
    assert token_mean == pytest.approx(llh.sum().item() / sum(LENGTHS))


def test_gradients_gradcheck():
    crf = _crf(3)
    emissions, tags, mask = _batch([3, 2, 1], 3)
    start, trans, end = (p.detach().clone().requires_grad_(True) for p in crf.scores(torch.float64))
    emissions.requires_grad_(True)
    assert _Lattice.build(emissions.detach(), mask, start.detach(), trans.detach(), end.detach()) is not None
    assert torch.autograd.gradcheck(lambda *x: log_partition(x[0], mask, *x[1:]), (emissions, start, trans, end))
    assert torch.autograd.gradcheck(lambda e: crf(e, tags, mask), (emissions,))


@pytest.mark.parametrize("compiled", [True, False])  # the C kernel, or _Lattice (many tags, other devices)
@pytest.mark.parametrize("tags", [6, 70])  # the element-wise vector-matrix product and torch.mm
def test_fast_gradient_equals_reference_gradient(tags, compiled, monkeypatch):
    if not compiled:
        monkeypatch.setattr(crf_module, "_use_compiled", lambda emissions: False)
    crf = _crf(tags, scale=2.0)
    emissions, _, mask = _batch([7, 5, 5, 1, 3, 7, 2], tags)
    lattice = _Lattice.build(emissions, mask, *(x.detach() for x in crf.scores(torch.float64)))
    assert lattice is not None and (lattice.scratch is None) == (tags == 70)
    inputs = [x.detach().clone().requires_grad_(True) for x in (emissions, *crf.scores(torch.float64))]
    weights = torch.randn(7, dtype=torch.float64)
    fast = torch.autograd.grad(log_partition(inputs[0], mask, *inputs[1:]) @ weights, inputs)
    ref = torch.autograd.grad(log_partition_reference(inputs[0], mask, *inputs[1:]) @ weights, inputs)
    for a, b in zip(fast, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_float32_partition_within_float32_error_of_float64():
    crf = _crf(9, scale=1.0)
    emissions, _, mask = _batch([40, 33, 12, 40], 9, dtype=torch.float32)
    exact = log_partition_reference(emissions.double(), mask, *crf.scores(torch.float64))
    fast = crf.float().log_partition(emissions, mask).double()
    ref32 = log_partition_reference(emissions, mask, *crf.scores(torch.float32)).double()
    eps = torch.finfo(torch.float32).eps
    bound = 8 * torch.maximum((ref32 - exact).abs(), eps * (exact.abs() + emissions.shape[1]))
    assert ((fast - exact).abs() <= bound).all(), ((fast - exact).abs(), bound)


def test_viterbi_and_kbest_match_brute_force():
    crf = _crf(4, scale=1.5)
    emissions, _, mask = _batch([4, 3, 1, 2, 4], 4, seed=3)
    paths = crf.decode(emissions, mask)
    kpaths, kscores = crf.decode_kbest(emissions, mask, k=6)
    assert paths.dtype == torch.long and paths.shape == mask.shape
    for b, length in enumerate(mask.sum(1).tolist()):
        scored = _all_paths(crf, emissions[b], length)
        ranked = sorted(scored, key=scored.get, reverse=True)
        assert tuple(paths[b, :length].tolist()) == ranked[0]
        assert (paths[b, length:] == -1).all()
        for r in range(6):
            if r < len(ranked):
                assert tuple(kpaths[b, r, :length].tolist()) == ranked[r]
                assert kscores[b, r].item() == pytest.approx(scored[ranked[r]], abs=1e-9)
            else:  # a length-1 row over 4 tags has 4 paths only
                assert (kpaths[b, r] == -1).all() and kscores[b, r].item() == float("-inf")
        assert (kpaths[b, :, length:] == -1).all()


def test_marginals_match_brute_force():
    crf = _crf(3, constraints="IOB1", tags=["O", "I-A", "B-A"])
    emissions, _, mask = _batch([4, 2, 1], 3, seed=5)
    marginals = crf.marginals(emissions, mask)
    for b, length in enumerate(mask.sum(1).tolist()):
        scored = _all_paths(crf, emissions[b], length)
        log_z = _log_sum_exp(scored.values())
        expected = torch.zeros(length, 3, dtype=torch.float64)
        for path, s in scored.items():
            for t, y in enumerate(path):
                expected[t, y] += math.exp(s - log_z)
        torch.testing.assert_close(marginals[b, :length], expected, rtol=1e-9, atol=1e-12)
        assert (marginals[b, length:] == 0).all()


def test_constraints_make_disallowed_paths_impossible():
    crf = _crf(5, constraints="BIO", tags=BIO, scale=0.1)
    # emissions favouring I-PER / I-LOC everywhere: unconstrained decoding would start and follow O with I-X
    torch.manual_seed(0)
    emissions = torch.randn(64, 6, 5, dtype=torch.float64)
    emissions[:, :, [2, 4]] += 3.0
    mask = torch.arange(6).unsqueeze(0) < torch.randint(1, 7, (64, 1))
    paths = crf.decode(emissions, mask)
    for row in paths.tolist():
        row = [BIO[y] for y in row if y >= 0]
        for prev, cur in zip(["O", *row], row, strict=False):
            assert not (cur.startswith("I-") and prev != "B" + cur[1:] and prev != cur), row
    kpaths, _ = crf.decode_kbest(emissions[:4], mask[:4], k=3)
    for row in kpaths.reshape(-1, 6).tolist():
        row = [BIO[y] for y in row if y >= 0]
        assert not row or not row[0].startswith("I-")
    # a gold path with a forbidden transition gets (about) DISALLOWED of log-likelihood
    llh = crf(emissions[:1, :2], torch.tensor([[0, 2]]), None)
    assert llh.item() < DISALLOWED / 2
    # the learned value of a forbidden transition is never used, and gets no gradient
    crf.transitions.data[0, 2] = 50.0
    crf(emissions, paths.clamp(min=0), mask).sum().backward()
    assert crf.transitions.grad[0, 2] == 0
    assert torch.equal(crf.decode(emissions, mask), paths)


def test_length_one_and_fully_padded_rows():
    crf = _crf(3)
    emissions, tags, mask = _batch([1, 1, 1], 3)
    start, _, end = crf.scores(torch.float64)
    llh = crf(emissions, tags, mask)
    expected = start[tags[:, 0]] + emissions[:, 0].gather(1, tags[:, :1]).squeeze(1) + end[tags[:, 0]]
    expected = expected - torch.logsumexp(start + emissions[:, 0] + end, 1)
    torch.testing.assert_close(llh, expected)
    assert torch.equal(crf.decode(emissions, mask)[:, 0], (start + emissions[:, 0] + end).argmax(1))
    # a row without a real token: the empty path, log-likelihood 0, all -1, zero marginals
    mask[1] = False
    emissions[1] = float("nan")
    assert crf(emissions, tags, mask)[1].item() == 0.0
    assert (crf.decode(emissions, mask)[1] == -1).all()
    assert (crf.marginals(emissions, mask)[1] == 0).all()
    paths, scores = crf.decode_kbest(emissions, mask, k=2)
    assert (paths[1] == -1).all() and scores[1].tolist() == [0.0, float("-inf")]


def test_padding_invariance():
    crf = _crf(4)
    emissions, tags, mask = _batch([5, 3, 2], 4)
    llh, paths, marg = crf(emissions, tags, mask), crf.decode(emissions, mask), crf.marginals(emissions, mask)
    padded = torch.cat([emissions, torch.full((3, 4, 4), float("nan"), dtype=torch.float64)], 1)
    emissions[~mask] = 1e30  # pads may hold anything
    mask_p = torch.cat([mask, torch.zeros(3, 4, dtype=torch.bool)], 1)
    tags_p = torch.cat([tags, torch.full((3, 4), -100)], 1)
    padded[:, :5] = emissions
    torch.testing.assert_close(crf(padded, tags_p, mask_p), llh, rtol=1e-12, atol=1e-12)
    assert torch.equal(crf.decode(padded, mask_p)[:, :5], paths)
    torch.testing.assert_close(crf.marginals(padded, mask_p)[:, :5], marg)
    # batch-size invariance: each row alone
    for b in range(3):
        torch.testing.assert_close(crf(emissions[b : b + 1], tags[b : b + 1], mask[b : b + 1]), llh[b : b + 1])


def test_extreme_scores_fall_back_to_the_reference():
    """Scores thousands of nats apart underflow exp space in float32: the reference takes over."""
    crf = _crf(5, constraints="BIO", tags=BIO).float()
    emissions, tags, mask = _batch([6, 4], 5, dtype=torch.float32)
    emissions = emissions * 300
    assert _Lattice.build(emissions, mask, *crf.scores(torch.float32)) is None
    leaf = emissions.clone().requires_grad_(True)
    llh = crf(leaf, tags, mask)
    llh.sum().backward()
    exact = crf.double()(emissions.double(), tags, mask)
    torch.testing.assert_close(llh.double(), exact, rtol=1e-5, atol=1e-2)
    assert torch.isfinite(leaf.grad).all()
    marginals = crf.marginals(emissions.double(), mask)
    torch.testing.assert_close(marginals.sum(2), mask.double())


@pytest.mark.parametrize("scale", [0.05, 0.5, 5.0])  # every row pruned, some, none
def test_pruned_max_plus_is_exact(scale):
    """Many tags: the candidate pruning is exact (small transitions) or falls back row by row (large ones)."""
    torch.manual_seed(0)
    tags = 80
    trans = torch.randn(tags, tags) * scale
    delta = torch.randn(7, tags) * 3
    out = (torch.empty(7, tags), torch.empty(7, tags, dtype=torch.long))
    _max_plus(delta, trans.t().contiguous(), trans.amax(0), out, torch.empty(7, tags, tags))
    expected = (delta.unsqueeze(2) + trans).max(1)
    assert torch.equal(out[0], expected.values) and torch.equal(out[1], expected.indices)
    crf = CRF(tags)
    torch.nn.init.normal_(crf.transitions, std=scale)
    emissions, _, mask = _batch([9, 4, 7], tags, dtype=torch.float32)
    assert torch.equal(crf.decode(emissions, mask), viterbi_reference(emissions, mask, *crf.scores(torch.float32)))


needs_kernel = pytest.mark.skipif(compiled_viterbi_available() is not None, reason="the C kernel is not built")


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("tags", [1, 2, 9, 50])
def test_compiled_viterbi_equals_reference_and_batched(tags, dtype):
    """The C kernel, the batched PyTorch path and the per-row reference find the same paths, and the
    kernel's scores are those paths' scores, over padded rows, a length-1 row and an empty one."""
    crf = _crf(tags, seed=tags, scale=2.0).to(dtype)
    emissions, _, mask = _batch([13, 1, 0, 7, 13, 2], tags, seed=tags, dtype=dtype)
    scores = tuple(x.detach() for x in crf.scores(dtype))
    paths, best = viterbi_compiled(emissions, mask.sum(1), *scores)
    expected = viterbi_reference(emissions, mask, *scores)
    assert torch.equal(paths, expected)
    assert torch.equal(viterbi_batched(emissions, mask, *scores)[0], expected)
    eps = torch.finfo(dtype).eps
    truth = path_score(emissions.double(), expected, mask, *(x.double() for x in scores))
    assert ((best.double() - truth).abs() <= 64 * eps * (1 + truth.abs())).all()


@needs_kernel
@pytest.mark.parametrize("tags", [6, 30])  # every previous tag tried, or the pruned candidates first
def test_compiled_viterbi_breaks_ties_like_the_reference(tags):
    """Integer scores make many paths tie: the kernel keeps the lowest previous tag, as the reference's
    max does, also among pruned candidates (the batched path's pruned steps break ties by score order)."""
    gen = torch.Generator().manual_seed(4)
    emissions = torch.randint(-1, 2, (5, 9, tags), generator=gen).float()
    shapes = [(tags,), (tags, tags), (tags,)]
    start, trans, end = (torch.randint(-1, 2, shape, generator=gen).float() for shape in shapes)
    mask = torch.arange(9).unsqueeze(0) < torch.tensor([9, 5, 1, 9, 3]).unsqueeze(1)
    emissions = emissions.masked_fill(~mask.unsqueeze(2), 0.0)
    paths, scores = viterbi_compiled(emissions, mask.sum(1), start, trans, end)
    assert torch.equal(paths, viterbi_reference(emissions, mask, start, trans, end))
    assert torch.equal(scores, path_score(emissions, paths, mask, start, trans, end))


@needs_kernel
def test_compiled_viterbi_over_threads(monkeypatch):
    """A batch large enough to be split over worker threads decodes as the reference does."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    crf = _crf(120, scale=0.5).float()
    emissions, _, mask = _batch([30, 25, 30, 4, 17, 30, 30], 120, dtype=torch.float32)
    scores = tuple(x.detach() for x in crf.scores(torch.float32))
    expected = viterbi_reference(emissions, mask, *scores)
    assert torch.equal(viterbi_compiled(emissions, mask.sum(1), *scores)[0], expected)


def test_viterbi_without_the_kernel_warns_and_takes_the_batched_path(monkeypatch):
    import seqzoo.heads.crf as crf_module

    monkeypatch.setattr(crf_module, "compiled_viterbi_available", lambda: "cannot load _crf_viterbi.so (test)")
    crf = _crf(5).float()
    emissions, _, mask = _batch([4, 2], 5, dtype=torch.float32)
    scores = tuple(x.detach() for x in crf.scores(torch.float32))
    with pytest.warns(RuntimeWarning, match="slower PyTorch Viterbi: cannot load"):
        paths, _ = viterbi(emissions, mask, *scores)
    assert torch.equal(paths, viterbi_reference(emissions, mask, *scores))


@needs_kernel
def test_compiled_viterbi_refuses_bad_arguments():
    emissions = torch.zeros(2, 3, 4)
    scores = (torch.zeros(4), torch.zeros(4, 4), torch.zeros(4))
    with pytest.raises(ValueError, match="lengths must be"):
        viterbi_compiled(emissions, torch.tensor([3, 4]), *scores)
    with pytest.raises(ValueError, match="start, trans, end"):
        viterbi_compiled(emissions, torch.tensor([3, 1]), torch.zeros(5), *scores[1:])
    with pytest.raises(TypeError, match="float32/float64"):
        viterbi_compiled(emissions.half(), torch.tensor([3, 1]), *scores)


def test_bf16_autocast_gives_float32_partition():
    crf = _crf(5).float()
    proj = torch.nn.Linear(8, 5)
    x = torch.randn(3, 4, 8)
    tags = torch.randint(5, (3, 4))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        emissions = proj(x)
        assert emissions.dtype == torch.bfloat16
        log_z = crf.log_partition(emissions)
        llh = crf(emissions, tags)
    assert log_z.dtype == torch.float32 and llh.dtype == torch.float32
    torch.testing.assert_close(log_z, crf.log_partition(emissions.float()))
    torch.testing.assert_close(llh, crf(emissions.float(), tags))


def test_argument_errors():
    with pytest.raises(ValueError, match="needs the names"):
        CRF(3, constraints="BIO")
    with pytest.raises(ValueError, match="does not belong"):
        CRF(3, constraints="BIO", tags=["O", "B-A", "E-A"])
    crf = CRF(3)
    with pytest.raises(ValueError, match="reduction"):
        crf(torch.randn(1, 2, 3), torch.zeros(1, 2, dtype=torch.long), reduction="avg")
    with pytest.raises(ValueError, match="the CRF has 3"):
        crf.decode(torch.randn(1, 2, 4))
    with pytest.raises(ValueError, match="right-padded"):
        crf.decode(torch.randn(1, 2, 3), torch.tensor([[False, True]]))


def test_equals_pytorch_crf():
    torchcrf = pytest.importorskip("torchcrf", reason="pytorch-crf is not installed (pip install 'seqzoo[dev]')")
    torch.manual_seed(0)
    for tags, lengths in [(9, [12, 7, 12, 1, 5]), (20, [30, 29, 3])]:
        peer = torchcrf.CRF(tags, batch_first=True)
        ours = CRF(tags)
        ours.load_state_dict(peer.state_dict())
        emissions, labels, mask = _batch(lengths, tags, dtype=torch.float32)
        expected = peer(emissions, labels, mask, reduction="none")
        torch.testing.assert_close(ours(emissions, labels, mask), expected, rtol=1e-5, atol=0)
        best = ours.decode(emissions, mask)
        for b, path in enumerate(peer.decode(emissions, mask)):
            assert best[b, : len(path)].tolist() == path


needs_partition_kernel = pytest.mark.skipif(
    compiled_partition_available() is not None, reason="the C log-partition kernel is not built"
)


def _leaves(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [x.detach().clone().requires_grad_(True) for x in tensors]


def _partition_and_gradients(fn, emissions, mask, scores, weights):
    """log Z (B,) by ``fn`` and the gradients of weights . log Z w.r.t. emissions, start, trans, end."""
    leaves = _leaves(emissions, *scores)
    log_z = fn(leaves[0], mask, *leaves[1:])
    return [log_z, *torch.autograd.grad(log_z @ weights, leaves)]


@needs_partition_kernel
@pytest.mark.parametrize("tags", [1, 2, 9, 50])
def test_compiled_partition_equals_reference(tags):
    """float64: the kernel's log Z and its gradients (emissions, start, transitions, end) are the reference's,
    over padded rows, a length-1 row, an empty one and full-length ones, called directly and through autograd."""
    crf = _crf(tags, seed=tags, scale=2.0)
    emissions, _, mask = _batch([13, 1, 0, 7, 13, 2], tags, seed=tags)
    emissions = emissions.masked_fill(~mask.unsqueeze(2), 0.0)
    scores = tuple(x.detach() for x in crf.scores(torch.float64))
    weights = torch.randn(6, dtype=torch.float64)
    expected = _partition_and_gradients(log_partition_reference, emissions, mask, scores, weights)
    assert expected[0][2] == 0 and (expected[1][2] == 0).all()
    assert crf_module._use_compiled(emissions)
    got = _partition_and_gradients(log_partition, emissions, mask, scores, weights)
    log_z, saved = log_partition_compiled(emissions, mask.sum(1), *scores)
    direct = [log_z, *log_partition_backward_compiled(emissions, mask.sum(1), *scores, saved, weights)]
    for result in (got, direct):
        for a, b in zip(result, expected, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@needs_partition_kernel
def test_compiled_partition_gradcheck():
    crf = _crf(3, scale=1.5)
    emissions, _, mask = _batch([3, 0, 2, 1], 3)
    emissions = emissions.masked_fill(~mask.unsqueeze(2), 0.0)
    inputs = _leaves(emissions, *crf.scores(torch.float64))
    assert crf_module._use_compiled(emissions)
    assert torch.autograd.gradcheck(lambda *x: log_partition(x[0], mask, *x[1:]), inputs)


@pytest.mark.parametrize("compiled", [True, False])
def test_create_graph_differentiates_the_reference(compiled, monkeypatch):
    """A backward with create_graph=True gives gradients that can be differentiated again, equal to the
    reference's second derivatives."""
    if not compiled:
        monkeypatch.setattr(crf_module, "_use_compiled", lambda emissions: False)
    crf = _crf(4)
    emissions, _, mask = _batch([5, 3, 1], 4)
    weights = torch.randn(3, dtype=torch.float64)
    results = []
    for fn in (log_partition, log_partition_reference):
        leaves = _leaves(emissions, *crf.scores(torch.float64))
        grads = torch.autograd.grad(fn(leaves[0], mask, *leaves[1:]) @ weights, leaves, create_graph=True)
        penalty = sum((g**2).sum() for g in grads)
        results.append([*grads, *torch.autograd.grad(penalty, leaves)])
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@needs_partition_kernel
@pytest.mark.parametrize("tags", [9, 50])
def test_compiled_partition_float32_within_float32_error_of_float64(tags):
    """float32 log Z and gradients are off float64 by no more than the float32 reference is, up to a factor."""
    crf = _crf(tags, seed=2)
    emissions, _, mask = _batch([40, 33, 12, 0, 40], tags, dtype=torch.float32)
    scores32 = tuple(x.detach().float() for x in crf.scores(torch.float64))
    weights = torch.randn(5, dtype=torch.float64)
    exact = _partition_and_gradients(
        log_partition_reference, emissions.double(), mask, crf.scores(torch.float64), weights
    )
    twin = _partition_and_gradients(log_partition_reference, emissions, mask, scores32, weights.float())
    got = _partition_and_gradients(log_partition, emissions, mask, scores32, weights.float())
    assert all(x.dtype == torch.float32 for x in got)
    assert_all_close_to_float64(got, [x.detach() for x in exact], twin)


@needs_partition_kernel
def test_compiled_partition_over_threads(monkeypatch):
    """A batch large enough to be split over worker threads (and their accumulators) gives the reference's."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    crf = _crf(120, scale=0.5)
    emissions, _, mask = _batch([30, 25, 30, 4, 17, 30, 0], 120)
    scores = tuple(x.detach() for x in crf.scores(torch.float64))
    weights = torch.randn(7, dtype=torch.float64)
    expected = _partition_and_gradients(log_partition_reference, emissions, mask, scores, weights)
    got = _partition_and_gradients(log_partition, emissions, mask, scores, weights)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_partition_path_by_device_dtype_and_tags(monkeypatch):
    """The C kernel for float32/float64 CPU emissions up to _COMPILED_MAX_TAGS tags, _Lattice otherwise."""
    monkeypatch.setattr(crf_module, "compiled_partition_available", lambda: None)
    limit = crf_module._COMPILED_MAX_TAGS
    assert crf_module._use_compiled(torch.zeros(1, 1, limit))
    assert crf_module._use_compiled(torch.zeros(1, 1, 3, dtype=torch.float64))
    assert not crf_module._use_compiled(torch.zeros(1, 1, limit + 1))
    assert not crf_module._use_compiled(torch.zeros(1, 1, 3, dtype=torch.bfloat16))
    assert not crf_module._use_compiled(torch.zeros(1, 1, 3, device="meta"))


def test_partition_without_the_kernel_warns_and_takes_the_lattice(monkeypatch):
    monkeypatch.setattr(crf_module, "compiled_partition_available", lambda: "cannot load _crf_forward.so (test)")
    crf = _crf(5)
    emissions, _, mask = _batch([4, 2, 0], 5)
    scores = tuple(x.detach() for x in crf.scores(torch.float64))
    weights = torch.randn(3, dtype=torch.float64)
    expected = _partition_and_gradients(log_partition_reference, emissions, mask, scores, weights)
    with pytest.warns(RuntimeWarning, match="slower PyTorch forward-backward: cannot load"):
        got = _partition_and_gradients(log_partition, emissions, mask, scores, weights)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    with pytest.warns(RuntimeWarning, match="slower PyTorch forward-backward"):
        marginals = crf.marginals(emissions, mask)
    torch.testing.assert_close(marginals, expected[1] / weights.view(3, 1, 1), rtol=1e-10, atol=1e-10)


@needs_partition_kernel
def test_compiled_partition_reports_lost_precision():
    """Scores hundreds of nats apart underflow exp space in float32: the kernel says so (None) rather than
    return a wrong value, and log_partition takes the reference."""
    crf = _crf(5, constraints="BIO", tags=BIO).float()
    emissions, _, mask = _batch([6, 4], 5, dtype=torch.float32)
    emissions = emissions * 300
    scores = tuple(x.detach() for x in crf.scores(torch.float32))
    assert log_partition_compiled(emissions, mask.sum(1), *scores) is None
    torch.testing.assert_close(
        log_partition(emissions, mask, *scores), log_partition_reference(emissions, mask, *scores)
    )


@needs_partition_kernel
def test_compiled_partition_refuses_bad_arguments():
    emissions, lengths = torch.zeros(2, 3, 4), torch.tensor([3, 1])
    scores = (torch.zeros(4), torch.zeros(4, 4), torch.zeros(4))
    with pytest.raises(ValueError, match="lengths must be"):
        log_partition_compiled(emissions, torch.tensor([3, 4]), *scores)
    with pytest.raises(TypeError, match="float32/float64"):
        log_partition_compiled(emissions.half(), lengths, *scores)
    _, saved = log_partition_compiled(emissions, lengths, *scores)
    with pytest.raises(ValueError, match="saved must be"):
        log_partition_backward_compiled(emissions, lengths, *scores, saved, torch.ones(3))
