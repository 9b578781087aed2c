"""The row operations on torch tensors (ops/rows_torch.py) keep ops/contract.py's contracts,
checked against the numpy reference on the same inputs: warps equal to float rounding
with the same zeros, the same argmax on ties, the same token for the same uniform, the
same residuals, gathers, overlaps and confidences, and operands of the two kinds mixed.
On the CPU; SPECROUTER_TEST_DEVICE=cuda puts the tensors on a GPU (scripts/gpu_check.sh)."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from specrouter.cascade.sampling import SamplingParams, sample, warp  # noqa: E402
from specrouter.cascade.verify import residual  # noqa: E402
from specrouter.ops import rows_torch as torch_rows  # noqa: E402
from specrouter.ops.rows import NUMPY, ops_of  # noqa: E402

TORCH = torch_rows.TorchOps()
torch_rows.register_tensors()
DEVICE = os.environ.get("SPECROUTER_TEST_DEVICE", "cpu")


def dev(x: np.ndarray):
    """x as a tensor on the tested device."""
    return torch.from_numpy(np.ascontiguousarray(x)).to(DEVICE)

PARAMS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7),
    SamplingParams(temperature=1.0, top_k=50),
    SamplingParams(temperature=0.8, top_p=0.9),
    SamplingParams(temperature=1.3, min_p=0.05, top_k=200, top_p=0.95),
    SamplingParams(temperature=1e-35),  # 1 / T beyond float32's range: float64 (sampling.warp)
    SamplingParams(temperature=5e-324),  # 1 / T overflows to inf
]


def logits(rows: int = 4, vocab: int = 5000, dtype=np.float32, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).normal(size=(rows, vocab)) * 3).astype(dtype)


def test_ops_dispatch_by_kind():
    x = logits(2, 8)
    assert ops_of(x) is NUMPY and ops_of(list(x)) is NUMPY
    assert isinstance(ops_of(dev(x)), torch_rows.TorchOps)
    assert isinstance(ops_of(list(dev(x))), torch_rows.TorchOps)
    with pytest.raises(TypeError, match="no row operations for str"):
        ops_of("row")


@pytest.mark.parametrize("params", PARAMS, ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_warp_matches_numpy(params, dtype):
    x = logits(dtype=dtype)
    expected = [warp(row, params) for row in x]
    got = TORCH.warp(dev(x), params)
    assert len(got) == len(expected)
    for e, g in zip(expected, got):
        g = g.cpu().numpy()
        assert g.dtype == np.float64
        np.testing.assert_array_equal(g == 0, e == 0)  # the filters cut the same tokens
        np.testing.assert_allclose(g, e, rtol=1e-6 if dtype == np.float32 else 1e-12, atol=0)
        assert math.isclose(g.sum(), 1.0, rel_tol=1e-12)


def test_warp_of_half_precision_rows_reads_them_as_float32():
    x = logits(2, 300).astype(np.float16)
    params = SamplingParams(temperature=0.9, top_p=0.9)
    got = TORCH.warp(dev(x).to(torch.bfloat16), params)
    widened = dev(x).to(torch.bfloat16).float().cpu().numpy()
    for e, g in zip((warp(row, params) for row in widened), got):
        np.testing.assert_allclose(g.cpu().numpy(), e, rtol=1e-6, atol=0)


def test_warp_leaves_the_callers_logits_alone():
    x = dev(logits(2, 100))
    before = x.clone()
    TORCH.warp(x, SamplingParams(temperature=0.5, top_k=3))
    assert torch.equal(x, before)


def test_argmax_takes_the_first_of_ties_as_numpy():
    x = logits(3, 50)
    x[0, [7, 3, 40]] = 100.0
    x[2, :] = 1.0
    assert TORCH.argmax(dev(x)) == NUMPY.argmax(x) == [3, int(np.argmax(x[1])), 0]
    greedy = TORCH.warp(dev(x), SamplingParams())
    assert [int(np.flatnonzero(g.cpu().numpy())[0]) for g in greedy] == [3, int(np.argmax(x[1])), 0]


@pytest.mark.parametrize("vocab", [7, 5000])  # numpy's short and blocked sampling paths
def test_sample_draws_the_numpy_token_for_every_uniform(vocab):
    probs = warp(logits(1, vocab)[0], SamplingParams(temperature=1.0, top_k=max(2, vocab // 3)))
    t = dev(probs)
    for u in [0.0, 1e-12, *np.random.default_rng(1).random(500), 0.5, 1 - 1e-16]:
        assert TORCH.sample(t, u) == NUMPY.sample(probs, u), u
    tokens = {TORCH.sample(t, u) for u in np.random.default_rng(2).random(2000)}
    assert all(probs[k] > 0 for k in tokens)


def test_sample_never_draws_a_token_without_mass():
    probs = np.array([0.5, 0.5, 0.0, 0.0])
    t = dev(probs)
    for u in [0.0, 0.49, 0.5, 0.99, np.nextafter(1.0, 0.0)]:
        assert TORCH.sample(t, u) == NUMPY.sample(probs, u) == (0 if u < 0.5 else 1)


def test_sample_with_a_generator_draws_one_uniform_either_kind():
    probs = warp(logits(1, 100)[0], SamplingParams(temperature=1.0))
    a, b = np.random.default_rng(5), np.random.default_rng(5)
    assert [sample(probs, a) for _ in range(50)] == [sample(dev(probs), b) for _ in range(50)]
    assert a.random() == b.random()


def dist(vocab: int, seed: int) -> np.ndarray:
    return warp(logits(1, vocab, seed=seed)[0], SamplingParams(temperature=2.0))


@pytest.mark.parametrize(("p_vocab", "q_vocab"), [(300, 300), (300, 280), (280, 300)])
def test_residual_matches_numpy(p_vocab, q_vocab):
    p, q = dist(p_vocab, 1), dist(q_vocab, 2)
    got = TORCH.residual(dev(p), dev(q), 5).cpu().numpy()
    np.testing.assert_allclose(got, residual(p, q, 5), rtol=1e-12, atol=1e-300)
    # The generic entry point dispatches: the torch row stays a tensor.
    assert isinstance(residual(dev(p), None, 5), torch.Tensor)
    np.testing.assert_allclose(residual(dev(p), None, 5).cpu().numpy(), residual(p, None, 5), rtol=1e-12)
    np.testing.assert_allclose(residual(dev(p), None, 10_000).cpu().numpy(), p, rtol=1e-12)


def test_residual_of_equal_rows_is_p_on_both():
    p = dist(50, 3)
    got = TORCH.residual(dev(p), dev(p.copy()), 1).cpu().numpy()
    np.testing.assert_array_equal(got, residual(p, p.copy(), 1))
    np.testing.assert_array_equal(got, p)


@pytest.mark.parametrize("q_vocab", [300, 280])
def test_mixed_kinds_are_converted_to_the_first(q_vocab):
    p, q = dist(300, 1), dist(q_vocab, 2)
    np.testing.assert_allclose(residual(p, dev(q), 9), residual(p, q, 9), rtol=1e-12)
    np.testing.assert_allclose(TORCH.residual(dev(p), q, 9).cpu().numpy(), residual(p, q, 9), rtol=1e-12)
    assert NUMPY.overlap([p], [dev(q)]) == pytest.approx(NUMPY.overlap([p], [q]), rel=1e-12)
    assert TORCH.overlap([dev(p)], [q]) == pytest.approx(NUMPY.overlap([p], [q]), rel=1e-12)


def test_at_overlap_confidence_and_host_match_numpy():
    rows = [dist(300, s) for s in range(4)]
    trows = [dev(r) for r in rows]
    tokens = [3, 299, 300, 0]  # 300: past the end of the row (a padded vocabulary), probability 0
    assert TORCH.at(trows, tokens) == NUMPY.at(rows, tokens)
    assert NUMPY.at(rows, tokens)[2] == 0.0
    assert TORCH.at([], []) == []
    shorter = [r[:250] for r in rows[1:]]
    assert TORCH.overlap(trows[:3], [dev(s) for s in shorter]) == pytest.approx(
        NUMPY.overlap(rows[:3], shorter), rel=1e-12)
    assert TORCH.overlap([], []) == []
    x = logits(2, 400)
    assert TORCH.confidence(dev(x[0])) == pytest.approx(NUMPY.confidence(x[0]), rel=1e-6)
    np.testing.assert_array_equal(TORCH.host(dev(x)), x)
    np.testing.assert_array_equal(TORCH.host(list(dev(x))), x)
    assert NUMPY.host(x) is x


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_one_hot_builds_new_rows_of_the_kind_shape_and_dtype_given(dtype):
    x = logits(3, 50, dtype=dtype)
    tokens, values = [7, 0, 49], [11.5, 1e-3, 20.25]
    expected = np.zeros((3, 50), dtype)
    expected[[0, 1, 2], tokens] = values
    host = NUMPY.one_hot(x, tokens, values)
    assert host.dtype == dtype and host is not x
    np.testing.assert_array_equal(host, expected)
    t = dev(x)
    got = TORCH.one_hot(t, tokens, values)
    assert got.dtype == t.dtype and got.device == t.device and got is not t
    np.testing.assert_array_equal(got.cpu().numpy(), expected)
    np.testing.assert_array_equal(t.cpu().numpy(), x)  # the given rows are left as they were
