"""A profile is trusted only when it can describe this machine: measurements taken while
other processes ran, with repeats that disagree or with a non-physical curve are used for
the run but not cached; a cached curve that is not physical is measured again; and a
cached profile that the timed forwards contradict is corrected and saved for the next
process (the busy-machine profile that once made auto 0.44-0.90x the target alone)."""

import copy
import json
import os
import warnings

import pytest

from specrouter.backends.synthetic import SyntheticBackend
from specrouter.router.config import DEFAULT_CONFIG
from specrouter.router.estimates.costs import CostProfile, OnlineCosts
from specrouter.router.estimates.profiler import PROFILE_NS, CpuSample, busy, implausible, unsteady
from specrouter.router.estimates.profile_cache import load_or_profile, save_refined

from ..router_synth import linear


def model(tmp_path, latency=linear(0.01, 0.002), name="m"):
    m = SyntheticBackend(name, latency=latency)
    m.path = tmp_path / f"{name}.gguf"
    m.path.write_bytes(b"GGUF fake weights")
    return m


def samples(*points):
    """A sampler returning the given CpuSamples in turn."""
    it = iter(points)
    return lambda: next(it)


def test_busy_counts_other_processes_only():
    start = CpuSample(wall=100.0, machine=1000.0, own=10.0)
    # 10 s on 2 cores: the machine did 14 CPU-seconds, 9 of them ours: others used 25%, the limit
    assert busy(start, CpuSample(110.0, 1014.0, 19.0), cores=2) is None
    assert busy(start, CpuSample(110.0, 1016.0, 19.0), cores=2) == \
        "other processes used 35% of the 2 cores while it was timed"
    assert busy(start, CpuSample(110.0, 1020.0, 30.0), cores=2) is None  # all of it ours
    assert busy(CpuSample(0.0, None, 0.0), CpuSample(10.0, None, 5.0), cores=2) is None  # no counters: no verdict


def test_a_curve_or_repeats_that_cannot_describe_a_forward_are_named():
    assert implausible({1: 0.07, 4: 0.1, 16: 0.23, 32: 0.44}) is None
    # real curves are jagged between larger sizes (an fp32 torch 1.5B: 1,120 ms at 12, 663 at 16)
    assert implausible({1: 0.327, 8: 0.889, 12: 1.120, 16: 0.663, 32: 0.918}) is None
    assert implausible({1: 0.07, 4: 0.1, 16: 0.05}) == "16 tokens cost 50.0 ms, less than 1 (70.0 ms)"
    assert unsteady({1: [0.07, 0.071, 0.069], 4: [0.1, 0.1, 0.11]}) is None
    assert unsteady({1: [0.07, 0.2, 0.07], 4: [0.1, 0.3, 0.1]}) == "repeats of one size differ by 2.93x (median over sizes)"


def test_a_profile_timed_on_a_busy_machine_is_used_but_not_cached(tmp_path):
    m = model(tmp_path)
    cores = os.cpu_count() or 1
    # 10 s of profiling, 2 CPU-seconds ours, other processes half of every core
    loaded = samples(*[CpuSample(0.0, 0.0, 0.0), CpuSample(10.0, 2.0 + 0.5 * 10 * cores, 2.0)] * 2)  # table, context
    with pytest.warns(UserWarning) as caught:
        profile = load_or_profile([m], tmp_path / "p", repeats=1, progress=False, clock=lambda: m.simulated_seconds,
                                  batches=(), sample=loaded)
    assert [str(w.message) for w in caught] == [
        f"the {what} of m is used for this run only, not cached: other processes used 50% of the {cores} cores "
        "while it was timed" for what in ("profile", "context table")]
    assert profile.tables["m"][1] == pytest.approx(0.012) and profile.context_tables["m"][1] == pytest.approx(0.012)
    assert not (tmp_path / "p" / "m.json").exists() and not (tmp_path / "p" / "m.context.json").exists()


def test_repeats_that_disagree_are_not_cached(tmp_path):
    m = model(tmp_path)
    # A machine whose speed moves while it is profiled: 3x slower until the first sweep
    # over the sizes is done (the prefix's forward, the warm-up's, one per size), then not.
    slow = iter([3] * (2 + len(PROFILE_NS)))
    m.latency = lambda n: (0.01 + 0.002 * n) * next(slow, 1)
    with pytest.warns(UserWarning, match="not cached: repeats of one size differ by 3.00x"):
        load_or_profile([m], tmp_path / "p", repeats=3, progress=False, clock=lambda: m.simulated_seconds, batches=())
    assert not (tmp_path / "p" / "m.json").exists()


