"""Cost profile: measurement with a cached prefix, interpolation, the JSON cache, online EMA."""

import json
import warnings

import pytest

from specrouter.backends.synthetic import SyntheticBackend
from specrouter.errors import InvalidParameterError
from specrouter.router.estimates.costs import (LONG_CONTEXT, PROFILED_CONTEXT, CostProfile, OnlineCosts, default_lookup_seconds,
                                     interpolate)
from specrouter.router.estimates.profiler import CONTEXT_NS, PROFILE_NS, profile_batches, profile_model
from specrouter.router.estimates.profile_cache import load_or_profile, read_profile

from ..router_synth import linear


def model(tmp_path, name="m"):
    m = SyntheticBackend(name, latency=linear(0.01, 0.002))
    m.path = tmp_path / f"{name}.gguf"  # the cache key reads the file's size and mtime
    m.path.write_bytes(b"GGUF fake weights")
    m.n_threads = 2
    return m


def test_profile_measures_forward_over_n_tokens_after_a_prefix():
    m = SyntheticBackend("m", latency=linear(0.01, 0.002))
    table = profile_model(m, ns=(1, 4, 16), repeats=3, clock=lambda: m.simulated_seconds)
    assert table == pytest.approx({1: 0.012, 4: 0.018, 16: 0.042})
    assert m._kv == {}  # the profiling sequence is released


def test_interpolation_is_linear_between_and_beyond_measured_sizes():
    table = {1: 1.0, 2: 2.0, 4: 3.0, 8: 7.0}
    assert interpolate(table, 3) == pytest.approx(2.5)
    assert interpolate(table, 6) == pytest.approx(5.0)
    assert interpolate(table, 16) == pytest.approx(15.0)  # slope of the last segment
    assert interpolate(table, 1.5) == pytest.approx(1.5)  # fractional sizes (expected tokens fed)


def test_profile_cache_is_reused_then_refreshed_when_stale(tmp_path):
    m = model(tmp_path)
    clock = lambda: m.simulated_seconds  # noqa: E731
    first = load_or_profile([m], tmp_path / "profiles", repeats=1, progress=False, clock=clock)
    assert set(first.tables["m"]) == set(PROFILE_NS)
    calls = m.decode_calls
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a valid cache is read silently
        again = load_or_profile([m], tmp_path / "profiles", repeats=1, progress=False, clock=clock)
    assert m.decode_calls == calls and again.tables == first.tables
    m.path.write_bytes(b"GGUF other weights")  # another file under the same name: the cached profile is stale
    with pytest.warns(UserWarning, match=r"stale \(file changed\): re-profiling"):
        load_or_profile([m], tmp_path / "profiles", repeats=1, progress=False, clock=clock)
    assert m.decode_calls > calls


@pytest.mark.parametrize("content", ["{not json", '{"format": 1, "key": {}, "table": {"1": -3}}', "[]", ""])
def test_corrupt_profile_cache_is_reprofiled_with_a_warning(tmp_path, content):
    m = model(tmp_path)
    clock = lambda: m.simulated_seconds  # noqa: E731
    load_or_profile([m], tmp_path / "profiles", repeats=1, progress=False, clock=clock)
    file = tmp_path / "profiles" / "m-2t.json"
    file.write_text(content)
    with pytest.warns(UserWarning, match="is corrupt .*: re-profiling"):
        profile = load_or_profile([m], tmp_path / "profiles", repeats=1, progress=False, clock=clock)
    assert profile.seconds("m", 1) == pytest.approx(0.012)
    assert json.loads(file.read_text())["table"]["1"] == pytest.approx(0.012)  # repaired on disk


def test_online_costs_follow_a_slowdown_at_every_size():
    costs = OnlineCosts(CostProfile({"m": {1: 0.01, 8: 0.03}}))
    for _ in range(10):
        costs.observe("m", 1, 0.03)  # three times slower at n = 1 ...
    assert costs.seconds("m", 1) == pytest.approx(0.03, rel=0.05)
    assert costs.seconds("m", 8) == pytest.approx(0.09, rel=0.05)  # ... and seen at n = 8 too
    costs.observe("m", 8, 0.03)  # one observation moves an estimate by ALPHA only
    assert 0.03 < costs.seconds("m", 8) < 0.09


