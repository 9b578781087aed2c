"""Log-probabilities of emitted tokens (cascade/logprobs.py): under every chain, each entry is
exactly what the target's own row after that token's prefix gives, computed here from the
synthetic target's logits directly; alternatives are the most likely tokens, most likely
first; stop strings, EOS and max_tokens cut the entries with the tokens; a batched stream
hands out every entry once, with the text that shows its token; under a bias, penalties and a
grammar, every entry is the row after all three (computed here from their definitions), not
the model's raw row."""

from __future__ import annotations

import numpy as np
import pytest

from specrouter.backends.synthetic import SyntheticBackend
from specrouter.cascade.chain import Chain
from specrouter.cascade.grammar import Grammar
from specrouter.cascade.logprobs import TokenLogprob, log_distribution, token_logprob
from specrouter.cascade.sampling import SamplingParams, warp
from specrouter.drafters.ngram import NgramDrafter
from specrouter.engine import generate
from specrouter.engine.batch import BatchScheduler, Delta, Finished, SeqRequest
from specrouter.errors import InvalidParameterError

VOCAB, EOS = 12, 11
PROMPT = [1, 2, 3, 1, 2]
PARAMS = {
    "greedy": SamplingParams(),
    "T=0.8": SamplingParams(temperature=0.8, seed=5),
    "T=1.3,top_k=4": SamplingParams(temperature=1.3, top_k=4, seed=6),
    "T=0.9,top_p=0.7": SamplingParams(temperature=0.9, top_p=0.7, seed=7),
}


def models(eos=None):
    target = SyntheticBackend("target", vocab=VOCAB, eos_id=eos)
    mid = SyntheticBackend("mid", vocab=VOCAB, model_seed=2, noise=0.6, eos_id=eos)
    small = SyntheticBackend("small", vocab=VOCAB, model_seed=3, noise=1.2, eos_id=eos)
    return target, mid, small


def chains(target, mid, small):
    return {
        "target alone": Chain([target], []),
        "2-level": Chain([small, target], [4]),
        "3-level": Chain([small, mid, target], [2, 3]),
        "n-gram 3-level": Chain([NgramDrafter(max_ngram=2), mid, target], [3, 2]),
    }


def expected(target: SyntheticBackend, prompt, tokens, params, top) -> list[TokenLogprob]:
    """What the target alone reports: each token's entry from its own row."""
    return [token_logprob(log_distribution(target.logits_for(prompt + tokens[:j]), params), t, top)
            for j, t in enumerate(tokens)]


@pytest.mark.parametrize("params", PARAMS.values(), ids=PARAMS.keys())
@pytest.mark.parametrize("name", ["target alone", "2-level", "3-level", "n-gram 3-level"])
def test_every_entry_is_the_targets_own_row(name, params):
    target, mid, small = models()
    r = generate(chains(target, mid, small)[name], PROMPT, params, 60, logprobs=3)
    assert len(r.token_ids) == 60 and r.cycles < 60 or name == "target alone"
    assert r.logprobs == expected(target, PROMPT, r.token_ids, params, 3)


def test_greedy_reports_the_temperature_1_distribution_and_sampling_the_warped_one():
    target, _, _ = models()
    row = target.logits_for(PROMPT)
    greedy = log_distribution(row, SamplingParams())
    assert np.allclose(np.exp(greedy), np.exp(row) / np.exp(row).sum(), rtol=1e-12, atol=0)
    params = SamplingParams(temperature=0.7, top_k=3)
    sampled = log_distribution(row, params)
    kept = np.isfinite(sampled)
    assert kept.sum() == 3 and set(np.flatnonzero(kept)) == set(np.argsort(-row)[:3].tolist())
    assert np.allclose(np.exp(sampled[kept]), warp(row, params)[kept], rtol=1e-12, atol=0)


