"""Exact mode's checks, run in a process of their own (test_exact_real.py starts it): exact
kernels switch ggml's tiled matmul off for the whole process, before any forward runs, so
they cannot share the test session's process, whose models already ran. Its argument, if
any: the profile folder it shares exact kernels' profiles with (main()).

Prints one JSON object:
- "blocks": per context, the k (1..24) whose block logits differ bitwise from one-token
  decoding of the same tokens (expected: none), and whether a sequence decoded in one
  forward with another got the rows it gets alone;
- "greedy": per chain, the prompts (PER_DATASET HumanEval and as many GSM8K) whose greedy
  ids differ from the target alone's (expected: none, with no near-tie escape);
- "logprobs": per chain, the prompts whose logprobs (each token's and its 5 alternatives')
  differ from the target alone's in any bit (expected: none);
- "batched": the same two lists for auto through the batch scheduler, at most 3 at a time,
  the second half of the prompts joining four steps after the first (one of them queues for
  a slot), and the most sequences one call took
  (expected: no prompt: in exact mode a sequence's rows are the same bits whatever shares
  its forward or its context, so the batch compositions auto's timings choose move nothing);
- "next_turns": the same two lists for conversations' second turns through a batch scheduler
  with a prefix cache (tests/real/turns.py; auto, every prompt, two conversations at a time):
  each turn 2 takes its turn 1's KV slot itself (exact mode's streams share no cells) and
  must write what the target alone writes cold, bit for bit; and the turns whose cached
  prompt tokens are not what turn 1's cache held (expected: none).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from specrouter.cascade.sampling import SamplingParams
from specrouter.drafters.memory import SuffixMemory
from specrouter.engine import GenerationResult, generate
from specrouter.engine.batch import BatchScheduler, Failed, Finished, SeqRequest
from specrouter.pool import Pool
from specrouter.router import Router, auto_router
from specrouter.router.estimates.profile_cache import install_profiles, profile_files

from .turns import FOLLOW_UP, resumable, two_turns

SMALL, TARGET = "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"
BLOCK = 24
TOKENS = 48
#: Prompts per dataset. Exact kernels run slower than the default ones and every prompt
#: costs 11 generations here (the chains, auto, batched, a next turn): two per dataset keep
#: this check within about ten minutes on a slow 2-core machine.
PER_DATASET = 2
LOGPROBS = 5  # alternatives per token
CHAINS = {
    "0.5b->1.5b": ([SMALL, TARGET], [4]),
    "ngram->1.5b": (["ngram", TARGET], [4]),
    "suffix->1.5b": (["suffix", TARGET], [16]),
    "ngram->0.5b->1.5b": (["ngram", SMALL, TARGET], [3, 4]),
    "suffix->0.5b->1.5b": (["suffix", SMALL, TARGET], [8, 4]),
}


def block_differences(target, context: list[int], continuation: list[int]) -> dict:
    """k whose k-token block's logits differ from one-token decoding, on one sequence."""
    seq = target.new_sequence()
    try:
        target.decode(seq, context, 0, 1)
        start = len(context)
        single = np.stack([target.decode(seq, [t], start + i, 1)[0] for i, t in enumerate(continuation)])
        differ = []
        for k in range(1, len(continuation) + 1):
            target.remove(seq, start)
            rows = target.decode(seq, continuation[:k], start, k)
            if not np.array_equal(rows, single[:k]):
                differ.append(k)
        # Two sequences in one forward: each gets the rows it gets alone, as long as its KV
        # cells lie where they lie alone (here: the other sequence's come after them).
        other = target.new_sequence()
        try:
            target.remove(seq, start)
            both = target.decode_batch([(seq, continuation[:5], start, 5), (other, context[:3], 0, 3)])
            batch_same = bool(np.array_equal(both[0], single[:5]))
        finally:
            target.free_sequence(other)
    finally:
        target.free_sequence(seq)
    return {"context": len(context), "differ": differ, "batch_same": batch_same}


