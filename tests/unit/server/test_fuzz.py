"""Fuzz the HTTP API from its own OpenAPI document (schemathesis): no request may get a 5xx.

The document comes from an app built at import (schemathesis' fixture-based lazy loading
does not work with pytest 9); the generated requests go to a live loopback server.
"""

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from specrouter.server.app import create_app
from specrouter.server.config import ServeConfig

from ..server_synth import MODEL, MODELS, build_service, leaked_kv, running_server, wait_until

schema = schemathesis.openapi.from_dict(create_app(build_service(routed=False)[0],
                                                   ServeConfig(models=MODELS)).openapi())


@pytest.fixture(scope="module")
def served():
    service, models = build_service()
    with running_server(service, max_tokens=16) as (url, _):  # short default generations keep the pass quick
        yield url, service, models


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, database=None)
def test_no_request_gets_a_server_error(case, served):
    if isinstance(case.body, dict) and isinstance(case.body.get("model"), str):
        case.body["model"] = MODEL  # a random name only meets the 404: let the rest of the body reach the engine
    case.call_and_validate(base_url=served[0], checks=[not_a_server_error], timeout=30)


def test_the_fuzzing_left_no_sequence_behind(served):
    _, service, models = served
    assert wait_until(lambda: service.live_sequences == 0 and leaked_kv(models) == 0)
