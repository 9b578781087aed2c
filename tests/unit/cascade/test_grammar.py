"""Structured output (cascade/grammar.py) under speculation: the restriction itself; a draft cut
where it leaves the grammar; the matcher holding the committed output only, whatever was drafted
and rejected (random cycles against a fresh matcher); every level's proposals inside the grammar;
greedy output of every chain equal to the constrained target alone's; sampled output of chains
of depth 2 and 3 following the constrained target's law exactly (chi-square against the law
enumerated from the synthetic target's rows, ends included); a cascade that restricts a row by
the committed output only, forgetting the tokens drafted before it, fails the same test."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from specrouter.backends.synthetic import SyntheticBackend
from specrouter.cascade.chain import Chain
from specrouter.cascade.grammar import Constraint, Grammar
from specrouter.cascade.penalties import History, penalize
from specrouter.cascade.sampling import SamplingParams, warp
from specrouter.drafters.ngram import NgramDrafter
from specrouter.engine import generate
from specrouter.engine.request import SequenceRun
from specrouter.errors import InvalidGrammarError

from .test_sampling_exactness import ALPHA, goodness_of_fit

VOCAB = 6  # tokens a..e, and 5 the end of generation
EOS = 5
PROMPT = [1, 2, 3, 1, 2]
N_TOKENS = 4
RUNS = 20_000

#: A grammar whose allowed set depends on the prefix (after a only b or c, ...), open-ended,
#: the end allowed between units; and a finite one that stops by itself.
PAIRS = Grammar("regex", "(a[bc]|b[ad]|c|d[a-e])*")
FINITE = Grammar("regex", "(ab|c)d?e?")


FAMILY = 3  # a family whose greedy text runs long (family 0 ends after one token)


def models():
    target = SyntheticBackend("target", vocab=VOCAB, eos_id=EOS, family_seed=FAMILY)
    mid = SyntheticBackend("mid", vocab=VOCAB, model_seed=2, noise=0.8, eos_id=EOS, family_seed=FAMILY)
    small = SyntheticBackend("small", vocab=VOCAB, model_seed=3, noise=1.5, eos_id=EOS, family_seed=FAMILY)
    return target, mid, small


def chains():
    target, mid, small = models()
    return {"2-level": Chain([small, target], [3]),
            "3-level": Chain([small, mid, target], [2, 3]),
            "n-gram 2-level": Chain([NgramDrafter(max_ngram=1), target], [4]),
            "n-gram 3-level": Chain([NgramDrafter(max_ngram=2), mid, target], [3, 2])}


def fresh(grammar, target, output) -> Constraint:
    c = Constraint(grammar, target)
    for token in output:
        c.commit(token)
    return c


def allowed(grammar, target, output) -> list[int]:
    row = fresh(grammar, target, output).restrict([np.zeros(VOCAB)], [], 0)[0]
    return np.flatnonzero(np.isfinite(row)).tolist()


# The restriction --------------------------------------------------------------------------

def test_the_mask_follows_the_prefix_and_allows_the_end_only_between_units():
    target, _, _ = models()
    assert allowed(PAIRS, target, []) == [0, 1, 2, 3, EOS]  # a b c d, or end the empty sentence
    assert allowed(PAIRS, target, [0]) == [1, 2]  # after a: b or c
    assert allowed(PAIRS, target, [1]) == [0, 3]  # after b: a or d
    assert allowed(PAIRS, target, [0, 2]) == [0, 1, 2, 3, EOS]


def test_rows_after_drafted_prefixes_are_restricted_and_the_matcher_keeps_the_committed_output():
    target, _, _ = models()
    c = fresh(PAIRS, target, [0])  # committed: a
    rows = [np.arange(VOCAB, dtype=np.float64) for _ in range(3)]
    out = c.restrict(rows, [1, 3], 0)  # after a, a b, a b d
    finite = [np.flatnonzero(np.isfinite(r)).tolist() for r in out]
    assert finite == [[1, 2], [0, 1, 2, 3, EOS], [0, 1, 2, 3, 4]]
    assert out[0][1] == 1.0 and out[0][0] == -np.inf  # kept logits are the row's own
    assert rows[0][0] == 0.0  # the caller's rows are untouched
    again = c.restrict([np.zeros(VOCAB)], [1], 1)[0]  # after a b once more (the cache)
    assert np.flatnonzero(np.isfinite(again)).tolist() == finite[1]
    assert allowed(PAIRS, target, [0]) == np.flatnonzero(np.isfinite(c.restrict([np.zeros(VOCAB)], [], 0)[0])).tolist()


def test_a_draft_is_cut_before_its_first_token_outside_the_grammar():
    target, _, _ = models()
    c = fresh(PAIRS, target, [0])
    assert c.valid_prefix([], [1, 3, 4, 0, 0]) == 4  # a | b, d e, a, then a a leaves it
    assert c.valid_prefix([1], [0, 0]) == 1  # after a b: a, then a again is outside
    assert c.valid_prefix([], [EOS]) == 0  # "a" is no whole sentence
    assert c.valid_prefix([2], [EOS, 0]) == 1  # "ac" is; no token follows an end
    assert c.valid_prefix([], [1, 3]) == 2  # and nothing was consumed for good


def test_the_finite_grammar_stops_and_generation_ends_there():
    target, _, small = models()
    for chain in (Chain([target], []), Chain([small, target], [3]), Chain([NgramDrafter(max_ngram=1), target], [4])):
        r = generate(chain, PROMPT, SamplingParams(grammar=FINITE), 20)
        expected = _greedy_constrained(target, FINITE, 20)
        assert r.token_ids == expected and r.finish_reason == "stop"
    c = fresh(FINITE, target, [0, 1, 3, 4])
    assert c.stopped


@pytest.mark.parametrize("eos", [EOS, None], ids=["end token", "no end token"])
def test_a_grammar_whose_one_sentence_is_empty_ends_at_once(eos):
    """With an end token the grammar allows only it; a vocabulary without one ends there too."""
    target = SyntheticBackend("target", vocab=VOCAB, eos_id=eos, family_seed=FAMILY)
    for chain in (Chain([target], []), Chain([NgramDrafter(max_ngram=1), target], [4])):
        for grammar in (Grammar("regex", ""), Grammar("gbnf", 'root ::= ""')):
            r = generate(chain, PROMPT, SamplingParams(grammar=grammar), 4)
            assert (r.token_ids, r.finish_reason) == ([], "stop")
    assert fresh(Grammar("regex", ""), target, []).stopped == (eos is None)


def test_a_grammar_that_does_not_compile_is_refused_when_built():
    with pytest.raises(InvalidGrammarError, match="regex grammar"):
        Grammar("regex", "(ab")
    with pytest.raises(InvalidGrammarError, match="json_schema grammar"):
        Grammar("json_schema", "{not json")
    assert Grammar.json_object().kind == "json_schema"


# State across cycles ------------------------------------------------------------------------

def record_prefixes(monkeypatch) -> list[tuple[int, list[int]]]:
    """Every (level, tokens) a cycle asks a model to evaluate, from now on."""
    from specrouter.cascade import chain as chain_module

    asked: list[tuple[int, list[int]]] = []
    execute = chain_module.execute

    def recording(calls, clock=None):
        asked.extend((request.level, list(request.tokens)) for _, request in calls)
        return execute(calls) if clock is None else execute(calls, clock)

    monkeypatch.setattr(chain_module, "execute", recording)
    return asked


def record_cuts(monkeypatch) -> list[tuple[int, int]]:
    """(drafted, kept) of every draft the grammar cut short."""
    from specrouter.cascade.proposer import Draft

    cuts: list[tuple[int, int]] = []
    cut = Draft.cut

    def recording(self, n):
        if n < len(self.tokens):
            cuts.append((len(self.tokens), n))
        return cut(self, n)

    monkeypatch.setattr(Draft, "cut", recording)
    return cuts


@pytest.mark.parametrize("name", ["2-level", "3-level", "n-gram 2-level", "n-gram 3-level"])
def test_after_random_cycles_the_matcher_is_the_committed_outputs_and_every_prefix_is_in_the_grammar(
        name, monkeypatch):
    """Property: whatever was drafted and rejected, the constraint after each cycle equals a
    fresh matcher fed the committed output (same allowed set); every prefix any level was asked
    to evaluate lies inside the grammar (drafts are restricted, or cut where they leave it)."""
    asked = record_prefixes(monkeypatch)
    rng = np.random.default_rng(7)
    cycles = rejected = 0
    for trial in range(12):
        chain = chains()[name]
        target = chain.target
        params = SamplingParams(temperature=float(rng.choice([0.0, 1.0, 1.5])), grammar=PAIRS)
        run = SequenceRun(chain, PROMPT, params, 24, rng=np.random.default_rng(trial))
        while (runner := run.start_cycle()) is not None:
            run.end_cycle(runner.cycle(run.context, run.room))
            cycles += 1
            if run.finished:
                break
            assert run.constraint.output == len(run.generated)
            got = run.constraint.restrict([np.zeros(VOCAB)], [], 0)[0]
            want = fresh(PAIRS, target, run.generated).restrict([np.zeros(VOCAB)], [], 0)[0]
            assert np.isfinite(got).tolist() == np.isfinite(want).tolist()
        run.release()
        rejected += sum(s.proposed - s.accepted for s in run.stats.values())
    checker = fresh(PAIRS, models()[0], [])
    outside = [(level, tokens) for level, tokens in asked
               if checker.valid_prefix([], tokens[len(PROMPT):]) < len(tokens) - len(PROMPT)]
    assert cycles >= 12 and rejected > 0 and len(asked) >= cycles and outside == []


def test_an_ngram_draft_outside_the_grammar_is_cut_and_the_output_is_the_constrained_targets(monkeypatch):
    """The prompt repeats "a b d": the lookup proposes d after b, b after a, a after d, and
    whether the grammar allows them depends on where the output's units start."""
    target, _, _ = models()
    cuts = record_cuts(monkeypatch)
    prompt = [0, 1, 3, 0, 1, 3, 0, 1]
    r = generate(Chain([NgramDrafter(max_ngram=1), target], [4]), prompt, SamplingParams(grammar=PAIRS), 12)
    assert r.token_ids == _greedy_constrained(target, PAIRS, 12, prompt)
    assert cuts and all(kept < drafted for drafted, kept in cuts)
    ngram = next(s for s in r.levels if s.name == "ngram")
    assert ngram.proposed < 4 * r.cycles  # cut drafts hand up fewer tokens than were asked for