def test_alternatives_are_the_most_likely_tokens_most_likely_first():
    logp = np.log(np.array([0.1, 0.3, 0.05, 0.3, 0.25]))
    entry = token_logprob(logp, 2, 3)
    assert entry.token == 2 and entry.logprob == pytest.approx(np.log(0.05))
    assert [t for t, _ in entry.top] == [1, 3, 4]  # the tie at 0.3 by token id
    assert [lp for _, lp in entry.top] == [logp[1], logp[3], logp[4]]
    assert token_logprob(logp, 2, 0).top == ()
    assert [t for t, _ in token_logprob(logp, 0, 9).top] == [1, 3, 4, 0, 2]  # at most the vocabulary


def test_a_token_the_filters_cut_is_minus_infinity():
    row = np.array([3.0, 2.0, 1.0, 0.0])
    logp = log_distribution(row, SamplingParams(temperature=1.0, top_k=2))
    assert token_logprob(logp, 3, 4).logprob == -np.inf
    assert token_logprob(logp, 3, 4).top[-1] == (3, -np.inf)


def test_without_logprobs_there_are_none():
    target, _, small = models()
    assert generate(Chain([small, target], [4]), PROMPT, SamplingParams(), 10).logprobs is None


def test_entries_follow_the_tokens_cut_by_eos_stop_strings_and_max_tokens():
    target, _, small = models(eos=EOS)
    chain = Chain([small, target], [4])
    r = generate(chain, PROMPT, SamplingParams(), 7, logprobs=1)
    assert len(r.logprobs) == len(r.token_ids) == 7
    long = generate(chain, PROMPT, SamplingParams(), 400, logprobs=1)
    assert long.finish_reason == "stop" and [e.token for e in long.logprobs] == long.token_ids  # EOS is no entry
    plain = generate(chain, PROMPT, SamplingParams(), 40, logprobs=1)  # one letter per token
    stop = plain.text[10:12]
    cut = generate(chain, PROMPT, SamplingParams(), 40, stop=[stop], logprobs=1)
    assert cut.text == plain.text[: plain.text.index(stop)]
    assert [e.token for e in cut.logprobs] == cut.token_ids == plain.token_ids[: len(cut.token_ids)]


@pytest.mark.parametrize("bad", [-1, 21, True, 1.5])
def test_bad_logprobs_are_refused(bad):
    target, _, small = models()
    with pytest.raises(InvalidParameterError, match="logprobs must be an integer in 0..20"):
        generate(Chain([small, target], [4]), PROMPT, SamplingParams(), 5, logprobs=bad)


def test_a_batched_stream_hands_out_every_entry_once_with_its_text():
    target, mid, small = models()
    chain = Chain([small, mid, target], [2, 3])
    # A synthetic token spells one letter; a stop string of three "j"s holds a tail of "j"s
    # back: every token's text is shown by some Delta, and its entry comes with that Delta.
    scheduler = BatchScheduler(lambda r: chain, max_batch=4)
    requests = {f"r{i}": SeqRequest(PROMPT[i:] + [i], SamplingParams(temperature=0.9, seed=i), max_tokens=30 + i,
                                    stop=["jjj"], logprobs=2) for i in range(3)}
    for rid, request in requests.items():
        scheduler.add(rid, request)
    streamed: dict[str, list] = {rid: [] for rid in requests}
    shown: dict[str, str] = {rid: "" for rid in requests}
    results = {}
    while scheduler.n_active or scheduler.n_waiting:
        for event in scheduler.step():
            if isinstance(event, Delta):
                shown[event.request_id] += event.text
                streamed[event.request_id] += event.logprobs
                assert target.detokenize([e.token for e in streamed[event.request_id]]) == shown[event.request_id]
            elif isinstance(event, Finished):
                results[event.request_id] = event.result
    for rid, r in results.items():
        assert streamed[rid] == r.logprobs and len(r.logprobs) == len(r.token_ids) > 0
        assert r.logprobs == expected(target, requests[rid].prompt_tokens, r.token_ids, requests[rid].params, 2)


# Penalties, biases and a grammar -----------------------------------------------------------

