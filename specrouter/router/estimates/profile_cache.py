"""The profiles' disk cache: one JSON file per model, kernels and thread count (and one for
its batched calls, one for its context table), keyed by what changes the timing: the model
file (its sha256 stamp for pool models, else size + mtime), the backend, its thread count, its
kernels and the CPU model. A corrupt, stale or not physical file is measured again with a
warning; a measurement that cannot be trusted (profiler.py: busy, unsteady, implausible) is
used for the run and not cached.

Writes go through persist.py (atomic, under the file's lock); the processes of one machine
that start together measure one at a time (folder_lock), so none times its forwards while
another runs its own.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import statistics
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from specrouter.backends.base import Backend
from specrouter.errors import InvalidParameterError
from specrouter.router.config import DEFAULT_CONFIG, RouterConfig
from specrouter.router.estimates.costs import LONG_CONTEXT, PROFILED_CONTEXT, CostProfile, OnlineCosts
from specrouter.router.estimates.persist import locked, write_atomic
from specrouter.router.estimates.profiler import (CONTEXT_NS, PROFILE_BATCH_NS, PROFILE_BATCHES, PROFILE_NS, CpuSample,
                                                  busy, cpu_model, cpu_sample, holds_long_context, implausible,
                                                  profile_batches, time_forwards, unsteady)

_FORMAT = 1


def default_profile_dir() -> Path:
    from specrouter.models import default_cache_dir

    return default_cache_dir().parent / "profiles"


def file_identity(path: Path | None) -> str:
    """sha256 from a pool model's stamp (hashing 1 GB per start is too slow), else size+mtime."""
    if path is None:
        return "no-file"
    stamp = path.with_name(path.name + ".sha256")
    try:
        fields = stamp.read_text().split()
        if fields:
            return "sha256:" + fields[0].lower()
    except OSError:
        pass
    try:
        st = path.stat()
        return f"size:{st.st_size}:mtime:{st.st_mtime_ns}"
    except OSError:
        return "missing"


def profile_key(backend: Backend) -> dict:
    """What a forward's time depends on besides n: the backend's TimingKey and the CPU."""
    key = backend.timing_key()
    return {
        "model": backend.name,
        "file": file_identity(key.file),
        "backend": key.backend,
        "dtype": key.dtype,
        "n_threads": key.n_threads,
        "cpu": cpu_model(),
        "gpu": key.gpu,
        "kernels": key.kernels,
    }


def _cache_file(directory: Path, backend: Backend, kind: str = "") -> Path:
    """One file per model, kernels and thread count: a model profiled in both modes, or run
    with another --threads (a fleet's replicas, a server beside the command line), keeps
    every table, and switching re-measures none (nor overwrites another)."""
    key = backend.timing_key()
    name = backend.name if key.kernels == "default" else f"{backend.name}-{key.kernels}"
    if key.n_threads is not None:
        name += f"-{key.n_threads}t"
    safe = "".join(c if c.isalnum() or c in "-._" else "_" for c in name)
    return directory / f"{safe}{kind}.json"


def _read_cached(file: Path, key: dict, nested: bool = False, sizes: Sequence[int] = (),
                 config: RouterConfig = DEFAULT_CONFIG) -> dict | None:
    """The cached table when the file is valid, its key matches and it holds every size of
    `sizes` (one timed at other sizes is stale: the router would interpolate where it is
    meant to read a timing); None (with a warning) otherwise. nested: a batch table,
    {B: {n: seconds}}."""
    if not file.exists():
        return None
    try:
        data = json.loads(file.read_text())
        if nested:
            table = {int(b): {int(n): float(s) for n, s in t.items()} for b, t in data["table"].items()}
            values = [s for t in table.values() for s in t.values()]
        else:
            table = {int(n): float(s) for n, s in data["table"].items()}
            values = list(table.values())
        if data.get("format") != _FORMAT or not table or any(s <= 0 for s in values):
            raise ValueError("bad format")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        warnings.warn(f"profile cache {file} is corrupt ({exc.__class__.__name__}): re-profiling", stacklevel=6)
        return None
    why = next(filter(None, (implausible(t, config) for t in (table.values() if nested else [table]))), None)
    if why:
        warnings.warn(f"profile cache {file} is not physical ({why}): re-profiling", stacklevel=6)
        return None
    if data.get("key") != key:
        changed = sorted(k for k in key if data.get("key", {}).get(k) != key[k]) if isinstance(data.get("key"), dict) else ["key"]
        warnings.warn(f"profile cache {file} is stale ({', '.join(changed)} changed): re-profiling", stacklevel=6)
        return None
    if missing := sorted(set(sizes) - set(table)):
        warnings.warn(f"profile cache {file} is stale (not timed at {', '.join(map(str, missing))} tokens): "
                      "re-profiling", stacklevel=6)
        return None
    return table