# Greedy -------------------------------------------------------------------------------------

def _greedy_constrained(target, grammar, n, prompt=PROMPT) -> list[int]:
    """The constrained target alone, one argmax at a time, ending at EOS or the grammar's stop."""
    out: list[int] = []
    while len(out) < n:
        c = fresh(grammar, target, out)
        if c.stopped:
            break
        token = int(np.argmax(c.restrict([target.logits_for(prompt + out)], [], 0)[0]))
        if token == EOS:
            break
        out.append(token)
    return out


@pytest.mark.parametrize("name", ["2-level", "3-level", "n-gram 2-level", "n-gram 3-level"])
def test_greedy_equals_the_constrained_target_alone(name):
    chain = chains()[name]
    r = generate(chain, PROMPT, SamplingParams(grammar=PAIRS), 40)
    assert r.token_ids == _greedy_constrained(chain.target, PAIRS, 40)
    assert r.token_ids != generate(chain, PROMPT, SamplingParams(), 40).token_ids  # the grammar changed the text


# Sampling -----------------------------------------------------------------------------------

SAMPLED = {
    "pairs": SamplingParams(temperature=1.0, grammar=PAIRS),
    "pairs,top_k,penalties": SamplingParams(temperature=0.9, top_k=3, presence_penalty=1.0, grammar=PAIRS),
    "finite": SamplingParams(temperature=1.2, grammar=FINITE),
}


