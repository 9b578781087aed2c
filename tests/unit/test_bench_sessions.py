"""The sessions benchmark's workloads (benchmarks/sessions_workloads.py): every request a pure
function of the answers before it, the same token ids when played twice; and its report's
arithmetic (benchmarks/sessions_report.py)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from benchmarks import sessions
from benchmarks.sessions_client import ChatClient, RunRecord, memory_tokens, play_sessions
from benchmarks.sessions_report import markdown, per_turn, pooled_table, runs_table, workloads_table, write_plots
from benchmarks.sessions_workloads import (AGENT_CUTS, DOC_QUESTIONS, EDIT_CUTS, EDIT_REPLY, MAX_TOKENS, Answer,
                                           Call, Message, Session, Turn, cut_text, load,
                                           stdlib_source)
from specrouter.backends.synthetic import SyntheticBackend
from specrouter.chat import chat_prompt_tokens
from specrouter.drafters.memory import SuffixMemory

from .server_synth import MODEL, build_service, running_server

#: A chat template that renders every part of a request: tools, contents, calls and their ids.
TEMPLATE = ("{% if tools %}[tools]{{ tools | tojson }}{% endif %}{% for m in messages %}[{{ m.role }}]"
            "{{ m.content or '' }}{% for c in m.tool_calls or [] %}[call {{ c.id }}]{{ c.function | tojson }}"
            "{% endfor %}{% if m.tool_call_id %}[for {{ m.tool_call_id }}]{% endif %}{% endfor %}[assistant]")


def fake_answer(turn: Turn) -> Answer:
    """A stand-in for the target: an answer that depends on the whole request (a forced turn:
    a write_file call, with a random-looking id as a server gives)."""
    digest = hashlib.sha256(json.dumps(turn.openai_messages()).encode()).hexdigest()
    if turn.forced:
        arguments = json.dumps({"path": "src/x.py", "content": f"# {digest}\n"})
        return Answer(None, (Call(f"call_{digest[:8]}", turn.forced, arguments),))
    return Answer(f"answer {turn.index}: {digest}")


def played(sessions: list[Session]) -> list[list[int]]:
    """Every turn's prompt ids, each session played to its end with fake answers."""
    model = SyntheticBackend("target", vocab=4096, chat_template=TEMPLATE)
    out = []
    for session in sessions:
        answers: list[Answer] = []
        while len(answers) < session.n_turns:
            turn = session.turn(answers)
            out.append(chat_prompt_tokens(model, turn.template_messages(), turn.tools))
            answers.append(fake_answer(turn))
    return out


def test_every_session_plays_to_the_same_token_ids_twice():
    first, second = played(load()), played(load())
    assert len(first) == 5 * 5 + 5 * 3 + 5 * 5  # edit and doc sessions: five turns; agent sessions: three
    assert first == second
    assert len({tuple(ids) for ids in first}) == len(first)  # every turn is a request of its own


def test_the_workloads_are_interleaved_five_sessions_each():
    sessions = load()
    assert [s.workload for s in sessions[:3]] == ["edit-loop", "agent-loop", "doc-qa"]
    assert [s.id for s in sessions if s.workload == "edit-loop"] == [f"edit-{c.module}" for c in EDIT_CUTS]
    assert [s.id for s in sessions if s.workload == "agent-loop"] == [f"agent-{c.module}" for c in AGENT_CUTS]
    assert len({s.id for s in sessions}) == 15


def test_an_edit_loop_turn_repeats_the_conversation_and_asks_for_the_whole_file():
    session = load(["edit-loop"], 1)[0]
    answers = [Answer("```python\nv1\n```"), Answer("```python\nv2\n```")]
    turn = session.turn(answers)
    assert turn.index == 2 and turn.max_tokens == MAX_TOKENS["edit-loop"] and turn.tools is None
    roles = [m.role for m in turn.messages]
    assert roles == ["user", "assistant", "user", "assistant", "user"]
    assert [m.content for m in turn.messages[1::2]] == ["```python\nv1\n```", "```python\nv2\n```"]
    assert turn.messages[-1].content == f"Rename `bisect_right` to `upper_bound` everywhere in the file. {EDIT_REPLY}"
    assert "if x <= a[mid]:" in turn.messages[0].content  # the injected bug
    assert session.turn(answers, max_tokens=16).max_tokens == 16