def test_batched_profile_times_one_call_over_b_sequences():
    """A batch of B sequences x n tokens is one call; its cost is what the backend reports
    for that call (synthetic: latency of all B x n tokens), and slots are released."""
    m = SyntheticBackend("m", latency=linear(0.01, 0.002))
    tables = profile_batches(m, batches=(2, 4), ns=(1, 4), repeats=2, clock=lambda: m.simulated_seconds)
    assert tables[2] == pytest.approx({1: 0.014, 4: 0.026}) and tables[4] == pytest.approx({1: 0.018, 4: 0.042})
    assert m.live_sequences == 0


def test_batched_cost_interpolates_over_batch_size_and_falls_back_to_total_tokens():
    profile = CostProfile({"m": {1: 0.010, 4: 0.016}}, batch_tables={"m": {4: {1: 0.020, 4: 0.060}}})
    assert profile.seconds("m", 4, batch=4) == pytest.approx(0.060)
    assert profile.seconds("m", 1, batch=2) == pytest.approx(0.010 + (0.020 - 0.010) / 3)  # between B = 1 and 4
    assert profile.seconds("m", 1, batch=8) == pytest.approx(0.020 + (0.020 - 0.010) / 3 * 4)  # beyond: last slope
    unbatched = CostProfile({"m": {1: 0.010, 4: 0.016}})
    assert unbatched.seconds("m", 1, batch=4) == pytest.approx(0.016)  # as 4 tokens of one sequence
    costs = OnlineCosts(profile)
    for _ in range(20):
        costs.observe("m", 16, 0.120, batch=4)  # batched calls twice as slow as profiled
    assert costs.seconds("m", 4, batch=4) == pytest.approx(0.120, rel=0.02)


def test_batch_profile_has_its_own_cache_file(tmp_path):
    m = model(tmp_path)
    clock = lambda: m.simulated_seconds  # noqa: E731
    first = load_or_profile([m], tmp_path / "profiles", repeats=1, progress=False, clock=clock)
    assert set(first.batch_tables["m"]) == {2, 4, 8}
    assert (tmp_path / "profiles" / "m-2t.batch.json").exists()
    calls = m.decode_calls
    again = load_or_profile([m], tmp_path / "profiles", repeats=1, progress=False, clock=clock)
    assert m.decode_calls == calls and again.batch_tables == first.batch_tables


def test_backends_without_native_batching_are_costed_as_a_loop(tmp_path):
    m = model(tmp_path)
    m.batches_natively = False  # as the torch backend: decode_batch is one call per sequence
    profile = load_or_profile([m], tmp_path / "profiles", repeats=1, progress=False, clock=lambda: m.simulated_seconds)
    assert profile.batch_tables == {} and not (tmp_path / "profiles" / "m-2t.batch.json").exists()
    assert profile.seconds("m", 4, batch=3) == pytest.approx(3 * profile.seconds("m", 4))


#: What scripts/torch_profile.py writes on a GPU machine (the GPU check): costs of models
#: that cannot be measured here, with what ran them.
GPU_PROFILE = {"device": {"name": "NVIDIA H200", "dtype": "bfloat16"}, "ngram_seconds": 2e-5,
               "settings": {"ks": [1, 2, 4, 8, 16, 32]},
               "models": {"m": {"1": 0.004, "2": 0.0041, "4": 0.0042, "8": 0.0045, "16": 0.005, "32": 0.006}}}