def main(shared: Path | None = None) -> None:
    """shared: a profile folder to start the auto routers' profiles from and to add theirs to
    (test_exact_real passes the test session's private one); None: none."""
    from .greedy_check import benchmark_prompts

    pool = Pool(n_ctx=2048, n_seq_max=4, exact=True)
    target = pool.model(TARGET)
    text = Path(__file__).with_name("greedy_check.py").read_text() * 2
    tokens = target.tokenize(text)
    assert len(tokens) > 700 + BLOCK, len(tokens)
    # 120 tokens: under 512 KV cells; 700: past them (where flash attention would split a row).
    blocks = [block_differences(target, tokens[:n], tokens[n:n + BLOCK]) for n in (120, 700)]

    prompts = benchmark_prompts(target, PER_DATASET)
    alone = pool.chain([TARGET])
    references = {pid: generate(alone, toks, SamplingParams(), TOKENS, logprobs=LOGPROBS) for pid, toks in prompts}
    greedy, logprobs = {}, {}

    def compare(name: str, source) -> None:
        results = {pid: generate(source, toks, SamplingParams(), TOKENS, logprobs=LOGPROBS) for pid, toks in prompts}
        greedy[name] = [pid for pid, r in results.items() if r.token_ids != references[pid].token_ids]
        logprobs[name] = [pid for pid, r in results.items() if r.logprobs != references[pid].logprobs]

    for name, (specs, lengths) in CHAINS.items():
        compare(name, pool.chain(specs, lengths))
    # Profiles in a folder of their own (no estimates saved before), started from the exact
    # kernels' profiles in `shared` (the test session's: tests/conftest.py) and handed back
    # there for the tests after it (test_sessions_real's exact server).
    profiles, models = Path(tempfile.mkdtemp()), [target, pool.model(SMALL)]
    if shared is not None:
        install_profiles(profiles, profile_files(shared, models))
    compare("auto", fresh_auto(pool, profiles))
    batched, max_batch = batched_auto(fresh_auto(pool, profiles), prompts)
    next_turns = next_turn_differences(fresh_auto(pool, profiles), pool, prompts, references)
    if shared is not None:
        install_profiles(shared, profile_files(profiles, models))
    pool.close()
    json.dump({"blocks": blocks, "greedy": greedy, "logprobs": logprobs, "prompts": [pid for pid, _ in prompts],
               "batched": {"greedy": [pid for pid, r in batched.items() if r.token_ids != references[pid].token_ids],
                           "logprobs": [pid for pid, r in batched.items() if r.logprobs != references[pid].logprobs],
                           "max_batch": max_batch},
               "next_turns": next_turns},
              sys.stdout)


def fresh_auto(pool: Pool, profiles: Path) -> Router:
    """An auto router with no estimates saved before (none are saved here) and its own memory;
    the models' profiles measured once in `profiles` (in exact kernels) and read thereafter."""
    return auto_router(pool, TARGET, [SMALL, TARGET], profile_dir=profiles, progress=False, lookup="suffix",
                       memory=SuffixMemory())


def next_turn_differences(router: Router, pool: Pool, prompts: list[tuple[str, list[int]]],
                          references: dict[str, GenerationResult]) -> dict[str, list[str]]:
    """Second turns resumed from the prefix cache against the target alone cold, routed by `router`."""
    target, alone = pool.model(TARGET), pool.chain([TARGET])
    turns = two_turns(lambda r: router.session(), prompts, target.tokenize(FOLLOW_UP, add_special=False), TOKENS,
                      LOGPROBS)
    greedy, logprobs, cached = [], [], []
    for pid, (first, second_prompt, second) in turns.items():
        cold = generate(alone, second_prompt, SamplingParams(), TOKENS, logprobs=LOGPROBS)
        for name, got, expected in ((f"{pid} turn 1", first, references[pid]), (f"{pid} turn 2", second, cold)):
            if got.token_ids != expected.token_ids:
                greedy.append(name)
            if got.logprobs != expected.logprobs:
                logprobs.append(name)
        if second.cached_tokens != resumable(first, second_prompt):
            cached.append(f"{pid}: {second.cached_tokens} of {resumable(first, second_prompt)}")
    return {"greedy": greedy, "logprobs": logprobs, "cached": cached}


def batched_auto(router: Router, prompts: list[tuple[str, list[int]]]) -> tuple[dict[str, GenerationResult], int]:
    """Every prompt through one batch scheduler routed by `router`, at most 3 at a time
    (the first half added at once, the second half four steps later: one joins the running
    ones, the other queues for a slot); the results by prompt id, and the most sequences one
    call took."""
    scheduler = BatchScheduler(lambda r: router.session(), max_batch=3)
    half = len(prompts) // 2
    out: dict[str, GenerationResult] = {}
    step = 0
    while len(out) < len(prompts):
        if step in (0, 4):
            for pid, toks in prompts[:half] if step == 0 else prompts[half:]:
                scheduler.add(pid, SeqRequest(toks, SamplingParams(), TOKENS, logprobs=LOGPROBS))
        for event in scheduler.step():
            if isinstance(event, Failed):
                raise event.error
            if isinstance(event, Finished):
                out[event.request_id] = event.result
        step += 1
    return out, max(max(sizes) for sizes in scheduler.batch_sizes.values())


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else None)
