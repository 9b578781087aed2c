"""What a benchmark ran on: recorded beside every result."""

from __future__ import annotations

import json
import os
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def write_result(out: Path, stem: str, result: dict, md: str) -> None:
    """A benchmark's result as `stem`.json and its report as `stem`.md in `out` (made if
    missing); the report is printed too."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1, default=str))
    (out / f"{stem}.md").write_text(md)
    print(md)


def machine_info() -> dict:
    try:
        import llama_cpp

        llama_version = llama_cpp.__version__
    except ImportError:
        llama_version = None
    return {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "llama_cpp_python": llama_version,
        "command": " ".join([os.path.basename(sys.executable), "-m", "benchmarks." + os.path.basename(sys.argv[0]).removesuffix(".py"), *sys.argv[1:]]),
    }