def constrained_law(target, params) -> dict[tuple, float]:
    """The exact law of the constrained target alone's output over N_TOKENS tokens: each
    outcome a (tokens, finish reason) pair (EOS, or a grammar that stops, end it with "stop");
    without a grammar (params.grammar None), the free target's."""
    law: dict[tuple, float] = {}

    def walk(out: list[int], p: float) -> None:
        c = fresh(params.grammar, target, out) if params.grammar is not None else None
        if out and c is not None and c.stopped:
            law[(tuple(out), "stop")] = law.get((tuple(out), "stop"), 0.0) + p
            return
        if len(out) == N_TOKENS:
            law[(tuple(out), "length")] = p
            return
        row = penalize(target.logits_for(PROMPT + out), PROMPT + out, params, History(PROMPT))
        dist = warp(c.restrict([row], [], 0)[0] if c is not None else row, params)
        for token in np.flatnonzero(dist):
            if token == EOS:
                law[(tuple(out), "stop")] = law.get((tuple(out), "stop"), 0.0) + p * dist[token]
            else:
                walk(out + [int(token)], p * dist[token])

    walk([], 1.0)
    return law


def counts_of(chain, params, seed, runs=RUNS) -> dict[tuple, int]:
    rng = np.random.default_rng(seed)
    counts: dict[tuple, int] = {}
    for _ in range(runs):
        r = generate(chain, PROMPT, params, N_TOKENS, rng=rng)
        key = (tuple(r.token_ids), r.finish_reason)
        counts[key] = counts.get(key, 0) + 1
    return counts


