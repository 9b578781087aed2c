"""What a benchmark ran on, and the command that ran it: recorded beside every result."""

from __future__ import annotations

import os
import platform
import shlex
import sys
from collections.abc import Sequence
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


def command(argv: Sequence[str] | None = None, executable: str | None = None) -> str:
    """The command line that runs again what `argv` (default sys.argv) runs: `python -m
    benchmarks NAME ...` when the harness (benchmarks/__main__.py) was started, `python -m
    benchmarks.MODULE ...` when a benchmark's module was; arguments quoted for a shell."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0]).name.removesuffix(".py")
    module = "benchmarks" if script == "__main__" else f"benchmarks.{script}"
    python = os.path.basename(executable or sys.executable)
    return shlex.join([python, "-m", module, *argv[1:]])


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
        "command": command(),
    }