def test_an_agent_loop_scripts_the_reads_and_renumbers_the_models_call_ids():
    session = load(["agent-loop"], 1)[0]
    opening = session.turn([])
    assert opening.forced == "write_file" and opening.tool_choice() == {"type": "function",
                                                                        "function": {"name": "write_file"}}
    assert [m.role for m in opening.messages] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert [json.loads(m.calls[0].arguments) for m in opening.messages[2::2]] == [{"path": "ISSUE.md"},
                                                                               {"path": "src/textwrap.py"}]
    assert opening.messages[5].content == cut_text(AGENT_CUTS[0])
    write = Call("call_random", "write_file", json.dumps({"path": "src/textwrap.py", "content": "abc"}))
    turn = session.turn([Answer(None, (write,))])
    call, result, ask = turn.messages[-3:]
    assert call.calls == (Call("call_0_0", "write_file", write.arguments),)
    assert (result.role, result.call_id) == ("tool", "call_0_0")
    assert result.content == "Wrote 3 characters to src/textwrap.py. The tests pass."
    assert ask.content.startswith("Now add type hints")
    unparsed = session.turn([Answer("<tool_call>\n{\"name\": \"write_file\", \"argu")])  # cut by max_tokens
    assert [m.role for m in unparsed.messages[-2:]] == ["assistant", "user"]
    assert session.turn([Answer(None)]).messages[-2] == Message("assistant", "")  # an empty answer: empty text
    with pytest.raises(ValueError, match="has 3 turns"):
        session.turn([Answer("a")] * 3)


def test_a_doc_qa_session_asks_the_five_questions_over_one_document():
    session = load(["doc-qa"], 1)[0]
    turn = session.turn([Answer("a1"), Answer("a2"), Answer("a3"), Answer("a4")])
    assert [m.content for m in turn.messages if m.role == "user"][1:] == list(DOC_QUESTIONS[1:])
    assert turn.messages[1].content.startswith("Here is a document:\n\n<document>\n")


@pytest.mark.parametrize("cut", [*EDIT_CUTS, *AGENT_CUTS], ids=lambda c: f"{c.module}-{c.functions[0]}")
def test_a_cut_is_its_functions_from_the_shipped_module_with_the_bug_injected_once(cut):
    code = cut_text(cut)
    assert [line.split("(")[0] for line in code.splitlines() if line.startswith("def ")] == \
        [f"def {name}" for name in cut.functions]
    good, bad = cut.bug
    assert bad in code
    module = stdlib_source(cut.module).splitlines()
    assert all(line in module for line in code.replace(bad, good, 1).splitlines())  # the shipped text, unbugged


def test_the_memory_size_is_read_from_the_metrics():
    text = "# HELP x\nspecrouter:suffix_memory_tokens 1234.0\nspecrouter:suffix_memory_budget_tokens 9.0\n"
    assert memory_tokens(text) == 1234
    assert memory_tokens("specrouter:kv_tokens 3.0\n") is None


def turn(session: str, index: int, tokens: int, seconds: float, **extra) -> dict:
    return {"session": session, "workload": "edit-loop", "turn": index, "prompt_tokens": 100, "cached_tokens": 0,
            "completion_tokens": tokens, "ttft_s": 0.5, "seconds": seconds, "finish_reason": "stop", "cycles": 0,
            "drafts": {}, "accepted": {}, "memory_tokens": None, "draft_n": None, "draft_accepted": None, **extra}


def run(method: str, seconds: float, turns: list[dict], answers: dict) -> dict:
    return {"server": "default", "method": method, "mode": "greedy", "concurrency": 1, "seconds": seconds,
            "turns": turns, "answers": answers, "memory_before": 0, "error": None,
            "tokens_per_s": sum(t["completion_tokens"] for t in turns) / seconds}


