"""`specrouter simulate` on a synthetic trace: the replay on a profile file and on a
roofline prints (and writes) what predict() computes; bad input is one clear line."""

import json

import pytest
from click.testing import CliRunner

from specrouter.backends.synthetic import SyntheticBackend
from specrouter.cli import main
from specrouter.cli_sim import read_prompts
from specrouter.errors import InvalidParameterError
from specrouter.router.estimates.profile_cache import read_profile
from specrouter.sim.roofline import device, roofline_profile
from specrouter.sim.simulate import predict
from specrouter.sim.trace import Trace, record

from .test_simulate import CHEAP, models, profile, prompts


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sim")
    p = profile(CHEAP)
    target, draft = models(p)
    record(target, [draft], prompts(), max_tokens=30).save(folder / "trace.json")
    (folder / "profile.json").write_text(json.dumps(p.as_dict()))
    return folder


def invoke(*args):
    return CliRunner().invoke(main, ["simulate", *map(str, args)])


def test_a_replay_on_a_profile_prints_and_writes_what_predict_computes(files):
    result = invoke(files / "trace.json", "--profile", files / "profile.json", "--json", files / "out.json")
    assert result.exit_code == 0, result.output
    written = json.loads((files / "out.json").read_text())
    expected = predict(Trace.load(files / "trace.json"), read_profile(files / "profile.json"))
    assert written["speedup"] == expected.speedup and written["best"] == expected.best
    auto = next(line for line in result.output.splitlines() if line.startswith("auto "))
    assert auto.split()[1:] == [f"{expected.speedup['auto'][g]:.3f}" for g in ("even", "odd", "all")]


def test_host_ms_prices_the_engines_own_work_in_a_replay(files):
    from specrouter.sim.host import HostCosts

    result = invoke(files / "trace.json", "--profile", files / "profile.json", "--host-ms", "0.5,0.1,0.8",
                    "--json", files / "host.json")
    assert result.exit_code == 0, result.output
    host = HostCosts(per_call=0.5e-3, per_row=0.1e-3, per_choice=0.8e-3)
    trace, measured = Trace.load(files / "trace.json"), read_profile(files / "profile.json")
    expected = predict(trace, measured, host=host)
    written = json.loads((files / "host.json").read_text())
    assert written["speedup"] == expected.speedup and written["host"] == host.label()
    assert expected.speedup != predict(trace, measured).speedup  # the host work moved the replay
    assert host.label() in result.output


def test_router_config_tunes_the_replayed_router(files):
    from specrouter.router.config import DEFAULT_CONFIG

    (files / "router.toml").write_text("explore_fraction = 0.0\ndraft_grid = [1]\nlookup_grid = [1]\n")
    result = invoke(files / "trace.json", "--profile", files / "profile.json", "--router-config", files / "router.toml",
                    "--json", files / "tuned.json")
    assert result.exit_code == 0, result.output
    trace, measured = Trace.load(files / "trace.json"), read_profile(files / "profile.json")
    config = DEFAULT_CONFIG.replace(explore_fraction=0.0, draft_grid=(1,), lookup_grid=(1,))
    expected = predict(trace, measured, config=config)
    assert json.loads((files / "tuned.json").read_text())["speedup"] == expected.speedup
    assert expected.speedup["auto"] != predict(trace, measured).speedup["auto"]  # the tuning moved auto


def test_a_profile_file_is_replayed_fitted_non_decreasing(files):
    """A measured table whose n = 1 median sits above larger sizes' (a GPU's launch-bound
    jitter) is pooled before the replay: the replay equals predict() on the fitted profile,
    not on the dip that discounts every chain."""
    data = json.loads((files / "profile.json").read_text())
    sizes = sorted(data["models"]["target"], key=int)
    data["models"]["target"][sizes[0]] = 3 * data["models"]["target"][sizes[2]]
    (files / "dip.json").write_text(json.dumps(data))
    result = invoke(files / "trace.json", "--profile", files / "dip.json", "--json", files / "dip-out.json")
    assert result.exit_code == 0, result.output
    assert "fitted non-decreasing" in result.output
    trace, measured = Trace.load(files / "trace.json"), read_profile(files / "dip.json")
    fitted = predict(trace, measured.nondecreasing())
    assert json.loads((files / "dip-out.json").read_text())["speedup"] == fitted.speedup
    assert fitted.speedup != predict(trace, measured).speedup


def test_a_roofline_replay_is_labelled_a_simulation_and_uses_the_devices_costs(files):
    result = invoke(files / "trace.json", "--roofline", "h200", "--overhead-ms", "1", "--json", files / "r.json")
    assert result.exit_code == 0, result.output
    assert "SIMULATION" in result.output and "H200" in result.output
    trace = Trace.load(files / "trace.json")
    expected = predict(trace, roofline_profile(device("h200", 1.0), trace.params_b))
    assert json.loads((files / "r.json").read_text())["speedup"] == expected.speedup


def test_a_batch_replay_prints_and_writes_what_predict_batches_computes(files):
    from specrouter.sim.batched import predict_batches

    result = invoke(files / "trace.json", "--roofline", "h100", "--batch", "1,4", "--json", files / "b.json")
    assert result.exit_code == 0, result.output
    trace = Trace.load(files / "trace.json")
    expected = predict_batches(trace, roofline_profile(device("h100"), trace.params_b), (1, 4))
    written = json.loads((files / "b.json").read_text())
    assert written["speedup"] == {str(b): v for b, v in expected.speedup.items()}
    assert written["best"] == {str(b): v for b, v in expected.best.items()}
    auto = next(line for line in result.output.splitlines() if line.startswith("auto "))
    assert auto.split()[1:] == [f"{expected.speedup[b]['auto']:.3f}" for b in (1, 4)]
    best = next(line for line in result.output.splitlines() if line.startswith("best 2-level "))
    assert best.split()[2:4] == [f"{expected.speedup[b][expected.best[b]['best 2-level']]:.3f}" for b in (1, 4)]
    assert "SIMULATION" in result.output


