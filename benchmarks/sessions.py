"""Sessions through the server: edit loops, agent loops and document QA, every turn repeating
the conversation so far, played with the official openai client against `specrouter serve`.

    python -m benchmarks sessions [--concurrency 1,4,8] [--ablation-concurrency LEVELS]
                                  [--peer-concurrency LEVELS] [--sessions 5] [--modes greedy,T=0.7]
                                  [--workloads edit-loop,agent-loop,doc-qa] [--max-tokens N]
                                  [--servers default,memory-off,prefix-cache-off] [--native-servers all]
                                  [--n-ctx 4096] [--threads N] [--router-dir DIR] [--stem NAME]
                                  [--interleave-peers]

Workloads: benchmarks/sessions_workloads.py (five sessions each by default, the target's own
answers fed into later turns; the agent loop's reads scripted, its writes the model's). The
sessions run through `specrouter serve` subprocesses, one server up at a time, streamed,
c sessions at once (a closed loop over all of them, workloads interleaved) for every c of
--concurrency (--ablation-concurrency for the two settings after the default), in each mode
(greedy, T=0.7):
- `default`: prefix cache and per-key memory on (the server's defaults); requests with
  `"speculation": "off"` (the target alone, the reference of every ratio), then `"auto"`;
- `memory-off` (`--memory off`): auto without the cross-request memory;
- `prefix-cache-off` (`--prefix-cache 0`): the target alone and auto without the prefix cache;
- `memory-ab` (defaults): what the memory buys, interleaved on one server: the target alone,
  auto, auto with every request opted out of the memory (`"suffix_memory": false`), the
  same again, auto, the target alone (ABBA: the router's learning and the machine's drift
  weigh on both alike; the report pools each method's runs).
Every run presents an API key of its own: its memory partition and
its prefix caches start empty, so no run drafts from another's answers to the same sessions.
Runs in that order on a server, whose router keeps what it learned from one run to the next
(as a server does). Every server starts with --max-batch max(c), from one folder (a fresh one
unless --router-dir names it; the pulled models linked; the cost profile measured at the
first start where missing; every server started with no saved acceptance estimates). Then llama-server's peers (benchmarks/sessions_peers.py)
replay the target alone's conversations with their own prompt cache at each c of
--peer-concurrency, where `make native-peers` built llama-server (else the report says so).
With --interleave-peers (c = 1, the default server) the peers run between our runs instead:
one session at a time, our server and every peer up at once, the target alone plays the
session, each peer replays its transcript, then auto plays it (`interleaved`): on a machine
whose speed drifts over an hour, every ratio then compares minutes that ran together.

Per turn: time to first visible output, tokens/s as its client saw it (tokens over sending to
the stream's end), prompt tokens taken from the prefix cache, the share of cycles auto drafted
from the request's own text and from the memory (usage.speculation.lookup_sources), and the
memory's size (/metrics, specrouter:suffix_memory_tokens). Writes JSON (checkpointed after
every run), a markdown report and PNG plots to benchmarks/results/ (benchmarks/sessions_report.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from benchmarks.args import benchmark_parser, int_list, result_stem
from benchmarks.machine import machine_info
from benchmarks.native_server import Peer
from benchmarks.output import save_json, write_result
from benchmarks.servers import free_port, stop, wait_healthy
from benchmarks.sessions_client import MODES, ChatClient, RunRecord, play_sessions
from benchmarks.sessions_peers import SESSION_PEERS, CachedServer, peers_missing, replay
from benchmarks.sessions_report import REFERENCE, markdown, write_plots
from benchmarks.sessions_workloads import MAX_TOKENS, WORKLOADS, Answer, Session, Turn, load
from specrouter.models import default_cache_dir

TARGET = "qwen2.5-coder-1.5b"
ROOT = Path(__file__).resolve().parents[1]
#: `specrouter serve` of this checkout, run by this interpreter (a console script on the PATH
#: may belong to another checkout's install).
SERVE = [sys.executable, "-c", "from specrouter.cli import main; main()", "serve"]
#: What a method's requests carry beyond the conversation (the server's extensions).
REQUEST_FIELDS = {"target alone": {"speculation": "off"}, "auto": {"speculation": "auto"},
                  "auto, memory opted out": {"speculation": "auto", "suffix_memory": False}}


@dataclass(frozen=True)
class Setting:
    """A server's setting: its flags beyond the defaults, and the methods run on it."""

    label: str
    flags: tuple[str, ...]
    methods: tuple[str, ...]


