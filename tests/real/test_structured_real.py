"""Structured output on the real default pool (openai-complete, item 4): a JSON schema answer
of the q4 1.5B, greedy, is the same text under every chain (model drafts, the n-gram, three
levels, auto) as under the constrained target alone, up to the near-tie rule of the other real
tests (greedy_check.py: llama.cpp's kernels for k tokens differ in the last bits), applied to the
restricted rows; and it parses and validates."""

import json

import jsonschema
import pytest

from specrouter.cascade.grammar import Grammar
from specrouter.cascade.sampling import SamplingParams
from specrouter.chat import chat_prompt_tokens
from specrouter.engine import generate
from specrouter.router import auto_router

from .conftest import SMALL, TARGET
from .greedy_check import check_divergence

SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
                         "languages": {"type": "array", "items": {"type": "string"}, "minItems": 1}},
          "required": ["name", "age", "languages"], "additionalProperties": False}
MESSAGES = [{"role": "user", "content": "Describe a fictional programmer as JSON with a name, an age and the "
                                        "programming languages they know."}]
CHAINS = [["ngram", TARGET], [SMALL, TARGET], ["ngram", SMALL, TARGET]]


@pytest.fixture(scope="module")
def constrained(pool):
    prompt = chat_prompt_tokens(pool.level(TARGET), MESSAGES)
    params = SamplingParams(grammar=Grammar.json_schema(SCHEMA))
    alone = generate(pool.chain([TARGET]), prompt, params, 128)
    return prompt, params, alone


def test_the_constrained_target_alone_answers_valid_json_where_it_would_fence_it(pool, constrained):
    prompt, _, alone = constrained
    free = generate(pool.chain([TARGET]), prompt, SamplingParams(), 128).text
    assert free.startswith("```")  # unconstrained, the 1.5B wraps its JSON in a fence
    assert alone.finish_reason == "stop"
    jsonschema.validate(json.loads(alone.text), SCHEMA)


@pytest.mark.parametrize("names", CHAINS, ids=lambda n: "->".join(n))
def test_every_chain_writes_the_constrained_targets_text(pool, constrained, names):
    prompt, params, alone = constrained
    r = generate(pool.chain(names), prompt, params, 128)
    check_divergence(pool.level(TARGET), "->".join(names), prompt, r.token_ids, alone.token_ids, params.grammar)
    jsonschema.validate(json.loads(r.text), SCHEMA)
    assert r.levels[0].proposed > 0  # the draft level drafted


def test_auto_writes_the_constrained_targets_text(pool, constrained):
    prompt, params, alone = constrained
    r = generate(auto_router(pool, TARGET, [SMALL, TARGET], progress=False), prompt, params, 128)
    check_divergence(pool.level(TARGET), "auto", prompt, r.token_ids, alone.token_ids, params.grammar)
    jsonschema.validate(json.loads(r.text), SCHEMA)
