"""Traces: what a simulation replays, recorded once with the real models.

A trace holds, per request, the prompt, the target's greedy answer (and whether it ended
at EOS) and, per draft model, its Track (backends/replay.py): its greedy token and top
probability at every position of the answer, teacher-forced on the target's text (after
prompt + answer[:j] for j = 0..len(answer), one forward over the whole sequence), and at
every position where that token is wrong, the tokens it drafts on after it. Under greedy
verification that is what decides a two-level chain's blocks: a block starts on the
committed text, the draft proposes its recorded tokens (its length policy reading the
recorded confidences), the target accepts them up to the first wrong one. Model-free
drafters need nothing recorded (they read the text itself).

Recording a request costs one greedy generation of the target, one forward over prompt +
answer per draft model and branch_tokens - 1 single-token forwards per wrong position. Near-ties aside (a forward over many tokens may round
differently from one over few: docs/cascade-and-exactness.md), the recorded tokens are those the
draft proposes in a real run. Only greedy agreement is recorded: sampled runs are not
simulated.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specrouter.backends.base import Backend
from specrouter.backends.replay import Script, Track
from specrouter.cascade.chain import Chain
from specrouter.cascade.proposer import confidence
from specrouter.cascade.sampling import SamplingParams
from specrouter.engine import generate
from specrouter.errors import InvalidParameterError
from specrouter.ops.rows import ops_of

FORMAT = 1


@dataclass(frozen=True)
class Request:
    """One recorded request (original ids); `tracks[model]`: each draft model's Track along
    the answer."""

    group: str  # what results are grouped by (a dataset, a workload)
    id: str
    prompt: list[int]
    answer: list[int]
    eos: bool
    tracks: dict[str, Track] = field(default_factory=dict)

    @property
    def script(self) -> Script:
        return Script(self.prompt, self.answer, self.eos)

    @classmethod
    def from_dict(cls, data: dict) -> Request:
        tracks = {m: Track(t["argmax"], t["confidence"],
                           {int(q): (list(b[0]), list(b[1])) for q, b in t.get("branches", {}).items()})
                  for m, t in data.pop("tracks").items()}
        return cls(tracks=tracks, **data)


@dataclass(frozen=True)
class Trace:
    """Recorded requests over one target, with the draft models recorded beside it and each
    model's size (the router ranks drafts by it)."""

    target: str
    drafts: list[str]
    params_b: dict[str, float]
    requests: list[Request]
    max_tokens: int
    eos_ids: list[int] = field(default_factory=list)  # the target's
    branch_tokens: int = 0  # the longest branch recorded (what a draft proposes after a wrong token)
    note: str = ""  # where and how it was recorded (machine, date, command)

    def __post_init__(self) -> None:
        for r in self.requests:
            if sorted(r.tracks) != sorted(self.drafts):
                raise InvalidParameterError(f"trace request {r.id}: recorded models {sorted(r.tracks)}, "
                                            f"expected the drafts {sorted(self.drafts)}")
            if any(len(t.argmax) != len(r.answer) + 1 or len(t.confidence) != len(t.argmax)
                   for t in r.tracks.values()):
                raise InvalidParameterError(f"trace request {r.id}: a draft's track is not len(answer) + 1 long")
        missing = [m for m in (self.target, *self.drafts) if m not in self.params_b]
        if missing:
            raise InvalidParameterError(f"trace: no size for {', '.join(missing)}")

    @property
    def groups(self) -> list[str]:
        return list(dict.fromkeys(r.group for r in self.requests))

    def take(self, n: int) -> Trace:
        """The trace with n of its requests, taken in turn from each group (every group's
        first, then every group's second, ...), in the trace's order."""
        by_group = [[r for r in self.requests if r.group == g] for g in self.groups]
        turns = [rs[i] for i in range(len(self.requests)) for rs in by_group if i < len(rs)]
        kept = {id(r) for r in turns[:n]}
        return dataclasses.replace(self, requests=[r for r in self.requests if id(r) in kept])

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps({"format": FORMAT, **asdict(self)}))

    @classmethod
    def load(cls, path: Path) -> Trace:
        try:
            data = json.loads(Path(path).read_text())
            if data.pop("format", None) != FORMAT:
                raise ValueError(f"not format {FORMAT}")
            requests = [Request.from_dict(r) for r in data.pop("requests")]
            return cls(requests=requests, **data)
        except OSError as exc:
            raise InvalidParameterError(f"cannot read the trace {path}: {exc.strerror or exc}") from None
        except (ValueError, TypeError, KeyError, AttributeError, IndexError) as exc:
            raise InvalidParameterError(f"{path} is not a trace ({exc.__class__.__name__}: {exc})") from None


def _greedy(row) -> tuple[int, float]:
    return ops_of(row).argmax([row])[0], round(confidence(row), 6)


def track(model: Backend, prompt: Sequence[int], answer: Sequence[int], branch_tokens: int, eos: bool) -> Track:
    """The model's Track along prompt + answer: one forward over the whole sequence (its
    token and confidence at every position), then at each position where its token is not
    the answer's (nor an EOS; after an answer that ended at EOS, where it is not an EOS) up
    to branch_tokens - 1 greedy steps on from its wrong token."""
    seq = model.new_sequence()
    try:
        full = [*prompt, *answer]
        rows = model.decode(seq, full, 0, len(answer) + 1)
        argmax, conf = map(list, zip(*(_greedy(row) for row in rows)))
        branches = {}
        valid = len(full)  # the cache holds the path up to here (beyond: the last branch)
        for q, token in enumerate(argmax if eos else argmax[:-1]):
            if token in model.eos_ids or (q < len(answer) and token == answer[q]) or branch_tokens < 2:
                continue
            start = min(valid, len(prompt) + q)
            model.remove(seq, start)
            fed, pos = [*full[start:len(prompt) + q], token], start
            valid = len(prompt) + q
            tokens, confs = [], []
            for _ in range(branch_tokens - 1):
                t, c = _greedy(model.decode(seq, fed, pos, 1)[0])
                tokens.append(t)
                confs.append(c)
                if t in model.eos_ids:
                    break
                pos, fed = pos + len(fed), [t]
            branches[q] = (tokens, confs)
    finally:
        model.free_sequence(seq)
    return Track(argmax, conf, branches)


def record(target: Backend, drafts: Sequence[Backend], prompts: Sequence[tuple[str, str, list[int]]],
           max_tokens: int, branch_tokens: int = 24, note: str = "",
           progress: Callable[[str], None] | None = None) -> Trace:
    """A trace of `prompts` ((group, id, prompt tokens) each): the target's greedy answer of
    at most max_tokens, and every draft's Track along it (branches of branch_tokens - 1
    tokens after each wrong one: a draft of up to branch_tokens is replayed as it ran)."""
    requests = []
    for group, rid, prompt in prompts:
        if progress is not None:
            progress(f"{group} {rid}")
        r = generate(Chain([target], []), prompt, SamplingParams(), max_tokens)
        answer = list(r.token_ids)
        eos = r.finish_reason == "stop"
        requests.append(Request(group, rid, list(prompt), answer, eos,
                                {d.name: track(d, prompt, answer, branch_tokens, eos) for d in drafts}))
    return Trace(target.name, [d.name for d in drafts], {m.name: m.params_b for m in (target, *drafts)},
                 requests, max_tokens, sorted(target.eos_ids), branch_tokens, note)