def test_a_saved_profile_is_read_back_as_written(tmp_path):
    measured = CostProfile({"a": {1: 0.01, 4: 0.02}}, {"ngram": 3e-5}, {"a": {2: {1: 0.015}}})
    (tmp_path / "p.json").write_text(json.dumps(measured.as_dict()))  # what `profile --json` writes
    again = read_profile(tmp_path / "p.json")
    lookups = {**default_lookup_seconds(), "ngram": 3e-5}  # drafters the file does not name keep their default
    assert (again.tables, again.batch_tables, again.lookup_seconds) == (measured.tables, measured.batch_tables, lookups)
    (tmp_path / "gpu.json").write_text(json.dumps(GPU_PROFILE))  # the format before lookups were named: still read
    gpu = read_profile(tmp_path / "gpu.json")
    assert gpu.seconds("m", 16) == 0.005 and gpu.seconds("m", 6) == pytest.approx(0.00435)
    assert gpu.lookup_seconds == {**default_lookup_seconds(), "ngram": 2e-5}


@pytest.mark.parametrize(("content", "problem"), [
    (None, "cannot read the profile"),
    ("{not json", "is not a cost profile (JSONDecodeError"),
    ('{"device": {}}', "is not a cost profile (KeyError: 'models')"),
    ('{"models": {}}', "is not a cost profile (ValueError: no model"),
    ('{"models": {"m": {"1": 0.01, "4": -1}}}', "is not a cost profile (ValueError: no model, an empty table or a cost"),
    ('{"models": {"m": {"one": 0.01}}}', "is not a cost profile (ValueError: invalid literal"),
    ('[1, 2]', "is not a cost profile (TypeError"),
])
def test_a_bad_profile_file_is_refused_with_what_was_expected(tmp_path, content, problem):
    file = tmp_path / "p.json"
    if content is not None:
        file.write_text(content)
    with pytest.raises(InvalidParameterError) as info:
        read_profile(file)
    assert str(info.value).startswith(f"{problem}" if content is None else f"{file} {problem}")


def test_given_costs_replace_measurement_for_the_models_they_name(tmp_path):
    m, other = model(tmp_path), model(tmp_path, "other")
    (tmp_path / "gpu.json").write_text(json.dumps(GPU_PROFILE))
    profile = load_or_profile([m, other], tmp_path / "profiles", repeats=1, progress=False,
                              clock=lambda: m.simulated_seconds + other.simulated_seconds,
                              given=read_profile(tmp_path / "gpu.json"))
    assert m.decode_calls == 0 and not (tmp_path / "profiles" / "m-2t.json").exists()  # nothing measured or cached
    assert profile.tables["m"] == {1: 0.004, 2: 0.0041, 4: 0.0042, 8: 0.0045, 16: 0.005, 32: 0.006}
    assert "m" not in profile.batch_tables  # not in the file: batched calls fall back to total tokens
    assert other.decode_calls > 0 and profile.seconds("other", 1) == pytest.approx(0.012)  # measured as usual


def test_a_cost_table_is_fitted_non_decreasing_by_pooling_the_dips():
    """Pool adjacent violators: each dip below a smaller size's cost is averaged with it
    until nothing decreases; the total is kept (a least-squares fit); a monotone table is
    returned as it is."""
    from specrouter.router.estimates.costs import nondecreasing

    assert nondecreasing({1: 4.0, 2: 1.0, 3: 1.0, 4: 2.0, 8: 5.0, 16: 3.0}) == {1: 2.0, 2: 2.0, 3: 2.0, 4: 2.0, 8: 4.0, 16: 4.0}
    assert nondecreasing({4: 2.0, 1: 1.0, 2: 1.0}) == {1: 1.0, 2: 1.0, 4: 2.0}
    assert nondecreasing({1: 3.0}) == {1: 3.0}
    profile = CostProfile({"a": {1: 0.03, 2: 0.02, 4: 0.05}}, {"ngram": 3e-5}, {"a": {8: {1: 0.2, 4: 0.1}}}, {"b"})
    fitted = profile.nondecreasing()
    assert fitted.tables == {"a": {1: 0.025, 2: 0.025, 4: 0.05}}
    assert fitted.batch_tables == {"a": {8: {1: 0.15000000000000002, 4: 0.15000000000000002}}}
    assert (fitted.lookup_seconds, fitted.looped) == (profile.lookup_seconds, profile.looped)
    assert profile.tables == {"a": {1: 0.03, 2: 0.02, 4: 0.05}}  # the measured profile is left as it was


