"""The servers the hostile client drives: `specrouter serve` subprocesses on loopback ports,
each with its own profile folder (the pulled models linked into it, never the user's
profiles), its log (stdout and stderr, unbuffered) in a file whose growth is measured, and
this checkout's code (PYTHONPATH: the server runs the code under test, not an installed
copy)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks.servers import free_port, wait_healthy
from specrouter.models import default_cache_dir

CLI = str(Path(sys.executable).with_name("specrouter"))
REPOSITORY = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class ServerSpec:
    """One server of the run: how the report names it, its flags, and its API key."""

    label: str
    flags: tuple[str, ...]
    key: str | None = None

    def command(self, port: int) -> list[str]:
        key = ("--api-key", self.key) if self.key else ()
        return ["specrouter", "serve", "--port", str(port), *key, *self.flags]


@dataclass
class Running:
    """A started server: its process, address, key, log file and profile folder."""

    label: str
    proc: subprocess.Popen
    url: str
    key: str | None
    log: Path
    folder: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_bytes(self) -> int:
        return self.log.stat().st_size

    @property
    def estimates(self) -> Path:
        """The acceptance store the server reads at start and merges into at exit."""
        return self.folder / "profiles" / "acceptance.json"


def profile_folder(folder: Path) -> Path:
    """`folder` as a server's cache: `models` links to the pulled models, `profiles` is its own."""
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / "models"
    if not link.exists():
        link.symlink_to(default_cache_dir(), target_is_directory=True)
    return folder


def start(spec: ServerSpec, folder: Path, log: Path, wait: bool = True) -> Running:
    """`specrouter serve` as `spec` says, its cache in `folder` (profile_folder), its output
    in `log`; returns once /health answers (wait) or at once."""
    port = free_port()
    env = {**os.environ, "SPECROUTER_CACHE": str(profile_folder(folder) / "models"), "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")]))}
    with log.open("ab") as out:
        proc = subprocess.Popen([CLI, *spec.command(port)[1:]], env=env, stdout=out, stderr=subprocess.STDOUT)
    running = Running(spec.label, proc, f"http://127.0.0.1:{port}", spec.key, log, folder)
    if wait:
        wait_healthy(proc, running.url, spec.label, timeout=600)
    return running


def terminate(running: Running, timeout: float = 180) -> int | None:
    """SIGTERM, then the exit status (None: it did not exit in time and was killed)."""
    if running.proc.poll() is None:
        running.proc.send_signal(signal.SIGTERM)
    try:
        return running.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        running.proc.kill()
        running.proc.wait()
        return None
