"""Stop strings (engine/request.py, TextTracker) on tokens that spell several characters:
for every place in a greedy text, several stop strings of different lengths, each completing
across token boundaries or inside one token, cut the text exactly where the definition says,
keep exactly the tokens that spell the kept text (a straddling token stays), report one
logprob entry per kept token (the target alone's), and stream deltas that add up to the
kept text without ever showing a stop string."""

from __future__ import annotations

import pytest

from specrouter.backends.synthetic import SyntheticBackend
from specrouter.cascade.chain import Chain
from specrouter.cascade.sampling import SamplingParams
from specrouter.engine import GenerationResult, generate, generate_stream

VOCAB = 12
PROMPT = [1, 2, 3, 1, 2]
TOKENS = 40
#: What each token spells: one to three letters, so a stop string can end inside a token,
#: begin inside one, or lie inside one. No token spells "@" or "#".
PIECES = ["a", "bc", "def", "g", "hi", "jkl", "m", "no", "pqr", "s", "tu", "vwx"]
NEVER = ["@", "#!"]


def spell(token: int) -> bytes:
    return PIECES[token].encode()


def models():
    target = SyntheticBackend("target", vocab=VOCAB)
    small = SyntheticBackend("small", vocab=VOCAB, model_seed=3, noise=1.2)
    return target, small


def reference():
    """The target alone, no stop strings: its text, tokens and entries, and where each token's
    text ends in the text."""
    target, _ = models()
    r = generate(Chain([target], []), PROMPT, SamplingParams(), TOKENS, detokenize=spell, logprobs=1)
    ends, length = [], 0
    for token in r.token_ids:
        length += len(PIECES[token])
        ends.append(length)
    assert r.text == "".join(PIECES[t] for t in r.token_ids) and len(set(r.token_ids)) >= 6
    return r, ends


def expected_cut(text: str, ends: list[int], stop: list[str]) -> tuple[int, int, int]:
    """(cut, kept tokens, the token that completed a stop string) by the definition: after the
    first token whose text completes a stop string, the text is cut before the earliest stop
    string it holds, and the tokens kept are the fewest whose text covers what is left."""
    for k, end in enumerate(ends):
        found = [i for i in (text[:end].find(s) for s in stop) if i >= 0]
        if found:
            cut = min(found)
            return cut, next((j + 1 for j, e in enumerate(ends) if e >= cut), 0) if cut else 0, k
    raise AssertionError(f"no stop string of {stop} completes")


def stop_lists(text: str) -> list[list[str]]:
    """At every place of the text: a long stop string with shorter ones that never occur
    (listed first or last), and pairs of stop strings that occur, of different lengths, one
    inside the other, overlapping, or completing in the same token (listed either way)."""
    out = []
    for s in range(len(text) - 5):
        out += [[text[s:s + 5], *NEVER], [*NEVER, text[s:s + 4]], [NEVER[0], text[s:s + 2]],
                [text[s + 1:s + 3], text[s:s + 5]], [text[s + 2:s + 4], text[s:s + 4]],
                [text[s:s + 3], text[s + 2:s + 6]], [text[s + 3:s + 6], text[s:s + 2], NEVER[1]]]
    return out


@pytest.mark.parametrize("chain_name", ["target alone", "2-level"])
def test_several_stop_strings_cut_at_the_earliest_with_one_entry_per_kept_token(chain_name):
    plain, ends = reference()
    text = plain.text
    cases = stop_lists(text)
    straddled = completed_in_kept = 0
    for stop in cases:
        target, small = models()
        chain = Chain([target], []) if chain_name == "target alone" else Chain([small, target], [4])
        items = list(generate_stream(chain, PROMPT, SamplingParams(), TOKENS, stop=stop, detokenize=spell,
                                     logprobs=1))
        r = items[-1]
        assert isinstance(r, GenerationResult)
        cut, kept, completing = expected_cut(text, ends, stop)
        assert (r.text, r.finish_reason) == (text[:cut], "stop"), stop
        assert r.token_ids == plain.token_ids[:kept], stop
        assert r.logprobs == plain.logprobs[:kept], stop  # one entry per kept token, the target's
        assert "".join(items[:-1]) == r.text, stop  # the stream showed the kept text, no stop string
        straddled += kept > 0 and ends[kept - 1] > cut
        completed_in_kept += kept == completing + 1
    # Among the cases: tokens that straddle the cut, and stop strings inside the last kept token.
    assert len(cases) > 100 and straddled > 20 and completed_in_kept > 5


def test_no_stop_string_that_never_completes_ends_the_text():
    plain, _ = reference()
    target, small = models()
    r = generate(Chain([small, target], [4]), PROMPT, SamplingParams(), TOKENS, stop=[*NEVER, plain.text[-3:] + "@"],
                 detokenize=spell, logprobs=1)
    assert (r.text, r.finish_reason, r.token_ids, r.logprobs) == (plain.text, "length", plain.token_ids, plain.logprobs)
