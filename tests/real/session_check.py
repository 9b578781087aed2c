"""A 3-turn edit loop through the server on the real default pool (benchmarks/sessions_workloads.py's
first edit session, short turns), run in a process of its own (test_sessions_real.py starts
it; --exact: exact kernels, which must be chosen before any llama.cpp forward runs in the
process). The server runs in this process, so that every request's token ids can be read off
its result (the metrics' hook every finished request passes).

Each turn is sent twice, streamed through the openai client: with `"speculation": "off"`
(the target alone, whose answer the next turn is built from) and with `"auto"` (the memory
and the prefix cache on, as the server's defaults). Prints one JSON object: per turn the
prompt's length, the target alone's tokens, and whether auto's ids equal them; in default
mode a divergence must be at a near-tie (greedy_check.check_divergence fails otherwise) and
is listed as [index, gap].
"""

from __future__ import annotations

import argparse
import json
import sys

import openai

from benchmarks.sessions_workloads import Answer, load
from specrouter.chat import chat_prompt_tokens
from specrouter.server.config import ServeConfig
from specrouter.server.run import build_engine
from tests.real.greedy_check import check_divergence
from tests.unit.server_synth import running_server

SMALL, TARGET = "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"
TURNS, TOKENS = 3, 32


def ask(client: openai.OpenAI, messages: list[dict], speculation: str) -> str:
    chunks = client.chat.completions.create(model=TARGET, messages=messages, max_tokens=TOKENS, temperature=0,
                                            stream=True, extra_body={"speculation": speculation})
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def main(exact: bool) -> dict:
    settings = {"models": [SMALL, TARGET], "n_ctx": 2048, "max_batch": 2, "exact": exact}
    session = load(["edit-loop"], 1)[0]
    served = []  # per turn: (index, prompt ids, auto's ids, the target alone's ids)
    with build_engine(ServeConfig(**settings)) as engine:
        results = []
        finished = engine.service.metrics.finished

        def record(result) -> None:
            results.append(result)
            finished(result)

        engine.service.metrics.finished = record
        with running_server(engine.service, **settings) as (url, _):
            client = openai.OpenAI(api_key="session", base_url=url + "/v1", max_retries=0, timeout=600)
            answers: list[Answer] = []
            for _ in range(TURNS):
                turn = session.turn(answers, TOKENS)
                text = ask(client, turn.openai_messages(), "off")
                alone = results[-1].token_ids
                ask(client, turn.openai_messages(), "auto")
                served.append((turn.index, chat_prompt_tokens(engine.target, turn.template_messages()),
                               results[-1].token_ids, alone))
                answers.append(Answer(text))
            client.close()
        # After the server stopped (its kept caches freed): a divergence's near-tie is checked
        # on the target's logits over the common prefix.
        out = [{"turn": i, "prompt_tokens": len(prompt), "tokens": len(alone), "equal": routed == alone,
                "diverged": None if exact else check_divergence(engine.target, f"turn {i}", prompt, routed, alone)}
               for i, prompt, routed, alone in served]
    return {"exact": exact, "turns": out}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--exact", action="store_true")
    json.dump(main(parser.parse_args().exact), sys.stdout)
