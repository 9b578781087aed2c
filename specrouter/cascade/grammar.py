"""Structured output: a grammar restricts which tokens may follow a prefix.

Contract. A request's Grammar (a JSON schema, any JSON object, a regular expression, a
GBNF or Lark grammar) defines, after every prefix of its output, the set of tokens that
keep the output a prefix of a sentence of the grammar (plus the end-of-generation tokens
once the output is a whole sentence). A row of logits after a prefix is restricted to that
set: every other token's logit becomes -inf. This comes after penalties and biases
(penalties.py) and before temperature and the filters (sampling.warp), vLLM's order; the
constrained target's distribution is its restricted, warped rows along the output.

Why speculation stays lossless. The restriction is a function of (row, prefix) only, so
every level applies it to its own row after the same prefix (the committed output plus the
tokens drafted before that position) and is exactly a constrained model; speculative
sampling then makes the output follow the constrained target (verify.py). A model's draft
is drawn from its restricted rows, so it never leaves the grammar; a model-free draft (an
n-gram or suffix lookup, q one-hot) is cut before its first token outside the grammar,
which changes nothing: such a token has p = 0 at the level above, so it would be rejected
with certainty and the level would draw from its residual max(p - q, 0) = p, exactly what
it draws at the end of the shorter block. Once the output is a whole sentence and the
grammar allows no more text, the sequence ends (finish reason stop) as it would at the
end-of-generation token that is then the only token allowed.

State and rollback. A Constraint's matcher holds the committed output only (`commit`, one
token at a time, never undone). Rows after a drafted prefix are computed by consuming the
drafted tokens, reading the mask after each, and rolling all of them back before the
call returns, so a rejected token leaves no trace: the matcher after a cycle is the
matcher of the committed output, whatever was drafted (tests/unit/cascade/test_grammar.py
checks it against a fresh matcher after random cycles).

The grammar engine is llguidance (pinned; why: docs/cascade-and-exactness.md): it takes JSON
schemas, regular expressions, Lark and GBNF, computes a token mask from a token trie without
tables built per grammar, and its matcher rolls back consumed tokens, which speculation needs.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import llguidance
import numpy as np

from specrouter.backends.base import Backend
from specrouter.errors import InvalidGrammarError, clip

#: What a Grammar's source is written in.
GrammarKind = Literal["json_schema", "regex", "gbnf", "lark", "choice"]


@dataclass(frozen=True)
class Grammar:
    """A constraint on the output's text: its kind and its source (a JSON schema as JSON
    text, a regular expression, a GBNF or Lark grammar, a JSON list of the allowed texts).
    Checked when built: a source llguidance cannot compile is an InvalidGrammarError."""

    kind: GrammarKind
    source: str

    def __post_init__(self) -> None:
        self.definition  # noqa: B018 - compiled now: a bad source raises here

    @classmethod
    def json_schema(cls, schema: dict | str) -> Grammar:
        return cls("json_schema", schema if isinstance(schema, str) else json.dumps(schema))

    @classmethod
    def json_object(cls) -> Grammar:
        """Any JSON object (OpenAI's response_format json_object)."""
        return cls.json_schema({"type": "object"})

    @cached_property
    def definition(self) -> str:
        """llguidance's grammar definition (compiled once)."""
        try:
            grammar = llguidance.grammar_from(self.kind, self.source)
        except (ValueError, TypeError) as e:
            raise InvalidGrammarError(f"{self.kind} grammar: {clip(str(e))}") from None
        error = llguidance.LLMatcher.validate_grammar(grammar)
        if error:
            raise InvalidGrammarError(f"{self.kind} grammar: {clip(error.splitlines()[0])}")
        return grammar


class _Vocabulary:
    """What llguidance's TokenizerWrapper reads of a tokenizer: every token's bytes (a control
    token as 0xff and its text, as llguidance marks special tokens), the end token, and a
    tokenize function. llguidance trusts that function where the grammar forces bytes, so it
    must spell exactly the text: where the backend's tokens do not (a test tokenizer that maps
    every character somewhere), the longest pieces that do are taken instead, up to the first
    byte no token spells."""

    def __init__(self, backend: Backend, eos: int) -> None:
        self._backend = backend
        control = backend.eos_ids
        tokens = []
        for t in range(backend.n_tokens):
            piece = backend.token_bytes(t)
            if t in control or not piece:
                text = backend.token_text(t)
                piece = b"\xff" + text if text else b""
            tokens.append(piece)
        if eos >= len(tokens):  # no end token: a virtual one past the vocabulary, never produced
            tokens.append(b"\xff<specrouter:end>")
        self.tokens = tokens
        self.eos_token_id = eos
        self.bos_token_id = None
        self.special_token_ids = [t for t, piece in enumerate(tokens) if piece.startswith(b"\xff")]
        self._by_piece: dict[bytes, int] | None = None  # built on the first text the backend cannot spell
        self._longest = 0

    def __call__(self, text: str) -> list[int]:
        ids = self._backend.tokenize(text, add_special=False, parse_special=False)
        data = text.encode()
        if b"".join(self.tokens[t] for t in ids if t < len(self.tokens)) == data:
            return ids
        return self._longest_pieces(data)

    def _longest_pieces(self, data: bytes) -> list[int]:
        if self._by_piece is None:
            self._by_piece = {piece: t for t, piece in enumerate(self.tokens) if piece and piece[0] != 0xFF}
            self._longest = max(map(len, self._by_piece), default=0)
        out, i = [], 0
        while i < len(data):
            for size in range(min(self._longest, len(data) - i), 0, -1):
                token = self._by_piece.get(data[i : i + size])
                if token is not None:
                    out.append(token)
                    i += size
                    break
            else:
                break
        return out


#: One llguidance tokenizer per backend (building one reads every token of the vocabulary).
_TOKENIZERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def prepare(backend: Backend) -> None:
    """Build (once per backend) the vocabulary every Constraint on it reads: seconds for a
    150k vocabulary (docs/cascade-and-exactness.md), so a server calls it off its scheduler's
    thread before such a request runs."""
    _tokenizer(backend)


@dataclass(frozen=True)
class _Prepared:
    """A backend's llguidance tokenizer, and the bytes no token of its vocabulary starts with
    (none below 0xf5, where UTF-8 text lies, for a real vocabulary: it has every byte)."""

    tokenizer: llguidance.LLTokenizer
    unspelled: frozenset[int]


def _tokenizer(backend: Backend) -> _Prepared:
    prepared = _TOKENIZERS.get(backend)
    if prepared is None:
        eos = min(backend.eos_ids) if backend.eos_ids else backend.n_tokens
        vocabulary = _Vocabulary(backend, eos)
        first = {piece[0] for piece in vocabulary.tokens if piece and piece[0] != 0xFF}
        prepared = _Prepared(llguidance.LLTokenizer(llguidance.TokenizerWrapper(vocabulary)),
                             frozenset(range(0xF5)) - first)
        _TOKENIZERS[backend] = prepared
    return prepared


class Constraint:
    """One sequence's grammar state over its committed output (see the module docstring).

    backend: the target (whose tokenizer every level of a pool shares); its end-of-generation
    tokens are all allowed where the grammar allows its end."""

    def __init__(self, grammar: Grammar, backend: Backend) -> None:
        prepared = _tokenizer(backend)
        self._tok, self._unspelled = prepared.tokenizer, prepared.unspelled
        self._matcher = llguidance.LLMatcher(self._tok, grammar.definition, log_level=0)
        self._kind = grammar.kind
        if self._matcher.is_error():
            raise InvalidGrammarError(f"{grammar.kind} grammar: {clip(self._matcher.get_error().splitlines()[0])}")
        self._eos_ids = frozenset(backend.eos_ids)
        self._end = self._tok.eos_token
        self._n = backend.n_tokens
        self.output = 0  # committed output tokens the matcher has consumed
        self._masks: dict[tuple[int, ...], np.ndarray | None] = {}  # by drafted tokens past the output
        self._allowed([], 0, 1)  # a grammar no token of this vocabulary can start is refused here

    @property
    def stopped(self) -> bool:
        """The committed output is a whole sentence the grammar allows no more text after. With
        a vocabulary that has no end-of-generation token, also where the grammar allows nothing
        but its end, which such a vocabulary cannot spell (llguidance says stopped only once a
        token was consumed: a grammar whose one sentence is empty allows only its end before)."""
        if self._matcher.is_stopped():
            return True
        return not self._eos_ids and self._matcher.is_accepting() and not self._allowed([], 0, 1)[0].any()

    def commit(self, token: int) -> None:
        """The output grew by token (drawn from a restricted row: the grammar allows it)."""
        if not self._matcher.consume_token(self._mapped(token)):
            raise self._failure(f"committed token {token}")
        self.output += 1
        self._masks.clear()

    def restrict(self, rows: Sequence[np.ndarray], drafted: Sequence[int], start: int) -> list[np.ndarray]:
        """rows[j] is the row after the committed output plus drafted[:start + j] (start +
        len(rows) <= len(drafted) + 1); each restricted to the tokens the grammar allows there."""
        allowed = self._allowed(drafted, start, len(rows))
        return [row if mask is None else _masked(row, mask) for row, mask in zip(rows, allowed)]

    def valid_prefix(self, drafted: Sequence[int], proposals: Sequence[int]) -> int:
        """How many leading proposals the grammar allows after the committed output plus drafted
        (all of them once drafted has ended: what follows an end is never emitted)."""
        if not proposals:
            return 0
        consumed = self._consume_until_end(drafted)
        try:
            if consumed < len(drafted):
                return len(proposals)
            return self._matcher.validate_tokens([self._mapped(t) for t in proposals])
        finally:
            self._matcher.rollback(consumed)

    def forced(self, drafted: Sequence[int]) -> list[int]:
        """The tokens the grammar forces after the committed output plus drafted (its only
        continuation, as llguidance tokenizes it); empty where it allows a choice, or ended."""
        consumed = self._consume_until_end(drafted)
        try:
            if consumed < len(drafted) or self._matcher.is_stopped():
                return []
            return [t for t in self._matcher.compute_ff_tokens() if t < self._n]
        finally:
            self._matcher.rollback(consumed)

    # ------------------------------------------------------------------------------
    def _mapped(self, token: int) -> int:
        return self._end if token in self._eos_ids else int(token)

    def _consume_until_end(self, tokens: Sequence[int]) -> int:
        """Consume tokens up to an end token or the grammar's stop; returns how many were
        consumed (the caller rolls them back)."""
        consumed = 0
        for t in tokens:
            if t in self._eos_ids or self._matcher.is_stopped():
                break
            if not self._matcher.consume_token(int(t)):
                failure = self._failure("a drafted prefix (it must have been cut)")
                self._matcher.rollback(consumed)
                raise failure
            consumed += 1
        return consumed

    def _allowed(self, drafted: Sequence[int], start: int, count: int) -> list[np.ndarray | None]:
        """The masks after drafted[:j] for start <= j < start + count (None: any token; after an
        end token or the grammar's stop, what follows is never emitted)."""
        out: list[np.ndarray | None] = []
        consumed = 0
        try:
            for j in range(start, start + count):
                key = tuple(drafted[:j])
                if key not in self._masks:
                    consumed += self._consume_until_end(drafted[consumed:j])
                    ended = consumed < j or self._matcher.is_stopped()
                    self._masks[key] = None if ended else self._mask()
                out.append(self._masks[key])
        finally:
            self._matcher.rollback(consumed)
        return out

    def _failure(self, what: str) -> Exception:
        """The matcher's error after `what` failed to consume: a token outside the grammar is
        this engine's bug (a RuntimeError: tokens are drawn from restricted rows, drafts cut);
        any other error is the grammar engine's limit on this grammar (an Earley row of too
        many items, ...), the request's fault: InvalidGrammarError, a 400. Either message
        quotes the error's first line, clipped (the rest is the matcher's state: kilobytes)."""
        error = self._matcher.get_error()
        first = clip(error.splitlines()[0]) if error else "no error given"
        if "doesn't satisfy the grammar" in first:
            return RuntimeError(f"{what} is outside the grammar: {first}")
        return InvalidGrammarError(f"{self._kind} grammar: beyond the grammar engine's limits after {self.output} "
                                   f"output tokens: {first}")

    def _mask(self) -> np.ndarray:
        # Bytes the grammar forces that no token starts with: llguidance's mask then allows what
        # would follow them (after "ab" in "ab_e|ab_s", "e" where "_" is missing), not nothing.
        forced = self._matcher.compute_ff_bytes() if self._unspelled else b""
        bits = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
        allowed = np.unpackbits(bits, bitorder="little")[: self._n].astype(bool)
        if self._end in self._eos_ids:
            allowed[self._end] = False  # the end as the grammar allows it, below
        if (forced and forced[0] in self._unspelled) or (not allowed.any() and not self._matcher.is_accepting()):
            # No text can follow and the output is no sentence yet: the vocabulary lacks the bytes
            # the grammar needs next (a real one has every byte). llguidance would offer the end.
            raise InvalidGrammarError(f"the grammar allows no token of the vocabulary after {self.output} output "
                                      f"tokens: no token spells what it needs next")
        if self._matcher.is_error():
            raise self._failure("the mask")
        if self._end < len(bits) * 8 and (bits[self._end // 8] >> (self._end % 8)) & 1:
            allowed[list(t for t in self._eos_ids if t < self._n)] = True
        return allowed


def _masked(row: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    out = np.full_like(row, -np.inf)
    n = min(len(row), len(allowed))
    out[:n] = np.where(allowed[:n], row[:n], -np.inf)
    return out
