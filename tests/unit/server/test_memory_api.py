"""The cross-request suffix memory through the HTTP API: what each request adds, in which
partition (per API key, shared, none), the opt-out field, and the settings' errors."""

import hashlib

import httpx
import numpy as np
import openai
import pytest

from specrouter.drafters.lookup import Lookup
from specrouter.drafters.memory import MemoryScope, SuffixMemory
from specrouter.errors import InvalidParameterError
from specrouter.server.config import ServeConfig, load_config

from ..server_synth import MODEL, build_service, running_server


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def complete(url: str, key: str, **extra) -> int:
    with openai.OpenAI(api_key=key, base_url=url + "/v1", max_retries=0) as client:
        r = client.completions.create(model=MODEL, prompt="remember me", max_tokens=30, temperature=0,
                                      extra_body=extra or None)
    return r.usage.completion_tokens


@pytest.mark.parametrize("setting", ["per-key", "shared"])
def test_each_request_adds_its_output_to_its_keys_partition_unless_it_opts_out(setting):
    memory = SuffixMemory(10_000)
    service, _ = build_service(memory=memory)
    with running_server(service, memory=setting) as (url, _):
        n = complete(url, "key-a")
        assert memory.total == n + 1  # the output and its separator
        complete(url, "key-b")
        expected = [digest("key-a"), digest("key-b")] if setting == "per-key" else [""]
        assert memory.partitions == expected
        held = memory.total
        complete(url, "key-a", suffix_memory=False)
        assert memory.total == held  # an opted-out request's text is not kept


def test_a_server_with_the_memory_off_keeps_nothing():
    memory = SuffixMemory(10_000)
    service, _ = build_service(memory=memory)
    with running_server(service, memory="off") as (url, _):
        complete(url, "key-a")
    assert memory.total == 0 and memory.partitions == []


def test_an_opt_out_of_the_wrong_type_is_a_400_naming_the_field():
    service, _ = build_service(memory=SuffixMemory(1000))
    with running_server(service) as (url, _):
        r = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "x", "suffix_memory": "no"})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "suffix_memory" and "valid boolean" in error["message"]


@pytest.mark.parametrize("tokens", [0, -1, "many"])
def test_a_memory_budget_that_is_not_a_positive_whole_number_is_refused(tokens):
    with pytest.raises(InvalidParameterError, match=r"memory_tokens: .*budget must be a whole number of tokens >= 1"):
        load_config(memory_tokens=tokens)


def test_an_unknown_memory_setting_is_refused():
    with pytest.raises(InvalidParameterError, match=r"memory: Input should be 'per-key', 'shared' or 'off'"):
        load_config(memory="sometimes")


def test_the_memory_is_built_only_for_a_lookup_that_reads_it():
    assert ServeConfig(lookup="ngram").suffix_memory() is None
    assert ServeConfig(lookup="suffix", memory="off").suffix_memory() is None
    memory = ServeConfig(lookup="suffix", memory_tokens=1000).suffix_memory()
    assert memory is not None and memory.budget == 1000


def test_a_keyed_request_drafts_from_its_keys_partition_only(monkeypatch):
    """With `per-key`, a request presenting a key is proposed only its key's texts: not the
    shared partition's (requests without a key), even where a shared text continues its
    prompt; a request without a key is proposed that shared text (the lookup does read it)."""
    memory = SuffixMemory(10_000)
    shared = np.random.default_rng(3).integers(0, 16, size=80).tolist()  # the letters a..p
    memory.add(shared)
    memory.add(shared[:30] + [15 - t for t in shared[30:]], MemoryScope(digest("key-b")))
    asked: list[tuple[MemoryScope, Lookup]] = []
    propose = memory.propose

    def recording(context, n, scope=MemoryScope()):
        found = propose(context, n, scope)
        asked.append((scope, found))
        return found

    monkeypatch.setattr(memory, "propose", recording)
    prompt = "".join(chr(97 + t) for t in shared[:30])
    service, _ = build_service(memory=memory)
    with running_server(service, memory="per-key") as (url, _):
        for key, scope in (("key-a", MemoryScope(digest("key-a"))), (None, MemoryScope())):
            asked.clear()
            with httpx.Client(base_url=url) as client:
                r = client.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 20,
                                                          "temperature": 0},
                                headers={"Authorization": f"Bearer {key}"} if key else {})
            assert r.status_code == 200
            assert asked and {s for s, _ in asked} == {scope}, key
            recalled = [found for _, found in asked if found.tokens]
            if key:
                assert recalled == []  # neither the shared text nor key-b's
            else:
                assert recalled and all(found.match >= 4 for found in recalled)