SETTINGS = {s.label: s for s in (Setting("default", (), ("target alone", "auto")),
                                 Setting("memory-off", ("--memory", "off"), ("auto",)),
                                 Setting("prefix-cache-off", ("--prefix-cache", "0"), ("target alone", "auto")),
                                 Setting("memory-ab", (), ("target alone", "auto", "auto, memory opted out",
                                                           "auto, memory opted out", "auto", "target alone")))}


@contextlib.contextmanager
def our_server(setting: Setting, folder: Path, max_batch: int, n_ctx: int, threads: int | None) -> Iterator[str]:
    """`specrouter serve` with the setting's flags, its cache `folder` (the models linked, no
    saved acceptance estimates: a file left by an earlier server is removed); yields its URL."""
    (folder / "profiles" / "acceptance.json").unlink(missing_ok=True)
    port = free_port()
    argv = [*SERVE, "--port", str(port), "--max-batch", str(max_batch), "--n-ctx", str(n_ctx), *setting.flags]
    if threads is not None:
        argv += ["--threads", str(threads)]
    path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "SPECROUTER_CACHE": str(folder / "models"), "PYTHONPATH": path}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, f"the server ({setting.label})")
        yield url
    finally:
        stop(proc)


def servers_folder(folder: Path | None) -> Path:
    """The servers' cache folder (their profiles and estimates, the user's pulled models linked
    in as `models`): `folder`, or a fresh one."""
    folder = Path(tempfile.mkdtemp(prefix="specrouter-sessions-bench-")) if folder is None else folder
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "models").exists():
        (folder / "models").symlink_to(default_cache_dir(), target_is_directory=True)
    return folder


def fingerprint(answer: Answer) -> str:
    """A short digest of an answer (text and calls): greedy runs are compared by it."""
    data = json.dumps([answer.content, [[c.name, c.arguments] for c in answer.calls]])
    return hashlib.sha256(data.encode()).hexdigest()[:16]


def run_record(run: RunRecord) -> dict:
    """A run as the JSON keeps it: its turns, and per session its answers' digests."""
    out = asdict(run)
    out["answers"] = {sid: [fingerprint(a) for a in answers] for sid, answers in run.answers.items()}
    out["tokens_per_s"] = run.tokens_per_s
    return out


@dataclass(frozen=True)
class Plan:
    """What a run plays: sessions, modes, our server settings and llama-server peers, each
    part at its concurrency levels, and the servers' context and threads."""

    sessions: tuple[Session, ...]
    modes: tuple[str, ...]
    levels: tuple[int, ...]  # the default server's
    ablation_levels: tuple[int, ...]  # the other settings'
    peer_levels: tuple[int, ...]
    settings: tuple[Setting, ...]
    peers: tuple[Peer, ...]
    n_ctx: int = 4096
    threads: int | None = None
    max_tokens: int | None = None  # every turn's cap (None: the workload's MAX_TOKENS)
    router_dir: Path | None = None  # the servers' cache folder (None: a fresh one)
    interleave_peers: bool = False  # c = 1, the default server: the peers one session at a time (interleaved)

    def levels_of(self, setting: Setting) -> tuple[int, ...]:
        return self.levels if setting.label == "default" else self.ablation_levels


