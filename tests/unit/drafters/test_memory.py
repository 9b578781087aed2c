"""The cross-request suffix memory against brute force (random texts in random partitions,
over budgets that evict), its eviction by budget, its partitions and opt-out, and its
input errors."""

import threading

import numpy as np
import pytest

from specrouter.drafters.lookup import Lookup
from specrouter.drafters.memory import (GRAM, MAX_CANDIDATES, MAX_MATCH, OPTED_OUT, MemoryScope, SuffixMemory, _hashes,
                                        _slot)
from specrouter.errors import InvalidParameterError


def brute_lookup(texts: list[tuple[list[int], str]], budget: int, context: list[int], n: int, partition: str) -> Lookup:
    """The memory's proposal computed from its definition: the kept slots are the last
    `budget` of the texts laid end to end, each followed by a separator."""
    slots: list[tuple[int, str]] = []
    for tokens, part in texts:
        slots += [(t, part) for t in tokens] + [(-1, part)]
    first = max(0, len(slots) - budget)
    tail = context[-MAX_MATCH:]
    found = []
    for p in range(first, len(slots)):
        if slots[p][1] != partition or slots[p][0] == -1:
            continue
        m = 0
        while m < len(tail) and p - m >= first and slots[p - m][0] == tail[-1 - m]:
            m += 1
        if m >= GRAM:
            found.append((p, m))
    if not found:
        return Lookup([], 0)
    match = max(m for _, m in found)
    alive = sorted((p for p, m in found if m == match), reverse=True)[:MAX_CANDIDATES]
    rows = []
    for p in alive:
        row = []
        for q in range(p + 1, min(p + 1 + n, len(slots))):
            if slots[q][0] == -1:
                break
            row.append(slots[q][0])
        rows.append(row)
    out = []
    for j in range(n):
        nexts = [r[j] for r in rows if j < len(r)]
        if not nexts:
            break
        counts = {t: nexts.count(t) for t in nexts}
        top = max(counts.values())
        token = next(t for t in nexts if counts[t] == top)  # rows are latest first
        out.append(token)
        rows = [r for r in rows if j < len(r) and r[j] == token]
    return Lookup(out, match, len(rows), len(alive))


@pytest.mark.parametrize("alphabet,budget", [(2, 40), (3, 100), (5, 1000), (3, 7)])
def test_recall_equals_brute_force_as_texts_are_added_and_evicted(alphabet, budget):
    rng = np.random.default_rng(alphabet * budget)
    memory = SuffixMemory(budget)
    texts: list[tuple[list[int], str]] = []
    for _ in range(30):
        text = rng.integers(0, alphabet, size=int(rng.integers(1, 30))).tolist()
        part = ("", "key-a", "key-b")[int(rng.integers(0, 3))]
        memory.add(text, MemoryScope(part))
        texts.append((text, part))
        assert len(memory) == min(budget, sum(len(t) + 1 for t, _ in texts))
        for _ in range(4):
            context = rng.integers(0, alphabet, size=int(rng.integers(1, 20))).tolist()
            if rng.random() < 0.5:  # a context that quotes a stored text: long matches
                source = texts[int(rng.integers(0, len(texts)))][0]
                context += source[: int(rng.integers(0, len(source) + 1))]
            partition = ("", "key-a", "key-b", "key-c")[int(rng.integers(0, 4))]
            n = int(rng.integers(1, 10))
            assert memory.propose(context, n, MemoryScope(partition)) == \
                brute_lookup(texts, budget, context, n, partition), (context, partition)


def test_a_query_hashes_its_window_to_the_slot_its_text_was_stored_under():
    """propose hashes one window in plain integers, add hashes all in numpy: both must agree
    (at vocabulary-sized ids and any partition), or no stored text would ever be found."""
    rng = np.random.default_rng(7)
    shift = np.uint64(64 - 20)
    for pid in (0, 1, 2, 977):
        arr = rng.integers(0, 152_000, size=40)
        slots = _hashes(arr, pid, shift)
        assert [_slot(arr[i:i + GRAM].tolist(), pid, int(shift)) for i in range(len(slots))] == slots.tolist()


