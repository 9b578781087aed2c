"""--chain auto with the suffix lookup and a cross-request memory on workloads whose answers
copy their prompt (benchmarks/workloads.py: code editing, an MT-Bench second turn, a
documentation page) and on two whose answers are fresh text (a HumanEval completion, a GSM8K
question): greedy output equals the target alone's (the near-tie rule of greedy_check), on a
first pass and on a second pass of the same requests, which find their own earlier answers
in the memory and draft them in long blocks.

A memory match is used only where it is longer than the request's own (drafters/suffix.py):
an answer that copies its prompt word for word finds as long a match in the prompt, so the
copy tasks alone need not read the memory at all (on an AMD EPYC, whose first 64 tokens of
each are exact copies of the prompt, none did: the cause of two CI failures, first blamed
on live costs). A fresh answer has no long match but the memory's on the second pass.

The router prices chains with stated costs (the reference's Xeon table), not corrected from
timings: which chains it picks then depends on acceptance alone, the same on every CPU."""

import pytest

from benchmarks.workloads import load
from specrouter.cascade.chain import Chain
from specrouter.cascade.sampling import SamplingParams
from specrouter.chat import chat_prompt_tokens
from specrouter.drafters.memory import SuffixMemory
from specrouter.engine import generate
from specrouter.router.estimates.acceptance import AcceptanceEstimator
from specrouter.router.build import build_router
from specrouter.router.estimates.costs import CostProfile, OnlineCosts

from .conftest import SMALL, TARGET
from .greedy_check import assert_matches_references, benchmark_prompts, reference_outputs

TOKENS = 64
FIRST_ANSWER_TOKENS = 96
#: ms per forward over n tokens, q4 llama.cpp on 2 Xeon cores (the 1.5B: reference notes,
#: 2026-12-01; the 0.5B: `specrouter profile` on the same machine kind, 2026-12-02).
XEON_MS = {SMALL: {1: 43, 2: 59, 3: 68, 4: 73, 6: 117, 8: 126, 12: 164, 16: 205, 24: 310, 32: 392},
           TARGET: {1: 70, 2: 102, 3: 120, 4: 106, 6: 157, 8: 195, 12: 236, 16: 234, 24: 357, 32: 398}}


class StatedCosts(OnlineCosts):
    """A profile the router never corrects from timings (no observe of any kind)."""

    def observe(self, name, n, seconds, batch=1) -> None:
        pass

    def observe_rows(self, kind, rows, seconds) -> None:
        pass

    def set_overhead(self, seconds) -> None:
        pass


@pytest.fixture(scope="module")
def copy_references(pool):
    target = pool.level(TARGET)
    prompts = []
    for workload, n in (("code-edit", 2), ("mtbench-turn2", 1), ("docs", 1)):
        for task in load(workload, n):
            answer = None
            if task.first_turn is not None:
                answer = generate(Chain([target], []), chat_prompt_tokens(target, task.first_turn), SamplingParams(),
                                  FIRST_ANSWER_TOKENS).text
            prompts.append((f"{workload}/{task.id}", chat_prompt_tokens(target, task.messages(answer))))
    prompts += benchmark_prompts(target, 1)  # answers of fresh text
    return reference_outputs(pool.chain([TARGET]), prompts, TOKENS)


def test_auto_with_the_suffix_lookup_and_a_memory_matches_the_target_alone(pool, copy_references):
    memory = SuffixMemory(100_000)
    costs = StatedCosts(CostProfile({m: {n: ms / 1e3 for n, ms in t.items()} for m, t in XEON_MS.items()}))
    router = build_router(pool.model(TARGET), [pool.model(SMALL)], costs, AcceptanceEstimator(), lookup="suffix",
                          memory=memory)
    target = pool.level(TARGET)
    first = assert_matches_references(target, copy_references, router, "auto (suffix), first pass", TOKENS)
    # Every answer, its EOS where it stopped there (no stop strings here), and a separator.
    assert memory.total == sum(len(r.token_ids) + (r.finish_reason == "stop") + 1 for r in first)
    second = assert_matches_references(target, copy_references, router, "auto (suffix), second pass", TOKENS)
    remembered = [k for (_, k, _) in router.acceptance.global_ if k.startswith("suffix#m")]
    assert remembered, "the second pass never drafted from the memory"
    used = [(names, ks) for r in second for names, ks in r.chains_used]
    print("second pass, chains used:", used)
    # a long block: the lookup grid's 15 or more (verified in 16 tokens or more)
    assert max((ks[0] for names, ks in used if names[0] == "suffix"), default=0) >= 15, used