def ours(plan: Plan, checkpoint: Callable[[list[RunRecord]], None]) -> dict[str, dict[str, list[Answer]]]:
    """Every setting's runs (handed to `checkpoint` after each); returns per mode the target
    alone's first transcript at its server's lowest concurrency (what the peers replay)."""
    folder, runs, transcripts = servers_folder(plan.router_dir), [], {}
    for setting in plan.settings:
        levels = plan.levels_of(setting)
        with our_server(setting, folder, max(levels), plan.n_ctx, plan.threads) as url:
            asyncio.run(_warm(ChatClient(url, TARGET, "warm-up", {"speculation": "off"})))
            for mode in plan.modes:
                for c in levels:
                    for method in setting.methods:
                        run = RunRecord(setting.label, method, mode, c)
                        client = ChatClient(url, TARGET, f"{setting.label}/{method}/{mode}/c{c}/{len(runs)}",
                                            REQUEST_FIELDS[method])
                        asyncio.run(_play(client, plan.sessions, plan, c, MODES[mode], run))
                        runs.append(run)
                        if method == REFERENCE and c == min(levels):
                            transcripts.setdefault(mode, run.answers)
                        _report(run)
                        checkpoint(runs)
    return transcripts


async def _warm(client: ChatClient) -> None:
    try:
        await client.client.chat.completions.create(model=client.model, max_tokens=4, temperature=0,
                                                    messages=[{"role": "user", "content": "Hello"}],
                                                    extra_body=client.extra)
    finally:
        await client.close()


async def _play(client: ChatClient, sessions: Sequence[Session], plan: Plan, c: int, temperature: float,
                run: RunRecord) -> None:
    try:
        await play_sessions(client, sessions, c, temperature, run, plan.max_tokens)
    finally:
        await client.close()


class PromptRenderer:
    """The peers' prompts: a session's turns after a transcript's answers with their prompt
    ids (the target's chat template, as our server tokenizes them), turns that force a tool
    call left out (sessions_peers.py). Holds the target (its tokenizer) while open."""

    def __init__(self, plan: Plan) -> None:
        from specrouter.pool import Pool

        self.plan = plan
        self.pool = Pool(n_ctx=plan.n_ctx, n_seq_max=1, n_threads=plan.threads)
        try:
            self.target = self.pool.level(TARGET)
        except BaseException:
            self.pool.close()
            raise

    @property
    def n_threads(self) -> int:
        return self.target.n_threads

    def turns(self, session: Session, answers: Sequence[Answer]) -> list[tuple[Turn, list[int]]]:
        from specrouter.chat import chat_prompt_tokens

        played = (session.turn(answers[:i], self.plan.max_tokens) for i in range(len(answers)))
        return [(turn, chat_prompt_tokens(self.target, turn.template_messages(), turn.tools))
                for turn in played if not turn.forced]

    def close(self) -> None:
        self.pool.close()


def peer_server(plan: Plan, peer: Peer, n_threads: int, slots: int) -> CachedServer:
    from specrouter.models import resolve_model

    draft = resolve_model(peer.draft_model) if peer.draft_model else None
    return CachedServer(peer, resolve_model(TARGET), draft, n_threads, plan.n_ctx, slots)


def _started(plan: Plan, peer: Peer, n_threads: int, slots: int, errors: dict[str, str]) -> CachedServer | None:
    """The peer's server, or None with why it could not start in `errors` (a peer that cannot
    run is a result to report, not a reason to stop)."""
    try:
        return peer_server(plan, peer, n_threads, slots)
    except Exception as exc:  # noqa: BLE001 - reported, see above
        errors[peer.label] = f"{type(exc).__name__}: {exc}"
        return None


def peers(plan: Plan, transcripts: dict[str, dict[str, list[Answer]]],
          checkpoint: Callable[[list[RunRecord]], None]) -> dict[str, str]:
    """The llama-server peers' replays of the transcripts (handed to `checkpoint` after each);
    returns why each peer that did not run did not."""
    renderer = PromptRenderer(plan)
    try:
        prompts = {mode: [renderer.turns(s, answers.get(s.id, [])) for s in plan.sessions]
                   for mode, answers in transcripts.items()}
        n_threads = renderer.n_threads
    finally:
        renderer.close()
    runs, errors = [], {}
    for peer in plan.peers:
        for c in plan.peer_levels:
            if (server := _started(plan, peer, n_threads, c, errors)) is None:
                break
            try:
                for mode, replays in prompts.items():
                    run = RunRecord(peer.label, "llama-server", mode, c)
                    asyncio.run(replay(server.url, replays, c, MODES[mode], run))
                    runs.append(run)
                    _report(run)
                    checkpoint(runs)
            finally:
                server.close()
    return errors


