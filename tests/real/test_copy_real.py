"""--chain auto with the suffix lookup and a cross-request memory on workloads whose answers
copy their prompt (benchmarks/workloads.py: code editing, an MT-Bench second turn, a
documentation page): greedy output equals the target alone's (the near-tie rule of
greedy_check), on a first pass and on a second pass of the same requests, which find their
own earlier answers in the memory and draft them in long blocks."""

import pytest

from benchmarks.workloads import load
from specrouter.cascade.chain import Chain
from specrouter.cascade.sampling import SamplingParams
from specrouter.chat import chat_prompt_tokens
from specrouter.drafters.memory import SuffixMemory
from specrouter.engine import generate
from specrouter.router import auto_router

from .conftest import SMALL, TARGET
from .greedy_check import assert_matches_references, reference_outputs

TOKENS = 64
FIRST_ANSWER_TOKENS = 96


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
    return reference_outputs(pool.chain([TARGET]), prompts, TOKENS)


def test_auto_with_the_suffix_lookup_and_a_memory_matches_the_target_alone(pool, copy_references):
    memory = SuffixMemory(100_000)
    router = auto_router(pool, TARGET, [SMALL, TARGET], progress=False, lookup="suffix", memory=memory)
    target = pool.level(TARGET)
    first = assert_matches_references(target, copy_references, router, "auto (suffix), first pass", TOKENS)
    assert memory.total == sum(len(r.token_ids) + 1 for r in first)  # every answer and its separator
    second = assert_matches_references(target, copy_references, router, "auto (suffix), second pass", TOKENS)
    remembered = [k for (_, k, _) in router.acceptance.global_ if k.startswith("suffix#m")]
    assert remembered, "the second pass never drafted from the memory"
    assert max(ks[0] for r in second for names, ks in r.chains_used if names[0] == "suffix") >= 16
