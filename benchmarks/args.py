"""Command-line options shared by the prompt-set benchmarks (router and torch target), and how a
benchmark states the router it started from."""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Callable
from pathlib import Path


def benchmark_parser(doc: str, results: Path) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--per-dataset", type=int, default=10, help="prompts per dataset in the main comparison")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--sweep-per-dataset", type=int, default=1, help="prompts per dataset in the draft-length sweep")
    ap.add_argument("--sweep-tokens", type=int, default=48, help="new tokens per sweep run")
    ap.add_argument("--out", type=Path, default=results)
    ap.add_argument("--render", type=Path, metavar="JSON", help="only rewrite the report of a saved result")
    ap.add_argument("--router-dir", type=Path, help="the router's starting profile and acceptance estimates "
                    "(default: none saved, the profile measured at the start; never the user's cache)")
    return ap


def router_start(router_dir: Path | None) -> tuple[Path, str]:
    """Where the router's cost profile and acceptance estimates are read (and a missing
    profile written), and how the report states it. None: a fresh folder, i.e. no saved
    estimates and a profile measured at the start of the run (never the user's cache: its
    contents would be an input of the result)."""
    if router_dir is None:
        return Path(tempfile.mkdtemp(prefix="specrouter-bench-router-")), \
            "fresh: no saved estimates, profile measured at the start"
    return router_dir, f"estimates and profile from {router_dir}"


def write_result(result: dict, out: Path, stem: str, markdown: Callable[[dict], str]) -> None:
    """<stem>.json and <stem>.md (the report, also printed) in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1, default=str))
    md = markdown(result)
    (out / f"{stem}.md").write_text(md)
    print(md)


#: Forward sizes (tokens) a report quotes of a starting profile.
PROFILE_SIZES = (1, 4, 16, 32, 64)


def profile_line(profile: dict, model: str, who: str, key: str = "profile") -> str:
    """The report's sentence on the cost profile a router started from (`profile`: its
    CostProfile.as_dict(), which the result's JSON keeps whole under `key`): `model`'s
    seconds at the PROFILE_SIZES it was timed at. That profile decides close calls (a
    draft's length, a draft model or none), so two runs of one benchmark can be told apart
    by it."""
    table = profile["models"].get(model, {})
    timed = [str(n) for n in PROFILE_SIZES if str(n) in table]
    if not timed:
        return f"{who} started from a profile that did not time {model}."
    return (f"{who} started from {model}'s profile {' / '.join(f'{table[n] * 1e3:.1f}' for n in timed)} ms for "
            f"{' / '.join(timed)} token{'' if timed == ['1'] else 's'} (`{key}` in the JSON: every size and model).")