def interleaved(plan: Plan, checkpoint_runs: Callable[[list[RunRecord]], None],
                checkpoint_peers: Callable[[list[RunRecord]], None]) -> dict[str, str]:
    """One session at a time, the default server and every peer up at once (an idle server
    costs nothing): per mode and session, the target alone plays it, each peer replays that
    transcript at once, then auto plays it; a method's sessions add up into one run per mode.
    Ratios then share the machine's state of the minutes they ran in. Returns why each
    peer that did not run did not."""
    setting, runs, peer_runs, errors = SETTINGS["default"], [], [], {}
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(our_server(setting, servers_folder(plan.router_dir), 1, plan.n_ctx, plan.threads))
        renderer = stack.enter_context(contextlib.closing(PromptRenderer(plan)))
        servers = {peer.label: stack.enter_context(contextlib.closing(server)) for peer in plan.peers
                   if (server := _started(plan, peer, renderer.n_threads, 1, errors)) is not None}
        asyncio.run(_warm(ChatClient(url, TARGET, "warm-up", {"speculation": "off"})))
        for mode in plan.modes:
            ours_ = {m: RunRecord(setting.label, m, mode, 1) for m in setting.methods}
            theirs = {label: RunRecord(label, "llama-server", mode, 1) for label in servers}
            runs += ours_.values()
            peer_runs += theirs.values()
            for session in plan.sessions:
                for method, run in ours_.items():
                    if run.error is None:
                        client = ChatClient(url, TARGET, f"{setting.label}/{method}/{mode}/interleaved",
                                            REQUEST_FIELDS[method])
                        asyncio.run(_play(client, [session], plan, 1, MODES[mode], run))
                    if method == REFERENCE:
                        replays = renderer.turns(session, ours_[REFERENCE].answers.get(session.id, []))
                        for label, server in servers.items():
                            if theirs[label].error is None:
                                asyncio.run(replay(server.url, [replays], 1, MODES[mode], theirs[label]))
                checkpoint_runs(runs)
                checkpoint_peers(peer_runs)
            for run in [*ours_.values(), *theirs.values()]:
                _report(run)
    return errors


def _report(run: RunRecord) -> None:
    print(f"{run.server} | {run.method} | {run.mode} | c={run.concurrency}: {run.tokens_per_s:.2f} tok/s"
          + (f" ({run.error})" if run.error else ""), flush=True)


def run(plan: Plan, out: Path, stem: str) -> dict:
    started = time.perf_counter()
    workloads = list(dict.fromkeys(s.workload for s in plan.sessions))
    result = {"machine": machine_info(), "settings": {
        "target": TARGET, "concurrency": list(plan.levels), "ablation_concurrency": list(plan.ablation_levels),
        "peer_concurrency": list(plan.peer_levels), "modes": list(plan.modes), "workloads": workloads,
        "sessions_per_workload": len(plan.sessions) // max(1, len(workloads)), "n_ctx": plan.n_ctx,
        "threads": plan.threads, "max_tokens": {w: plan.max_tokens or MAX_TOKENS[w] for w in workloads},
        "servers": {s.label: {"flags": list(s.flags), "methods": list(s.methods)} for s in plan.settings},
        "router_start": ("fresh folder: the cost profile measured at the first server's start" if plan.router_dir
                         is None else f"the cost profiles in {plan.router_dir}") + "; every server started with no "
                        "saved acceptance estimates",
        "native_servers": [p.label for p in plan.peers], "peers_missing": peers_missing(),
        "interleaved": plan.interleave_peers},
        "sessions": [{"id": s.id, "workload": s.workload, "source": s.source, "sha256": s.digest,
                      "turns": s.n_turns} for s in plan.sessions], "runs": [], "peer_runs": [], "peer_errors": {}}

    def checkpoint(key: str) -> Callable[[list[RunRecord]], None]:
        def save(records: list[RunRecord]) -> None:
            result[key] = [run_record(r) for r in records]
            save_json(result, out / f"{stem}.json")
        return save

    if plan.interleave_peers:
        plan = replace(plan, peers=plan.peers if peers_missing() is None else ())
        result["peer_errors"] = interleaved(plan, checkpoint("runs"), checkpoint("peer_runs"))
    else:
        transcripts = ours(plan, checkpoint("runs"))
        if plan.peers and peers_missing() is None:
            result["peer_errors"] = peers(plan, transcripts, checkpoint("peer_runs"))
    result["minutes"] = round((time.perf_counter() - started) / 60, 1)
    return result


