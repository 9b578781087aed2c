"""`specrouter serve` on the real default pool: a subprocess on a loopback port, driven by
the openai client, stopped with SIGINT."""

import json
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest

from benchmarks.servers import free_port

from .conftest import REFERENCE_TOKENS, SMALL, TARGET

CLI = str(Path(sys.executable).with_name("specrouter"))



def wait_healthy(proc: subprocess.Popen, url: str, timeout: float) -> None:
    """Until `url`/health answers 200; fails with the server's output if it exits first."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, proc.stdout.read()
        try:
            if httpx.get(url + "/health").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "the server did not come up"
        time.sleep(0.5)


@contextmanager
def serving(args: list[str], timeout: float, stop: signal.Signals = signal.SIGINT):
    """`specrouter serve --port P *args` until it is healthy (at most `timeout` s); yields
    (base url, process, openai client); stopped with `stop` unless a test ended it."""
    port = free_port()
    proc = subprocess.Popen([CLI, "serve", "--port", str(port), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(proc, url, timeout)
    client = openai.OpenAI(api_key="unused", base_url=url + "/v1", max_retries=0, timeout=300)
    try:
        yield url, proc, client
    finally:
        client.close()
        if proc.poll() is None:
            proc.send_signal(stop)
            proc.wait(timeout=180)


@pytest.fixture(scope="module")
def server(pool):
    # The test pool's context and slots, so that the target alone evaluates exactly as in the references.
    with serving(["--n-ctx", "2048", "--max-batch", "4"], 300) as running:
        yield running


def test_serves_the_default_target(server):
    assert [m.id for m in server[2].models.list()] == [TARGET]


def test_without_speculation_the_text_is_the_references(pool, references, server):
    target = pool.level(TARGET)
    for pid, (tokens, expected) in list(references.items())[:2]:
        r = server[2].completions.create(model=TARGET, prompt=tokens, max_tokens=REFERENCE_TOKENS, temperature=0,
                                         extra_body={"speculation": "off"})
        assert r.choices[0].text == target.detokenize(expected), pid
        assert r.usage.speculation["chain"] == [TARGET]


def test_streamed_chat_with_routing_and_a_fixed_chain(server):
    url, _, client = server
    messages = [{"role": "user", "content": "Write a Python function that reverses a string."}]
    chunks = list(client.chat.completions.create(model=TARGET, messages=messages, max_tokens=32, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip() and chunks[-1].usage.speculation["levels"][-1]["name"] == TARGET
    r = client.chat.completions.create(model=TARGET, messages=messages, max_tokens=32, temperature=0,
                                       extra_body={"speculation": {"chain": [SMALL, TARGET], "draft_lengths": [3]}})
    small = r.usage.speculation["levels"][0]
    assert small["name"] == SMALL and 0 < small["accepted"] <= small["proposed"]
    metrics = httpx.get(url + "/metrics").text
    assert f'specrouter:spec_decode_num_draft_tokens_total{{level="{SMALL}"}}' in metrics


def test_a_tool_call_round_trip_on_the_target(server):
    """The 1.5B, told about a function through its template, calls it (it writes the call in
    a fenced JSON block, which the parser accepts as llama.cpp's does); the tool's answer
    sent back in a tool message is rendered and answered."""
    client = server[2]
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    messages = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    r = client.chat.completions.create(model=TARGET, messages=messages, tools=tools, temperature=0, max_tokens=64)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": '{"celsius": 18, "sky": "cloudy"}'}]
    again = client.chat.completions.create(model=TARGET, messages=messages, tools=tools, temperature=0, max_tokens=48)
    assert again.choices[0].message.content or again.choices[0].message.tool_calls


def test_a_forced_tool_call_and_a_json_schema_answer_with_speculation(server):
    """tool_choice required: the 1.5B, which fences its calls when free, answers with a tagged
    call whose arguments follow the function's schema; response_format json_schema with auto
    routing: the answer parses and validates."""
    client = server[2]
    weather = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
               "required": ["city", "unit"], "additionalProperties": False}
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                               "parameters": weather, "strict": True}}]
    messages = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    r = client.chat.completions.create(model=TARGET, messages=messages, tools=tools, tool_choice="required",
                                       temperature=0, max_tokens=64, extra_body={"speculation": "auto"})
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, weather)
    assert call.function.name == "get_weather" and arguments["city"] == "Paris"
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}, "why": {"type": "string"}},
              "required": ["answer", "why"], "additionalProperties": False}
    r = client.chat.completions.create(
        model=TARGET, messages=[{"role": "user", "content": "What is 17 + 25? Answer in JSON."}], temperature=0,
        max_tokens=96, response_format={"type": "json_schema", "json_schema": {"name": "sum", "schema": schema}},
        extra_body={"speculation": "auto"})
    answer = json.loads(r.choices[0].message.content)
    jsonschema.validate(answer, schema)
    assert answer["answer"] == 42 and r.choices[0].finish_reason == "stop"


def test_choices_share_the_prompt_and_choice_0_is_the_request_alone(server):
    """n = 3 on llama.cpp: choices 1 and 2 take the prompt's cells from choice 0 (sequence
    copy); each writes its own sample, and choice 0 is what the request alone writes (the
    three decode in one batch: a sampled token could flip only where a draw falls within the
    last bits of a boundary)."""
    client = server[2]
    kw = dict(model=TARGET, messages=[{"role": "user", "content": "Name a colour."}], temperature=0.8, seed=5,
              max_tokens=12, extra_body={"speculation": "off"})
    alone = client.chat.completions.create(**kw).choices[0].message.content
    three = client.chat.completions.create(n=3, **kw)
    texts = [c.message.content for c in three.choices]
    assert len(texts) == 3 and all(texts) and texts[0] == alone


def test_a_seeded_request_repeats_whatever_was_served_in_between(server):
    """The seed contract on the real pool: the same seeded, sampled chat four times, with
    and without speculation, another turn of the same chat served in between each time
    (it leaves a prefix cache this request could resume from, text in the cross-request
    memory, and new estimates): the same text and the same logprobs every time."""
    client = server[2]
    messages = [{"role": "user", "content": "Write a haiku about the sea."}]
    for speculation in ("off", "auto"):
        answers = set()
        for i in range(4):
            r = client.chat.completions.create(model=TARGET, messages=messages, temperature=1.0, seed=1234,
                                               max_tokens=24, logprobs=True, extra_body={"speculation": speculation})
            answers.add((r.choices[0].message.content, tuple(t.logprob for t in r.choices[0].logprobs.content)))
            client.chat.completions.create(model=TARGET, max_tokens=8, messages=[
                *messages, {"role": "assistant", "content": r.choices[0].message.content},
                {"role": "user", "content": f"Another, number {i}."}])
        assert len(answers) == 1, (speculation, answers)


def test_a_seeded_request_repeats_after_long_prompts_were_kept(server):
    """On default kernels every sequence's cells lie in one unified cache, and a long
    prompt's caches kept for later requests move where a new sequence's cells lie, and so
    its logprobs. A seeded request admitted alone releases the kept caches first and computes
    as on a fresh server: the same text and logprobs after each long prompt."""
    client = server[2]
    messages = [{"role": "user", "content": "Write a Python function that returns the n-th Fibonacci number."}]

    def seeded() -> tuple:
        r = client.chat.completions.create(model=TARGET, messages=messages, temperature=1.0, seed=1234, max_tokens=6,
                                           logprobs=True, extra_body={"speculation": "off"})
        return r.choices[0].message.content, tuple(t.logprob for t in r.choices[0].logprobs.content)

    first = seeded()
    for words in (300, 700):
        client.chat.completions.create(model=TARGET, max_tokens=2, temperature=0, extra_body={"speculation": "off"},
                                       messages=[{"role": "user", "content": "word " * words}])
        assert seeded() == first, words


def test_sigint_shuts_down_cleanly(server):
    _, proc, _ = server
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == 0
    output = proc.stdout.read()
    assert "Traceback" not in output and "Application shutdown complete" in output

