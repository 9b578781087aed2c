"""The hostile client (issue server-hardening-2): the server driven as a careless or hostile
client would, on loopback, on the real default pool (q4 Qwen2.5-Coder 0.5B drafting for the
1.5B target).

    python -m benchmarks hostile [--soak-clients 24] [--soak-each 8] [--slow-clients 400]
                                 [--profile-from RESULT.json] [--stem NAME] [--render RESULT.json]

Two `specrouter serve` subprocesses, one after the other: the default mode with an API key,
then `--exact`; each from its own fresh profile folder (the pulled models linked, never the
user's profiles), with the cost profile of a committed result (--profile-from: no minutes of
profiling per start; costs only steer the router, which no item judges), read timeouts
shortened to keep the run short (--header-timeout 3, --body-timeout 5), --max-connections
450 and --shutdown-timeout 4 (the drain's grace). Against each, in order: inputs that were
500s (item 1), control-token text in tools (2), seeds (3), loose types (5), auth and the
Host allow-list, 22 bad `speculation` values, bodies far over the limit, 400 slow clients
and the connection bound (4), a soak of concurrent clients, in --exact mode concurrent
against solo greedy outputs, and last a drain on SIGTERM. Then two more servers on one
profile folder that exit together (7). Item 6 (head-of-line blocking) is measured by
benchmarks.prefill_stall.

Per item: requests sent, 2xx, 4xx, 5xx, hangs (no answer within the client's timeout),
dropped connections, and whether its expectation held. Writes
benchmarks/results/hostile-<date>-<cpu>.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from benchmarks import hostile_items as items
from benchmarks import hostile_load as load
from benchmarks import hostile_soak as soaks
from benchmarks.hostile_client import ANSWER_SECONDS, ItemResult, Tally
from benchmarks.hostile_servers import REPOSITORY, Running, ServerSpec, start, terminate
from benchmarks.args import benchmark_parser
from benchmarks.machine import machine_info
from benchmarks.output import RESULTS, write_result
from specrouter.backends.llamacpp import LlamaCppBackend
from specrouter.models import model_path

PROFILE_FROM = RESULTS / "router-auto-2026-12-06-epyc-firm.json"
TIMEOUTS = load.Timeouts(header_s=3.0, body_s=5.0, max_connections=450)
KEY = "hostile-key"
COUNTS = ("sent", "ok", "client_errors", "server_errors", "unexpected_5xx", "hangs", "dropped")


def cpu_tag(cpu: str) -> str:
    """A short name of the CPU for file names: its family (epyc, xeon, ...) where known."""
    lowered = cpu.lower()
    known = next((f for f in ("epyc", "xeon", "ryzen", "core", "graviton", "neoverse") if f in lowered), None)
    return known or (re.findall(r"[a-z0-9]+", lowered) or ["cpu"])[0]


def _guarded(label: str, name: str, run_item) -> ItemResult:
    """The item's result, or a failed one saying how the harness broke (never the whole run)."""
    try:
        return run_item()
    except Exception as exc:  # noqa: BLE001 - a broken item is reported, the others still run
        failed = ItemResult(name, label, "the item ran to its end")
        failed.check(f"the item raised {type(exc).__name__}: {str(exc)[:300]}", False)
        failed.figures["traceback"] = traceback.format_exc()[-3000:].replace(str(REPOSITORY), ".")
        return failed


