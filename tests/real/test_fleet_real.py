"""`specrouter serve --ray` on the real default pool: 2 replicas with 1 thread each behind one
endpoint (a local Ray instance the command starts and stops), driven by the openai client."""

import signal

import httpx
import pytest

from .conftest import REFERENCE_TOKENS, TARGET
from .test_server_real import serving


@pytest.fixture(scope="module")
def fleet(pool):
    # Up to 10 minutes: Ray's start, and the models' profiles when none is cached.
    args = ["--ray", "--replicas", "2", "--threads", "1", "--n-ctx", "2048", "--max-batch", "4"]
    with serving(args, 600, signal.SIGTERM) as running:
        yield running


def test_two_replicas_answer_the_openai_client(pool, references, fleet):
    url, proc, client = fleet
    target = pool.level(TARGET)
    for pid, (tokens, expected) in list(references.items())[:2]:
        r = client.completions.create(model=TARGET, prompt=tokens, max_tokens=REFERENCE_TOKENS, temperature=0,
                                      extra_body={"speculation": "off"})
        assert r.choices[0].text == target.detokenize(expected), pid
    messages = [{"role": "user", "content": "Write a Python function that reverses a string."}]
    whole = client.chat.completions.create(model=TARGET, messages=messages, max_tokens=24, temperature=0)
    assert whole.choices[0].message.content.strip() and whole.usage.completion_tokens == 24
    metrics = httpx.get(url + "/metrics").text
    assert 'replica="' in metrics and "specrouter:num_requests_running" in metrics


def test_sigterm_stops_the_fleet_and_saves_what_it_learned(fleet, private_cache):
    _, proc, _ = fleet
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=180) == 0, proc.stdout.read()
    assert (private_cache.parent / "profiles" / "acceptance.json").is_file()
