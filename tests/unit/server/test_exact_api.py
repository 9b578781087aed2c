"""The `exact` request extension: a server runs one kind of kernels for every request, so a
request asking for the other kind is a 400 naming the field, and one asking for the kind the
server runs (or not asking) is served."""

import httpx
import pytest

from specrouter.server.config import load_config

from ..server_synth import MODEL, build_service, running_server


def post(url: str, **extra) -> httpx.Response:
    return httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 3, **extra})


@pytest.mark.parametrize("server_exact", [False, True])
def test_a_request_gets_the_servers_kernels_or_a_400(server_exact):
    service, _ = build_service()
    with running_server(service, exact=server_exact) as (url, _):
        assert post(url).status_code == 200
        assert post(url, exact=server_exact).status_code == 200
        refused = post(url, exact=not server_exact)
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["param"] == "exact" and error["code"] == "unsupported_value"
    assert ("start it with --exact" if not server_exact else "restart it without --exact") in error["message"]


def test_an_exact_field_of_the_wrong_type_is_a_400_naming_it():
    service, _ = build_service()
    with running_server(service) as (url, _):
        r = post(url, exact="yes")
    assert r.status_code == 400 and r.json()["error"]["param"] == "exact"


def test_the_config_file_and_the_flag_set_exact(tmp_path):
    file = tmp_path / "serve.toml"
    file.write_text("exact = true\n")
    assert load_config(file).exact is True
    assert load_config(None).exact is False
    assert load_config(file, exact=None).exact is True  # an absent flag keeps the file's setting
