"""The sessions benchmark's client: sessions (benchmarks/sessions_workloads.py) played against
an OpenAI-compatible server with the official `openai` client, streamed, c sessions at once,
each answer fed into the session's next turn; what every turn cost, as its client saw it.

A turn's time to first token is to its first visible output: a chunk with text or a tool
call (the server's first chunk, the assistant role with empty text, shows nothing). A
streamed tool call is held until it closes (server/streams.py), so a write_file turn's
first output is its whole call. The memory's size after a turn is read from /metrics
(specrouter:suffix_memory_tokens; None where the server exports none).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx
import openai

from benchmarks.sessions_workloads import Answer, Call, Session, Turn

#: Sampling per mode: a temperature (greedy is 0: the server's argmax path).
MODES = {"greedy": 0.0, "T=0.7": 0.7}
#: What a client waits for one turn (generation on a busy CPU is slow).
TURN_SECONDS = 1800.0


@dataclass
class TurnRecord:
    """One turn as its client saw it, and what the server's usage said of it."""

    session: str
    workload: str
    turn: int
    prompt_tokens: int
    cached_tokens: int  # prompt tokens the target took from the prefix cache
    completion_tokens: int
    ttft_s: float | None  # to the first visible output (None: none came)
    seconds: float  # from sending to the stream's end
    finish_reason: str | None
    cycles: int = 0
    #: Blocks the routed lookup drafted per source (request, memory, forced), and their accepted tokens.
    drafts: dict[str, int] = field(default_factory=dict)
    accepted: dict[str, int] = field(default_factory=dict)
    memory_tokens: int | None = None  # the memory's size when the turn ended (every partition)
    draft_n: int | None = None  # a llama-server peer's drafted tokens (its timings)
    draft_accepted: int | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.seconds if self.seconds > 0 else 0.0

    def share(self, source: str) -> float | None:
        """The share of the turn's cycles whose block came from `source` (None: no cycles counted)."""
        return self.drafts.get(source, 0) / self.cycles if self.cycles else None


@dataclass
class RunRecord:
    """Sessions played at one concurrency by one method (a server's setting and a request's
    speculation) in one mode: every turn, and the transcripts (the answers) per session."""

    server: str
    method: str
    mode: str
    concurrency: int
    seconds: float = 0.0
    turns: list[TurnRecord] = field(default_factory=list)
    answers: dict[str, list[Answer]] = field(default_factory=dict)
    memory_before: int | None = None
    error: str | None = None

    @property
    def tokens(self) -> int:
        return sum(t.completion_tokens for t in self.turns)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def memory_tokens(metrics_text: str) -> int | None:
    """specrouter:suffix_memory_tokens in a /metrics exposition (None: not there)."""
    for line in metrics_text.splitlines():
        if line.startswith("specrouter:suffix_memory_tokens "):
            return int(float(line.split()[1]))
    return None


class ChatClient:
    """One server's chat endpoint through the openai client, under one API key (which picks
    the memory's and the prefix cache's partition on our server), requests carrying `extra`
    (the speculation field)."""

    def __init__(self, url: str, model: str, key: str, extra: dict | None = None) -> None:
        self.url, self.model, self.extra = url, model, extra or {}
        self.client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=TURN_SECONDS)
        self.http = httpx.AsyncClient(base_url=url, timeout=60)

    async def memory(self) -> int | None:
        return memory_tokens((await self.http.get("/metrics")).text)

    async def close(self) -> None:
        await self.client.close()
        await self.http.aclose()

    async def play(self, turn: Turn, temperature: float) -> tuple[TurnRecord, Answer]:
        kwargs: dict = {"model": self.model, "messages": turn.openai_messages(), "max_tokens": turn.max_tokens,
                        "temperature": temperature, "stream": True, "stream_options": {"include_usage": True},
                        "extra_body": self.extra or None}
        if turn.tools:
            kwargs["tools"] = turn.tools
        if turn.forced:
            kwargs["tool_choice"] = turn.tool_choice()
        sent = time.perf_counter()
        first = None
        text: list[str] = []
        calls: dict[int, list[str]] = {}  # index -> [id, name, arguments]
        usage, finish = None, None
        stream = await self.client.chat.completions.create(**kwargs)
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                delta = choice.delta
                if (delta.content or delta.tool_calls) and first is None:
                    first = time.perf_counter()
                text.append(delta.content or "")
                for c in delta.tool_calls or ():
                    slot = calls.setdefault(c.index, ["", "", ""])
                    slot[0] += c.id or ""
                    slot[1] += (c.function.name or "") if c.function else ""
                    slot[2] += (c.function.arguments or "") if c.function else ""
                finish = choice.finish_reason or finish
        done = time.perf_counter()
        answer = Answer("".join(text) or None, tuple(Call(*calls[i]) for i in sorted(calls)))
        return _record(turn, usage, sent, first, done, finish), answer


def _record(turn: Turn, usage, sent: float, first: float | None, done: float, finish: str | None) -> TurnRecord:
    spec = getattr(usage, "speculation", None) or {}
    details = getattr(usage, "prompt_tokens_details", None)
    record = TurnRecord(turn.session, turn.workload, turn.index, usage.prompt_tokens if usage else 0,
                        (details.cached_tokens or 0) if details else 0, usage.completion_tokens if usage else 0,
                        None if first is None else first - sent, done - sent, finish, spec.get("cycles", 0))
    for source in spec.get("lookup_sources", ()):
        record.drafts[source["source"]] = source["drafts"]
        record.accepted[source["source"]] = source["accepted"]
    return record


async def play_sessions(client: ChatClient, sessions: Sequence[Session], concurrency: int, temperature: float,
                        run: RunRecord, max_tokens: int | None = None, watch_memory: bool = True) -> RunRecord:
    """Play every session, `concurrency` at once (a closed loop: a finished session's place is
    taken by the next), filling `run`; a failed turn ends the run with its error recorded. A
    run played in parts (a session at a time) adds up their seconds; its memory_before is
    the first part's."""
    todo = list(sessions)
    if watch_memory and run.memory_before is None:
        run.memory_before = await client.memory()

    async def worker() -> None:
        while todo:
            session = todo.pop(0)
            answers = run.answers.setdefault(session.id, [])
            while len(answers) < session.n_turns:
                record, answer = await client.play(session.turn(answers, max_tokens), temperature)
                if watch_memory:
                    record.memory_tokens = await client.memory()
                run.turns.append(record)
                answers.append(answer)

    start = time.perf_counter()
    try:
        async with asyncio.TaskGroup() as group:  # a failure cancels the other sessions
            for _ in range(concurrency):
                group.create_task(worker())
    except* (openai.OpenAIError, httpx.HTTPError) as failed:
        exc = failed.exceptions[0]
        run.error = f"{type(exc).__name__}: {exc}"
    run.seconds += time.perf_counter() - start
    return run
