"""The sessions benchmark's llama-server replay (benchmarks/sessions_peers.py) against a
stand-in server that answers one request per connection, as llama-server may after a
streamed answer: every turn played and read from its last event."""

from __future__ import annotations

import asyncio
import json

from benchmarks.sessions_client import RunRecord
from benchmarks.sessions_peers import replay
from benchmarks.sessions_workloads import Answer, load


async def _one_request_per_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                                      bodies: list[dict]) -> None:
    """Read one request, stream three events, then close the connection a moment later
    without saying so (no `Connection: close`): a request sent on it meanwhile is lost."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    body = json.loads(await reader.readexactly(length))
    bodies.append(body)
    events = [{"content": "x"}, {"content": "y"},
              {"content": "", "stop": True, "stop_type": "limit",
               "timings": {"cache_n": 3 * (len(bodies) - 1), "predicted_n": 2}}]
    payload = b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events)
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                 + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    await writer.drain()
    await asyncio.sleep(0.2)
    writer.close()


def test_every_turn_is_replayed_on_a_connection_of_its_own():
    session = next(s for s in load(["edit-loop"], 1))
    turns, answers = [], []
    for i in range(3):
        turns.append((session.turn(answers), list(range(10 + 5 * i))))
        answers.append(Answer(f"answer {i}"))
    bodies: list[dict] = []

    async def main() -> RunRecord:
        server = await asyncio.start_server(lambda r, w: _one_request_per_connection(r, w, bodies), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            return await replay(f"http://127.0.0.1:{port}", [turns], 1, 0.0, RunRecord("peer", "llama-server",
                                                                                     "greedy", 1))

    run = asyncio.run(main())
    assert run.error is None
    assert [(t.turn, t.prompt_tokens, t.cached_tokens, t.completion_tokens, t.finish_reason) for t in run.turns] == [
        (0, 10, 0, 2, "limit"), (1, 15, 3, 2, "limit"), (2, 20, 6, 2, "limit")]
    assert [b["prompt"] for b in bodies] == [tokens for _, tokens in turns]
    assert all(b["cache_prompt"] and b["n_predict"] == turns[0][0].max_tokens for b in bodies)
