"""The operations every kind of logits rows provides, and the constants their warping shares.

A backend hands the cascade its rows as one array (n_logits, n_vocab): numpy on the host
(llama.cpp, the synthetic and replay backends, torch on a CPU), or a torch tensor left on
its device (a torch model on a GPU, where copying a verification's rows of a 152k vocabulary
to the host costs more than the forward). The cascade never asks which: it calls
`rows.ops_of(rows)`, which returns the RowOps of the rows' kind, and every operation on rows
goes through it. What crosses to the host per cycle is then only what decides the control
flow: token ids (argmax, a sample), and per proposal the two probabilities of the acceptance
test. The uniforms stay on the host's Generator, drawn in the same order by both kinds, so a
seeded run draws the same numbers whichever kind its levels produce (the tokens can still
differ where float rounding moves a sample across a CDF boundary).

Contracts, the same for every kind (the numpy one is the reference; tests run both on the
same inputs):
- `argmax(rows)`: each row's argmax, the first index on ties.
- `warp(rows, params)`: each row's warped distribution (rows_numpy.warp's rules: exponentials
  in float32 for float32 logits, normalised in float64), as a list of rows.
- `sample(probs, u)`: inverse-CDF sampling of one row with the uniform u in [0, 1): the
  first index whose cumulative mass exceeds u * total (the last index with mass at most).
- `at(rows, tokens)`: rows[j][tokens[j]] as floats, 0.0 past a row's end (padded vocabularies).
- `residual(p, q, token)`: norm(max(p - q, 0)), q one-hot(token) when None (cascade/verify.py).
- `overlap(ps, qs)`: per pair of rows sum(min(p, q)) over their shared range: 1 - TV(p, q),
  the acceptance rate of speculative sampling.
- `confidence(row)`: the top probability of a logits row's softmax.
- `host(rows)`: the rows on the host as numpy (a 2-D array, or a list of host rows as
  given): what penalties, grammars and logprobs read. Dtypes are kept.
- `one_hot(rows, tokens, values)`: new rows of the kind, shape, dtype (and device) of the 2-D
  `rows`, 0 but row j's tokens[j], which holds values[j] (rounded to the dtype); `rows` is
  left as it is. What a backend that stands in another's values (backends/forced.py) builds.

A second operand of another kind (a llama.cpp draft's q under a torch target) is converted
to the first's kind.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

#: Rows as a backend returns them (2-D) or as the cascade keeps them (a list of 1-D rows).
Rows = Any

#: Top-p keeps tokens until their cumulative mass reaches top_p less this (float rounding of the sum).
TOP_P_MARGIN = 1e-12
#: Above this 1/temperature the scaled logits leave float32's range: float64 is used.
FLOAT32_MAX_INVERSE_TEMPERATURE = 1e30


class WarpParams(Protocol):
    """What warping reads of the sampling parameters (cascade/params.py: SamplingParams).
    temperature 0 is greedy; top_k 0, top_p 1 and min_p 0 disable those filters."""

    temperature: float
    top_k: int
    top_p: float
    min_p: float

    @property
    def greedy(self) -> bool: ...


class RowOps(Protocol):
    def argmax(self, rows: Rows) -> list[int]: ...

    def warp(self, rows: Rows, params: WarpParams) -> list: ...

    def sample(self, probs: Any, u: float) -> int: ...

    def at(self, rows: Rows, tokens: Sequence[int]) -> list[float]: ...

    def residual(self, p: Any, q: Any | None, token: int) -> Any: ...

    def overlap(self, ps: Rows, qs: Rows) -> list[float]: ...

    def confidence(self, row: Any) -> float: ...

    def host(self, rows: Rows) -> Any: ...

    def one_hot(self, rows: Rows, tokens: Sequence[int], values: Sequence[float]) -> Rows: ...
