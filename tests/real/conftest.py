"""Real-model fixtures: the default Qwen pair through llama.cpp, loaded once per session.

`make test` pulls the models first. Outside CI a missing model skips these tests with
the command that fixes it; in CI (CI set) it is an error, so they can never be skipped
silently there.
"""

import os

import pytest

from specrouter.models import is_pulled
from specrouter.pool import Pool

SMALL, TARGET, SMOL = "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "smollm2-135m"
#: Length of the greedy reference outputs of the 1.5B alone (8 prompts).
REFERENCE_TOKENS = 48


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/real/" in str(item.fspath):
            item.add_marker(pytest.mark.real)


def require_pulled(*names: str) -> None:
    """Skip the test (fail it in CI) unless every named pool model is pulled."""
    missing = [n for n in names if not is_pulled(n)]
    if missing:
        message = f"models not pulled: {missing}; run `specrouter pull`"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="session")
def pool():
    require_pulled(SMALL, TARGET, SMOL)
    p = Pool(n_ctx=2048, n_seq_max=4)
    yield p
    p.close()


@pytest.fixture(scope="session")
def references(pool):
    """The 1.5B alone, greedy, on 4 HumanEval and 4 GSM8K prompts: what every chain must match."""
    from .greedy_check import benchmark_prompts, reference_outputs

    return reference_outputs(pool.chain([TARGET]), benchmark_prompts(pool.level(TARGET), 4), REFERENCE_TOKENS)
