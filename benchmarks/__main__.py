"""`python -m benchmarks` lists the benchmarks; `python -m benchmarks NAME [options]` runs one
(benchmarks/registry.py). `python -m benchmarks.MODULE [options]` runs the same code."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from benchmarks.registry import find, listing


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "list"):
        print(listing())
        return
    benchmark = find(argv[0])
    if benchmark is None:
        print(f"no benchmark {argv[0]!r}\n\n{listing()}", file=sys.stderr)
        raise SystemExit(2)
    benchmark.main()(argv[1:])


if __name__ == "__main__":
    main()