def chosen_peers(ap: argparse.ArgumentParser, text: str) -> tuple[Peer, ...]:
    by_label = {p.label: p for p in SESSION_PEERS}
    chosen = {"all": SESSION_PEERS, "none": ()}.get(text)
    if chosen is None:
        if unknown := [w for w in text.split(",") if w not in by_label]:
            ap.error(f"unknown llama-server peers {unknown}: use all, none or {', '.join(by_label)}")
        chosen = tuple(by_label[w] for w in text.split(","))
    return chosen


def main(argv: Sequence[str] | None = None) -> None:
    ap = benchmark_parser("sessions", __doc__, concurrency="1,4,8")
    ap.add_argument("--ablation-concurrency", type=int_list, metavar="LEVELS",
                    help="the memory-off and prefix-cache-off servers' levels (default: --concurrency)")
    ap.add_argument("--peer-concurrency", type=int_list, metavar="LEVELS",
                    help="the llama-server peers' levels (default: --concurrency)")
    ap.add_argument("--sessions", type=int, default=5, metavar="N", help="sessions per workload (default 5)")
    ap.add_argument("--modes", default="greedy,T=0.7", help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated, of {', '.join(WORKLOADS)}")
    ap.add_argument("--max-tokens", type=int, metavar="N", help="new tokens per turn, every workload (default: "
                    + ", ".join(f"{w} {n}" for w, n in MAX_TOKENS.items()) + ")")
    ap.add_argument("--servers", default=",".join(SETTINGS), help=f"our server settings: {', '.join(SETTINGS)}")
    ap.add_argument("--native-servers", default="all", help="llama-server peers: all, none, or comma-separated "
                    f"labels of {', '.join(p.label for p in SESSION_PEERS)}")
    ap.add_argument("--n-ctx", type=int, default=4096, help="context per sequence, every server (default 4096)")
    ap.add_argument("--threads", type=int, help="threads per model (default: every core)")
    ap.add_argument("--router-dir", type=Path, metavar="DIR", help="the servers' cache folder: the cost profiles "
                    "they read (measured where missing) and write; saved acceptance estimates there are removed "
                    "before every server starts (default: a fresh folder; never the user's cache)")
    ap.add_argument("--interleave-peers", action="store_true", help="one session at a time, our default server "
                    "and the peers up at once: per session the target alone, each peer's replay, then auto "
                    "(needs --concurrency 1 --servers default)")
    args = ap.parse_args(argv)
    if args.interleave_peers and (args.concurrency != [1] or args.servers != "default"):
        ap.error("--interleave-peers runs one session at a time on the default server: "
                 "give --concurrency 1 --servers default")
    modes, workloads, servers = args.modes.split(","), args.workloads.split(","), args.servers.split(",")
    if unknown := [m for m in modes if m not in MODES] + [w for w in workloads if w not in WORKLOADS]:
        ap.error(f"unknown modes or workloads {unknown}")
    if unknown := [s for s in servers if s not in SETTINGS]:
        ap.error(f"unknown servers {unknown}: use {', '.join(SETTINGS)}")
    plan = Plan(tuple(load(workloads, args.sessions)), tuple(modes), tuple(args.concurrency),
                tuple(args.ablation_concurrency or args.concurrency), tuple(args.peer_concurrency or args.concurrency),
                tuple(SETTINGS[s] for s in servers), chosen_peers(ap, args.native_servers), args.n_ctx, args.threads,
                args.max_tokens, args.router_dir, args.interleave_peers)
    stem = result_stem(args, "sessions")
    result = run(plan, args.out, stem)
    plots = write_plots(result, args.out, stem)
    write_result(result, lambda r: markdown(r, plots), out=args.out, stem=stem)


if __name__ == "__main__":
    main()
