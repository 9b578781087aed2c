"""API key, full queue, disconnects, timeouts and shutdown, on real loopback servers."""

import json
import signal
import threading
import time

import httpx
import openai
import pytest

from ..server_synth import MODEL, build_service, leaked_kv, running_server, wait_until


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


def sse_data(lines) -> list[str]:
    return [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]


def drained(service, models) -> bool:
    """Every sequence cancelled or finished and its KV cells freed in every model."""
    return wait_until(lambda: service.live_sequences == 0 and leaked_kv(models) == 0)


def failures(service, reason: str) -> float:
    return service.metrics.failure.labels(reason)._value.get()


def test_api_key_is_required_on_v1_only():
    service, _ = build_service()
    with running_server(service, api_key="sekrit") as (url, _):
        body = {"model": MODEL, "prompt": "abc", "max_tokens": 3}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic sekrit"}):
            r = httpx.post(url + "/v1/completions", json=body, headers=headers)
            assert error_of(r, 401)["code"] == "invalid_api_key" and r.headers["www-authenticate"] == "Bearer"
        assert httpx.get(url + "/v1/models").status_code == 401
        assert httpx.get(url + "/health").status_code == 200 and httpx.get(url + "/metrics").status_code == 200
        with openai.OpenAI(api_key="sekrit", base_url=url + "/v1", max_retries=0) as ok:
            assert len(ok.completions.create(**body).choices[0].text) == 3
        with openai.OpenAI(api_key="wrong", base_url=url + "/v1", max_retries=0) as bad:
            with pytest.raises(openai.AuthenticationError):
                bad.completions.create(**body)


def test_a_full_queue_answers_429():
    service, models = build_service(sleep=True, max_batch=1, max_queue=1)
    long = {"model": MODEL, "prompt": "abc", "max_tokens": 400, "stream": True}
    with running_server(service) as (url, _), httpx.Client(base_url=url, timeout=30) as http:
        with http.stream("POST", "/v1/completions", json=long) as running:
            lines = running.iter_lines()  # kept: dropping a half-read iterator closes the connection
            next(lines)  # the first chunk: this request holds the only batch slot
            with http.stream("POST", "/v1/completions", json=long) as waiting:
                assert waiting.status_code == 200  # admitted: it waits in the queue
                err = error_of(http.post("/v1/completions", json={**long, "stream": False}), 429)
                assert (err["type"], err["code"]) == ("rate_limit_error", "queue_full")
                with openai.OpenAI(api_key="x", base_url=url + "/v1", max_retries=0) as client:
                    with pytest.raises(openai.RateLimitError):
                        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
        assert drained(service, models)
        assert failures(service, "queue_full") == 2 and failures(service, "cancelled") == 2


def test_a_client_that_disconnects_mid_stream_frees_its_sequence():
    service, models = build_service(sleep=True)
    with running_server(service) as (url, _), httpx.Client(base_url=url, timeout=30) as http:
        with http.stream("POST", "/v1/completions",
                         json={"model": MODEL, "prompt": "abc", "max_tokens": 400, "stream": True}) as r:
            lines = r.iter_lines()
            chunks = [json.loads(d) for d in sse_data(next(lines) for _ in range(6))]
            assert all(c["choices"][0]["finish_reason"] is None for c in chunks)
            assert service.live_sequences == 1
        assert drained(service, models)  # the stream was closed after 3 chunks of 400 tokens
        assert failures(service, "cancelled") == 1
        assert service.metrics.success.labels("length")._value.get() == 0


def test_a_client_that_gives_up_on_a_non_streamed_request_frees_its_sequence(caplog):
    service, models = build_service(sleep=True)
    with running_server(service) as (url, _):
        for n in (1, 3):  # one choice, and several
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "abc", "max_tokens": 400, "n": n},
                           timeout=0.5)
            assert drained(service, models) and failures(service, "cancelled") == 1 + 3 * (n == 3)
        time.sleep(0.2)  # the handler's last step runs after the sequences are freed
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text  # the server saw no failure


