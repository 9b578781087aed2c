"""One verification block, exactly: the law of what a level emits, by enumeration, no sampling.

A block: a proposer drafts x_1..x_n (from q, autoregressively, or deterministically), the
verifier scores them in one forward (rows p_1..p_{n+1}, row i given x_<i) and emits the
accepted prefix plus one token. Its law in closed form (Leviathan et al. 2023), with
a_i(y) = min(p_i(y), q_i(y)) and beta_i = 1 - sum_y a_i(y):

    P(emit y_1..y_m, z) = prod_{i<=m} a_i(y_i) * beta_{m+1} * r_{m+1}(z)    m < n  (corrected)
    P(emit y_1..y_n, z) = prod_{i<=n} a_i(y_i) * p_{n+1}(z)                         (bonus)

where r_i = norm(max(p_i - q_i, 0)) and every row is taken at the prefix y_<i. A
deterministic proposer has q_i = one-hot(x_i). And whatever the block emitted, continuing it
with the verifier's own rows gives exactly the verifier's law over n + 1 tokens (the
theorem the cascade rests on).

The implementation is driven by a scripted uniform stream. Its contract with the random
generator: one uniform per proposal it tests (accepted when u * q(x) < p(x)), one for the
token it samples (inverse CDF). So its exact law is a finite sum: accepted tests take the
middle of [0, t), the rejecting one the middle of [t, 1), and the sampled token every
interval of a partition that refines the cumulative sums of every row it could sample from
(the residual, p and q of that position), each weighted by its length. Nothing is estimated:
both sides agree to rounding (1e-12) or the test fails, however small the bug.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
import pytest

from specrouter.cascade.verify import verify_sampled

Row = Callable[[tuple[int, ...]], np.ndarray]


class ScriptedUniforms:
    """A random generator whose random() returns the scripted values, in order."""

    def __init__(self, values: list[float]) -> None:
        self.values, self.used = values, 0

    def random(self) -> float:
        assert self.used < len(self.values), "the verifier drew more uniforms than its contract allows"
        self.used += 1
        return self.values[self.used - 1]


def random_rows(n_vocab: int, seed: int, support: int | None = None) -> Row:
    """A seeded distribution per prefix; support < n_vocab leaves a zero-probability tail
    (a padded row: more logits than tokens the model would ever give mass to)."""
    memo: dict[tuple[int, ...], np.ndarray] = {}
    width = n_vocab if support is None else support

    def row(prefix: tuple[int, ...]) -> np.ndarray:
        if prefix not in memo:
            w = np.random.default_rng([seed, *prefix]).gamma(0.7, size=width)
            memo[prefix] = np.concatenate([w / w.sum(), np.zeros(n_vocab - width)])
        return memo[prefix]

    return row


def at(row: np.ndarray, token: int) -> float:
    return float(row[token]) if token < row.shape[0] else 0.0


def reference_residual(p: np.ndarray, q: np.ndarray | None, x: int) -> np.ndarray:
    n = max(p.shape[0], q.shape[0] if q is not None else 0, x + 1)
    pp = np.zeros(n)
    pp[: p.shape[0]] = p
    qq = np.zeros(n)
    if q is None:
        qq[x] = 1.0
    else:
        qq[: q.shape[0]] = q
    r = np.maximum(pp - qq, 0.0)
    return r / r.sum()


def closed_form(p: Row, q: Row | None, proposals: tuple[int, ...] | None, n: int, vocab: int) -> dict:
    """The module docstring's formula. q None: a deterministic proposer of `proposals`."""
    law: dict[tuple[int, ...], float] = {}

    def grow(prefix: tuple[int, ...], mass: float) -> None:
        i = len(prefix)
        p_i = p(prefix)
        if i == n:
            for z in range(vocab):
                law[prefix + (z,)] = law.get(prefix + (z,), 0.0) + mass * at(p_i, z)
            return
        q_i = q(prefix) if q is not None else np.eye(1, vocab, proposals[i])[0]
        a = np.minimum(_pad(p_i, vocab), _pad(q_i, vocab))
        beta = 1.0 - a.sum()
        if beta > 1e-15:
            r = reference_residual(p_i, q_i, proposals[i] if q is None else 0)
            for z in range(vocab):
                law[prefix + (z,)] = law.get(prefix + (z,), 0.0) + mass * beta * at(r, z)
        for y in range(vocab):
            if a[y] > 0 and (q is not None or y == proposals[i]):
                grow(prefix + (y,), mass * a[y])

    grow((), 1.0)
    return {k: v for k, v in law.items() if v > 0}