def test_a_cached_curve_that_is_not_physical_is_measured_again(tmp_path):
    m = model(tmp_path)
    clock = lambda: m.simulated_seconds  # noqa: E731
    load_or_profile([m], tmp_path / "p", repeats=1, progress=False, clock=clock, batches=())
    file = tmp_path / "p" / "m.json"
    data = json.loads(file.read_text())
    data["table"]["32"] = data["table"]["1"] / 10
    file.write_text(json.dumps(data))
    calls = m.decode_calls
    with pytest.warns(UserWarning, match=r"m.json is not physical \(32 tokens cost 1.2 ms, less than 1 \(12.0 ms\)"):
        again = load_or_profile([m], tmp_path / "p", repeats=1, progress=False, clock=clock, batches=())
    assert m.decode_calls > calls and again.tables["m"][32] == pytest.approx(0.074)


def test_a_profile_the_timed_forwards_contradict_is_refitted_at_once_and_saved(tmp_path):
    """The cached profile held 2.1 s for 1 token and 3.0 s for 32 (measured while other work
    ran); the forwards take 71 ms + 12 ms a token. Its first forward, ~30x faster than
    profiled, replaces the profile at once by the forwards timed, and each new size timed
    refits it; the store saves it, and the next process reads it without measuring."""
    m = model(tmp_path, latency=linear(0.059, 0.012))
    clock = lambda: m.simulated_seconds  # noqa: E731
    load_or_profile([m], tmp_path / "p", repeats=1, progress=False, clock=clock, batches=())
    file = tmp_path / "p" / "m.json"
    data = json.loads(file.read_text())
    data["table"] = {n: 2.1 + (3.0 - 2.1) * (int(n) - 1) / 31 for n in data["table"]}
    file.write_text(json.dumps(data))
    costs = OnlineCosts(load_or_profile([m], tmp_path / "p", repeats=1, progress=False, clock=clock, batches=()))
    assert "m" in costs.profile.context_tables
    costs.observe("m", 1, m.latency(1))
    assert 0 < costs.refitted["m"] < 1 / DEFAULT_CONFIG.early_disagree  # the profile was ~30x too slow
    assert "m" not in costs.profile.context_tables  # timed against the table that was wrong
    # One size timed: t(n) = t(1) n, the most a curve whose cost per token never grows allows
    assert costs.seconds("m", 1) == pytest.approx(0.071) and costs.seconds("m", 4) == pytest.approx(0.284)
    for n in (1, 4):
        costs.observe("m", n, m.latency(n))  # 4 is a new size: refitted again
    assert costs.refitted["m"] == pytest.approx(0.071 / 2.1)  # the factor it was off by, as first found
    assert costs.seconds("m", 1) == pytest.approx(0.071) and costs.seconds("m", 32) == pytest.approx(0.443)
    assert save_refined(costs, [m], tmp_path / "p") == costs.refitted
    calls = m.decode_calls
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the saved table is valid, and read silently
        fixed = load_or_profile([m], tmp_path / "p", repeats=1, progress=False, clock=clock, batches=())
    assert m.decode_calls == calls and fixed.seconds("m", 8) == pytest.approx(0.155)


def test_a_refit_prices_the_sizes_not_timed_toward_running_the_target_alone():
    """A busy profile (2.1 s at 1 token) of a forward whose curve is concave (the q4 1.5B on
    a fast EPYC, ms: 26 at 1 token, 70 at 4, 137 at 16, 165 at 20, 206 at 24, 710 for a prefill
    of 118).
    Timed only at large sizes, the refit prices a size below them at t(m) n / m (no more
    than it costs: a line through the large sizes extended down put one token at ~90 ms,
    and drafting with a model looked worth it); between sizes timed, linearly; above, on
    the line through the two largest (no less than a concave curve costs). A new size
    timed is taken up at once."""
    curve = {1: 0.026, 4: 0.070, 16: 0.137, 20: 0.165, 24: 0.206, 118: 0.710}
    busy = {n: 2.1 + 0.9 * (n - 1) / 31 for n in (1, 2, 4, 8, 16, 24, 32, 48, 64)}
    costs = OnlineCosts(CostProfile({"m": busy}))
    costs.observe("m", 118, curve[118])  # the prompt's prefill, ~8x faster than profiled
    assert costs.refitted["m"] == pytest.approx(curve[118] / busy[64])  # past the sizes profiled: the largest
    assert costs.seconds("m", 1) == pytest.approx(curve[118] / 118) and curve[118] / 118 < curve[1]
    costs.observe("m", 24, curve[24])
    costs.observe("m", 20, curve[20])
    assert costs.seconds("m", 1) == pytest.approx(curve[20] / 20) and curve[20] / 20 < curve[1]
    assert costs.seconds("m", 16) == pytest.approx(curve[20] * 16 / 20) and curve[20] * 16 / 20 < curve[16]
    assert costs.seconds("m", 64) == pytest.approx(curve[24] + (curve[118] - curve[24]) * 40 / 94)
    costs.observe("m", 1, curve[1])  # the target alone ran: its single forward is timed
    assert costs.seconds("m", 1) == pytest.approx(curve[1])
    assert costs.seconds("m", 4) == pytest.approx(curve[1] + (curve[20] - curve[1]) * 3 / 19)


