"""The cascade on rows left on the device (ops/rows.py, rows_torch.py), on CPU tensors.

- Sampled output of chains whose levels hand over torch tensors, alone or mixed with
  numpy levels, follows the target's distribution (the chi-square test of
  test_sampling_exactness.py, same models, same runs), and a broken residual is caught.
- Only token ids and per-proposal probabilities cross to the host: an audited tensor
  kind records every transfer out of torch, and none is a row.
- The same seed gives the same tokens with the rows on the host or on the device: greedy
  and sampled chains of tiny torch models, and the router's estimates from them.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from specrouter.backends.synthetic import SyntheticBackend  # noqa: E402
from specrouter.cascade.chain import Chain  # noqa: E402
from specrouter.cascade.sampling import SamplingParams  # noqa: E402
from specrouter.drafters.ngram import NgramDrafter  # noqa: E402
from specrouter.engine import generate  # noqa: E402

from ..router_synth import make_router, simulated_clock  # noqa: E402
from ..tiny_torch import tiny_backend  # noqa: E402
from .test_sampling_exactness import ALPHA, PROMPT, VOCAB, BelowHalf, output_pvalue  # noqa: E402


class TensorRows(SyntheticBackend):
    """A synthetic model that hands its rows over as torch tensors (of `kind`)."""

    def __init__(self, *args, kind: type = torch.Tensor, **kw) -> None:
        super().__init__(*args, **kw)
        self.kind = kind

    def _tensor(self, rows: np.ndarray):
        t = torch.from_numpy(np.ascontiguousarray(rows))
        return t if self.kind is torch.Tensor else t.as_subclass(self.kind)

    def decode(self, seq, tokens, pos, n_logits):
        out = super().decode(seq, tokens, pos, n_logits)
        return out if isinstance(out, torch.Tensor) else self._tensor(out)

    def decode_batch(self, items):
        return [r if isinstance(r, torch.Tensor) else self._tensor(r) for r in super().decode_batch(items)]


def models(kind: type = torch.Tensor, vocab: int = VOCAB, numpy_mid: bool = False):
    """test_sampling_exactness.make_models' target and drafts, handing over tensors
    (the mid level numpy's when numpy_mid)."""
    target = TensorRows("target", vocab=vocab, noise=0.0, kind=kind)
    mid = (SyntheticBackend("mid", vocab=vocab, model_seed=2, noise=0.8) if numpy_mid
           else TensorRows("mid", vocab=vocab, model_seed=2, noise=0.8, kind=kind))
    small = TensorRows("small", vocab=vocab, model_seed=3, noise=1.5, kind=kind)
    tiny = TensorRows("tiny", vocab=vocab, model_seed=4, noise=2.5, kind=kind)
    return target, mid, small, tiny


def chains():
    target, mid, small, tiny = models()
    t2, numpy_mid, s2, _ = models(numpy_mid=True)
    return {
        "2-level-stop": Chain([small, target], [3], draft_stop=BelowHalf()),
        "3-level": Chain([small, mid, target], [2, 3]),
        "4-level-ngram": Chain([NgramDrafter(max_ngram=2), tiny, mid, target], [2, 2, 3]),
        "mixed-3-level": Chain([s2, numpy_mid, t2], [2, 3]),
    }


CASES = [
    ("2-level-stop", SamplingParams(temperature=1.0)),
    ("3-level", SamplingParams(temperature=1.0, top_k=4)),
    ("4-level-ngram", SamplingParams(temperature=0.7, top_k=4, top_p=0.9)),
    ("mixed-3-level", SamplingParams(temperature=0.8, top_p=0.9)),
]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "params"), CASES, ids=[f"{n}-{p}" for n, p in CASES])
def test_device_rows_output_follows_target_distribution(name, params):
    pvalue = output_pvalue(chains()[name], params)
    assert pvalue > ALPHA, f"{name}: output deviates from the target distribution (p = {pvalue:.2e})"


@pytest.mark.slow
def test_broken_residual_is_detected_on_device_rows():
    pvalue = output_pvalue(chains()["3-level"], SamplingParams(temperature=1.0), residual_fn=lambda p, q, x: p)
    assert pvalue < 1e-6, f"a broken residual went unnoticed (p = {pvalue:.2e})"


class Audited(torch.Tensor):
    """A tensor kind that records every transfer of its values out of torch: (how, elements)."""

    moved: list[tuple[str, int]] = []
    _OUT = {"numpy", "cpu", "__array__", "tolist", "item", "__float__", "__int__", "__index__", "__bool__"}

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in cls._OUT:
            cls.moved.append((name, int(args[0].numel())))
        return super().__torch_function__(func, types, args, kwargs or {})


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.9, top_p=0.95)], ids=str)
def test_only_ids_and_scalars_reach_the_host(params):
    vocab = 64
    target, mid, small, _ = models(Audited, vocab=vocab)
    chain = Chain([small, mid, target], [3, 4])
    Audited.moved = []
    result = generate(chain, PROMPT, params, 40, rng=np.random.default_rng(0))
    assert len(result.token_ids) == 40
    hows = {how for how, _ in Audited.moved}
    assert Audited.moved and hows <= {"tolist", "item"}, hows  # never a row as numpy
    # The most one transfer carries: a verification's ids or acceptance probabilities (4 + 1).
    assert max(n for _, n in Audited.moved) <= 5, sorted(Audited.moved, key=lambda m: -m[1])[:3]