def test_a_long_match_proposes_the_stored_continuation_up_to_the_end_of_its_text():
    memory = SuffixMemory(1000)
    answer = list(range(100, 160))
    memory.add(answer)
    memory.add([1, 2, 3, 4, 5, 6])
    got = memory.propose([7, 8] + answer[:20], 64)
    assert got == Lookup(answer[20:], 20, 1, 1)  # stops where the stored text ends


def test_the_budget_evicts_the_oldest_tokens():
    memory = SuffixMemory(50)
    old = list(range(200, 230))
    memory.add(old)
    assert memory.propose(old[:10], 5).tokens == old[10:15]
    memory.add(list(range(300, 330)))  # 31 + 31 slots > 50: the old text's first 12 slots go
    assert len(memory) == 50 and memory.oldest == 12
    assert memory.propose(old[:10], 5) == Lookup([], 0)  # its windows were evicted
    assert memory.propose(old[12:20], 3).tokens == old[20:23]  # what is left is still found
    memory.add(list(range(400, 450)))
    assert memory.propose(old[12:20], 3) == Lookup([], 0)


def test_partitions_and_opted_out_requests_never_see_each_others_text():
    memory = SuffixMemory(1000)
    secret = list(range(500, 540))
    memory.add(secret, MemoryScope("key-a"))
    memory.add(list(range(600, 640)), OPTED_OUT)  # an opted-out request's text is not kept
    assert len(memory) == 41
    assert memory.propose(secret[:8], 8, MemoryScope("key-a")).tokens == secret[8:16]
    for scope in (MemoryScope(), MemoryScope("key-b"), OPTED_OUT):
        assert memory.propose(secret[:8], 8, scope) == Lookup([], 0)
    assert memory.propose(list(range(600, 608)), 8, MemoryScope()) == Lookup([], 0)
    assert memory.propose(list(range(600, 608)), 8, MemoryScope("key-a")) == Lookup([], 0)


def test_concurrent_adds_and_proposals_keep_the_store_consistent():
    memory = SuffixMemory(10_000)
    texts = [[t * 1000 + i for i in range(50)] for t in range(8)]

    def worker(t: int) -> None:
        for _ in range(20):
            memory.add(texts[t])
            memory.propose(texts[t][:10], 8)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(memory) == memory.total == 8 * 20 * 51
    for text in texts:  # every copy is whole: each add wrote its slots under the lock
        assert memory.propose(text[:10], 40) == Lookup(text[10:50], 10, 20, 20)


@pytest.mark.parametrize("budget", [0, -5, 2.5, "1000", True, None])
def test_a_budget_that_is_not_a_positive_whole_number_is_refused(budget):
    with pytest.raises(InvalidParameterError, match=f"budget must be a whole number of tokens >= 1, got {budget!r}"):
        SuffixMemory(budget)


def test_negative_token_ids_are_refused_before_anything_is_stored():
    memory = SuffixMemory(100)
    with pytest.raises(InvalidParameterError, match="token ids must be >= 0"):
        memory.add([1, 2, -1, 3])
    assert len(memory) == 0


def test_a_keyed_request_reads_its_own_partition_only():
    """A key's request is proposed its key's texts, never the shared partition's (the texts of
    requests without a key) nor another key's, even where those match its context longer."""
    memory = SuffixMemory(1000)
    shared, other, own = list(range(700, 740)), list(range(800, 840)), list(range(700, 712)) + list(range(900, 920))
    memory.add(shared)  # the shared partition: continues 700..711 with 712..
    memory.add(other, MemoryScope("key-b"))
    assert memory.propose(shared[:20], 8, MemoryScope("key-a")) == Lookup([], 0)  # key-a holds nothing yet
    memory.add(own, MemoryScope("key-a"))  # key-a's text continues 700..711 with 900..
    assert memory.propose(shared[:20], 8, MemoryScope("key-a")) == Lookup([], 0)  # 712.. is not key-a's
    assert memory.propose(shared[:12], 8, MemoryScope("key-a")) == Lookup(own[12:20], 12, 1, 1)
    assert memory.propose(shared[:12], 8) == Lookup(shared[12:20], 12, 1, 1)
    assert memory.propose(other[:10], 8, MemoryScope("key-a")) == Lookup([], 0)
    assert memory.propose(other[:10], 8, MemoryScope("key-b")).tokens == other[10:18]