def test_the_gpu_check_profile_script_writes_what_the_router_reads(tmp_path):
    """scripts/torch_profile.py as the GPU check runs it, cut down to a tiny model on the CPU."""
    pytest.importorskip("torch")
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[3] / "scripts" / "torch_profile.py"
    spec = importlib.util.spec_from_file_location("torch_profile", script)
    torch_profile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(torch_profile)
    out = tmp_path / "gpu_cost_profile.json"
    torch_profile.main(["--device", "cpu", "--dtype", "float32", "--tiny", "--models", "llama-3.2-1b",
                        "--ks", "1,2,4", "--prefix", "8", "--repeats", "1", "--out", str(out)])
    profile = read_profile(out)
    assert list(profile.tables) == ["llama-3.2-1b"] and set(profile.tables["llama-3.2-1b"]) == {1, 2, 4}
    assert all(s > 0 for s in profile.tables["llama-3.2-1b"].values())


def test_exact_kernels_keep_a_profile_of_their_own(tmp_path):
    """A model profiled with exact kernels (generate --exact) and with the default ones keeps
    both tables: switching modes re-measures neither, and neither overwrites the other."""
    from specrouter.backends.base import TimingKey

    default = model(tmp_path)
    exact = model(tmp_path)
    exact.latency = linear(0.02, 0.002)  # another cost curve for the same file
    exact.timing_key = lambda: TimingKey(exact.kind, exact.path, None, exact.n_threads, kernels="exact")
    folder = tmp_path / "profiles"
    first = load_or_profile([default], folder, repeats=1, progress=False, clock=lambda: default.simulated_seconds)
    second = load_or_profile([exact], folder, repeats=1, progress=False, clock=lambda: exact.simulated_seconds)
    assert (folder / "m-2t.json").exists() and (folder / "m-exact-2t.json").exists()
    assert second.seconds("m", 1) == pytest.approx(2 * first.seconds("m", 1), rel=0.2)
    calls = default.decode_calls
    again = load_or_profile([default], folder, repeats=1, progress=False, clock=lambda: default.simulated_seconds)
    assert default.decode_calls == calls and again.seconds("m", 1) == first.seconds("m", 1)


def test_another_thread_count_keeps_a_profile_of_its_own(tmp_path):
    """A model run with 1 thread (a fleet's replicas) and with 2 (the command line) keeps both
    tables: switching re-measures neither, and neither overwrites the other."""
    one, two = model(tmp_path), model(tmp_path)
    one.n_threads, two.latency = 1, linear(0.005, 0.001)  # two threads: another cost curve
    folder = tmp_path / "profiles"
    first = load_or_profile([one], folder, repeats=1, progress=False, clock=lambda: one.simulated_seconds)
    second = load_or_profile([two], folder, repeats=1, progress=False, clock=lambda: two.simulated_seconds)
    assert (folder / "m-1t.json").exists() and (folder / "m-2t.json").exists()
    assert second.seconds("m", 1) == pytest.approx(first.seconds("m", 1) / 2, rel=0.2)
    calls = one.decode_calls
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # read silently: not stale
        again = load_or_profile([one], folder, repeats=1, progress=False, clock=lambda: one.simulated_seconds)
    assert one.decode_calls == calls and again.tables == first.tables


