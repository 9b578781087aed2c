"""Profiling: measure the wall seconds of one forward over n tokens, per model, on this
machine, and keep them in a disk cache (the cost model they feed: costs.py).

A forward's cost is measured the way the cascade uses it: on top of a cached prefix,
n new tokens with logits for all n (a verifier needs a row per proposal), then the n
positions are removed again. Only a subset of n is timed (costs.py interpolates). The
prefix is PROFILED_CONTEXT tokens; a few sizes are timed again after LONG_CONTEXT tokens
(the context table: what a long conversation adds to every forward, costs.py), where the
model's context holds them.

Profiles are cached as JSON, one file per model, keyed by what changes the timing:
the model file (its sha256 stamp for pool models, else size + mtime), the backend,
its thread count and the CPU model. A corrupt or stale file is re-profiled with a
warning.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import platform
import statistics
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from specrouter.backends.base import Backend
from specrouter.drafters import MODEL_FREE
from specrouter.errors import BackendError, InvalidParameterError
from specrouter.router.config import DEFAULT_CONFIG, RouterConfig
from specrouter.router.costs import LONG_CONTEXT, PROFILED_CONTEXT, CostProfile, OnlineCosts
from specrouter.router.persist import locked, write_atomic

#: Timed sizes: dense where the cost curve bends (small n), sparse above, where they are
#: the verification forwards (k + 1 tokens) of the router's coarse draft lengths
#: (scheduler.DRAFT_GRID, LOOKUP_GRID): those are timed, not interpolated.
PROFILE_NS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
#: Batched forwards: B sequences of n tokens each in one call (what serving runs). Few
#: points: between and beyond them the cost is interpolated over B as over n.
PROFILE_BATCHES = (2, 4, 8)
PROFILE_BATCH_NS = (1, 2, 4, 8)
#: Sizes timed again after LONG_CONTEXT cached tokens (the context table).
CONTEXT_NS = (1, 4, 16, 32, 64)
_FORMAT = 1
_PREFIX_TEXT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    a, b = 0, 1\n"


def profile_model(
    backend: Backend,
    ns: Sequence[int] = PROFILE_NS,
    repeats: int = DEFAULT_CONFIG.profile_repeats,
    clock: Callable[[], float] = time.perf_counter,
    bar: tqdm | None = None,
) -> dict[int, float]:
    """Median seconds of a forward over n tokens after a cached prefix, for each n."""
    return {n: statistics.median(t) for n, t in time_forwards(backend, ns, repeats, clock, bar).items()}


def time_forwards(
    backend: Backend,
    ns: Sequence[int] = PROFILE_NS,
    repeats: int = DEFAULT_CONFIG.profile_repeats,
    clock: Callable[[], float] = time.perf_counter,
    bar: tqdm | None = None,
    context: int = PROFILED_CONTEXT,
) -> dict[int, list[float]]:
    """Every timed forward over n tokens after `context` cached tokens (`repeats` per n)."""
    prefix = _prefix_tokens(backend, context)
    filler = _prefix_tokens(backend, max(ns))
    seq = backend.new_sequence()
    try:
        backend.decode(seq, prefix, 0, 1)
        backend.decode(seq, filler[:4], len(prefix), 4)  # warm-up: first calls allocate buffers
        backend.remove(seq, len(prefix))
        # Round-robin over the sizes, not all repeats of one size in a row: a slow stretch
        # of the machine (seen: +30% for tens of seconds) then costs each size one sample,
        # which the median drops, instead of bending the curve at the sizes it fell on.
        times: dict[int, list[float]] = {n: [] for n in ns}
        for _ in range(repeats):
            for n in ns:
                start = clock()
                backend.decode(seq, filler[:n], len(prefix), n)
                times[n].append(clock() - start)
                backend.remove(seq, len(prefix))
                if bar is not None:
                    bar.update(1)
        return times
    finally:
        backend.free_sequence(seq)


# Sanity of a profile ----------------------------------------------------------------
def implausible(table: dict[int, float], config: RouterConfig = DEFAULT_CONFIG) -> str | None:
    """Why a cost curve cannot describe a forward (None: it can): a size costs less than the
    config's non_physical_drop times the smallest size timed."""
    ns = sorted(table)
    first = ns[0]
    for n in ns[1:]:
        if table[n] < config.non_physical_drop * table[first]:
            return f"{n} tokens cost {table[n] * 1e3:.1f} ms, less than {first} ({table[first] * 1e3:.1f} ms)"
    return None