def implementation_law(p: Row, q: Row | None, proposals: tuple[int, ...] | None, n: int, vocab: int) -> dict:
    """The implementation's exact law, by the scripted uniform stream of the module docstring."""
    law: dict[tuple[int, ...], float] = {}
    drafts = itertools.product(range(vocab), repeat=n) if q is not None else [proposals]
    for x in drafts:
        weight = 1.0
        if q is not None:
            weight = float(np.prod([at(q(x[:i]), x[i]) for i in range(n)]))
            if weight == 0:
                continue
        q_rows = [q(x[:i]) for i in range(n)] if q is not None else None
        p_rows = [p(x[:i]) for i in range(n + 1)]
        thresholds = [at(p_rows[i], x[i]) / (at(q_rows[i], x[i]) if q_rows else 1.0) for i in range(n)]
        for m in range(n + 1):  # m proposals accepted
            script, w = [], weight
            for t in thresholds[:m]:
                script.append(min(t, 1.0) / 2)
                w *= min(t, 1.0)
            if m < n:
                if thresholds[m] >= 1:
                    continue
                script.append((thresholds[m] + 1) / 2)
                w *= 1 - thresholds[m]
            if w == 0:
                continue
            rows = [p_rows[m]] + ([q_rows[m], reference_residual(p_rows[m], q_rows[m], x[m])] if m < n and q_rows
                                  else [reference_residual(p_rows[m], None, x[m])] if m < n else [])
            cuts = np.unique(np.concatenate([[0.0, 1.0], *(np.cumsum(r) / r.sum() for r in rows)]))
            cuts = cuts[(cuts >= 0) & (cuts <= 1)]
            for lo, hi in zip(cuts[:-1], cuts[1:]):
                if hi - lo <= 0:
                    continue
                rng = ScriptedUniforms(script + [(lo + hi) / 2])
                n_acc, nxt = verify_sampled(list(x), q_rows, p_rows, rng)
                assert rng.used == len(rng.values), "the verifier drew fewer uniforms than its contract says"
                out = tuple(x[:n_acc]) + (nxt,)
                law[out] = law.get(out, 0.0) + w * (hi - lo)
    return law


def _pad(v: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros(max(n, v.shape[0]))
    out[: v.shape[0]] = v
    return out


def assert_same_law(a: dict, b: dict) -> None:
    keys = set(a) | set(b)
    diff = max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in keys)
    worst = max(keys, key=lambda k: abs(a.get(k, 0.0) - b.get(k, 0.0)))
    assert diff < 1e-12, f"laws differ by {diff:.3g} at {worst}: {a.get(worst, 0.0)} vs {b.get(worst, 0.0)}"


def assert_continues_to_verifier_law(law: dict, p: Row, n: int, vocab: int) -> None:
    """Emitted block + the verifier's own rows up to n + 1 tokens = the verifier's law."""
    full: dict[tuple[int, ...], float] = {}
    for out, mass in law.items():
        stack = [(out, mass)]
        while stack:
            seq, m = stack.pop()
            if len(seq) == n + 1:
                full[seq] = full.get(seq, 0.0) + m
                continue
            row = p(seq)
            stack += [(seq + (z,), m * at(row, z)) for z in range(vocab) if at(row, z) > 0]
    target = {}
    for seq in itertools.product(range(vocab), repeat=n + 1):
        m = float(np.prod([at(p(seq[:i]), seq[i]) for i in range(n + 1)]))
        if m > 0:
            target[seq] = m
    assert_same_law(full, target)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_sampled_block_law_equals_closed_form(n):
    """q differs per position and per prefix; long blocks (up to 4 proposals) included."""
    vocab = 4
    p, q = random_rows(vocab, seed=10 + n), random_rows(vocab, seed=20 + n)
    law = implementation_law(p, q, None, n, vocab)
    assert_same_law(law, closed_form(p, q, None, n, vocab))
    assert_continues_to_verifier_law(law, p, n, vocab)
    assert abs(sum(law.values()) - 1) < 1e-12


@pytest.mark.parametrize("proposals", [(0,), (2, 1), (1, 1, 3), (3, 0, 2, 2)])
def test_deterministic_proposer_block_law_equals_closed_form(proposals):
    """An n-gram draft: q is one-hot, acceptance p(x), residual p without x."""
    vocab, n = 4, len(proposals)
    p = random_rows(vocab, seed=31)
    law = implementation_law(p, None, proposals, n, vocab)
    assert_same_law(law, closed_form(p, None, proposals, n, vocab))
    assert_continues_to_verifier_law(law, p, n, vocab)


@pytest.mark.parametrize(("q_len", "p_len", "p_support"), [(3, 5, 5), (5, 3, 3), (5, 5, 3)])
def test_padded_vocabularies_block_law(q_len, p_len, p_support):
    """Rows of different lengths (a draft with fewer or more logits than its verifier, or a
    verifier whose padded tail has no mass): the missing tail is probability zero."""
    vocab, n = max(q_len, p_len), 3
    p, q = random_rows(p_len, seed=41, support=p_support), random_rows(q_len, seed=42)
    law = implementation_law(p, q, None, n, vocab)
    assert_same_law(law, closed_form(p, q, None, n, vocab))
    assert_continues_to_verifier_law(law, p, n, vocab)