def first_tokens(law: dict[tuple, float]) -> dict[int, float]:
    """A law's marginal of the first token (EOS where the output is empty)."""
    out: dict[int, float] = {}
    for (tokens, _), p in law.items():
        first = tokens[0] if tokens else EOS
        out[first] = out.get(first, 0.0) + p
    return out


def in_grammar(checker: Constraint, outcome: tuple) -> bool:
    """Whether an outcome (tokens, finish reason) is one the grammar allows: its tokens a
    prefix of a sentence, and a whole sentence (the end allowed after it) where it stopped.
    checker: a constraint with no committed output."""
    tokens = list(outcome[0])
    if outcome[1] == "length":
        return checker.valid_prefix([], tokens) == len(tokens)
    return checker.valid_prefix([], tokens + [EOS]) == len(tokens) + 1


def test_the_constrained_law_is_a_law_and_differs_from_the_free_one():
    """Each constrained law sums to 1, every outcome of it is in the grammar, and it differs
    from the free law of the same params, which puts most of its mass outside the grammar.
    Where no filter follows the mask, the first token's marginal is exactly the free one
    restricted to what the grammar allows first, renormalised."""
    target, _, _ = models()
    for name, params in SAMPLED.items():
        law = constrained_law(target, params)
        free = constrained_law(target, replace(params, grammar=None))
        assert sum(law.values()) == pytest.approx(1.0) and sum(free.values()) == pytest.approx(1.0)
        checker = fresh(params.grammar, target, [])
        assert all(in_grammar(checker, k) for k in law), name
        outside = sum(p for k, p in free.items() if not in_grammar(checker, k))
        distance = 0.5 * sum(abs(law.get(k, 0.0) - free.get(k, 0.0)) for k in law.keys() | free.keys())
        assert outside > 0.5 and distance > 0.5, name
        if params.top_k == 0 and params.top_p == 1.0:
            first, free_first = first_tokens(law), first_tokens(free)
            start = allowed(params.grammar, target, [])
            mass = sum(free_first[t] for t in start)
            assert first == pytest.approx({t: free_first[t] / mass for t in start}, rel=1e-9), name
    assert len(constrained_law(target, SAMPLED["finite"])) < 12


@pytest.mark.slow
@pytest.mark.parametrize("params", SAMPLED.values(), ids=SAMPLED.keys())
@pytest.mark.parametrize("name", ["2-level", "3-level", "n-gram 2-level", "n-gram 3-level"])
def test_sampled_output_follows_the_constrained_targets_law(name, params):
    chain = chains()[name]
    law = constrained_law(chain.target, params)
    pvalue = goodness_of_fit(law, counts_of(chain, params, seed=2025), RUNS)
    assert pvalue > ALPHA, f"{name}: output deviates from the constrained target's law (p = {pvalue:.2e})"


@pytest.mark.slow
def test_restricting_by_the_committed_output_only_is_detected(monkeypatch):
    """The bug the contract rules out: a row after drafted tokens restricted as if they were
    not there. It cannot go unnoticed: a draft leaves the grammar (the constraint refuses to
    consume it), or the output has impossible outcomes or fails the same chi-square."""
    params = SAMPLED["pairs"]
    chain = chains()["2-level"]
    law = constrained_law(chain.target, params)
    original = Constraint.restrict
    monkeypatch.setattr(Constraint, "restrict",
                        lambda self, rows, drafted, start: [original(self, [row], [], 0)[0] for row in rows])
    try:
        counts = counts_of(chain, params, seed=2025)
    except RuntimeError as e:
        assert "left the grammar" in str(e) or "outside the grammar" in str(e)
        return
    impossible = [k for k in counts if law.get(k, 0.0) == 0.0]
    assert impossible or goodness_of_fit(law, counts, RUNS) < ALPHA, "committed-only masks went unnoticed"


