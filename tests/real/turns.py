"""Conversations' next turns through a batch scheduler with a prefix cache (shared by the real
tests of both kernel modes): every turn 2 resumes from its finished turn 1."""

from __future__ import annotations

from specrouter.cascade.sampling import SamplingParams
from specrouter.engine import GenerationResult
from specrouter.engine.batch import BatchScheduler, Failed, Finished, Planner, SeqRequest
from specrouter.engine.prefix_cache import PrefixCache

FOLLOW_UP = "\nNow say it again, shorter."


def resumable(turn: GenerationResult, prompt: list[int]) -> int:
    """The positions a next turn with this prompt (turn 1's prompt and tokens first) takes:
    what turn 1's target cache holds (every committed token but the last; an EOS that ended
    it is committed, not in token_ids), at most all of the prompt but the token it feeds."""
    return min(turn.prompt_tokens + len(turn.token_ids) - (turn.finish_reason == "length"), len(prompt) - 1)


def two_turns(plan: Planner, prompts: list[tuple[str, list[int]]], follow_up: list[int], tokens: int,
              logprobs: int | None = None) -> dict[str, tuple[GenerationResult, list[int], GenerationResult]]:
    """Two conversations at a time (max_batch 2, a prefix cache of 2): each prompt's turn 1,
    and once it has finished its turn 2 (the prompt, turn 1's tokens and `follow_up`), added
    at once, so it resumes from turn 1 while the other conversation runs beside it. Per
    prompt id: (turn 1, turn 2's prompt, turn 2)."""
    scheduler = BatchScheduler(plan, max_batch=2, prefix_cache=PrefixCache(2))
    todo, first, second, out = list(prompts), {}, {}, {}
    prompt_of = dict(prompts)
    while len(out) < len(prompts):
        while todo and scheduler.n_active + scheduler.n_waiting < 2:
            pid, toks = todo.pop(0)
            scheduler.add(pid, SeqRequest(toks, SamplingParams(), tokens, logprobs=logprobs))
        for event in scheduler.step():
            if isinstance(event, Failed):
                raise event.error
            if not isinstance(event, Finished):
                continue
            pid, result = event.request_id.removesuffix(" turn 2"), event.result
            if event.request_id.endswith(" turn 2"):
                out[pid] = (first[pid], second[pid], result)
            else:
                first[pid] = result
                second[pid] = prompt_of[pid] + result.token_ids + follow_up
                scheduler.add(f"{pid} turn 2", SeqRequest(second[pid], SamplingParams(), tokens, logprobs=logprobs))
    scheduler.close()
    return out
