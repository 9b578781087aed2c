"""Sampled output of torch chains and mixed chains follows the torch target's distribution.

The test of test_sampling_exactness.py with tiny random Qwen2 models (tiny_torch.py)
in place of synthetic tables: the exact distribution of the first three generated
tokens is enumerated from the target (one cache-less forward per context: 1 + 6 + 36
of them), RUNS generations per configuration are compared with it by a chi-square
test at significance ALPHA with a fixed seed, and a cascade whose residual step is
broken on purpose must fail the same test. The mixed chain puts the n-gram drafter, a
synthetic table model and torch models in one chain, with no special case anywhere.

RUNS is 10,000, not the 50,000 of the synthetic test: a generation of three tokens
costs 13 ms (2 levels) to 22 ms (4 levels) here, one torch thread, about 2 ms per
forward of which most is transformers' Python overhead, so 50,000 runs would take
11 to 18 minutes per configuration, about an hour for this file. At 10,000 runs the
four tests take about 12 minutes on one core (6 with `-n 2`), and the broken residual
is still rejected at p < 1e-6 (pytest -s prints the p-values).

Detection limit, computed: with 100-215 cells after pooling, 50% power at ALPHA needs a
noncentrality of 50-71, i.e. a chi-square distance sum((p' - p)^2 / p) of 0.005-0.007 between
the output's law p' and the target's over three tokens. The broken residual is far above
that; a 5% mixture of it (distance ~1e-4) is far below. This test checks that torch backends
plug into the cascade correctly (rows, padding, warps, rollback); the fine-grained guarantees
come from the synthetic tiers in tests/unit/cascade/, which run the same cascade code
(the slow tier's sentinel detects a 1.5% mixture).
"""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from specrouter.drafters.ngram import NgramDrafter  # noqa: E402
from specrouter.backends.synthetic import SyntheticBackend  # noqa: E402
from specrouter.cascade.chain import Chain  # noqa: E402
from specrouter.cascade.sampling import SamplingParams, warp  # noqa: E402

from ..cascade.test_sampling_exactness import ALPHA, N_TOKENS, PROMPT, VOCAB, empirical_counts, goodness_of_fit  # noqa: E402
from ..tiny_torch import full_forward_logits, tiny_backend  # noqa: E402

pytestmark = pytest.mark.slow
#: Generations per configuration; scripts/gpu_check.sh lowers it to fit its time budget.
RUNS = int(os.environ.get("SPECROUTER_TORCH_RUNS", "10000"))


def exact_distribution(target, params: SamplingParams) -> dict[tuple[int, ...], float]:
    probs = {}
    cache: dict[tuple[int, ...], np.ndarray] = {}
    for seq in itertools.product(range(VOCAB), repeat=N_TOKENS):
        p = 1.0
        for i, token in enumerate(seq):
            key = seq[:i]
            if key not in cache:
                cache[key] = warp(full_forward_logits(target, PROMPT + list(key)).numpy(), params)
            p *= cache[key][token]
            if p == 0:
                break
        probs[seq] = p
    return probs


def chains():
    target = tiny_backend(101, name="target")
    mid = tiny_backend(102, name="mid")
    small = tiny_backend(103, name="small")
    synthetic = SyntheticBackend("synthetic", vocab=VOCAB, model_seed=3, noise=1.5)
    static = [tiny_backend(seed, name=name, runtime="static") for seed, name in ((103, "small"), (102, "mid"),
                                                                                   (101, "target"))]
    return {
        "torch-2-level": Chain([small, target], [3]),
        "torch-3-level": Chain([small, mid, target], [2, 3]),
        "mixed-4-level": Chain([NgramDrafter(max_ngram=2), synthetic, mid, target], [2, 2, 3]),
        # The static runtime (backends/torch_static.py): the same models, KV and forwards its own.
        "static-3-level": Chain([NgramDrafter(max_ngram=2), *static], [2, 2, 3]),
    }


CASES = [
    ("torch-2-level", SamplingParams(temperature=1.0)),
    ("torch-3-level", SamplingParams(temperature=1.0, top_k=4)),
    ("mixed-4-level", SamplingParams(temperature=0.7, top_k=4, top_p=0.9)),
    ("static-3-level", SamplingParams(temperature=0.9, top_p=0.9)),
]


@pytest.mark.parametrize(("name", "params"), CASES, ids=[f"{n}-{p}" for n, p in CASES])
def test_torch_chain_output_follows_target_distribution(name, params):
    chain = chains()[name]
    exact = exact_distribution(chain.target, params)
    counts = empirical_counts(chain, params, seed=1234, runs=RUNS)
    assert sum(counts.values()) == RUNS
    pvalue = goodness_of_fit(exact, counts, runs=RUNS)
    print(f"{name}: p = {pvalue:.3f}")
    assert pvalue > ALPHA, f"{name}: output deviates from the target distribution (p = {pvalue:.2e})"
    # The drafts are not the target: rejections (and so residual draws) did happen.
    assert any(s.accepted < s.proposed for s in chain_stats(chain, params)), "no rejections: the test would be weak"


def chain_stats(chain, params):
    from specrouter.engine import generate

    stats = generate(chain, PROMPT, params, 24, rng=np.random.default_rng(0)).levels
    return [s for s in stats[:-1] if s.proposed]


def test_broken_residual_is_detected_with_torch_models():
    def full_p_instead_of_residual(p, q, proposed):
        return p

    chain = chains()["torch-3-level"]
    params = SamplingParams(temperature=1.0)
    exact = exact_distribution(chain.target, params)
    counts = empirical_counts(chain, params, seed=1234, runs=RUNS, residual_fn=full_p_instead_of_residual)
    pvalue = goodness_of_fit(exact, counts, runs=RUNS)
    print(f"broken residual: p = {pvalue:.2e}")
    assert pvalue < 1e-6, f"a broken residual went unnoticed (p = {pvalue:.2e})"
