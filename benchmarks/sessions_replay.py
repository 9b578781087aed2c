"""The session workloads' greedy turns, recorded once and replayed through the real router on
the recorded forward costs: per turn, auto against the target alone and the oracle's ceiling.

    python -m benchmarks sessions-replay [--per-workload 5] [--workloads doc-qa,edit-loop] [--stem NAME]
    python -m benchmarks sessions-replay --render benchmarks/results/NAME.json   # replay again, no model

What a policy change does to sessions, judged on many turns at once, in seconds, and without
the noise of a loaded machine (the server's benchmark, benchmarks/sessions.py, takes most of an
hour for a few sessions). One session is too few: a choice that moves one block moves every
later one, so a single session's turns swing with any change of policy.

Recording (real models, in process): every session of the workloads (benchmarks/
sessions_workloads.py; the agent loop's forced calls are the server's business, so it is left
out), one after another, each turn's request built from the target's own greedy answers to
the earlier ones, as the server's chat template renders it; and the target's forward cost
t(n), n = 1..65 tokens after a cached prefix (median of 3).

Replay (no model; `--render` replays a saved recording with the router as it is now): one
router for all turns, warm from the first (the server's), over the recorded answers
(copy_ceiling.router_replay: the request's own suffix lookup, no cross-request memory); a
forward of up to 65 tokens costs t(n), a longer one (a prompt) nothing, for both methods:
what is compared is decoding (the prompt's cycle runs the target alone under auto too). The
oracle: copy_ceiling.oracle over the same answers (the best draft length at every cycle).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm

from benchmarks.args import benchmark_parser, result_stem
from benchmarks.chains import TARGET
from benchmarks.copy_ceiling import COST_POINTS, Costs, oracle, router_replay, rows
from benchmarks.machine import machine_info
from benchmarks.measure import forward_costs
from benchmarks.output import write_result
from benchmarks.sessions_workloads import Answer, load
from specrouter.cascade.chain import Chain
from specrouter.cascade.sampling import SamplingParams
from specrouter.chat import chat_prompt_tokens
from specrouter.engine import generate
from specrouter.pool import Pool

REPLAYED = ("edit-loop", "doc-qa")


def record(workloads: Sequence[str], per_workload: int) -> dict:
    pool = Pool(n_ctx=4096, n_seq_max=1)
    try:
        target = pool.level(TARGET)
        costs = forward_costs(pool, [TARGET], COST_POINTS, repeats=3)[TARGET]
        tasks = []
        for session in tqdm(load(workloads, per_workload), desc="sessions", unit="session"):
            answers: list[Answer] = []
            for _ in range(session.n_turns):
                turn = session.turn(answers)
                prompt = chat_prompt_tokens(target, turn.template_messages(), turn.tools)
                r = generate(Chain([target], []), prompt, SamplingParams(), turn.max_tokens)
                tasks.append({"workload": session.workload, "turn": turn.index + 1,
                              "id": f"{session.id}/{turn.index + 1}", "prompt": prompt, "answer": list(r.token_ids),
                              "eos": r.finish_reason == "stop"})
                answers.append(Answer(r.text))
    finally:
        pool.close()
    return {"costs_ms": costs, "tasks": tasks}


def evaluate(result: dict) -> dict:
    """Per group (a workload's turn, its turns 2 and later, all): auto's speed-up, replayed;
    its drafted cycles of all; the oracle's speed-up; the tokens."""
    costs = Costs(result["costs_ms"])
    longest = max(COST_POINTS)

    def t(n: int) -> float:  # a prompt's forward (longer than any verification) is free
        return costs(n) if n <= longest else 0.0

    def groups(task: dict) -> list[str]:
        workload, turn = task["workload"], task["turn"]
        return [f"{workload} turn {turn}"] + ([f"{workload} turns 2+"] if turn > 1 else [])

    speedups, cycles = router_replay(result["tasks"], t, groups)
    members: dict[str, list[list]] = {}
    for task in result["tasks"]:
        recorded = rows(task["prompt"], task["answer"])
        for name in (*groups(task), "all"):
            members.setdefault(name, []).append(recorded)
    return {name: {"auto": speedups[name],
                   "oracle": round(sum(len(r) * t(1) for r in answers) / sum(oracle(r, t) for r in answers), 3),
                   "drafted": list(cycles[name]), "tokens": sum(len(r) for r in answers)}
            for name, answers in sorted(members.items())}


def markdown(result: dict) -> str:
    m, s, ev = result["machine"], result["settings"], result["evaluation"]
    t = Costs(result["costs_ms"])
    lines = [f"# Session turns replayed through the router ({m['date']})", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, Python {m['python']}, llama-cpp-python "
             f"{m['llama_cpp_python']}. Command: `{m['command']}`."]
    if "replayed" in result:
        r = result["replayed"]
        lines += ["", f"Replayed {r['date']} on {r['cpu']} (`{r['command']}`), the recording's costs."]
    lines += ["", f"Target {s['target']} (q4 llama.cpp), greedy, {s['per_workload']} sessions per workload "
              f"({', '.join(s['workloads'])}), the target's own answers fed into later turns. Simulated decoding "
              "time on the recorded forward costs, prompts unpriced; one router, warm from the first turn, no "
              "saved state (benchmarks/sessions_replay.py says how).", "",
              "Forward of n tokens (ms): " + ", ".join(f"{n}: {t(n):.0f}" for n in (1, 2, 4, 8, 17, 33, 65)) + ".",
              "", "| turns | tokens | auto, replayed | oracle | cycles that drafted |", "|---|---|---|---|---|"]
    for name, row in ev.items():
        drafted, total = row["drafted"]
        share = f"{drafted / total:.0%} of {total}" if total else ""
        lines.append(f"| {name} | {row['tokens']:,} | {row['auto']} | {row['oracle']} | {share} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    ap = benchmark_parser("sessions-replay", __doc__, per=("workload", 5), render=True)
    ap.add_argument("--workloads", default=",".join(REPLAYED), help=f"comma-separated (default {','.join(REPLAYED)})")
    args = ap.parse_args(argv)
    if args.render is not None:
        result = json.loads(Path(args.render).read_text())
        info = machine_info()
        result["replayed"] = {key: info[key] for key in ("date", "cpu", "command")}
    else:
        workloads = [w for w in args.workloads.split(",") if w]
        if unknown := [w for w in workloads if w not in REPLAYED]:
            ap.error(f"--workloads: {', '.join(unknown)} cannot be replayed (valid: {', '.join(REPLAYED)})")
        result = {"machine": machine_info(),
                  "settings": {"per_workload": args.per_group, "workloads": workloads, "target": TARGET},
                  **record(workloads, args.per_group)}
    result["evaluation"] = evaluate(result)
    write_result(result, markdown, out=args.out, stem=result_stem(args, "sessions-replay", result))


if __name__ == "__main__":
    main()
