"""Structured output on the real pool: forced tool calls and JSON schema answers, with and
without speculation.

    python -m benchmarks structured [--repeats 3] [--stem NAME]

In process, one request at a time, greedy, on the default target (the q4 1.5B, llama.cpp).
Tasks: a tool call with tool_choice naming the function (weather), one with tool_choice
required and two tools (time), a JSON schema answer written from nothing (a fictional
programmer), and one copied from the prompt (fields extracted from a message). Methods, in
this order every repeat: the target alone, a fixed n-gram chain (draft length 16), auto (a
router made at the start in a fresh folder: no saved profile or estimates, profiled now, and
learning across the run's requests), the target alone again. Per task and method: the
median seconds per request, and after the first token (the request's time less its task's
time to first token, the median of the target alone asked for one token before the run).
Writes JSON and markdown to benchmarks/results/.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.args import benchmark_parser, result_stem
from benchmarks.machine import machine_info
from benchmarks.output import write_result
from specrouter.cascade.grammar import Grammar
from specrouter.cascade.sampling import SamplingParams
from specrouter.chat import chat_prompt_tokens
from specrouter.engine import generate
from specrouter.pool import Pool
from specrouter.router import auto_router
from specrouter.server.tools import forced_calls

TARGET, SMALL = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"
MAX_TOKENS = 128

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current local time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "description": "IANA name"}},
                   "required": ["zone"], "additionalProperties": False}}}
PROGRAMMER = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                               "languages": {"type": "array", "items": {"type": "string"}}},
              "required": ["name", "age", "languages"], "additionalProperties": False}
CONTACT = {"type": "object", "properties": {"name": {"type": "string"}, "email": {"type": "string"},
                                            "city": {"type": "string"}, "company": {"type": "string"}},
           "required": ["name", "email", "city", "company"], "additionalProperties": False}
MESSAGE = ("Hi team, please add our new partner to the CRM: Maria Gonzalez-Whitfield from Northwind Analytics "
           "GmbH, reachable at maria.gonzalez-whitfield@northwind-analytics.example, based in Barcelona.")


@dataclass
class Task:
    name: str
    messages: list[dict]
    grammar: Grammar
    tools: list[dict] | None = None


TASKS = [
    Task("tool call, named", [{"role": "user", "content": "What is the weather in Paris right now?"}],
         forced_calls([WEATHER], ["get_weather"], False), [WEATHER]),
    Task("tool call, required", [{"role": "user", "content": "What time is it in Tokyo?"}],
         forced_calls([WEATHER, TIME], ["get_weather", "get_time"], False), [WEATHER, TIME]),
    Task("JSON schema, written", [{"role": "user", "content": "Describe a fictional programmer as JSON with a "
                                                              "name, an age and the languages they know."}],
         Grammar.json_schema(PROGRAMMER)),
    Task("JSON schema, copied", [{"role": "user", "content": "Extract the contact as JSON (name, email, city, "
                                                             "company): " + MESSAGE}],
         Grammar.json_schema(CONTACT)),
]


def timed(chain, prompt: list[int], params: SamplingParams, max_tokens: int) -> tuple[float, object]:
    start = time.perf_counter()
    result = generate(chain, prompt, params, max_tokens)
    return time.perf_counter() - start, result


def main(argv: Sequence[str] | None = None) -> None:
    args = benchmark_parser("structured", __doc__, repeats=3).parse_args(argv)
    pool = Pool(n_ctx=2048, n_seq_max=1)
    target = pool.level(TARGET)
    router_dir = Path(tempfile.mkdtemp(prefix="structured-router-"))
    router = auto_router(pool, TARGET, [SMALL, TARGET], profile_dir=router_dir, progress=False)
    methods = {"target alone": lambda: pool.chain([TARGET]), "ngram [16]": lambda: pool.chain(["ngram", TARGET], [16]),
               "auto": router.session, "target alone (last)": lambda: pool.chain([TARGET])}
    prompts = {t.name: chat_prompt_tokens(target, t.messages, t.tools) for t in TASKS}
    params = {t.name: SamplingParams(grammar=t.grammar) for t in TASKS}
    first_token = {}
    for t in TASKS:  # the time to the first token: the target alone asked for one (prefill included)
        first_token[t.name] = statistics.median(timed(pool.chain([TARGET]), prompts[t.name], params[t.name], 1)[0]
                                                for _ in range(3))
    runs: dict[str, dict[str, list]] = {t.name: {m: [] for m in methods} for t in TASKS}
    texts: dict[str, dict[str, str]] = {t.name: {} for t in TASKS}
    for _ in range(args.repeats):
        for t in TASKS:
            for m, make in methods.items():
                seconds, r = timed(make(), prompts[t.name], params[t.name], MAX_TOKENS)
                runs[t.name][m].append({"seconds": round(seconds, 4), "tokens": len(r.token_ids), "cycles": r.cycles})
                texts[t.name][m] = r.text
    pool.close()
    rows = []
    for t in TASKS:
        alone = statistics.median(x["seconds"] for x in runs[t.name]["target alone"])
        for m in methods:
            seconds = statistics.median(x["seconds"] for x in runs[t.name][m])
            rows.append({"task": t.name, "method": m, "median_s": round(seconds, 3),
                         "after_first_token_s": round(seconds - first_token[t.name], 3),
                         "ratio": round(alone / seconds, 3),
                         "ratio_after_first_token": round((alone - first_token[t.name])
                                                          / (seconds - first_token[t.name]), 3),
                         "tokens": runs[t.name][m][0]["tokens"], "cycles": [x["cycles"] for x in runs[t.name][m]],
                         "same_text_as_alone": texts[t.name][m] == texts[t.name]["target alone"]})
    result = {"machine": machine_info(), "repeats": args.repeats, "max_tokens": MAX_TOKENS,
              "router_dir": "a fresh temporary folder (no saved profile or estimates)",
              "first_token_s": {k: round(v, 3) for k, v in first_token.items()},
              "texts": {k: v["target alone"] for k, v in texts.items()}, "rows": rows, "runs": runs}
    write_result(result, markdown, out=args.out, stem=result_stem(args, "structured", result))


def markdown(result: dict) -> str:
    m = result["machine"]
    head = ["task", "method", "median s", "after the first token (s)", "ratio", "ratio after the first token",
            "tokens", "cycles per repeat", "text = target alone's"]
    lines = [f"# Structured output with speculation ({m['date']})", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, llama-cpp-python {m['llama_cpp_python']}. Command: "
             f"`{m['command']}`. Target {TARGET} (q4, llama.cpp), greedy, one request at a time, at most "
             f"{result['max_tokens']} tokens; {result['repeats']} repeats, methods interleaved in the order shown "
             f"(the target alone first and last). auto: the router starts from {result['router_dir']} and learns "
             "across the run. Ratios: the target alone's (first) median over the method's. \"After the first "
             "token\" subtracts the task's time to the first token (the target alone asked for one token, median "
             f"of 3: {result['first_token_s']}).", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in result["rows"]:
        lines.append("| " + " | ".join(str(x) for x in (
            r["task"], r["method"], r["median_s"], r["after_first_token_s"], r["ratio"], r["ratio_after_first_token"],
            r["tokens"], r["cycles"], "yes" if r["same_text_as_alone"] else "no")) + " |")
    lines += ["", "The target alone's answers:", ""]
    lines += [f"- {name}: `{json.dumps(text)[1:-1]}`" for name, text in result["texts"].items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