@pytest.mark.parametrize(("args", "message"), [
    ([], "give one of --record PROMPTS, --profile FILE, --roofline DEVICE or --validate"),
    (["--roofline", "h100", "--batch", "1,x"], "--batch takes comma-separated whole numbers, got '1,x'"),
    (["--roofline", "h100", "--batch", "0,8"], "--batch sizes must be >= 1, got '0,8'"),
    (["--validate", "--batch", "8"], "--batch goes with --profile or --roofline"),
    (["--roofline", "h100", "--profile", "p.json"], "give one of"),
    (["--profile", "p.json", "--overhead-ms", "2"], "--overhead-ms goes with --roofline"),
    (["--roofline", "h100", "--bytes-per-param", "0"], "--bytes-per-param must be > 0"),
    (["--record", "p.jsonl", "--branch-tokens", "0"], "--branch-tokens must be >= 1, got 0"),
    (["--roofline", "h100", "--host-ms", "0.1"], "host costs must be 'CALL_MS,ROW_MS'"),
    (["--roofline", "h100", "--host-ms", "0.1,x"], "host costs must be 'CALL_MS,ROW_MS'"),
    (["--roofline", "h100", "--host-ms", "0.1,-1"], "host per_row must be seconds in [0, 1), got -0.001"),
    (["--record", "p.jsonl", "--host-ms", "0.1,0.1"], "--host-ms goes with a replay"),
])
def test_bad_options_are_one_clear_line(files, args, message):
    result = invoke(files / "trace.json", *args)
    assert result.exit_code == 2 and f"error: {message}" in result.output and "Traceback" not in result.output


def test_a_file_that_is_not_a_trace_is_refused(files):
    (files / "bad.json").write_text("[1, 2]")
    result = invoke(files / "bad.json", "--roofline", "h100")
    assert result.exit_code == 2 and "is not a trace" in result.output


def test_prompts_are_json_lines_of_text_or_chat_with_ids_and_groups(tmp_path):
    target = SyntheticBackend("t", vocab=30)
    file = tmp_path / "p.jsonl"
    file.write_text('{"prompt": "abc", "id": "x", "group": "g"}\n\n{"messages": [{"role": "user", "content": "hi"}]}\n')
    (g1, id1, tokens1), (g2, id2, tokens2) = read_prompts(file, target)
    assert (g1, id1, tokens1) == ("g", "x", [0, 1, 2])
    assert (g2, id2) == ("all", "3") and len(tokens2) > 2
    for line, message in [('{"prompt": "a", "messages": []}', "line 1: one of"), ("[1]", "line 1: one of"),
                          ("{not json", "line 1: Expecting"), ('{"prompt": ""}', "line 1: the prompt is empty")]:
        file.write_text(line + "\n")
        with pytest.raises(InvalidParameterError, match=message):
            read_prompts(file, target)
    file.write_text("\n")
    with pytest.raises(InvalidParameterError, match="holds no prompt"):
        read_prompts(file, target)


def test_the_benchmarks_report_shows_each_profiles_speedups_and_best_chains(files):
    from benchmarks.simulation import PHASES, markdown, predict_all, predict_batched
    from specrouter.sim.batched import predict_batches

    trace = Trace.load(files / "trace.json")
    profiles = {"synthetic": read_profile(files / "profile.json")}
    result = {"machine": {"date": "d", "cpu": "c", "cores": 2, "llama_cpp_python": "v", "command": "x"},
              "trace": {"requests": 4, "tokens": 120, "max_tokens": 30, "target": "target", "drafts": ["draft"],
                        "branch_tokens": 24, "note": ""},
              "phase_seconds": {}, "validation": None, "predictions": predict_all(trace, profiles),
              "step_models": "in-phase",
              "batches": {"synthetic: SIMULATION": predict_batched(trace, profiles["synthetic"], (1, 4), PHASES["in-phase"])}}
    md = markdown(json.loads(json.dumps(result)))  # as a saved result renders
    expected = predict(trace, profiles["synthetic"])
    best3 = expected.best["best 3-level"]
    assert (f"| best 3-level | {expected.speedup[best3['even']]['even']:.3f} | "
            f"{expected.speedup[best3['odd']]['odd']:.3f} | {expected.speedup[best3['all']]['all']:.3f} |") in md
    assert f"| auto | {expected.speedup['auto']['even']:.3f} |" in md
    batched = predict_batches(trace, profiles["synthetic"], (1, 4))
    best2 = [batched.best[b]["best 2-level"] for b in (1, 4)]
    assert (f"| best 2-level | {batched.speedup[1][best2[0]]:.3f} ({best2[0]}) | "
            f"{batched.speedup[4][best2[1]]:.3f} ({best2[1]}) |") in md
    assert f"| auto | {batched.speedup[1]['auto']:.3f} | {batched.speedup[4]['auto']:.3f} |" in md
    assert "calling per step the model most sequences wait on and any whose sequences waited a step" in md
