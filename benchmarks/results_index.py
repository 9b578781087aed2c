"""The index of benchmarks/results/ (its README.md), and which files stay there.

    python -m benchmarks.results_index [--prune]

A run is a result's files: `<stem>.md` and `.json`, and the files named after it (plots,
the trace it recorded). A run stays when
- it is the latest of its benchmark (the stem's part before the date) on its machine kind
  (the kind the stem names: epyc, xeon, h200; else the CPU its JSON records),
- the README or docs/ cite it (one of its files, or its stem; `a-{b,c}-d.md` stands for
  two names, `a[-b]` for a and a-b),
- code reads one of its files (a default trace, a test's saved result), or
- a run that stays cites it.
The others are superseded: --prune deletes them (git keeps them). The README lists each run
that stays: what it shows (its report's title, where the docs cite it), machine, date, command.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.output import RESULTS

ROOT = RESULTS.parents[1]
STEM = re.compile(r"^(?P<bench>[a-z0-9-]+?)-(?P<date>20\d\d-\d\d-\d\d)(?P<rest>.*)$")
KINDS = {"h200": "NVIDIA H200", "epyc": "AMD EPYC", "xeon": "Intel Xeon"}
#: A name with alternatives in it: `a-{b,c}-d.md`, `a[-b]`.
PATTERN = re.compile(r"[\w.-]*(?:\{[\w.,-]*\}|\[[\w.-]*\])[\w.,{}\[\]-]*")


@dataclass(frozen=True)
class Run:
    stem: str
    files: tuple[str, ...]
    bench: str  # the benchmark, as the stem's prefix names it
    kind: str  # the machine kind the latest-run rule goes by
    cpu: str  # the CPU the JSON records, by its kind's label where it has one ("": none recorded)
    date: str  # when it ran, as recorded (else the stem's date)
    command: str
    title: str  # its report's first heading, without the date


def group(names: Iterable[str]) -> dict[str, list[str]]:
    """Files by run: a name whose stem has a report (`.md`) is that run's; any other goes to
    the longest such stem it starts with (a plot, a trace, a run's data), else is a run alone."""
    names = sorted(names)
    reported = {n[:-3] for n in names if n.endswith(".md")}
    runs: dict[str, list[str]] = {}
    for name in names:
        stem = name.rsplit(".", 1)[0]
        if stem not in reported:
            stem = max((s for s in reported if stem.startswith(s + "-")), key=len, default=stem)
        runs.setdefault(stem, []).append(name)
    return runs


def expand(token: str) -> list[str]:
    """The names a pattern stands for: `a{b,c}d` is abd and acd, `a[b]c` is ac and abc."""
    m = re.search(r"\{([^{}]*)\}|\[([^\[\]]*)\]", token)
    if m is None:
        return [token]
    alternatives = m[1].split(",") if m[1] is not None else ["", m[2]]
    return [name for alt in alternatives for name in expand(token[:m.start()] + alt + token[m.end():])]


def first_mention(run: Run, text: str) -> int:
    """Where the text first names the run: one of its files, its stem as a whole word, or a
    pattern (expand) that stands for one of them; -1 if it never does."""
    names = {*run.files, run.stem}
    found = [m.start() for m in re.finditer(rf"(?<![\w-]){re.escape(run.stem)}(?![\w-])", text)][:1]
    found += [i for i in (text.find(f) for f in run.files) if i >= 0]
    found += [m.start() for m in PATTERN.finditer(text) if names & set(expand(m[0]))][:1]
    return min(found, default=-1)


def _read(folder: Path, stem: str, files: Sequence[str]) -> Run:
    data = json.loads((folder / f"{stem}.json").read_text()) if f"{stem}.json" in files else {}
    machine = data.get("machine") or data.get("device") or {}
    md = (folder / f"{stem}.md").read_text() if f"{stem}.md" in files else ""
    quoted = re.search(r"Command[^`]*`([^`]+)`", md)
    command = " ".join((machine.get("command") or (quoted[1] if quoted else "") or (
        "scripts/gpu_check.sh (the report says how)" if stem.startswith("gpu-") else "")).split())
    title = re.sub(r"\s*(\(20\d\d-[^)]*\)|:\s*20\d\d-.*)$", "", md.splitlines()[0].lstrip("# ")) if md else ""
    m = STEM.match(stem)
    cpu = machine.get("cpu") or machine.get("host_cpu") or ""
    cpu = next((label for label in KINDS.values() if label.split()[-1].lower() in cpu.lower()), cpu)
    token = next((k for k in KINDS if k in m["rest"]), None)
    kind = KINDS[token] if token else cpu
    return Run(stem, tuple(files), m["bench"], kind, cpu, machine.get("date") or m["date"], command, title)


def heading_before(text: str, at: int) -> str:
    found = re.findall(r"^#+ (.+)$", text[:at], flags=re.M)
    return found[-1] if found else ""


def citations(runs: Sequence[Run], texts: dict[str, str], sections: bool = True) -> dict[str, list[str]]:
    """Per run, the texts (path -> text) that name one of its files, as `path ("section")`
    (the markdown heading above the first mention; sections=False: the path alone)."""
    out: dict[str, list[str]] = {}
    for path, text in texts.items():
        for run in runs:
            at = first_mention(run, text)
            if at >= 0:
                section = heading_before(text, at) if sections else ""
                out.setdefault(run.stem, []).append(f'{path} ("{section}")' if section else path)
    return out


def kept(runs: Sequence[Run], docs: dict[str, list[str]], code: dict[str, list[str]], folder: Path) -> dict[str, str]:
    """Why each run that stays stays (module docstring); the others are superseded."""
    why = {stem: "cited by the docs" for stem in docs}
    why.update({stem: f"read by {', '.join(paths)}" for stem, paths in code.items() if stem not in why})
    latest: dict[tuple[str, str], Run] = {}
    for run in runs:
        key = (run.bench, run.kind)
        if key not in latest or run.date > latest[key].date:
            latest[key] = run
    for run in latest.values():
        why.setdefault(run.stem, f"the latest {run.bench} on {run.kind}")
    by_stem = {r.stem: r for r in runs}
    todo = list(why)
    while todo:
        stem = todo.pop()
        text = "".join((folder / f).read_text() for f in by_stem[stem].files if f.endswith((".md", ".json")))
        for run in runs:
            if run.stem not in why and first_mention(run, text) >= 0:
                why[run.stem] = f"cited by {stem}"
                todo.append(run.stem)
    return why


def index(runs: Sequence[Run], why: dict[str, str], docs: dict[str, list[str]]) -> str:
    lines = ["# Benchmark results", "",
             "The latest run of each benchmark per machine kind, the runs the docs cite, and the files code reads "
             "(a default trace, a test's saved result). Generated by `python -m benchmarks.results_index`, whose "
             "`--prune` deletes the superseded runs (git keeps them). Run a benchmark with "
             "`python -m benchmarks NAME`; `python -m benchmarks` lists them.", ""]
    for bench in sorted({r.bench for r in runs if r.stem in why}):
        lines += [f"## {bench}", "", "| run | shows | machine | date | kept: | command |", "|---|---|---|---|---|---|"]
        for r in sorted((r for r in runs if r.bench == bench and r.stem in why), key=lambda r: r.date):
            link = f"[{r.stem}]({r.stem}.md)" if f"{r.stem}.md" in r.files else r.stem
            also = [f.removeprefix(r.stem) for f in r.files if f not in (f"{r.stem}.md", f"{r.stem}.json")]
            shows = "; ".join(filter(None, [r.title, *(f"in {c}" for c in docs.get(r.stem, []))]))
            machine = r.kind if r.cpu in ("", r.kind) else f"{r.kind} (ran on {r.cpu})"
            cell = lambda s: s.replace("|", "\\|")  # noqa: E731
            lines.append(f"| {link}{' (+ ' + ', '.join(also) + ')' if also else ''} | {cell(shows)} | {machine} "
                         f"| {r.date} | {why[r.stem]} | {'`' + cell(r.command) + '`' if r.command else ''} |")
        lines.append("")
    return "\n".join(lines)


def _texts(paths: Iterable[Path]) -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text(errors="replace") for p in paths if p.is_file()}


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.results_index", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prune", action="store_true", help="delete the superseded runs' files")
    args = ap.parse_args(argv)
    folder = RESULTS
    runs = [_read(folder, stem, files) for stem, files in group(
        p.name for p in folder.iterdir() if p.name != "README.md").items()]
    docs = citations(runs, _texts([ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]))
    code = citations(runs, _texts(p for d in ("benchmarks", "specrouter", "scripts", "tests")
                                  for p in sorted((ROOT / d).rglob("*")) if p.suffix in (".py", ".sh")), sections=False)
    why = kept(runs, docs, code, folder)
    superseded = [f for r in runs if r.stem not in why for f in r.files]
    if args.prune:
        for name in superseded:
            (folder / name).unlink()
    (folder / "README.md").write_text(index(runs, why, docs))
    print(f"{len(why)} runs kept, {len(runs) - len(why)} superseded ({len(superseded)} files"
          f"{', deleted' if args.prune else '; --prune deletes them'})")


if __name__ == "__main__":
    main()
