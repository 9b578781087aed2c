"""A session's later turn through the server: drafted from the cross-request memory its
earlier turn fed (usage.speculation.lookup_sources says which source drafted), within the
session's API key only, never for a request that opted out, and the output the target's
either way. What each request adds to which partition: test_memory_api.py."""

import httpx
import openai

from specrouter.drafters.memory import SuffixMemory
from specrouter.engine.request import GenerationResult
from specrouter.metrics import LevelStats, SpecStats
from specrouter.server.api_responses import Usage

from ..server_synth import MODEL, build_service, reference_text, running_server

TOKENS = 60


def complete(url: str, key: str, prompt: str, **extra):
    with openai.OpenAI(api_key=key, base_url=url + "/v1", max_retries=0) as client:
        return client.completions.create(model=MODEL, prompt=prompt, max_tokens=TOKENS, temperature=0,
                                         extra_body=extra or None)


def drafts(response) -> dict[str, int]:
    return {s["source"]: s["drafts"] for s in response.usage.speculation["lookup_sources"]}


def test_a_later_turn_drafts_from_its_sessions_memory_and_nobody_elses():
    """Turn 2 opens with the start of turn 1's answer (a client that quotes it): the rest of
    that answer is nowhere in turn 2's prompt, only in the memory of turn 1's key."""
    memory = SuffixMemory(10_000)
    service, _ = build_service(memory=memory)
    with running_server(service, memory="per-key") as (url, _):
        first = complete(url, "session-key", "remember me")
        assert set(drafts(first)) <= {"request"}  # the memory was empty
        later = "abc" + first.choices[0].text[:8]
        turn2 = complete(url, "session-key", later)
        other_key = complete(url, "another-key", later)
        opted_out = complete(url, "session-key", later, suffix_memory=False)
        alone = complete(url, "session-key", later, speculation="off")
        metrics = httpx.get(url + "/metrics").text
    expected = reference_text(later, TOKENS)
    assert [r.choices[0].text for r in (turn2, other_key, opted_out, alone)] == [expected] * 4
    assert drafts(turn2)["memory"] > 0
    assert sum(drafts(turn2).values()) <= turn2.usage.speculation["cycles"]  # one block per cycle at most
    assert "memory" not in drafts(other_key) and "memory" not in drafts(opted_out)
    assert alone.usage.speculation["lookup_sources"] == []  # the target alone drafts nothing
    # Three texts kept (the opted-out one and the target alone's are not), each with its separator.
    held = sum(r.usage.completion_tokens + 1 for r in (first, turn2, other_key))
    assert len(memory) == held
    assert f"specrouter:suffix_memory_tokens {float(held)}" in metrics
    assert f"specrouter:suffix_memory_added_tokens_total {float(held)}" in metrics  # nothing evicted yet
    assert f"specrouter:suffix_memory_budget_tokens {float(10_000)}" in metrics


def test_a_server_without_a_memory_exports_no_memory_size():
    service, _ = build_service()
    with running_server(service) as (url, _):
        assert "suffix_memory" not in httpx.get(url + "/metrics").text


def result(lookup: list[LevelStats]) -> GenerationResult:
    return GenerationResult(text="", token_ids=[1, 2], finish_reason="stop", chain=["t"], draft_lengths=[], levels=[],
                            cycles=2, prompt_tokens=3, wall_seconds=1.0, lookup=SpecStats.of(lookup))


def test_usage_sums_the_lookups_blocks_per_source_over_the_choices():
    choices = [result([LevelStats("suffix#4", proposed=5, accepted=3, drafts=2),
                       LevelStats("suffix#m16", proposed=8, accepted=8, drafts=1)]),
               result([LevelStats("suffix#m8", proposed=4, accepted=1, drafts=1),
                       LevelStats("suffix#g", proposed=6, accepted=6, drafts=1)])]
    usage = Usage.of(choices).speculation.lookup_sources
    assert [u.model_dump() for u in usage] == [
        {"source": "request", "drafts": 2, "proposed": 5, "accepted": 3},
        {"source": "memory", "drafts": 2, "proposed": 12, "accepted": 9},
        {"source": "forced", "drafts": 1, "proposed": 6, "accepted": 6}]
    assert Usage.of([result([])]).speculation.lookup_sources == []