#: After the committed output, the letters the grammar (a[bc]|b[ad]|c|d[a-e])* allows next,
#: written out by hand: between units a, b, c or d, or the end; after a: b or c; after b: a
#: or d; after d: a to e.
PAIRS_NEXT = {None: {0, 1, 2, 3, EOS}, 0: {1, 2}, 1: {0, 3}, 3: {0, 1, 2, 3, 4}}
CONSTRAINED = {
    "greedy": dict(temperature=0.0),
    "T=0.8": dict(temperature=0.8, seed=11),
    "T=1.3": dict(temperature=1.3, seed=12),
}


def pairs_allowed(output: list[int]) -> set[int]:
    """The tokens the pair grammar allows after `output` (independently of grammar.py)."""
    pending = None  # the first letter of an unfinished unit
    for token in output:
        pending = None if pending is not None or token == 2 else token
    return PAIRS_NEXT[pending]


def constrained_row(target, prompt, output, params) -> np.ndarray:
    """The target's row after prompt + output under params' bias, repetition, frequency and
    presence penalties and the pair grammar, computed from their definitions one token at a
    time: the row every reported entry must come from."""
    row = np.array(target.logits_for(prompt + output), dtype=np.float64)
    for token, bias in params.logit_bias:
        row[token] += bias
    r = params.repetition_penalty
    for token in set(prompt) | set(output):
        row[token] = row[token] / r if row[token] > 0 else row[token] * r
    for token in set(output):
        row[token] -= params.frequency_penalty * output.count(token) + params.presence_penalty
    row[[t for t in range(VOCAB) if t not in pairs_allowed(output)]] = -np.inf
    return row


def expected_constrained(target, prompt, tokens, params) -> list[tuple[int, float]]:
    """(token, log-probability) of each emitted token: log_softmax of its constrained row at
    temperature 1 (greedy) or at the request's temperature (sampling, no filters)."""
    out = []
    for j, token in enumerate(tokens):
        row = constrained_row(target, prompt, tokens[:j], params)
        scaled = row / (params.temperature or 1.0)
        finite = scaled[np.isfinite(scaled)]
        out.append((token, float(scaled[token] - finite.max() - np.log(np.exp(finite - finite.max()).sum()))))
    return out


@pytest.mark.parametrize("sampling", CONSTRAINED.values(), ids=CONSTRAINED.keys())
@pytest.mark.parametrize("name", ["target alone", "2-level", "3-level", "n-gram 3-level"])
def test_entries_come_from_the_row_after_bias_penalties_and_the_grammar_mask(name, sampling):
    """The reported distribution is the one the target decoded from: its logits after the
    bias, the penalties and the grammar's mask, not the model's raw row (which puts mass on
    tokens the grammar forbids and ignores the penalties)."""

    target, mid, small = models(eos=EOS)
    params = SamplingParams(**sampling, logit_bias=((EOS, -9.0), (3, 1.5), (1, -0.7)), repetition_penalty=1.4,
                            frequency_penalty=0.6, presence_penalty=0.3,
                            grammar=Grammar("regex", "(a[bc]|b[ad]|c|d[a-e])*"))
    r = generate(chains(target, mid, small)[name], PROMPT, params, 24, logprobs=2)
    assert len(r.token_ids) == 24 and r.finish_reason == "length"
    assert len(r.logprobs) == 24 and [e.token for e in r.logprobs] == r.token_ids
    want = expected_constrained(target, PROMPT, r.token_ids, params)
    assert [e.logprob for e in r.logprobs] == pytest.approx([lp for _, lp in want], rel=0, abs=1e-9)
    raw = expected(target, PROMPT, r.token_ids, SamplingParams(**sampling), 2)
    assert all(abs(e.logprob - plain.logprob) > 1e-3 for e, plain in zip(r.logprobs, raw))  # raw rows differ
    for j, entry in enumerate(r.logprobs):  # the alternatives: the grammar's most likely tokens, none outside it
        allowed = pairs_allowed(r.token_ids[:j])
        assert {t for t, _ in entry.top} <= allowed
        row = constrained_row(target, PROMPT, r.token_ids[:j], params)
        assert [t for t, _ in entry.top] == sorted(allowed, key=lambda t: (-row[t], t))[:2]