def load_or_profile(backends: Iterable[Backend], directory: Path | None = None, **kw) -> CostProfile:
    """_load_or_profile (below) under the profile folder's lock (folder_lock): the processes
    of one machine that start together (a fleet's replicas) measure one at a time, so none
    times its forwards while another runs its own, and the later ones find the first one's
    cached profile instead of measuring again."""
    directory = Path(directory) if directory is not None else default_profile_dir()
    with folder_lock(directory):
        return _load_or_profile(backends, directory, **kw)


@contextlib.contextmanager
def folder_lock(directory: Path) -> Iterator[None]:
    """An exclusive advisory lock (flock) of `directory`, held across processes; none where
    the folder cannot be written (then nothing is cached there either)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        handle = open(directory / ".lock", "a")
    except OSError:
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def profile_files(directory: Path, backends: Iterable[Backend]) -> dict[str, str]:
    """The cached profile files of these models (name -> text): what a fleet shares between
    nodes of one CPU model (specrouter.fleet)."""
    files = {}
    for backend in backends:
        for file in (_cache_file(directory, backend, kind) for kind in ("", ".batch", ".context")):
            try:
                files[file.name] = file.read_text()
            except OSError:
                pass
    return files


def install_profiles(directory: Path, files: dict[str, str]) -> list[str]:
    """Write the files (profile_files() of another node) that this folder lacks; returns their
    names. Each is still checked against this machine's key when read (_read_cached): one
    measured elsewhere under another key is measured again here."""
    written = []
    with folder_lock(directory):
        for name, text in files.items():
            file = directory / Path(name).name  # a bare name: nothing outside the folder
            if not file.exists():
                try:
                    write_atomic(file, text)
                    written.append(file.name)
                except OSError:
                    pass
    return written


def _load_or_profile(
    backends: Iterable[Backend],
    directory: Path,
    repeats: int | None = None,
    ns: Sequence[int] = PROFILE_NS,
    force: bool = False,
    progress: bool = True,
    clock: Callable[[], float] = time.perf_counter,
    batches: Sequence[int] = PROFILE_BATCHES,
    given: CostProfile | None = None,
    sample: Callable[[], CpuSample] | None = None,
    config: RouterConfig = DEFAULT_CONFIG,
) -> CostProfile:
    """Cached profiles where valid; the others are measured (one progress bar) and saved.
    Batched timings live in a file of their own (`<model>.batch.json`, same key), and so
    do the context table's (`<model>.context.json`; measured where the model's context
    holds LONG_CONTEXT + the largest of CONTEXT_NS tokens).
    `given` (see read_profile): the models it names take its costs and are not measured.

    A measurement is used but not cached, with a warning, when it cannot be trusted: other
    processes were busy while it was timed (busy(), from `sample`: by default the machine's
    CPU counters when `clock` is the wall clock, nothing for a simulated one), its repeats
    disagree (unsteady) or its curve is not physical (implausible). A cached curve that is
    not physical is measured again."""
    sitting = _Sitting(directory, ns, config.profile_repeats if repeats is None else repeats, clock, batches,
                       sample or (cpu_sample if clock is time.perf_counter else _no_sample), config)
    profile, todo = CostProfile(), _Todo()
    for backend in backends:
        if given is not None and backend.name in given.tables:
            _take_given(profile, backend, given)
        else:
            sitting.read(profile, backend, todo, force)
    total = (len(todo.tables) * len(ns) + len(todo.batched) * len(batches) * len(PROFILE_BATCH_NS)
             + len(todo.contexts) * len(CONTEXT_NS)) * sitting.repeats
    if total:
        with tqdm(total=total, desc="profiling", unit="fwd", disable=not progress) as bar:
            sitting.measure(profile, todo, bar)
    return profile


def _take_given(profile: CostProfile, backend: Backend, given: CostProfile) -> None:
    """The model's costs as a profile file gives them."""
    name = backend.name
    profile.tables[name] = given.tables[name]
    if name in given.context_tables:
        profile.context_tables[name] = given.context_tables[name]
    if not backend.batches_natively:
        profile.looped.add(name)
    elif name in given.batch_tables:
        profile.batch_tables[name] = given.batch_tables[name]