def test_the_report_takes_ratios_to_the_target_alone_per_run_and_per_turn():
    alone = run("target alone", 10.0, [turn("s1", 0, 50, 5.0), turn("s2", 0, 50, 5.0)], {"s1": ["a"], "s2": ["b"]})
    auto = run("auto", 4.0, [turn("s1", 0, 50, 2.0, cycles=10, drafts={"request": 4, "memory": 1}, memory_tokens=80),
                             turn("s2", 0, 50, 1.0, cycles=10, drafts={"request": 2}, memory_tokens=120)],
               {"s1": ["a"], "s2": ["c"]})
    result = {"settings": {"concurrency": [1], "workloads": ["edit-loop"]}, "runs": [alone, auto]}
    row = runs_table(result)[3]
    assert row == "| auto | greedy | 1 | 2 | 100 | 25.00 | 2.500 | 500 | 0% | 30% | 5% | 120 | 1 of 2 |"
    curves = per_turn(result, "greedy")["auto"][("edit-loop", 0)]
    assert curves["tokens_per_s"] == 37.5  # the median of 25 and 50
    assert curves["ratio"] == 3.75  # the median of 2.5 and 5
    assert (curves["request"], curves["memory"], curves["memory_tokens"]) == (0.3, 0.05, 100)


def test_an_interleaved_ab_pools_each_methods_runs_on_its_server():
    """memory-ab's ABBA: each method's runs pooled (tokens over seconds), ratios to the same
    server's target alone pooled; per-run ratios to the first target alone run; the per-turn
    curve of a repeated method the median over all its runs' turns."""
    def ab(method: str, seconds: float, tokens: int) -> dict:
        return {**run(method, seconds, [turn("s1", 0, tokens, seconds)], {"s1": ["a"]}), "server": "memory-ab"}

    runs = [ab("target alone", 10.0, 100), ab("auto", 5.0, 100), ab("auto, memory opted out", 4.0, 100),
            ab("auto, memory opted out", 6.0, 110), ab("auto", 3.0, 80), ab("target alone", 12.0, 120)]
    result = {"settings": {"concurrency": [1], "workloads": ["edit-loop"]}, "runs": runs}
    assert pooled_table(result)[2:] == [
        "| target alone, memory-ab | greedy | 1 | 2 | 220 | 22 | 10.00 | 1.000 | 10.00, 10.00 |",
        "| auto, memory-ab | greedy | 1 | 2 | 180 | 8 | 22.50 | 2.250 | 20.00, 26.67 |",
        "| auto, memory opted out, memory-ab | greedy | 1 | 2 | 210 | 10 | 21.00 | 2.100 | 25.00, 18.33 |"]
    assert runs_table(result)[3].startswith("| auto, memory-ab | greedy | 1 | 1 | 100 | 20.00 | 2.000 |")
    curve = per_turn(result, "greedy")["auto, memory-ab"][("edit-loop", 0)]
    assert curve["tokens_per_s"] == (20.0 + 80 / 3) / 2  # the median of both runs' turn
    assert pooled_table({"settings": result["settings"], "runs": runs[:3]}) == []  # nothing repeated


def test_the_client_plays_a_session_through_the_server_feeding_each_answer_back():
    """Through the synthetic server: five streamed turns, each prompt the last one plus its
    answer and the next instruction, the memory's size read after each; twice the same."""
    def play() -> RunRecord:
        memory = SuffixMemory(100_000)
        service, _ = build_service(memory=memory, n_ctx=8192)
        with running_server(service, memory="per-key") as (url, _):
            client = ChatClient(url, MODEL, "session", {"speculation": "auto"})
            record = RunRecord("default", "auto", "greedy", 1)

            async def go() -> None:
                await play_sessions(client, load(["edit-loop"], 1), 1, 0.0, record, max_tokens=20)
                await client.close()

            asyncio.run(go())
        return record

    first, second = play(), play()
    assert first.error is None and first.memory_before == 0
    assert [t.turn for t in first.turns] == [0, 1, 2, 3, 4]
    assert [t.completion_tokens for t in first.turns] == [20] * 5
    assert [t.memory_tokens for t in first.turns] == [21 * (i + 1) for i in range(5)]  # each answer and a separator
    prompts = [t.prompt_tokens for t in first.turns]
    assert all(b > a + 20 for a, b in zip(prompts, prompts[1:]))  # the last prompt, its answer and an instruction
    assert all(t.ttft_s is not None and t.cycles > 0 for t in first.turns)
    assert [(t.prompt_tokens, t.completion_tokens) for t in second.turns] == [(t.prompt_tokens, 20) for t in first.turns]
    assert second.answers == first.answers and len(first.answers["edit-bisect"]) == 5