def test_a_request_timeout_cancels_the_request():
    service, models = build_service(sleep=True, request_timeout=0.3)
    body = {"model": MODEL, "prompt": "abc", "max_tokens": 400}
    with running_server(service) as (url, _), httpx.Client(base_url=url, timeout=30) as http:
        err = error_of(http.post("/v1/completions", json=body), 504)
        assert (err["type"], err["code"]) == ("timeout_error", "request_timeout")
        with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            data = sse_data(r.iter_lines())
        assert data[-1] == "[DONE]" and json.loads(data[-2])["error"]["code"] == "request_timeout"
        assert all("choices" in json.loads(d) for d in data[:-2])
        with openai.OpenAI(api_key="x", base_url=url + "/v1", max_retries=0) as client:
            with pytest.raises(openai.APIError, match="longer than"):
                list(client.completions.create(**body, stream=True))
        assert drained(service, models) and failures(service, "timeout") == 3


def test_shutdown_lets_an_in_flight_stream_finish():
    service, models = build_service(sleep=True)
    with running_server(service, graceful=20) as (url, server):
        with httpx.stream("POST", url + "/v1/completions", timeout=30,
                          json={"model": MODEL, "prompt": "abc", "max_tokens": 60, "stream": True}) as r:
            lines = r.iter_lines()
            first = next(lines)
            server.handle_exit(signal.SIGTERM, None)  # what uvicorn's signal handler calls
            data = sse_data([first, *lines])
        texts = [json.loads(d)["choices"][0]["text"] for d in data[:-1]]
        assert data[-1] == "[DONE]" and len("".join(texts)) == 60
        assert wait_until(lambda: not service.alive)
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/health")
    assert leaked_kv(models) == 0 and service.live_sequences == 0


def test_sigterm_drains_new_requests_get_503_and_those_past_the_grace_end_cleanly():
    """SIGTERM with requests in flight (server-hardening, graceful drain): a request that
    arrives is refused (503, Retry-After); one that finishes within the grace period
    finishes; past it, a stream ends with an error event then [DONE] and a plain request
    gets a 503 body, all within the grace period and a few seconds."""
    service, models = build_service(sleep=True)
    long = {"model": MODEL, "prompt": "abc", "max_tokens": 480, "speculation": "off"}
    out: dict[str, object] = {}

    def stream():
        with httpx.stream("POST", url + "/v1/completions", timeout=30, json={**long, "stream": True}) as r:
            out["stream"] = sse_data(r.iter_lines())

    def plain(key: str, body: dict):
        out[key] = httpx.post(url + "/v1/completions", timeout=30, json=body)

    with running_server(service, drain=1.0) as (url, server):
        threads = [threading.Thread(target=stream), threading.Thread(target=plain, args=("plain", long))]
        for t in threads:
            t.start()
        assert wait_until(lambda: service.live_sequences == 2)
        started = time.monotonic()
        server.handle_exit(signal.SIGTERM, None)  # what uvicorn's signal handler calls
        assert wait_until(lambda: service._draining)
        refused = httpx.post(url + "/v1/completions", timeout=30, json={**long, "max_tokens": 2})
        assert error_of(refused, 503)["code"] == "shutting_down" and refused.headers["retry-after"] == "1"
        assert httpx.get(url + "/health").status_code == 503
        for t in threads:
            t.join(timeout=30)
        ended = time.monotonic() - started
    assert 1.0 <= ended < 1.0 + 5, ended
    data = out["stream"]
    assert data[-1] == "[DONE]" and json.loads(data[-2])["error"]["code"] == "shutting_down"
    assert all("choices" in json.loads(d) for d in data[:-2]) and len(data) > 3  # it streamed, then ended cleanly
    assert error_of(out["plain"], 503)["code"] == "shutting_down"
    assert service.live_sequences == 0 and leaked_kv(models) == 0 and not service.alive
    assert failures(service, "stopped") == 3  # the two cut off, and the one refused