def test_a_profile_measured_on_one_node_is_installed_on_another_only_where_missing(tmp_path):
    import threading

    from specrouter.router.estimates.profile_cache import folder_lock, install_profiles, profile_files

    m = SyntheticBackend("m", latency=linear(0.01, 0.002))
    first = tmp_path / "node-a"
    load_or_profile([m], first, repeats=1, progress=False, clock=lambda: m.simulated_seconds)
    files = profile_files(first, [m])
    assert sorted(files) == ["m.batch.json", "m.context.json", "m.json"]
    other = tmp_path / "node-b"
    other.mkdir()
    (other / "m.json").write_text("its own")
    assert install_profiles(other, {**files, "../escape.json": "x"}) == ["m.batch.json", "m.context.json",
                                                                         "escape.json"]
    assert (other / "m.json").read_text() == "its own" and not (tmp_path / "escape.json").exists()
    # A second process's measurement waits for the first's (the folder lock).
    entered = threading.Event()

    def take() -> None:
        with folder_lock(first):
            entered.set()

    with folder_lock(first):
        t = threading.Thread(target=take)
        t.start()
        assert not entered.wait(0.3)
    assert entered.wait(5)
    t.join()


class Attending(SyntheticBackend):
    """Every forward also costs 1 microsecond per token per cached token before it."""

    def decode(self, seq, tokens, pos, n_logits):
        out = super().decode(seq, tokens, pos, n_logits)
        self.simulated_seconds += 1e-6 * len(tokens) * pos
        return out


def test_the_context_table_times_the_forwards_again_after_a_long_context_and_is_cached(tmp_path):
    m = Attending("m", latency=linear(0.01, 0.002))
    folder = tmp_path / "p"
    profile = load_or_profile([m], folder, repeats=1, progress=False, clock=lambda: m.simulated_seconds, batches=())
    assert sorted(profile.context_tables["m"]) == list(CONTEXT_NS)
    for n in CONTEXT_NS:
        assert profile.context_seconds("m", n, 2048) == pytest.approx(1e-6 * n * (2048 - PROFILED_CONTEXT), rel=1e-9)
    assert (folder / "m.context.json").exists()
    calls = m.decode_calls
    again = load_or_profile([m], folder, repeats=1, progress=False, clock=lambda: m.simulated_seconds, batches=())
    assert m.decode_calls == calls and again.context_tables == profile.context_tables
    # A model whose context cannot hold LONG_CONTEXT + 32 tokens has no context table (its context costs nothing).
    short = SyntheticBackend("short", latency=linear(0.01, 0.002), n_ctx=LONG_CONTEXT)
    alone = load_or_profile([short], folder, repeats=1, progress=False, clock=lambda: short.simulated_seconds,
                            batches=())
    assert alone.context_tables == {} and not (folder / "short.context.json").exists()


def test_a_cache_timed_at_other_sizes_is_measured_again(tmp_path):
    """A profile cached before the profiled sizes changed lacks some of them: the router would
    interpolate where it reads a timing now, so it is measured again (context table too)."""
    m = model(tmp_path)
    m.n_ctx = LONG_CONTEXT + 2 * max(CONTEXT_NS)  # long enough for a context table
    clock = lambda: m.simulated_seconds  # noqa: E731
    load_or_profile([m], tmp_path / "profiles", repeats=1, progress=False, clock=clock, batches=())
    for name in ("m-2t.json", "m-2t.context.json"):
        file = tmp_path / "profiles" / name
        data = json.loads(file.read_text())
        del data["table"]["64"]
        file.write_text(json.dumps(data))
    calls = m.decode_calls
    with pytest.warns(UserWarning) as caught:
        again = load_or_profile([m], tmp_path / "profiles", repeats=1, progress=False, clock=clock, batches=())
    assert sorted(str(w.message).split("profiles/")[1] for w in caught) == [
        "m-2t.context.json is stale (not timed at 64 tokens): re-profiling",
        "m-2t.json is stale (not timed at 64 tokens): re-profiling"]
    assert m.decode_calls > calls and set(again.tables["m"]) == set(PROFILE_NS)
    assert set(again.context_tables["m"]) == set(CONTEXT_NS)
    assert "64" in json.loads((tmp_path / "profiles" / "m-2t.json").read_text())["table"]  # cached again