def test_the_report_renders_every_section_and_its_plots(tmp_path):
    alone = run("target alone", 10.0, [turn("s1", 0, 50, 5.0), turn("s1", 1, 50, 5.0)], {"s1": ["a", "b"]})
    auto = run("auto", 5.0, [turn("s1", 0, 50, 2.0, cycles=10, drafts={"request": 4}),
                             turn("s1", 1, 50, 3.0, cycles=10, drafts={"memory": 2})], {"s1": ["a", "b"]})
    result = {"machine": {"date": "2026-12-07 00:00 UTC", "cpu": "cpu", "cores": 2, "python": "3.11",
                          "llama_cpp_python": "0.3", "command": "python -m benchmarks sessions"},
              "settings": {"target": "t", "n_ctx": 4096, "workloads": ["edit-loop"], "sessions_per_workload": 1,
                           "max_tokens": {"edit-loop": 512}, "modes": ["greedy"], "concurrency": [1],
                           "servers": {"default": {"flags": [], "methods": ["target alone", "auto"]}},
                           "router_start": "fresh", "native_servers": ["llama-server"],
                           "peers_missing": "build/native/llama-server is missing: build it with `make native-peers`"},
              "runs": [alone, auto], "peer_runs": [], "peer_errors": {}, "minutes": 1.0}
    plots = write_plots(result, tmp_path, "run")
    assert plots == ["run-turns-greedy.png", "run-concurrency.png"]
    assert all((tmp_path / name).stat().st_size > 0 for name in plots)
    report = markdown(result, plots)
    assert "llama-server peers: build/native/llama-server is missing" in report
    assert "| edit-loop | 2 | auto | 16.67 | 1.667 | 500 | 0% | 0% | 20% |  |" in report
    assert "| auto | greedy | 1 | 20.00 (2.000) |" in report  # 100 tokens over 5 s of turns, alone 10 s
    assert report.endswith("![run-concurrency.png](run-concurrency.png)\n")


def test_a_run_plays_every_setting_one_server_at_a_time_and_writes_its_report(tmp_path, monkeypatch):
    """The benchmark's orchestration over synthetic servers (one per setting, as `serve` would
    start it): runs per setting, method and level, a key each, the report and plots written."""
    started: list[str] = []

    @contextmanager
    def synthetic_server(setting, folder, max_batch, n_ctx, threads):
        assert (folder / "models").is_symlink()
        started.append(setting.label)
        memory = None if "--memory" in setting.flags else SuffixMemory(100_000)
        service, _ = build_service(memory=memory, n_ctx=8192)
        with running_server(service, memory="off" if memory is None else "per-key") as (url, _):
            yield url

    monkeypatch.setattr(sessions, "our_server", synthetic_server)
    monkeypatch.setattr(sessions, "TARGET", MODEL)
    sessions.main(["--workloads", "edit-loop", "--sessions", "1", "--concurrency", "1,2", "--ablation-concurrency",
                   "1", "--modes", "greedy", "--servers", "default,memory-off", "--native-servers", "none",
                   "--max-tokens", "8", "--router-dir", str(tmp_path / "servers"), "--out", str(tmp_path / "out"),
                   "--stem", "run"])
    assert started == ["default", "memory-off"]
    result = json.loads((tmp_path / "out" / "run.json").read_text())
    assert [(r["server"], r["method"], r["concurrency"]) for r in result["runs"]] == [
        ("default", "target alone", 1), ("default", "auto", 1), ("default", "target alone", 2), ("default", "auto", 2),
        ("memory-off", "auto", 1)]
    assert all(len(r["turns"]) == 5 and r["error"] is None for r in result["runs"])
    assert result["runs"][1]["answers"] == result["runs"][0]["answers"]  # greedy: auto wrote the target alone's
    assert result["runs"][4]["memory_before"] is None  # no memory, no gauge
    assert result["peer_runs"] == [] and result["settings"]["native_servers"] == []
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "run-concurrency.png", "run-turns-greedy.png", "run.json", "run.md"]


