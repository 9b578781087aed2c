"""Server configuration: TOML file, CLI flags over it, defaults, and bad values."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from specrouter.cli import main
from specrouter.engine.batch import Speculation
from specrouter.errors import InvalidParameterError
from specrouter.server import run
from specrouter.server.config import DEFAULT_MODELS, ServeConfig, load_config

SMALL, TARGET = DEFAULT_MODELS

TOML = f"""
models = ["{SMALL}", "{TARGET}"]
chain = "ngram,{SMALL},{TARGET}"
draft_lengths = [3, 2]
max_batch = 2
max_queue = 5
request_timeout = 30
port = 9000
api_key = "from-file"
"""


def test_defaults_serve_the_default_pool_on_loopback():
    c = load_config()
    assert (c.models, c.served, c.chain, c.host, c.port, c.api_key) == (DEFAULT_MODELS, TARGET, "auto", "127.0.0.1",
                                                                      8000, None)
    assert c.default_speculation() == Speculation()
    assert c.levels == ["ngram", "suffix", SMALL, TARGET]


def test_flags_override_the_file(tmp_path):
    path = tmp_path / "serve.toml"
    path.write_text(TOML)
    c = load_config(path, port=9100, max_queue=None)
    assert (c.port, c.max_queue, c.max_batch, c.request_timeout, c.api_key) == (9100, 5, 2, 30.0, "from-file")
    assert c.default_speculation() == Speculation("chain", ("ngram", SMALL, TARGET), (3, 2))


@pytest.mark.parametrize("values,message", [
    ({"max_batch": 0}, "max_batch: Input should be greater than or equal to 1"),
    ({"prefix_cache": -1}, "prefix_cache: Input should be greater than or equal to 0"),
    ({"prefix_cache": "some"}, "prefix_cache: Input should be a valid integer"),
    ({"colour": "red"}, "colour: Extra inputs are not permitted"),
    ({"chain": f"{TARGET},{SMALL}"}, "must end at the served model"),
    ({"chain": f"missing,{TARGET}"}, "must use levels of"),
    ({"draft_lengths": [2]}, "draft_lengths needs an explicit chain"),
    ({"port": 70000}, "port: Input should be less than or equal to 65535"),
    ({"lookup": "nope"}, "lookup: Value error, lookup must be one of ngram, suffix, got 'nope'"),
])
def test_bad_values_name_the_field(values, message):
    with pytest.raises(InvalidParameterError, match="invalid server configuration") as info:
        load_config(**values)
    assert message in str(info.value)


def test_a_target_outside_the_models_joins_the_pool_last():
    c = load_config(target="other")
    assert c.served == "other" and c.models == [SMALL, TARGET, "other"]
    assert load_config(target=SMALL).models == [SMALL, TARGET]


def test_an_unreadable_file_is_one_clear_error(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("port = = 1")
    with pytest.raises(InvalidParameterError, match="cannot read the config file"):
        load_config(bad)
    with pytest.raises(InvalidParameterError, match="cannot read the config file"):
        load_config(tmp_path / "missing.toml")


@pytest.fixture
def served(monkeypatch):
    """`specrouter serve` up to the point where it would load models."""
    seen: list[ServeConfig] = []
    monkeypatch.setattr(run, "serve", seen.append)
    return seen


def test_serve_without_arguments_uses_the_defaults(served):
    result = CliRunner().invoke(main, ["serve"], env={"SPECROUTER_API_KEY": None})
    assert result.exit_code == 0, result.output
    assert served == [load_config()]


def test_serve_flags_and_environment_override_the_file(served, tmp_path):
    path = tmp_path / "serve.toml"
    path.write_text(TOML)
    args = ["serve", "--config", str(path), "--port", "9200", "--max-batch", "3", "--chain", "off",
            "--models", f"{SMALL},{TARGET}", "--host", "0.0.0.0", "--request-timeout", "0", "--profile", "costs.json",
            "--gpu-layers", "-1", "--gpu-layers", f"{SMALL}=0"]
    result = CliRunner().invoke(main, args, env={"SPECROUTER_API_KEY": "from-env"})
    assert result.exit_code != 0 and "draft_lengths needs an explicit chain" in result.output  # the file's lengths
    path.write_text(TOML.replace("draft_lengths = [3, 2]", ""))
    result = CliRunner().invoke(main, args, env={"SPECROUTER_API_KEY": "from-env"})
    assert result.exit_code == 0, result.output
    c = served[-1]
    assert (c.port, c.max_batch, c.chain, c.host, c.request_timeout, c.api_key, c.max_queue, c.profile) == (
        9200, 3, "off", "0.0.0.0", 0, "from-env", 5, Path("costs.json"))
    assert (c.offload.of(TARGET), c.offload.of(SMALL)) == (-1, 0)
    assert c.kept_sequences == 3  # the prefix cache keeps as many finished requests as run at once
    result = CliRunner().invoke(main, [*args, "--prefix-cache", "0"], env={"SPECROUTER_API_KEY": "from-env"})
    assert result.exit_code == 0, result.output
    assert (served[-1].prefix_cache, served[-1].kept_sequences) == (0, 0)


def test_serve_with_a_bad_flag_exits_2_with_one_line(served):
    result = CliRunner().invoke(main, ["serve", "--max-queue", "-1"])
    assert result.exit_code == 2 and not served
    assert result.output.startswith("error: invalid server configuration: max_queue")


RAY_TOML = """
port = 9000
[ray]
enabled = true
replicas = 3
affinity_slack = 1
"""


def test_the_ray_table_and_its_flags_field_by_field(tmp_path):
    path = tmp_path / "serve.toml"
    path.write_text(RAY_TOML)
    c = load_config(path, ray={"replicas": 2, "address": "auto", "sync_seconds": None})
    assert (c.ray.enabled, c.ray.replicas, c.ray.address, c.ray.affinity_slack, c.ray.sync_seconds) == (
        True, 2, "auto", 1, 1.0)
    assert load_config().ray.enabled is False


@pytest.mark.parametrize("table,message", [
    ({"min_replicas": 1}, "min_replicas and max_replicas go together"),
    ({"min_replicas": 3, "max_replicas": 2}, "min_replicas 3 exceeds max_replicas 2"),
    ({"replicas": 0}, "ray.replicas: Input should be greater than or equal to 1"),
    ({"sync_seconds": 0}, "ray.sync_seconds: Input should be greater than 0"),
    ({"colour": "red"}, "ray.colour: Extra inputs are not permitted"),
])
def test_bad_ray_values_name_the_field(table, message):
    with pytest.raises(InvalidParameterError, match="invalid server configuration") as info:
        load_config(ray=table)
    assert message in str(info.value)


def test_serve_ray_flags_reach_the_fleet(monkeypatch):
    from specrouter.fleet import deploy

    seen: list[ServeConfig] = []
    monkeypatch.setattr(deploy, "serve_fleet", seen.append)
    args = ["serve", "--ray", "--min-replicas", "1", "--max-replicas", "4", "--ray-address", "auto",
            "--affinity-slack", "0", "--ray-sync-seconds", "0.5", "--target-ongoing-requests", "3"]
    result = CliRunner().invoke(main, args, env={"SPECROUTER_API_KEY": None})
    assert result.exit_code == 0, result.output
    (c,) = seen
    assert (c.ray.enabled, c.ray.min_replicas, c.ray.max_replicas, c.ray.address, c.ray.affinity_slack,
            c.ray.sync_seconds, c.ray.target_ongoing_requests) == (True, 1, 4, "auto", 0, 0.5, 3.0)


def test_the_router_config_is_a_table_or_a_file_and_its_errors_name_the_key(tmp_path, served):
    c = load_config(None, router_config={"hysteresis": 0.1, "draft_grid": [1, 2, 4]})
    assert c.router_settings().changed() == {"draft_grid": (1, 2, 4), "hysteresis": 0.1}
    assert load_config().router_settings().changed() == {}
    path = tmp_path / "serve.toml"
    path.write_text("port = 9000\n[router_config]\nshrink = 16\n")
    assert load_config(path).router_settings().shrink == 16.0
    tuning = tmp_path / "router.toml"
    tuning.write_text("explore_fraction = 0.01\n")
    path.write_text(f"router_config = {str(tuning)!r}\n")
    c = load_config(path)
    assert c.router_config == {"explore_fraction": 0.01}  # read at once: a fleet's replicas get the table
    assert load_config(path, router_config=tmp_path / "router.toml") == c
    result = CliRunner().invoke(main, ["serve", "--router-config", str(tuning)], env={"SPECROUTER_API_KEY": None})
    assert result.exit_code == 0, result.output
    assert served[-1].router_settings().explore_fraction == 0.01
    with pytest.raises(InvalidParameterError, match=r"router_config: .*invalid router config: unknown key 'hysteresi' "
                                                    r"\(did you mean 'hysteresis'\?\)"):
        load_config(None, router_config={"hysteresi": 0.1})
    tuning.write_text("explore_fraction = 2\n")
    result = CliRunner().invoke(main, ["serve", "--router-config", str(tuning)])
    assert result.exit_code == 2 and len(served) == 1
    assert result.output.startswith("error: invalid server configuration: router_config: ")
    assert f"invalid router config {tuning}: explore_fraction: Input should be less than 1 (got 2)" in result.output


def test_the_server_builds_its_router_with_the_router_config(monkeypatch):
    seen = {}

    def auto_router(*args, config, **kw):
        seen["config"] = config
        raise RuntimeError("stop here")

    monkeypatch.setattr(run, "auto_router", auto_router)
    monkeypatch.setattr(run, "Pool", lambda **kw: type("P", (), {"close": lambda self: None})())
    with pytest.raises(RuntimeError, match="stop here"), run.build_engine(load_config(None, router_config={"stretch": 3})):
        pass
    assert seen["config"].changed() == {"stretch": 3}
