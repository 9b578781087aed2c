"""The machine's profile timed in rounds between other work (sim/machine.py): the median of
every size over the rounds, so a slow stretch moves an entry by one sample of many."""

import pytest

from specrouter.backends.synthetic import SyntheticBackend
from specrouter.router.estimates.costs import CostProfile, nondecreasing
from specrouter.router.estimates.profiler import CONTEXT_NS
from specrouter.sim.machine import InterleavedProfile

NS = (1, 2, 4, 8)


def drifting(name: str, slow: list[float], n_ctx: int = 4096, dip: bool = False) -> SyntheticBackend:
    """A model whose forward of n tokens costs slow[0] * (10 ms + 2 ms per token) (with
    `dip`, 2 tokens cost less than 1, as a jagged kernel curve can)."""
    def latency(n: int) -> float:
        return slow[0] * (0.003 if dip and n == 2 else 0.010 + 0.002 * n)
    return SyntheticBackend(name, latency=latency, n_ctx=n_ctx)


def test_the_profile_is_the_median_of_each_size_over_the_rounds():
    slow = [1.0]
    a, b = drifting("a", slow), drifting("b", slow, n_ctx=512)
    machine = InterleavedProfile([a, b], NS, clock=lambda: a.simulated_seconds + b.simulated_seconds)
    with pytest.raises(ValueError, match="no round timed yet"):
        machine.profile()
    for factor in (1.0, 3.0, 1.0):  # a slow stretch during one round: outvoted
        slow[0] = factor
        machine.round()
    assert machine.rounds == 3
    p = machine.profile()
    assert p.tables == {m: pytest.approx({n: 0.010 + 0.002 * n for n in NS}, rel=1e-12) for m in ("a", "b")}
    # The context sizes after LONG_CONTEXT tokens where the model's context holds them (this
    # model's cost does not grow with its context: the same costs), none where it does not.
    assert p.context_tables == {"a": pytest.approx({n: 0.010 + 0.002 * n for n in CONTEXT_NS}, rel=1e-12)}
    for factor in (3.0, 3.0):  # the machine stays slow: most rounds say so
        slow[0] = factor
        machine.round()
    assert machine.profile().tables["a"] == pytest.approx({n: 3 * (0.010 + 0.002 * n) for n in NS}, rel=1e-12)
    assert a._kv == {} and b._kv == {}  # no sequence left behind for the work in between
    assert isinstance(p, CostProfile) and p.batch_tables == {}


def test_a_dip_in_the_curve_is_fitted_non_decreasing():
    m = drifting("m", [1.0], dip=True)
    machine = InterleavedProfile([m], NS, clock=lambda: m.simulated_seconds)
    machine.round()
    raw = {1: 0.012, 2: 0.003, 4: 0.018, 8: 0.026}
    assert machine.profile().tables["m"] == pytest.approx(nondecreasing(raw), rel=1e-12)
    assert machine.profile().tables["m"][1] == machine.profile().tables["m"][2] == pytest.approx(0.0075)