def tiny_chains(rows_on_device: bool, runtime: str = "eager"):
    target = tiny_backend(101, name="target", rows_on_device=rows_on_device, runtime=runtime)
    mid = tiny_backend(102, name="mid", rows_on_device=rows_on_device, runtime=runtime)
    small = tiny_backend(103, name="small", rows_on_device=rows_on_device, runtime=runtime)
    return target, [Chain([small, target], [3]), Chain([small, mid, target], [2, 3]),
                    Chain([NgramDrafter(max_ngram=2), small, target], [2, 4])]


def test_tiny_torch_rows_on_device_when_asked():
    host, device = tiny_backend(101, rows_on_device=False), tiny_backend(101, rows_on_device=True)
    seq_h, seq_d = host.new_sequence(), device.new_sequence()
    a, b = host.decode(seq_h, PROMPT, 0, 2), device.decode(seq_d, PROMPT, 0, 2)
    assert isinstance(a, np.ndarray) and isinstance(b, torch.Tensor) and b.dtype == torch.float32
    np.testing.assert_array_equal(a, b.cpu().numpy())
    rows = device.decode_batch([(seq_d, [1], len(PROMPT), 1), (device.new_sequence(), PROMPT, 0, 1)])
    assert all(isinstance(r, torch.Tensor) for r in rows)


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.8, top_k=4, top_p=0.9),
                                    SamplingParams(temperature=1.0)], ids=str)
def test_same_tokens_with_rows_on_host_or_device(params):
    target_h, host = tiny_chains(False)
    target_d, device = tiny_chains(True)
    for seed in range(3):
        alone = generate(Chain([target_h], []), PROMPT, params, 30, rng=np.random.default_rng(seed)).token_ids
        for ch, cd in zip(host, device):
            h = generate(ch, PROMPT, params, 30, rng=np.random.default_rng(seed)).token_ids
            d = generate(cd, PROMPT, params, 30, rng=np.random.default_rng(seed)).token_ids
            assert d == h, (ch.names, seed)
            if params.greedy:
                assert h == alone, (ch.names, seed)


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.8, top_k=4, top_p=0.9)], ids=str)
@pytest.mark.parametrize("rows_on_device", [False, True], ids=["host-rows", "device-rows"])
def test_same_tokens_with_the_static_or_the_eager_runtime(params, rows_on_device):
    """The static runtime's rows equal the eager one's to ~1e-6 (tests/unit/backends/
    test_torch_static.py): under one seed every chain draws the same tokens with either."""
    target_e, eager = tiny_chains(rows_on_device)
    _, static = tiny_chains(rows_on_device, runtime="static")
    for seed in range(3):
        alone = generate(Chain([target_e], []), PROMPT, params, 30, rng=np.random.default_rng(seed)).token_ids
        for ce, cs in zip(eager, static):
            e = generate(ce, PROMPT, params, 30, rng=np.random.default_rng(seed)).token_ids
            assert generate(cs, PROMPT, params, 30, rng=np.random.default_rng(seed)).token_ids == e, (ce.names, seed)
            if params.greedy:
                assert e == alone, (ce.names, seed)


def test_router_learns_the_same_from_device_rows():
    params = SamplingParams(temperature=0.9)
    estimates = []
    for kind in (np.ndarray, torch.Tensor):
        if kind is np.ndarray:
            target = SyntheticBackend("target", vocab=16, latency=lambda n: 0.05 + 0.004 * n)
            drafts = [SyntheticBackend("mid", vocab=16, model_seed=2, noise=0.5, latency=lambda n: 0.012 + 0.002 * n),
                      SyntheticBackend("small", vocab=16, model_seed=3, noise=1.0, latency=lambda n: 0.003)]
        else:
            target = TensorRows("target", vocab=16, latency=lambda n: 0.05 + 0.004 * n)
            drafts = [TensorRows("mid", vocab=16, model_seed=2, noise=0.5, latency=lambda n: 0.012 + 0.002 * n),
                      TensorRows("small", vocab=16, model_seed=3, noise=1.0, latency=lambda n: 0.003)]
        for d, params_b in zip(drafts, (1.0, 0.1)):
            d.params_b = params_b
        target.params_b = 7.0
        router = make_router(target, drafts)
        clock = simulated_clock([target, *drafts])  # no wall time: the same costs in both runs
        out = generate(router, PROMPT, params, 60, rng=np.random.default_rng(3), clock=clock).token_ids
        estimates.append((out, {k: (round(e.mean, 12), round(e.count, 9)) for k, e in router.acceptance.global_.items()}))
    (out_h, est_h), (out_d, est_d) = estimates
    assert est_h, "the router observed nothing"
    assert out_d == out_h
    assert est_d == est_h
