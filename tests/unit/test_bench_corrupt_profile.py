"""The router benchmark's busy-profile check (`--corrupt-profile`) must hand the router the busy
profile: a cache the profiler finds stale is measured again, and the check then tests nothing
(2026-12-05: the busy table lacked the sizes 48 and 64 the profiler had come to time)."""

from __future__ import annotations

import warnings

import pytest

from benchmarks.chains import busy_seconds, corrupt_target_profile
from specrouter.backends.synthetic import SyntheticBackend
from specrouter.router.estimates.profiler import PROFILE_NS
from specrouter.router.estimates.profile_cache import load_or_profile

from .router_synth import linear


def test_the_busy_profile_is_what_the_router_reads(tmp_path):
    m = SyntheticBackend("m", latency=linear(0.01, 0.002))
    m.path = tmp_path / "m.gguf"
    m.path.write_bytes(b"GGUF fake weights")
    clock = lambda: m.simulated_seconds  # noqa: E731
    load_or_profile([m], tmp_path / "p", repeats=1, progress=False, clock=clock, batches=())
    corrupt_target_profile(m, tmp_path / "p")
    calls = m.decode_calls
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # read as it is: not stale, not corrupt, physical
        profile = load_or_profile([m], tmp_path / "p", repeats=1, progress=False, clock=clock, batches=())
    assert m.decode_calls == calls
    assert profile.tables["m"] == pytest.approx({n: busy_seconds(n) for n in PROFILE_NS})
    assert profile.tables["m"][1] == pytest.approx(2.1) and profile.tables["m"][32] == pytest.approx(3.0)