def test_memory_ab_interleaves_opted_out_runs_each_under_a_key_of_its_own(tmp_path, monkeypatch):
    """memory-ab on one server: the target alone first and last, auto and opted-out auto
    ABBA between; an opted-out run adds nothing to the memory, auto's runs do, and no run
    finds another's texts (a key each: a repeated method starts from an empty partition)."""
    @contextmanager
    def synthetic_server(setting, folder, max_batch, n_ctx, threads):
        service, _ = build_service(memory=SuffixMemory(100_000), n_ctx=8192)
        with running_server(service, memory="per-key") as (url, _):
            yield url

    keys: list[str] = []

    class KeyedClient(sessions.ChatClient):
        def __init__(self, url, model, key, extra=None):
            keys.append(key)
            super().__init__(url, model, key, extra)

    monkeypatch.setattr(sessions, "our_server", synthetic_server)
    monkeypatch.setattr(sessions, "TARGET", MODEL)
    monkeypatch.setattr(sessions, "ChatClient", KeyedClient)
    sessions.main(["--workloads", "edit-loop", "--sessions", "1", "--concurrency", "1", "--modes", "greedy",
                   "--servers", "memory-ab", "--native-servers", "none", "--max-tokens", "8",
                   "--router-dir", str(tmp_path / "servers"), "--out", str(tmp_path / "out"), "--stem", "ab"])
    runs = json.loads((tmp_path / "out" / "ab.json").read_text())["runs"]
    assert [r["method"] for r in runs] == ["target alone", "auto", "auto, memory opted out", "auto, memory opted out",
                                           "auto", "target alone"]
    growth = [r["turns"][-1]["memory_tokens"] - r["memory_before"] for r in runs]
    assert growth[1] > 0 and growth[4] == growth[1]  # auto's runs: the same texts, each in its own partition
    assert growth[2] == growth[3] == growth[0] == growth[5] == 0
    assert all(r["answers"] == runs[0]["answers"] for r in runs)  # greedy: every method wrote the target alone's
    assert len(set(keys[1:])) == 6  # after the warm-up's, a key per run
    assert "## Repeated methods, pooled" in (tmp_path / "out" / "ab.md").read_text()


class _PeerHandler(BaseHTTPRequestHandler):
    """A stand-in llama-server: every /completion answers two tokens, logged as (its label, the prompt)."""

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.log.append((self.server.label, tuple(body["prompt"])))
        events = [{"content": "x"}, {"content": "y"},
                  {"content": "", "stop": True, "stop_type": "limit", "timings": {"cache_n": 0, "predicted_n": 2}}]
        payload = b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args) -> None:
        pass