def test_a_long_prefill_is_fast_against_the_profiles_line_extended_not_against_the_profile():
    """A sound profile whose last two sizes are a tile apart (a forward of 64 tokens twice one
    of 48): extended past 64, its line prices a prefill of 1,000 tokens at ~30 s, which the
    machine runs in 4. That is no sign of a busy profile (a forward of more tokens never
    costs less than the largest size profiled, and this one costs 4x that): nothing is refitted."""
    table = {1: 0.02, 16: 0.1, 48: 0.5, 64: 1.0}
    costs = OnlineCosts(CostProfile({"m": table}))
    assert costs.seconds("m", 1000) > 7 * 4.0
    costs.observe("m", 1000, 4.0)
    assert costs.refitted == {} and costs.profile.tables["m"] == table
    costs.observe("m", 1000, 0.2)  # but under a fifth of the largest size's time: timed busy
    assert costs.refitted["m"] == pytest.approx(0.2)


def test_a_refit_replaces_the_routers_copy_never_the_profile_it_was_given(tmp_path):
    """A simulator prices its machine with the profile it hands the router (sim/simulate.py),
    and routers may share one: the router's refit must not move it."""
    m = model(tmp_path)
    given = CostProfile({"m": {1: 30 * m.latency(1), 16: 30 * m.latency(16)}}, batch_tables={"m": {2: {1: 1.0}}},
                        context_tables={"m": {1: 40 * m.latency(1), 16: 40 * m.latency(16)}})
    before = copy.deepcopy(given)
    costs = OnlineCosts(given)
    for n in (1, 16, 1):
        costs.observe("m", n, m.latency(n))
    assert "m" in costs.refitted and costs.seconds("m", 1) == pytest.approx(m.latency(1), rel=0.05)
    assert given == before and "m" not in costs.profile.context_tables and "m" not in costs.profile.batch_tables


def test_a_profile_off_by_less_than_the_early_margin_waits_for_more_forwards(tmp_path):
    """3x too slow: not refitted at the EARLY_OBSERVED-th forward, but at the MIN_OBSERVED-th;
    one slow first forward (10x: weights paged in) does not trigger the early refit."""
    m = model(tmp_path)
    costs = OnlineCosts(CostProfile({"m": {1: 3 * m.latency(1), 16: 3 * m.latency(16)}}))
    for i, n in enumerate((1, 16, 1, 16, 1, 16, 1, 16)):
        assert costs.refitted == {}, i
        costs.observe("m", n, m.latency(n))
    assert 1 / DEFAULT_CONFIG.early_disagree < costs.refitted["m"] < 1 / DEFAULT_CONFIG.disagree
    costs = OnlineCosts(CostProfile({"m": {1: m.latency(1), 16: m.latency(16)}}))
    for i, n in enumerate((1, 16, 1)):
        costs.observe("m", n, m.latency(n) * (10 if i == 0 else 1))
    assert costs.refitted == {}


def test_a_sound_profile_is_kept(tmp_path):
    m = model(tmp_path)
    costs = OnlineCosts(CostProfile({"m": {1: 0.012, 16: 0.042}}))
    for n in (1, 16) * 6:
        costs.observe("m", n, m.latency(n) * 1.5)  # a machine 50% slower today: within DISAGREE
    assert costs.refitted == {} and costs.profile.tables["m"] == {1: 0.012, 16: 0.042}
    assert save_refined(costs, [m], tmp_path / "p") == {}
