"""Command-line options shared by the prompt-set benchmarks (router and torch target)."""

from __future__ import annotations

import argparse
from pathlib import Path


def benchmark_parser(doc: str, results: Path) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--per-dataset", type=int, default=10, help="prompts per dataset in the main comparison")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--sweep-per-dataset", type=int, default=1, help="prompts per dataset in the draft-length sweep")
    ap.add_argument("--sweep-tokens", type=int, default=48, help="new tokens per sweep run")
    ap.add_argument("--out", type=Path, default=results)
    ap.add_argument("--render", type=Path, metavar="JSON", help="only rewrite the report of a saved result")
    return ap
