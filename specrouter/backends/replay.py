"""Recorded greedy answers replayed as a model: the target of a trace-driven simulation.

Greedy verification commits only the verifier's argmax at positions whose context is the
committed text itself (the accepted prefix of a block, then the verifier's own token);
every other row of a block is discarded. So a model whose argmax after prompt + answer[:i]
is answer[i] (and EOS after the whole answer, where it ended at EOS) makes every chain over
it, routed or fixed, commit exactly the recorded answer, whatever its drafts propose, and the
simulated clock (SyntheticBackend's `simulated_seconds`, `latency(n)` per forward of n
tokens) says what the run would have cost on the machine the latency describes.

- A draft model is replayed from its recorded Track (specrouter.sim.trace records it):
  its greedy token and top probability after prompt + answer[:j], teacher-forced on the
  target's text, and where that token is wrong, what it drafts on after it (a branch).
  A block starts on the path (the committed text), and under greedy decoding every token
  a model emits, drafted or as a verifier's correction, is its own argmax: so every
  context a single draft model sees, drafting or verifying a lookup's proposals, is the
  path or the path plus its own branch. Chains of the target, one draft model and a
  model-free drafter are therefore replayed as they ran (tests/unit/sim), up to a
  branch's recorded length. With two draft models the lower one's rows after the upper
  one's wrong token are not recorded (OFF): such chains are approximate off the path.
- Rows off the recorded path (after a rejected proposal, or any other context) are one
  fixed token's (OFF); no greedy chain commits them. Only greedy runs are replayed.
- Ids are remapped to a compact vocabulary (the distinct ids of every script, every
  recorded draft token and the target's EOS ids, then OFF), one Vocabulary shared by the
  models of one replay: a model-free drafter compares ids only, so its proposals (an EOS
  copied from a prompt's chat turns included), and every decision made from them, are
  those of the real run.
- The prompt is not priced unless asked (`price_prompt`): a forward's cost counts only the
  tokens it feeds at positions from the prompt's last token on (the prefill is the same for
  every method compared, and the copy ceiling's replay leaves it out too). While no script
  is current (a profiler's probes), every token counts.
- The context is priced where asked (`context_latency(n, c)`: what n priced tokens fed after c
  cached tokens cost beyond the latency, CostProfile.context_seconds): added per sequence,
  in a batched call too (each sequence's tokens attend over its own cache).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from specrouter.backends.synthetic import SyntheticBackend

#: The logit of a row's one token (every other is 0): argmax only matters under greedy.
PEAK = 10.0


@dataclass(frozen=True)
class Script:
    """One recorded request: its prompt and greedy answer (original ids), and whether the
    answer ended at EOS (else at max_tokens)."""

    prompt: list[int]
    answer: list[int]
    eos: bool


def peak_for(p: float, n_vocab: int) -> float:
    """The logit of a row's one token (every other 0) whose softmax gives it probability p:
    p = e^L / (e^L + n_vocab - 1). Kept > 0, so that token stays the argmax (a p below
    1 / n_vocab, which no argmax has in the real vocabulary, is not reproduced)."""
    p = min(max(p, 1e-9), 1 - 1e-12)
    return max(float(np.log(p / (1 - p) * (n_vocab - 1))), 1e-3)


@dataclass(frozen=True)
class Track:
    """A draft model's recorded behaviour along one script (original ids):
    `argmax[j]` its greedy token after prompt + answer[:j] (j = 0..len(answer)) and
    `confidence[j]` its top probability there; `branches[q]`, at a position q where its
    token is not the answer's, its greedy continuation after prompt + answer[:q] +
    [argmax[q]] (what it drafts on after its first wrong token in a block) and the
    confidences of those tokens."""

    argmax: list[int]
    confidence: list[float]
    branches: dict[int, tuple[list[int], list[float]]] = field(default_factory=dict)

    def tokens(self) -> list[int]:
        return [*self.argmax, *(t for tokens, _ in self.branches.values() for t in tokens)]


class Vocabulary:
    """The compact ids of one replay (shared by its models): the distinct original ids of
    `tokens` and `eos_ids`, in order, then OFF. The target's EOS ids stay EOS ids wherever
    they occur (a prompt's chat turns end with one, and a lookup drafter that copies it
    proposes an EOS); without any, one id after the others is EOS (before OFF)."""

    def __init__(self, tokens: Iterable[int], eos_ids: Iterable[int] = ()) -> None:
        eos = sorted(set(eos_ids))
        ids = sorted(set(tokens) | set(eos))
        #: The original id of each compact id below len(ids) (those from it on, an added EOS and
        #: OFF, stand for no token of the original vocabulary).
        self.ids = ids
        self._compact = {t: i for i, t in enumerate(ids)}
        self.eos_ids = frozenset(self._compact[t] for t in eos) if eos else frozenset({len(ids)})
        self.end = min(self.eos_ids)  # the EOS that ends an answer stopped at EOS
        self.off = len(ids) + (0 if eos else 1)
        self.size = self.off + 1

    @classmethod
    def of(cls, scripts: Sequence[Script], tracks: Iterable[Sequence[Track]] = (),
           eos_ids: Iterable[int] = ()) -> Vocabulary:
        """Every id the scripts and the recorded draft tokens (per model, per script) use."""
        tokens = [t for s in scripts for t in (*s.prompt, *s.answer)]
        tokens += [t for per_script in tracks for track in per_script for t in track.tokens()]
        return cls(tokens, eos_ids)

    def __call__(self, tokens: Sequence[int]) -> list[int]:
        return [self._compact[t] for t in tokens]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix (bisection over slice comparisons)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(frozen=True)
class Played:
    """A script made current, in compact ids: its path (prompt + answer), the rows along it
    (token, logit) after path[:prompt + j], and its branches (q -> (wrong token, rows after it))."""

    path: list[int]
    prompt: int
    next: list[tuple[int, float]]
    branches: dict[int, tuple[int, list[tuple[int, float]]]]

    def row(self, context: Sequence[int]) -> tuple[int, float] | None:
        """The recorded row after `context` (None: off what was recorded)."""
        return self.row_at(context, len(context), common_prefix(context, self.path))

    def row_at(self, context: Sequence[int], n: int, common: int) -> tuple[int, float] | None:
        """row(context[:n]), where `common` is the length of context's common prefix with the
        path (so that a caller that keeps it up to date pays nothing per row for the path)."""
        p, d = self.prompt, min(common, n)  # context[d] is the first token off the path
        if n < p:
            return None
        if d == n:
            return self.next[n - p]
        branch = self.branches.get(d - p)
        if branch is not None and context[d] == branch[0] and n - d - 1 < len(branch[1]):
            rows = branch[1]
            if all(context[d + 1 + i] == rows[i][0] for i in range(n - d - 1)):
                return rows[n - d - 1]
        return None


class ReplayBackend(SyntheticBackend):
    """Replays `scripts`: `play(i)` makes script i current and returns its prompt and answer
    in this model's ids; `play_many` makes several current at once (a batch: each sequence's
    rows come from the script whose prompt its context starts with, so the same script may
    run in several sequences). `tracks` (one per script): what this draft model did along
    each (its rows there have its recorded token and top probability); None: the model is
    the target whose answers these are. Any other context gets OFF at PEAK.
    Models replayed together share one `vocabulary` (default: this model's own)."""

    def __init__(self, name: str, scripts: Sequence[Script], latency: Callable[[int], float],
                 params_b: float = 1.0, tracks: Sequence[Track] | None = None,
                 vocabulary: Vocabulary | None = None, price_prompt: bool = False,
                 batch_latency: Callable[[float, int], float] | None = None,
                 context_latency: Callable[[int, int], float] | None = None) -> None:
        """batch_latency(n, b): what one call of b sequences feeding n tokens in all costs
        (default: latency(n), one forward over all their tokens); context_latency: see the
        module docstring (default: the context costs nothing)."""
        if tracks is not None and ([len(t.argmax) for t in tracks] != [len(s.answer) + 1 for s in scripts]
                                   or any(len(t.confidence) != len(t.argmax) for t in tracks)):
            raise ValueError(f"{name}: a track needs len(answer) + 1 tokens and confidences per script")
        self.vocabulary = vocabulary or Vocabulary.of(scripts, [tracks] if tracks is not None else [])
        self.off = self.vocabulary.off
        super().__init__(name, vocab=self.vocabulary.size, latency=latency, params_b=params_b, order=0)
        self.eos_ids = self.vocabulary.eos_ids
        self.scripts, self.tracks, self.price_prompt = list(scripts), tracks, price_prompt
        self.batch_latency = batch_latency
        self.context_latency = context_latency
        self._played: list[Played] = []

    def compact(self, tokens: Sequence[int]) -> list[int]:
        return self.vocabulary(tokens)

    def play(self, index: int | None) -> tuple[list[int], list[int]]:
        """Make script `index` current (None: none) and return its (prompt, answer), compact."""
        if index is None:
            self._played = []
            return [], []
        return self.play_many([index])[0]

    def play_many(self, indices: Sequence[int]) -> list[tuple[list[int], list[int]]]:
        """Make the scripts `indices` current together and return each one's (prompt, answer),
        compact. No prompt may start with another's (a context must tell which script it is in)."""
        played: dict[int, Played] = {}
        for index in dict.fromkeys(indices):
            s = self.scripts[index]
            prompt, answer = self.compact(s.prompt), self.compact(s.answer)
            if self.tracks is None:
                rows = [(t, PEAK) for t in answer + [self.vocabulary.end if s.eos else self.off]]
                branches = {}
            else:
                track = self.tracks[index]
                rows = self._rows(track.argmax, track.confidence)
                branches = {q: (rows[q][0], self._rows(tokens, conf)) for q, (tokens, conf) in track.branches.items()}
            played[index] = Played(prompt + answer, len(prompt), rows, branches)
        prompts = sorted(p.path[:p.prompt] for p in played.values())
        if any(b[:len(a)] == a for a, b in zip(prompts, prompts[1:])):
            raise ValueError(f"{self.name}: scripts played together need prompts that do not start with another's")
        self._played = list(played.values())
        return [(played[i].path[:played[i].prompt], played[i].path[played[i].prompt:]) for i in indices]

    def _rows(self, tokens: Sequence[int], confidence: Sequence[float]) -> list[tuple[int, float]]:
        return [(t, peak_for(c, self.n_vocab)) for t, c in zip(self.compact(tokens), confidence, strict=True)]

    def played_for(self, context: Sequence[int]) -> Played | None:
        """The current script whose prompt `context` starts with (None: none)."""
        for played in self._played:
            p = played.prompt
            if len(context) >= p and context[:p] == played.path[:p]:
                return played
        return None

    def logits_for(self, context: Sequence[int]) -> np.ndarray:
        row = np.zeros(self.n_vocab)
        context = list(context)
        played = self.played_for(context)
        found = played.row(context) if played is not None else None
        token, logit = found if found is not None else (self.off, PEAK)
        row[token] = logit
        return row

    def _priced(self, seq: int, tokens: Sequence[int], pos: int) -> int:
        """How many of a forward's tokens are priced: without price_prompt, the tokens at
        positions before its script's prompt's last are not (every token while none is current)."""
        if self.price_prompt:
            return len(tokens)
        played = self.played_for(self._kv[seq])
        prompt = played.prompt if played is not None else 0
        return len(tokens) - max(0, min(len(tokens), prompt - 1 - pos))

    def _context_cost(self, priced: int, tokens: Sequence[int], pos: int) -> float:
        """What a forward's `priced` tokens (its last ones) pay for the context before them."""
        if self.context_latency is None or not priced:
            return 0.0
        return self.context_latency(priced, pos + len(tokens) - priced)

    def decode(self, seq: int, tokens: Sequence[int], pos: int, n_logits: int) -> np.ndarray:
        logits = self._extend(seq, tokens, pos, n_logits)
        priced = self._priced(seq, tokens, pos)
        self._charge(priced)
        self.simulated_seconds += self._context_cost(priced, tokens, pos)
        return logits

    def decode_batch(self, items: Sequence[tuple[int, Sequence[int], int, int]]) -> list[np.ndarray]:
        """One call for several sequences: it costs batch_latency of all their priced tokens."""
        if len(items) == 1:
            return [self.decode(*items[0])]
        out = [self._extend(*item) for item in items]
        self.batch_calls += 1
        priced = [self._priced(seq, tokens, pos) for seq, tokens, pos, _ in items]
        n = sum(priced)
        self.simulated_seconds += sum(self._context_cost(p, tokens, pos)
                                      for p, (_, tokens, pos, _) in zip(priced, items, strict=True))
        if self.batch_latency is None:
            self._charge(n)
        else:
            self.decode_calls += 1
            self.simulated_seconds += self.batch_latency(n, len(items))
        return out
