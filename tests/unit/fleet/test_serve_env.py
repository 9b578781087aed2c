"""The Ray Serve settings a fleet runs with (deploy.SERVE_ENV): a user's variable wins."""

from specrouter.fleet.deploy import SERVE_ENV, serve_env


def test_serve_env_defaults_to_the_fleets_settings(monkeypatch):
    for name in SERVE_ENV:
        monkeypatch.delenv(name, raising=False)
    assert serve_env() == SERVE_ENV
    assert serve_env()["RAY_SERVE_ENABLE_DIRECT_INGRESS"] == "0"  # one endpoint on --port, through the proxy


def test_a_variable_the_user_set_wins(monkeypatch):
    for name in SERVE_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RAY_SERVE_CONTROL_LOOP_INTERVAL_S", "0.1")
    env = serve_env()
    assert env["RAY_SERVE_CONTROL_LOOP_INTERVAL_S"] == "0.1"
    assert {k: v for k, v in env.items() if k != "RAY_SERVE_CONTROL_LOOP_INTERVAL_S"} == \
        {k: v for k, v in SERVE_ENV.items() if k != "RAY_SERVE_CONTROL_LOOP_INTERVAL_S"}
