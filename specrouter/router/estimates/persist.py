"""Files that several processes of one machine write: an inter-process lock beside each file,
and atomic replacement.

Contract of a write through this module: a reader (locked or not) sees the old text or the
new one, never a mix or a truncated file (the text goes to a temporary file in the same
folder, then os.replace, atomic within one file system); two writers never share a temporary
file (each gets its own unique name); a writer that reads, changes and writes back under
`locked` sees every earlier writer's result (no lost update). The lock is advisory
(filelock.FileLock on `<name>.lock` beside the file): only writers that take it are ordered.
It is released when its holder exits, however it exits; waiting for it ends after
LOCK_TIMEOUT seconds with filelock.Timeout, an OSError like every other failure here, so a
caller that treats a failed write as lost state handles a stuck holder the same way.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock

#: Seconds a writer waits for another holding the lock. A holder only reads and writes a small
#: file, so a wait this long means the holder hangs: the caller gives up instead of hanging too.
LOCK_TIMEOUT = 30.0
#: Permissions of a written file, as Path.write_text gives them under the usual umask
#: (tempfile creates its files readable by their owner only).
FILE_MODE = 0o644


@contextlib.contextmanager
def locked(file: Path) -> Iterator[None]:
    """Hold the inter-process lock of `file` (its folder is created if missing)."""
    file.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(file.with_name(file.name + ".lock"), timeout=LOCK_TIMEOUT):
        yield


def write_atomic(file: Path, text: str) -> None:
    """Replace `file` with `text` at once (see the module docstring); the temporary file is
    removed when anything fails."""
    file.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=file.parent, prefix=f".{file.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            os.fchmod(handle.fileno(), FILE_MODE)
            handle.write(text)
        os.replace(tmp, file)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