class _FakePeer:
    def __init__(self, label: str, log: list) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _PeerHandler)
        self.server.label, self.server.log = label, log
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_interleaved_peers_replay_each_session_between_the_target_alone_and_auto(tmp_path, monkeypatch):
    """--interleave-peers: one session at a time, the target alone, then every peer replaying
    that session's transcript (as the target's template renders it), then auto; a method's
    sessions add up into one run; a peer that cannot start is reported and the others run.
    A turn that forces a tool call is not replayed."""
    log: list = []

    @contextmanager
    def synthetic_server(setting, folder, max_batch, n_ctx, threads):
        assert (setting.label, max_batch) == ("default", 1)
        service, _ = build_service(memory=SuffixMemory(100_000), n_ctx=8192)
        with running_server(service, memory="per-key") as (url, _):
            yield url

    def peer_server(plan, peer, n_threads, slots):
        if peer.draft_model:
            raise FileNotFoundError("no draft here")
        return _FakePeer(peer.label, log)

    class Renderer(sessions.PromptRenderer):
        def __init__(self, plan):
            self.plan, self.target = plan, SyntheticBackend("target", vocab=4096, chat_template=TEMPLATE)

        def close(self):
            pass

    real_play = sessions.play_sessions
    records: dict[str, RunRecord] = {}

    async def logged_play(client, played, c, temperature, run, max_tokens=None, watch_memory=True):
        log.append((run.method, tuple(s.id for s in played)))
        records[run.method] = run
        return await real_play(client, played, c, temperature, run, max_tokens, watch_memory)

    for name, value in {"our_server": synthetic_server, "peer_server": peer_server, "PromptRenderer": Renderer,
                        "play_sessions": logged_play, "TARGET": MODEL, "peers_missing": lambda: None}.items():
        monkeypatch.setattr(sessions, name, value)
    sessions.main(["--workloads", "edit-loop,doc-qa", "--sessions", "1", "--concurrency", "1", "--modes",
                   "greedy", "--servers", "default", "--max-tokens", "8", "--interleave-peers",
                   "--router-dir", str(tmp_path / "servers"), "--out", str(tmp_path / "out"), "--stem", "il"])
    result = json.loads((tmp_path / "out" / "il.json").read_text())
    played = load(["edit-loop", "doc-qa"], 1)
    peers = [p.label for p in sessions.SESSION_PEERS if not p.draft_model]
    assert result["peer_errors"] == {p.label: "FileNotFoundError: no draft here"
                                     for p in sessions.SESSION_PEERS if p.draft_model}
    alone = result["runs"][0]
    expected = []
    renderer = Renderer(None)
    for session in played:
        answers = records["target alone"].answers[session.id]
        prompts = [tuple(chat_prompt_tokens(renderer.target, t.template_messages(), t.tools))
                   for t in (session.turn(answers[:i], 8) for i in range(len(answers)))]
        expected += [("target alone", (session.id,)), *[(p, ids) for p in peers for ids in prompts],
                     ("auto", (session.id,))]
    assert log == expected
    assert [(r["method"], len(r["turns"]), r["error"]) for r in result["runs"]] == [
        ("target alone", 10, None), ("auto", 10, None)]  # five turns of each session, one run per method
    assert alone["seconds"] >= sum(t["seconds"] for t in alone["turns"])
    assert [(r["server"], len(r["turns"]), r["error"]) for r in result["peer_runs"]] == [(p, 10, None) for p in peers]
    assert result["settings"]["interleaved"] is True
    assert "up together, one session at a time" in (tmp_path / "out" / "il.md").read_text()
    agent = load(["agent-loop"], 1)[0]
    renderer.plan = sessions.Plan((agent,), ("greedy",), (1,), (1,), (1,), (), ())
    answers: list[Answer] = []
    for _ in range(agent.n_turns):
        answers.append(fake_answer(agent.turn(answers)))
    assert agent.forced == "write_file" and renderer.turns(agent, answers) == []  # every turn forces its call
    assert len(renderer.turns(played[0], records["target alone"].answers[played[0].id])) == 5


def test_interleaved_peers_need_one_session_at_a_time_on_the_default_server(tmp_path):
    for flags in (["--concurrency", "1,4"], ["--concurrency", "1", "--servers", "default,memory-off"]):
        with pytest.raises(SystemExit):
            sessions.main(["--interleave-peers", *flags, "--out", str(tmp_path)])


def test_a_peers_workload_ratio_counts_the_turns_it_replayed():
    """A peer skips a forced turn: its workload ratio is to the target alone's same turns."""
    alone = run("target alone", 30.0, [turn("s1", 0, 100, 10.0), turn("s1", 1, 100, 20.0)], {"s1": ["a", "b"]})
    peer = {**run("llama-server", 5.0, [turn("s1", 0, 100, 5.0)], {}), "server": "peer"}
    result = {"settings": {"concurrency": [1], "workloads": ["edit-loop"]}, "runs": [alone], "peer_runs": [peer]}
    assert workloads_table(result)[3] == "| peer | greedy | 1 | 20.00 (2.000) |"  # 20 tok/s over turn 0's 10
