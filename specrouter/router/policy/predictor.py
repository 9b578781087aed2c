"""Expected seconds per committed token of a chain, from costs and acceptance rates.

Model. Level j's tokens are accepted by level j + 1 independently at each position
with probability a_j = a(level j, level j + 1) (the acceptance estimator's number).
t_j(n) is level j's forward over n tokens (the profile, refined online).

One block. Level i verifies m proposals from level i - 1 in one forward and returns
the accepted prefix plus one token of its own, G tokens in all:
    P(G = g) = a^(g-1) (1 - a)  for g = 1..m,    P(G = m + 1) = a^m,
    E[G] = (1 - a^(m+1)) / (1 - a)                                          (1)
(a proposer that returns fewer tokens than asked, a lookup, is folded into a: the
estimator scores the first missing position as a rejection, and the verifier feeds
fill * m proposals on average, fill = proposals given / asked).

Cost of a target cycle (what CycleRunner.cycle does: ONE target block with
m = min(k_top, max_new - 1) proposals):
    cost = P_{L-2}(m) + t_T(m + 1),    tokens = E[G] by (1),    s/token = cost / tokens
The target feeds exactly m + 1 tokens: its cache lacks only the last committed token.
A target alone feeds 1 token per cycle and commits 1.

P_i(n), the cost of level i producing n proposals for the level above (_propose):
- level 0, a model: n forwards of 1 token, the first of which also catches up on what
  the level above emitted last time; that is 2 tokens when all its previous n
  proposals were accepted (the last was never fed), else 1:
      P_0(n) = (n - 1) t_0(1) + (1 - pi) t_0(1) + pi t_0(2),  pi = a_0^n
- level 0, a model-free drafter: one lookup, t_ng.
- level i > 0 runs blocks until it holds n tokens; each block asks level i - 1 for
  min(k_{i-1}, missing) proposals and the surplus of the last block is dropped. With
  r tokens still missing, C(r) = B(min(k, r)) + sum_g P(G = g) C(max(r - g, 0)),
  C(0) = 0, B(m) = P_{i-1}(m) + t_i(m + 1): a dynamic program over r = 1..n (exact
  under the model: no "n / E[G] blocks" approximation). The first block of a cycle
  feeds one catch-up token more with probability a_i^n, like level 0.

The sum over g needs no loop. rest[0] = 0, so with V(r) = sum_{g=1}^{min(k, r)} a^(g-1) C(r - g)
(the geometric part of P(G = g), g <= m, over the last k values):
    sum_g P(G = g) C(max(r - g, 0)) = (1 - a) V(r) + [r > k] a^k C(r - k - 1)
(for r <= k the block asks r, so its g = r + 1 term reads C(0) = 0), and V slides:
    V(r + 1) = C(r) + a V(r) - [r >= k] a^k C(r - k).
A level's cost for n is then O(n), and the blocks B(m) are min(k, n) distinct values (m = k
for every r >= k); the whole prediction costs O(L * n) arithmetic, n the longest draft.

Python work per logits row (`row`: warping, sampling, verifying; far more under sampling
than under greedy, OnlineCosts.row_seconds per row kind) is added per row a forward returns:
1 per draft forward, f m + 1 per verification of m proposals, none for a lookup. A
forward's own cost t_j(n) is the backend call alone (what the profile measures).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class ChainSpec:
    """A chain by names (cheapest first, target last) and draft lengths per non-target level."""

    names: tuple[str, ...]
    draft_lengths: tuple[int, ...] = ()

    def __str__(self) -> str:
        lengths = ",".join(map(str, self.draft_lengths))
        return " -> ".join(self.names) + (f" [{lengths}]" if lengths else "")


@dataclass(frozen=True)
class Prediction:
    seconds_per_token: float
    cycle_seconds: float
    tokens_per_cycle: float


def expected_tokens(a: float, m: int) -> float:
    """E[G] of equation (1): sum over g of P(G >= g) = a^0 + a^1 + ... + a^m."""
    a = min(max(a, 0.0), 1.0)
    total, term = 0.0, 1.0
    for _ in range(m + 1):
        total, term = total + term, term * a
    return total


def predict(
    spec: ChainSpec,
    cost: Callable[[str, float], float],
    rate: Callable[[str, str], float],
    fill: Callable[[str, str], float] = lambda proposer, verifier: 1.0,
    room: int | None = None,
    memo: dict | None = None,
    row: float = 0.0,
    lookups: frozenset[str] = frozenset(),
) -> Prediction:
    """Expected seconds per committed token of `spec` (derivation in the module docstring).

    `memo`: shared by calls with the same cost/rate/fill functions, so that a search
    over draft lengths computes each lower level's P_i(n) once (keyed by the levels and
    lengths it depends on). `lookups`: the model-free levels (a lookup costs cost(name, n)
    once, whatever n; no forward per token)."""
    names, ks = spec.names, spec.draft_lengths
    memo = {} if memo is None else memo
    top = len(names) - 1
    if top == 0:
        t = cost(names[0], 1) + row
        return Prediction(t, t, 1.0)
    acc = [rate(names[j], names[j + 1]) for j in range(top)]
    fills = [fill(names[j], names[j + 1]) for j in range(top)]

    def produce(i: int, n: int) -> float:
        """P_i(n): level i producing n proposals for level i + 1 (memoised)."""
        key = (names[: i + 2], ks[:i], n)
        value = memo.get(key)
        if value is None:
            value = memo[key] = _produce(i, n)
        return value

    def _produce(i: int, n: int) -> float:
        if i == 0:
            if names[0] in lookups:
                return cost(names[0], n)
            pi = acc[0] ** n
            return (n - 1) * cost(names[0], 1) + (1 - pi) * cost(names[0], 1) + pi * cost(names[0], 2) + n * row
        k, a, f = ks[i - 1], min(max(acc[i - 1], 0.0), 1.0), fills[i - 1]
        full = a**k  # P(G = k + 1): a block of k proposals all accepted
        # blocks[m]: B(m) of a block that is not the cycle's first, m = 1..min(k, n)
        blocks = [0.0] + [produce(i - 1, m) + cost(names[i], f * m + 1) + (f * m + 1) * row
                          for m in range(1, min(k, n) + 1)]
        rest = [0.0] * (n + 1)  # rest[r] = C(r): expected cost with r missing, not the first block
        window = after = 0.0  # V(r), and the sum over g that C(r) adds to its block
        for r in range(1, n + 1):
            window = rest[r - 1] + a * window - (full * rest[r - 1 - k] if r > k else 0.0)
            after = (1 - a) * window + (full * rest[r - k - 1] if r > k else 0.0)
            rest[r] = blocks[min(k, r)] + after
        m = min(k, n)
        first = produce(i - 1, m) + cost(names[i], f * m + 1 + acc[i] ** n) + (f * m + 1) * row
        return first + after

    m = ks[top - 1] if room is None else max(0, min(ks[top - 1], room - 1))
    if m == 0:
        t = cost(names[top], 1) + row
        return Prediction(t, t, 1.0)
    rows = fills[top - 1] * m + 1
    cycle = produce(top - 1, m) + cost(names[top], rows) + rows * row
    tokens = expected_tokens(acc[top - 1], m)
    return Prediction(cycle / tokens, cycle, tokens)


def closed_form_two_level(a: float, k: int, t_draft: Callable[[float], float], t_target: Callable[[float], float]) -> float:
    """The textbook 2-level number, for tests: (k t_d(1) + t_T(k + 1)) / E[G]
    (ignores the drafter's catch-up token, which predict() includes)."""
    return (k * t_draft(1) + t_target(k + 1)) / ((1 - a ** (k + 1)) / (1 - a) if a < 1 else k + 1)