def one_server(spec: ServerSpec, work: Path, model: LlamaCppBackend, args: argparse.Namespace
               ) -> tuple[list[ItemResult], dict]:
    slug = re.sub(r"[^a-z0-9]+", "-", spec.label.lower()).strip("-")
    started = time.monotonic()
    run: Running = start(spec, work / slug, work / f"{slug}.log")
    exact = "--exact" in spec.flags
    plan = [
        ("1 inputs that were 500s", lambda: items.inputs_that_were_500s(run)),
        ("2 control-token text in tools", lambda: items.control_tokens_from_tools(run, model)),
        ("3 seeds repeat", lambda: items.seeds_repeat(run)),
        ("5 loose validation", lambda: items.loose_types(run)),
        ("turn 2: auth and Host", lambda: items.auth_and_hosts(run)),
        ("turn 2: bad speculation", lambda: items.bad_speculation(run)),
        ("turn 2: bodies", lambda: load.big_bodies(run)),
        ("4 slow clients", lambda: load.slow_clients_closed(run, TIMEOUTS, args.slow_clients)),
        ("4 connection bound", lambda: load.connection_bound(run, TIMEOUTS)),
        ("turn 2: soak", lambda: soaks.soak(run, args.soak_clients, args.soak_each)),
    ]
    if exact:
        plan.append(("turn 2: exactness under concurrency", lambda: soaks.exact_under_concurrency(run)))
    results = []
    for name, run_item in plan:
        print(f"[{spec.label}] {name}", flush=True)
        results.append(_guarded(spec.label, name, run_item))
    print(f"[{spec.label}] turn 2: drain on SIGTERM", flush=True)
    results.append(_guarded(spec.label, "turn 2: drain on SIGTERM", lambda: load.drain_on_sigterm(run)))
    status = terminate(run)  # the drain's exit status (or, if the drain broke, a plain SIGTERM's)
    command = " ".join(spec.command(0)).replace("--port 0 ", "").replace(f"{work}{os.sep}", "")
    info = {"command": command, "exit_status": status,
            "minutes": round((time.monotonic() - started) / 60, 1), "log_bytes": run.log_bytes(),
            "store_after": json.loads(run.estimates.read_text()) if run.estimates.exists() else None}
    return results, info


def main(argv: Sequence[str] | None = None) -> None:
    ap = benchmark_parser("hostile", __doc__, stem="hostile-<date>-<cpu>", render=True)
    ap.add_argument("--soak-clients", type=int, default=24, metavar="N", help="concurrent soak clients (default 24)")
    ap.add_argument("--soak-each", type=int, default=8, metavar="N",
                    help="requests per soak client, in two rounds of half (default 8)")
    ap.add_argument("--slow-clients", type=int, default=400, metavar="N", help="slow clients of item 4 (default 400)")
    ap.add_argument("--profile-from", type=Path, default=PROFILE_FROM, metavar="JSON",
                    help=f"a result whose `profile` the servers' router prices with (default: {PROFILE_FROM.name})")
    args = ap.parse_args(argv)
    if args.render:
        result = json.loads(args.render.read_text())
        write_result(result, markdown, out=args.out, stem=args.stem or args.render.stem)
        return
    began, load_before = time.monotonic(), os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="specrouter-hostile-"))
    profile = work / "profile.json"
    profile.write_text(json.dumps(json.loads(args.profile_from.read_text())["profile"]))
    common = ("--profile", str(profile), *TIMEOUTS.flags(), "--shutdown-timeout", "4")
    specs = [ServerSpec("default mode, API key", common, KEY), ServerSpec("--exact", ("--exact", *common))]
    model = LlamaCppBackend(model_path(items.TARGET), n_ctx=512, n_seq_max=1, n_threads=1)
    all_items, servers = [], {}
    try:
        for spec in specs:
            results, info = one_server(spec, work, model, args)
            all_items += results
            servers[spec.label] = info
    finally:
        model.close()
    keyed = work / re.sub(r"[^a-z0-9]+", "-", specs[0].label.lower()).strip("-") / "profiles" / "acceptance.json"
    print("[two servers] 7 two servers, one store", flush=True)
    pair = ServerSpec("two servers, one folder", common, KEY)
    all_items.append(_guarded(pair.label, "7 two servers, one store", lambda: load.two_servers_merge(
        pair, work / "item7", work, keyed if keyed.exists() else None)))
    machine = machine_info()
    result = {"machine": machine, "load_average": {"start": load_before, "end": os.getloadavg()},
              "minutes": round((time.monotonic() - began) / 60, 1), "profile_from": str(args.profile_from.name),
              "timeouts": asdict(TIMEOUTS), "servers": servers,
              "items": [{**asdict(i), "held": i.held} for i in all_items], "totals": totals(all_items)}
    stem = args.stem or f"hostile-{machine['date'][:10]}-{cpu_tag(machine['cpu'])}"
    write_result(result, markdown, out=args.out, stem=stem)


