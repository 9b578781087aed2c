"""The one command-line parser of the benchmarks (the options they share, each benchmark
adding its own), and how a benchmark states the router it started from."""

from __future__ import annotations

import argparse
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from benchmarks.output import RESULTS

#: Words for "prompts per group" (a dataset, a workload, a prompt set): one option, spelt as
#: its benchmark says, the other spellings accepted too (they mean the same thing).
GROUP_WORDS = ("dataset", "workload", "set", "group")


def int_list(text: str) -> list[int]:
    """A comma-separated list of integers ("1,4,8"); empty items are skipped."""
    try:
        return [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def benchmark_parser(name: str, doc: str, *, stem: str | None = None, per: tuple[str, int] | None = None,
                     max_tokens: int | None = None, repeats: int | None = None,
                     repeats_help: str = "repeats of each measurement", concurrency: str | None = None,
                     trace: Path | None | bool = False, sweep: bool = False, render: bool = False,
                     router_dir: str | None = None) -> argparse.ArgumentParser:
    """The parser of benchmark `name` (as `python -m benchmarks NAME` calls it; `doc`: its
    module docstring, shown by --help). Every benchmark has --out (default benchmarks/results)
    and --stem (the result files' name; `stem` says the default for --help, `<name>-<date>`
    when None). The shared options a benchmark uses are added with its defaults:
    per=(word, n): --per-<word> N, prompts per dataset (or workload, set, group: dest
    per_group); max_tokens; repeats (what one is: repeats_help); concurrency: --concurrency
    LEVELS (a list of ints);
    trace: --trace FILE (a default path, or None: no default; False: no option); sweep: the
    draft-length sweep's --sweep-per-dataset and --sweep-tokens; render: --render JSON (only
    rewrite the report of a saved result); router_dir: --router-dir DIR with this help (the
    router's starting profile and estimates; default: a fresh folder, router_start)."""
    ap = argparse.ArgumentParser(prog=f"python -m benchmarks {name}", description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=RESULTS, metavar="DIR", help="folder of the result files (default: benchmarks/results)")
    ap.add_argument("--stem", metavar="NAME", help=f"name of the result files (default: {stem or name + '-<date>'})")
    if per is not None:
        word, default = per
        ap.add_argument(f"--per-{word}", dest="per_group", type=int, default=default, metavar="N",
                        help=f"prompts per {word} (default {default})")
        for other in GROUP_WORDS:  # the same option under the other benchmarks' words
            if other != word:
                ap.add_argument(f"--per-{other}", dest="per_group", type=int, default=argparse.SUPPRESS,
                                help=argparse.SUPPRESS)
    if max_tokens is not None:
        ap.add_argument("--max-tokens", type=int, default=max_tokens, metavar="N", help=f"new tokens per request (default {max_tokens})")
    if repeats is not None:
        ap.add_argument("--repeats", type=int, default=repeats, metavar="N", help=f"{repeats_help} (default {repeats})")
    if concurrency is not None:
        ap.add_argument("--concurrency", type=int_list, default=int_list(concurrency), metavar="LEVELS",
                        help=f"comma-separated requests in flight (default {concurrency})")
    if trace is not False:
        ap.add_argument("--trace", type=Path, default=trace, metavar="FILE",
                        help="the recorded trace to replay (specrouter.sim.trace)"
                             + (f" (default: {trace.name})" if trace else " (default: none, one is recorded)"))
    if sweep:
        ap.add_argument("--sweep-per-dataset", type=int, default=1, metavar="N", help="prompts per dataset in the draft-length sweep")
        ap.add_argument("--sweep-tokens", type=int, default=48, metavar="N", help="new tokens per sweep run")
    if render:
        ap.add_argument("--render", type=Path, metavar="JSON",
                        help="only rewrite the report of a saved result (default stem: the file's)")
    if router_dir is not None:
        ap.add_argument("--router-dir", type=Path, metavar="DIR", help=router_dir)
    return ap


#: --router-dir's help where one router reads one folder.
ROUTER_DIR = ("the router's starting profile and acceptance estimates (default: none saved, the profile "
              "measured at the start; never the user's cache)")


def result_stem(args: argparse.Namespace, prefix: str, result: dict | None = None) -> str:
    """The stem a run writes: --stem, else the rendered file's (--render), else `<prefix>-<date>`,
    the date of `result`'s run (None: today's, UTC, for a stem needed before the run)."""
    if args.stem:
        return args.stem
    if getattr(args, "render", None) is not None:
        return args.render.stem
    date = result["machine"]["date"] if result is not None else datetime.now(timezone.utc).strftime("%Y-%m-%d")
    return f"{prefix}-{date[:10]}"


def router_start(router_dir: Path | None) -> tuple[Path, str]:
    """Where the router's cost profile and acceptance estimates are read (and a missing
    profile written), and how the report states it. None: a fresh folder, i.e. no saved
    estimates and a profile measured at the start of the run (never the user's cache: its
    contents would be an input of the result)."""
    if router_dir is None:
        return Path(tempfile.mkdtemp(prefix="specrouter-bench-router-")), \
            "fresh: no saved estimates, profile measured at the start"
    return router_dir, f"estimates and profile from {router_dir}"


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