def unsteady(times: dict[int, list[float]], config: RouterConfig = DEFAULT_CONFIG) -> str | None:
    """Why repeated timings cannot be trusted (None: they can): the repeats of a size are
    further apart than repeat_spread (the median over sizes). Sizes timed under min_timed
    seconds are left out: the clock and Python dominate them."""
    spreads = [max(t) / min(t) for t in times.values() if len(t) > 1 and min(t) >= config.min_timed]
    if spreads and statistics.median(spreads) > config.repeat_spread:
        return f"repeats of one size differ by {statistics.median(spreads):.2f}x (median over sizes)"
    return None


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds at one moment: of the whole machine (None where /proc/stat is missing)
    and of this process (all its threads, the model's included)."""

    wall: float
    machine: float | None
    own: float


def cpu_sample() -> CpuSample:
    try:
        values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        machine = (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait
    except (OSError, ValueError, IndexError):
        machine = None
    times = os.times()
    return CpuSample(time.monotonic(), machine, times.user + times.system)


def busy(start: CpuSample, end: CpuSample, cores: int | None = None, config: RouterConfig = DEFAULT_CONFIG) -> str | None:
    """Why the machine was too busy between the two samples for timings taken then to
    describe the model alone (None: it was not): other processes used more than busy_share
    of its cores (this process's own threads do not count). Spans under min_span: no verdict."""
    wall = end.wall - start.wall
    if start.machine is None or end.machine is None or wall < config.min_span:
        return None
    cores = cores or os.cpu_count() or 1
    others = max(0.0, (end.machine - start.machine) - (end.own - start.own)) / (wall * cores)
    if others > config.busy_share:
        return f"other processes used {others:.0%} of the {cores} cores while it was timed"
    return None


def profile_batches(
    backend: Backend,
    batches: Sequence[int] = PROFILE_BATCHES,
    ns: Sequence[int] = PROFILE_BATCH_NS,
    repeats: int = DEFAULT_CONFIG.profile_repeats,
    clock: Callable[[], float] = time.perf_counter,
    bar: tqdm | None = None,
) -> dict[int, dict[int, float]]:
    """Median seconds of one decode_batch of B sequences x n tokens, each after a cached
    prefix. Batch sizes beyond the backend's free sequence slots are skipped."""
    prefix = _prefix_tokens(backend, PROFILED_CONTEXT)
    filler = _prefix_tokens(backend, max(ns))
    seqs: list[int] = []
    try:
        for _ in range(max(batches)):
            try:
                seqs.append(backend.new_sequence())
            except BackendError:
                break
        backend.decode_batch([(s, prefix, 0, 1) for s in seqs])
        tables: dict[int, dict[int, float]] = {}
        for b in batches:
            if b > len(seqs):
                if bar is not None:
                    bar.update(len(ns) * repeats)
                continue
            tables[b] = {}
            # Untimed first call at this batch's largest shape: it sizes the backend's buffers.
            backend.decode_batch([(s, filler[: max(ns)], len(prefix), max(ns)) for s in seqs[:b]])
            for s in seqs[:b]:
                backend.remove(s, len(prefix))
            for n in ns:
                times = []
                for _ in range(repeats):
                    start = clock()
                    backend.decode_batch([(s, filler[:n], len(prefix), n) for s in seqs[:b]])
                    times.append(clock() - start)
                    for s in seqs[:b]:
                        backend.remove(s, len(prefix))
                    if bar is not None:
                        bar.update(1)
                tables[b][n] = statistics.median(times)
        return tables
    finally:
        for s in seqs:
            backend.free_sequence(s)


def profile_lookups(repeats: int = 20, context_tokens: int = 2048) -> dict[str, float]:
    """Median seconds of one lookup of 8 tokens over a context of context_tokens, per
    model-free drafter."""
    context = [(i * 7919) % 1000 for i in range(context_tokens)]
    out = {}
    for name, kind in MODEL_FREE.items():
        drafter = kind()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            drafter.lookup(context, 8)
            times.append(time.perf_counter() - start)
        out[name] = statistics.median(times)
    return out


def holds_long_context(backend: Backend) -> bool:
    """Whether the model's context holds LONG_CONTEXT cached tokens and the largest of
    CONTEXT_NS after them (where its context table is timed)."""
    return backend.n_ctx > LONG_CONTEXT + max(CONTEXT_NS)


def _prefix_tokens(backend: Backend, n: int) -> list[int]:
    tokens = backend.tokenize(_PREFIX_TEXT, add_special=False) or [0]
    return (tokens * (1 + n // len(tokens)))[:n]


# Cache -----------------------------------------------------------------------------
def default_profile_dir() -> Path:
    from specrouter.models import default_cache_dir

    return default_cache_dir().parent / "profiles"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


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
    """One file per model and kernels (a model profiled in both modes keeps both)."""
    kernels = backend.timing_key().kernels
    name = backend.name if kernels == "default" else f"{backend.name}-{kernels}"
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
        warnings.warn(f"profile cache {file} is corrupt ({exc.__class__.__name__}): re-profiling", stacklevel=4)
        return None
    why = next(filter(None, (implausible(t, config) for t in (table.values() if nested else [table]))), None)
    if why:
        warnings.warn(f"profile cache {file} is not physical ({why}): re-profiling", stacklevel=4)
        return None
    if data.get("key") != key:
        changed = sorted(k for k in key if data.get("key", {}).get(k) != key[k]) if isinstance(data.get("key"), dict) else ["key"]
        warnings.warn(f"profile cache {file} is stale ({', '.join(changed)} changed): re-profiling", stacklevel=4)
        return None
    if missing := sorted(set(sizes) - set(table)):
        warnings.warn(f"profile cache {file} is stale (not timed at {', '.join(map(str, missing))} tokens): "
                      "re-profiling", stacklevel=4)
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
    sample = sample or (cpu_sample if clock is time.perf_counter else _no_sample)
    repeats = config.profile_repeats if repeats is None else repeats
    profile = CostProfile()
    todo, todo_batch, todo_context = [], [], []
    for backend in backends:
        if given is not None and backend.name in given.tables:
            profile.tables[backend.name] = given.tables[backend.name]
            if backend.name in given.context_tables:
                profile.context_tables[backend.name] = given.context_tables[backend.name]
            if not backend.batches_natively:
                profile.looped.add(backend.name)
            elif backend.name in given.batch_tables:
                profile.batch_tables[backend.name] = given.batch_tables[backend.name]
            continue
        key = profile_key(backend)
        table = None if force else _read_cached(_cache_file(directory, backend), key, sizes=ns, config=config)
        if table is None:
            todo.append((backend, key))
        else:
            profile.tables[backend.name] = table
        if holds_long_context(backend):
            long = None if force else _read_cached(_cache_file(directory, backend, ".context"), key, sizes=CONTEXT_NS,
                                                   config=config)
            if long is None:
                todo_context.append((backend, key))
            else:
                profile.context_tables[backend.name] = long
        if not backend.batches_natively:
            profile.looped.add(backend.name)  # nothing to measure: B calls in a row
        elif batches:
            batched = None if force else _read_cached(_cache_file(directory, backend, ".batch"), key, nested=True,
                                                      config=config)
            if batched is None:
                todo_batch.append((backend, key))
            else:
                profile.batch_tables[backend.name] = batched
    total = (len(todo) * len(ns) + len(todo_batch) * len(batches) * len(PROFILE_BATCH_NS)
             + len(todo_context) * len(CONTEXT_NS)) * repeats
    if total:
        with tqdm(total=total, desc="profiling", unit="fwd", disable=not progress) as bar:
            for backend, key in todo:
                bar.set_postfix_str(backend.name)
                start = sample()
                times = time_forwards(backend, ns, repeats, clock=clock, bar=bar)
                table = {n: statistics.median(t) for n, t in times.items()}
                profile.tables[backend.name] = table
                why = busy(start, sample(), config=config) or unsteady(times, config) or implausible(table, config)
                if why:
                    warnings.warn(f"the profile of {backend.name} is used for this run only, not cached: {why}",
                                  stacklevel=3)
                else:
                    _write(_cache_file(directory, backend), {"format": _FORMAT, "key": key,
                                                             "table": {str(n): s for n, s in table.items()}})
            for backend, key in todo_context:
                bar.set_postfix_str(f"{backend.name} after {LONG_CONTEXT} tokens")
                start = sample()
                times = time_forwards(backend, CONTEXT_NS, repeats, clock=clock, bar=bar, context=LONG_CONTEXT)
                long = profile.context_tables[backend.name] = {n: statistics.median(t) for n, t in times.items()}
                why = busy(start, sample(), config=config) or unsteady(times, config) or implausible(long, config)
                if why:
                    warnings.warn(f"the context table of {backend.name} is used for this run only, not cached: {why}",
                                  stacklevel=3)
                else:
                    _write(_cache_file(directory, backend, ".context"), {
                        "format": _FORMAT, "key": key, "table": {str(n): s for n, s in long.items()}})
            for backend, key in todo_batch:
                bar.set_postfix_str(f"{backend.name} batched")
                start = sample()
                batched = profile_batches(backend, batches, repeats=repeats, clock=clock, bar=bar)
                if not batched:  # no batch fits the backend's slots: costs fall back to total tokens
                    continue
                profile.batch_tables[backend.name] = batched
                why = busy(start, sample(), config=config)
                if why:
                    warnings.warn(f"the batched profile of {backend.name} is used for this run only, not cached: "
                                  f"{why}", stacklevel=3)
                else:
                    _write(_cache_file(directory, backend, ".batch"), {
                        "format": _FORMAT, "key": key,
                        "table": {str(b): {str(n): s for n, s in t.items()} for b, t in batched.items()}})
    return profile


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