def totals(results: list[ItemResult]) -> dict:
    """Per server, the counts summed over its items, and how many items held."""
    out: dict[str, dict] = {}
    for r in results:
        entry = out.setdefault(r.server, {"tally": Tally(), "items": 0, "held": 0})
        entry["tally"].add(r.tally)
        entry["items"] += 1
        entry["held"] += r.held
    return {s: {**{k: getattr(e["tally"], k) for k in COUNTS}, "items": e["items"], "held": e["held"]}
            for s, e in out.items()}


def markdown(result: dict) -> str:
    m = result["machine"]
    la = result["load_average"]
    lines = [f"# The hostile client on the default pool ({m['date']})", "",
             "Issue server-hardening-2's hostile list and its turn-2 list, re-run on loopback against `specrouter "
             "serve` on the default pool (q4 Qwen2.5-Coder 0.5B drafting for the 1.5B target, llama.cpp). Per item: "
             f"requests, their answers, hangs (no answer within {ANSWER_SECONDS:g} s; a slow client closed later "
             f"than its timeout + {load.SLACK_S:g} s fails its item) and dropped connections (closed or reset "
             "without an answer, "
             "or a stream read to its end without [DONE]). Item 6 (head-of-line blocking) is measured by "
             "benchmarks.prefill_stall, not here.", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, llama-cpp-python {m['llama_cpp_python']}. Command: "
             f"`{m['command']}`; {result['minutes']} min. Other work shared the cores during the run (load average "
             f"{la['start'][0]:.1f} at the start, {la['end'][0]:.1f} at the end): a correctness run, not a speed "
             "measurement; no figure below is a timing claim except where an item bounds a time.", "",
             f"Servers (one after the other, each from a fresh profile folder, the router priced with the profile of "
             f"`{result['profile_from']}`; read timeouts shortened to {result['timeouts']['header_s']:g} s headers "
             f"and {result['timeouts']['body_s']:g} s body to keep the run short; the defaults are 10 and 30):", ""]
    for label, info in result["servers"].items():
        lines.append(f"- {label}: `{info['command']}`, exit status {info['exit_status']}, {info['minutes']} min")
    head = ["server", "items held", "requests", "2xx", "4xx", "5xx", "5xx unexpected", "hangs", "dropped"]
    lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, t in result["totals"].items():
        lines.append(f"| {label} | {t['held']} / {t['items']} | " + " | ".join(
            str(t[k]) for k in COUNTS) + " |")
    lines += ["", "5xx counts the 503s that the connection bound and the drain are expected to answer; \"5xx "
              "unexpected\" counts the others (any 500), each of which fails its item.", ""]
    head = ["item", "server", "held", "requests", "2xx", "4xx", "5xx", "5xx unexpected", "hangs", "dropped"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i in result["items"]:
        t = i["tally"]
        lines.append(f"| {i['item']} | {i['server']} | {'yes' if i['held'] else '**no**'} | "
                     + " | ".join(str(t[k]) for k in COUNTS) + " |")
    lines.append("")
    for i in result["items"]:
        lines += [f"## {i['item']} ({i['server']}): {'held' if i['held'] else 'FAILED'}", "",
                  f"Expectation: {i['expectation']}.", ""]
        lines += [f"- {'ok' if c['held'] else 'FAILED'}: {c['what']}" for c in i["checks"]]
        lines += [f"- unexpected: {u}" for u in i["tally"]["unexpected"][:20]]
        figures = {k: v for k, v in i["figures"].items() if k != "traceback"}
        if figures:
            lines += ["", "```", json.dumps(figures, ensure_ascii=False, indent=1)[:3000], "```"]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