@dataclass
class _Todo:
    """The models whose tables, context tables and batched tables must be measured, with their keys."""

    tables: list[tuple[Backend, dict]] = field(default_factory=list)
    contexts: list[tuple[Backend, dict]] = field(default_factory=list)
    batched: list[tuple[Backend, dict]] = field(default_factory=list)


@dataclass(frozen=True)
class _Sitting:
    """How one load_or_profile reads the cache and measures what it lacks."""

    directory: Path
    ns: Sequence[int]
    repeats: int
    clock: Callable[[], float]
    batches: Sequence[int]
    sample: Callable[[], CpuSample]
    config: RouterConfig

    def read(self, profile: CostProfile, backend: Backend, todo: _Todo, force: bool) -> None:
        """The model's cached tables into `profile`; what is missing (or `force`d) into `todo`."""
        key, name = profile_key(backend), backend.name

        def cached(kind: str, **kw) -> dict | None:
            return None if force else _read_cached(_cache_file(self.directory, backend, kind), key, config=self.config,
                                                   **kw)

        if (table := cached("", sizes=self.ns)) is None:
            todo.tables.append((backend, key))
        else:
            profile.tables[name] = table
        if holds_long_context(backend):
            if (long := cached(".context", sizes=CONTEXT_NS)) is None:
                todo.contexts.append((backend, key))
            else:
                profile.context_tables[name] = long
        if not backend.batches_natively:
            profile.looped.add(name)  # nothing to measure: B calls in a row
        elif self.batches:
            if (batched := cached(".batch", nested=True)) is None:
                todo.batched.append((backend, key))
            else:
                profile.batch_tables[name] = batched

    def measure(self, profile: CostProfile, todo: _Todo, bar: tqdm) -> None:
        """Time what `todo` lists into `profile`, and cache what can be trusted."""
        config = self.config
        for backend, key in todo.tables:
            profile.tables[backend.name] = self._time_table(backend, key, "", bar)
        for backend, key in todo.contexts:
            profile.context_tables[backend.name] = self._time_table(backend, key, ".context", bar)
        for backend, key in todo.batched:
            bar.set_postfix_str(f"{backend.name} batched")
            start = self.sample()
            batched = profile_batches(backend, self.batches, repeats=self.repeats, clock=self.clock, bar=bar)
            if not batched:  # no batch fits the backend's slots: costs fall back to total tokens
                continue
            profile.batch_tables[backend.name] = batched
            self._keep(backend, ".batch", key, {str(b): {str(n): s for n, s in t.items()} for b, t in batched.items()},
                       busy(start, self.sample(), config=config), "the batched profile")

    def _time_table(self, backend: Backend, key: dict, kind: str, bar: tqdm) -> dict[int, float]:
        """Time a model's table of `kind` ("": the profile, ".context": after LONG_CONTEXT
        cached tokens), cache it where it can be trusted, and return it."""
        long = kind == ".context"
        bar.set_postfix_str(f"{backend.name} after {LONG_CONTEXT} tokens" if long else backend.name)
        start = self.sample()
        times = time_forwards(backend, CONTEXT_NS if long else self.ns, self.repeats, clock=self.clock, bar=bar,
                              context=LONG_CONTEXT if long else PROFILED_CONTEXT)
        table = {n: statistics.median(t) for n, t in times.items()}
        config = self.config
        why = busy(start, self.sample(), config=config) or unsteady(times, config) or implausible(table, config)
        self._keep(backend, kind, key, {str(n): s for n, s in table.items()}, why,
                   "the context table" if long else "the profile", stacklevel=6)
        return table

    def _keep(self, backend: Backend, kind: str, key: dict, table: dict, why: str | None, what: str,
              stacklevel: int = 5) -> None:
        """Cache a measured table, or say why it is used for this run only (`why`; the warning
        names the caller `stacklevel` frames up: the code that asked for the profile)."""
        if why:
            warnings.warn(f"{what} of {backend.name} is used for this run only, not cached: {why}",
                          stacklevel=stacklevel)
        else:
            _write(_cache_file(self.directory, backend, kind), {"format": _FORMAT, "key": key, "table": table})