def test_a_grammar_the_vocabulary_cannot_spell_is_refused_before_anything_runs():
    target, _, _ = models()  # letters a..e only: no "{"
    with pytest.raises(InvalidGrammarError, match="allows no token of the vocabulary after 0 output tokens"):
        generate(Chain([target], []), PROMPT, SamplingParams(grammar=Grammar.json_object()), 4)


def test_a_grammar_forcing_a_byte_no_token_spells_is_refused_there():
    """After "ab" the grammar forces "_", which the letters a..e cannot spell."""
    target, _, small = models()
    for chain in (Chain([target], []), Chain([small, target], [3]), Chain([NgramDrafter(max_ngram=1), target], [4])):
        with pytest.raises(InvalidGrammarError, match="allows no token of the vocabulary after .* no token spells"):
            generate(chain, PROMPT, SamplingParams(grammar=Grammar("regex", "ab_c|ab_d")), 4)


# Forced continuations as drafts ----------------------------------------------------------

#: After its first letter, a long stretch the grammar forces, then a choice, and again.
FORCING = Grammar("regex", "(a|b)cdecdecde(a|b)cdecdecde(a|b)")


def test_the_constraint_names_the_tokens_the_grammar_forces():
    target, _, _ = models()
    c = fresh(FORCING, target, [])
    assert c.forced([]) == []  # a or b: a choice
    assert c.forced([0]) == [2, 3, 4] * 3  # then "cdecdecde"
    assert c.forced([0, 2]) == [3, 4] + [2, 3, 4] * 2
    assert fresh(FORCING, target, [1]).forced([]) == [2, 3, 4] * 3  # the same from the committed output
    assert fresh(PAIRS, target, [0]).forced([]) == []  # b or c
    assert fresh(FINITE, target, [0]).forced([]) == [1]  # "a" forces "b"


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=1.0, seed=3)], ids=["greedy", "sampled"])
def test_a_lookup_level_drafts_what_the_grammar_forces_in_one_block(params):
    """Forced stretches come as drafts of their own class: 9 forced tokens cost one verifying
    forward, not nine; the output is the constrained target alone's (greedy) and a sentence."""
    target, _, _ = models()
    chain = Chain([NgramDrafter(max_ngram=2), target], [12])
    r = generate(chain, PROMPT, SamplingParams(grammar=FORCING, temperature=params.temperature, seed=params.seed),
                 40, rng=np.random.default_rng(params.seed))
    assert r.finish_reason == "stop" and len(r.token_ids) == 21
    assert r.cycles <= 5  # a letter, the forced stretch (+ the next letter as the bonus), ...
    ngram = next(s for s in r.levels if s.name == "ngram")
    assert ngram.accepted >= 18
    if params.greedy:
        assert r.token_ids == _greedy_constrained(target, FORCING, 40)


def test_auto_learns_that_forced_drafts_pay_and_takes_them():
    """The router's shadow scores the forced class against the target's rows even while the
    target runs alone, so auto moves to the lookup level for forced stretches. Timed by the
    target's simulated clock (a forward: 50 ms + 4 ms a token): on the wall clock a synthetic
    forward costs microseconds and the Python work per row decides, which varies with load."""
    from ..router_synth import linear, make_router, simulated_clock

    target = SyntheticBackend("target", vocab=VOCAB, eos_id=EOS, family_seed=FAMILY, latency=linear(0.05, 0.004))
    router = make_router(target, [], lookup="ngram")
    long = Grammar("regex", "((a|b)cdecdecdecdecde)+")
    results = [generate(router.session(), PROMPT, SamplingParams(grammar=long), 120, clock=simulated_clock([target]))
               for _ in range(3)]
    last = results[-1]
    forced_blocks = [ks[0] for names, ks in last.chains_used if names[0] == "ngram"]
    assert forced_blocks, last.chains_used
    assert last.cycles < len(last.token_ids) / 4  # most of the text came in forced blocks
    assert last.token_ids == _greedy_constrained(target, long, 120)