def _no_sample() -> CpuSample:
    return CpuSample(0.0, None, 0.0)


def save_refined(costs: OnlineCosts, backends: Iterable[Backend], directory: Path) -> dict[str, float]:
    """Write the tables of the models whose profile the timed forwards replaced
    (OnlineCosts.refitted) to their cache files, so that the next process starts from what
    this one timed; their batched tables are dropped (measured again when next needed).
    Returns the models written, with the factor their profile was off by.

    Two processes that save one model's table: the last one written wins, whole (_write).
    Tables are not merged: a table is the medians of one sitting's timings, each consistent
    with the machine's state then, and carries no count to weigh it by; an average of two
    would describe neither sitting, and the next process refits whatever it starts from."""
    saved = {}
    for backend in backends:
        factor = costs.refitted.get(backend.name)
        table = costs.profile.tables.get(backend.name)
        if factor is None or table is None or implausible(table, costs.config):
            continue
        _write(_cache_file(directory, backend), {"format": _FORMAT, "key": profile_key(backend),
                                                 "table": {str(n): s for n, s in table.items()}},
               drop=_cache_file(directory, backend, ".batch"))
        saved[backend.name] = factor
    return saved


def read_profile(file: Path) -> CostProfile:
    """A profile saved by `specrouter profile --json` or scripts/torch_profile.py (the GPU
    check): {"models": {model: {n: seconds}}, optionally "batched" and "lookup_seconds"}.
    Its costs are taken as given, with no cache key to check: whoever passes the file
    vouches that it describes the machine (a GPU profile cannot be measured on a CPU)."""
    try:
        data = json.loads(Path(file).read_text())
        profile = CostProfile.from_dict(data)
        values = [s for t in profile.tables.values() for s in t.values()]
        values += [s for bt in profile.batch_tables.values() for t in bt.values() for s in t.values()]
        values += [s for t in profile.context_tables.values() for s in t.values()]
        if not profile.tables or any(not t for t in profile.tables.values()) or any(not s > 0 for s in values):
            raise ValueError("no model, an empty table or a cost that is not > 0")
    except OSError as exc:
        raise InvalidParameterError(f"cannot read the profile {file}: {exc.strerror or exc}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InvalidParameterError(
            f"{file} is not a cost profile ({exc.__class__.__name__}: {exc}); expected "
            '{"models": {"<model>": {"<n tokens>": <seconds>, ...}}} as `specrouter profile --json` writes it') from None
    return profile


def _write(file: Path, data: dict, drop: Path | None = None) -> None:
    """Replace a profile file, and remove `drop` (a table measured against the one replaced),
    under the file's inter-process lock, atomically (persist.py: a reader never sees half a
    profile, two writers never share a temporary file); the last writer wins."""
    try:
        with locked(file):
            write_atomic(file, json.dumps(data, indent=1))
            if drop is not None:
                drop.unlink(missing_ok=True)
    except OSError as exc:  # a folder that cannot be written, or a lock not had in time
        warnings.warn(f"could not save profile {file}: {exc}", stacklevel=2)


