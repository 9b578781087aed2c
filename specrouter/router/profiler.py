"""Cost profile: wall seconds of one forward over n tokens, per model, on this machine.

A forward's cost is measured the way the cascade uses it: on top of a cached prefix,
n new tokens with logits for all n (a verifier needs a row per proposal), then the n
positions are removed again. Only a subset of n is timed; the rest is interpolated
linearly (and extrapolated from the last two points, for catch-up runs past 32).

Profiles are cached as JSON, one file per model, keyed by what changes the timing:
the model file (its sha256 stamp for pool models, else size + mtime), the backend,
its thread count and the CPU model. A corrupt or stale file is re-profiled with a
warning. OnlineCosts refines the profile from the timings of real cycles (EMA).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from specrouter.backends.base import Backend
from specrouter.backends.ngram import NGRAM_NAME, NgramDrafter
from specrouter.errors import BackendError, InvalidParameterError

#: Timed sizes: dense where the cost curve bends (small n), sparse above.
PROFILE_NS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
#: Repeats per size: 3 keeps the default pool under a minute (the 1.5B takes ~4 s per sweep).
PROFILE_REPEATS = 3
#: Batched forwards: B sequences of n tokens each in one call (what serving runs). Few
#: points: between and beyond them the cost is interpolated over B as over n.
PROFILE_BATCHES = (2, 4, 8)
PROFILE_BATCH_NS = (1, 2, 4, 8)
PREFIX_TOKENS = 32
#: Default n-gram lookup cost (measured ~20 us on a few thousand tokens); refined online.
NGRAM_SECONDS = 2e-5
_FORMAT = 1
_PREFIX_TEXT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    a, b = 0, 1\n"


def interpolate(table: dict[int, float], n: float) -> float:
    """Linear in n between measured sizes; linear extrapolation beyond them."""
    ns = sorted(table)
    if not ns:
        raise ValueError("empty cost table")
    if len(ns) == 1:
        return table[ns[0]] * n / ns[0]
    if n <= ns[0]:
        lo, hi = ns[0], ns[1]
    elif n >= ns[-1]:
        lo, hi = ns[-2], ns[-1]
    else:
        hi = next(x for x in ns if x >= n)
        lo = max(x for x in ns if x <= n)
        if lo == hi:
            return table[lo]
    slope = (table[hi] - table[lo]) / (hi - lo)
    return max(table[lo] + slope * (n - lo), 1e-9)


@dataclass
class CostProfile:
    """Seconds per forward, model name -> {n tokens: seconds}, plus the n-gram lookup; and
    per model, batched calls: {B sequences: {n tokens each: seconds of the call}}."""

    tables: dict[str, dict[int, float]] = field(default_factory=dict)
    ngram_seconds: float = NGRAM_SECONDS
    batch_tables: dict[str, dict[int, dict[int, float]]] = field(default_factory=dict)
    #: Models whose batched call is a loop over the sequences: it costs B single calls.
    looped: set[str] = field(default_factory=set)

    def seconds(self, name: str, n: float, batch: float = 1) -> float:
        """One call of `batch` sequences with n tokens each (n tokens of one sequence at batch 1)."""
        if name == NGRAM_NAME:
            return self.ngram_seconds
        if batch == 1:
            return interpolate(self.tables[name], n)
        if name in self.looped:
            return batch * interpolate(self.tables[name], n)
        batched = self.batch_tables.get(name)
        if not batched:  # not profiled in batches: a call costs about what its tokens cost together
            return interpolate(self.tables[name], n * batch)
        per_batch = {1: interpolate(self.tables[name], n)}
        per_batch.update({b: interpolate(t, n) for b, t in batched.items()})
        return interpolate(per_batch, batch)

    def as_dict(self) -> dict:
        return {"ngram_seconds": self.ngram_seconds,
                "models": {m: {str(n): s for n, s in sorted(t.items())} for m, t in self.tables.items()},
                "batched": {m: {str(b): {str(n): s for n, s in sorted(t.items())} for b, t in sorted(bt.items())}
                            for m, bt in self.batch_tables.items()}}

    @classmethod
    def from_dict(cls, data: dict) -> CostProfile:
        tables = {m: {int(n): float(s) for n, s in t.items()} for m, t in data["models"].items()}
        batched = {m: {int(b): {int(n): float(s) for n, s in t.items()} for b, t in bt.items()}
                   for m, bt in data.get("batched", {}).items()}
        return cls(tables, float(data.get("ngram_seconds", NGRAM_SECONDS)), batched)


def profile_model(
    backend: Backend,
    ns: Sequence[int] = PROFILE_NS,
    repeats: int = PROFILE_REPEATS,
    clock: Callable[[], float] = time.perf_counter,
    bar: tqdm | None = None,
) -> dict[int, float]:
    """Median seconds of a forward over n tokens after a cached prefix, for each n."""
    prefix = _prefix_tokens(backend, PREFIX_TOKENS)
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
        return {n: statistics.median(t) for n, t in times.items()}
    finally:
        backend.free_sequence(seq)


def profile_batches(
    backend: Backend,
    batches: Sequence[int] = PROFILE_BATCHES,
    ns: Sequence[int] = PROFILE_BATCH_NS,
    repeats: int = PROFILE_REPEATS,
    clock: Callable[[], float] = time.perf_counter,
    bar: tqdm | None = None,
) -> dict[int, dict[int, float]]:
    """Median seconds of one decode_batch of B sequences x n tokens, each after a cached
    prefix. Batch sizes beyond the backend's free sequence slots are skipped."""
    prefix = _prefix_tokens(backend, PREFIX_TOKENS)
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


def profile_ngram(repeats: int = 20, context_tokens: int = 2048) -> float:
    drafter = NgramDrafter()
    context = [(i * 7919) % 1000 for i in range(context_tokens)]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        drafter.propose(context, 8)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


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


def backend_name(backend: Backend) -> str:
    kind = type(backend).__name__
    return "llama.cpp" if kind == "LlamaCppBackend" else kind


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


def accelerator(backend: Backend) -> str | None:
    """The GPU a torch backend runs on (its timings are that GPU's), else None."""
    device = str(getattr(backend, "device", "") or "")
    if not device.startswith("cuda"):
        return None
    try:
        import torch

        return torch.cuda.get_device_name(torch.device(device))
    except Exception:  # no driver here: the device string is still a key
        return device


def profile_key(backend: Backend) -> dict:
    """What a forward's time depends on besides n: model file, backend, dtype, threads, CPU/GPU."""
    path = getattr(backend, "path", None)
    dtype = getattr(backend, "dtype", None)
    return {
        "model": backend.name,
        "file": file_identity(Path(path) if path is not None else None),
        "backend": backend_name(backend),
        "dtype": None if dtype is None else str(dtype),
        "n_threads": getattr(backend, "n_threads", None),
        "cpu": cpu_model(),
        "gpu": accelerator(backend),
    }


def _cache_file(directory: Path, backend: Backend, kind: str = "") -> Path:
    safe = "".join(c if c.isalnum() or c in "-._" else "_" for c in backend.name)
    return directory / f"{safe}{kind}.json"


def _read_cached(file: Path, key: dict, nested: bool = False) -> dict | None:
    """The cached table when the file is valid and its key matches; None (with a warning) otherwise.
    nested: a batch table, {B: {n: seconds}}."""
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
        warnings.warn(f"profile cache {file} is corrupt ({exc.__class__.__name__}): re-profiling", stacklevel=3)
        return None
    if data.get("key") != key:
        changed = sorted(k for k in key if data.get("key", {}).get(k) != key[k]) if isinstance(data.get("key"), dict) else ["key"]
        warnings.warn(f"profile cache {file} is stale ({', '.join(changed)} changed): re-profiling", stacklevel=3)
        return None
    return table


def load_or_profile(
    backends: Iterable[Backend],
    directory: Path | None = None,
    repeats: int = PROFILE_REPEATS,
    ns: Sequence[int] = PROFILE_NS,
    force: bool = False,
    progress: bool = True,
    clock: Callable[[], float] = time.perf_counter,
    batches: Sequence[int] = PROFILE_BATCHES,
    given: CostProfile | None = None,
) -> CostProfile:
    """Cached profiles where valid; the others are measured (one progress bar) and saved.
    Batched timings live in a file of their own (`<model>.batch.json`, same key).
    `given` (see read_profile): the models it names take its costs and are not measured."""
    directory = Path(directory) if directory is not None else default_profile_dir()
    profile = CostProfile()
    todo, todo_batch = [], []
    for backend in backends:
        if given is not None and backend.name in given.tables:
            profile.tables[backend.name] = given.tables[backend.name]
            if not backend.batches_natively:
                profile.looped.add(backend.name)
            elif backend.name in given.batch_tables:
                profile.batch_tables[backend.name] = given.batch_tables[backend.name]
            continue
        key = profile_key(backend)
        table = None if force else _read_cached(_cache_file(directory, backend), key)
        if table is None:
            todo.append((backend, key))
        else:
            profile.tables[backend.name] = table
        if not backend.batches_natively:
            profile.looped.add(backend.name)  # nothing to measure: B calls in a row
        elif batches:
            batched = None if force else _read_cached(_cache_file(directory, backend, ".batch"), key, nested=True)
            if batched is None:
                todo_batch.append((backend, key))
            else:
                profile.batch_tables[backend.name] = batched
    total = (len(todo) * len(ns) + len(todo_batch) * len(batches) * len(PROFILE_BATCH_NS)) * repeats
    if total:
        with tqdm(total=total, desc="profiling", unit="fwd", disable=not progress) as bar:
            for backend, key in todo:
                bar.set_postfix_str(backend.name)
                table = profile_model(backend, ns, repeats, clock=clock, bar=bar)
                profile.tables[backend.name] = table
                _write(_cache_file(directory, backend), {"format": _FORMAT, "key": key,
                                                         "table": {str(n): s for n, s in table.items()}})
            for backend, key in todo_batch:
                bar.set_postfix_str(f"{backend.name} batched")
                batched = profile_batches(backend, batches, repeats=repeats, clock=clock, bar=bar)
                if not batched:  # no batch fits the backend's slots: costs fall back to total tokens
                    continue
                profile.batch_tables[backend.name] = batched
                _write(_cache_file(directory, backend, ".batch"), {
                    "format": _FORMAT, "key": key,
                    "table": {str(b): {str(n): s for n, s in t.items()} for b, t in batched.items()}})
    return profile


def read_profile(file: Path) -> CostProfile:
    """A profile saved by `specrouter profile --json` or scripts/torch_profile.py (the GPU
    check): {"models": {model: {n: seconds}}, optionally "batched" and "ngram_seconds"}.
    Its costs are taken as given, with no cache key to check: whoever passes the file
    vouches that it describes the machine (a GPU profile cannot be measured on a CPU)."""
    try:
        data = json.loads(Path(file).read_text())
        profile = CostProfile.from_dict(data)
        values = [s for t in profile.tables.values() for s in t.values()]
        values += [s for bt in profile.batch_tables.values() for t in bt.values() for s in t.values()]
        if not profile.tables or any(not t for t in profile.tables.values()) or any(not s > 0 for s in values):
            raise ValueError("no model, an empty table or a cost that is not > 0")
    except OSError as exc:
        raise InvalidParameterError(f"cannot read the profile {file}: {exc.strerror or exc}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InvalidParameterError(
            f"{file} is not a cost profile ({exc.__class__.__name__}: {exc}); expected "
            '{"models": {"<model>": {"<n tokens>": <seconds>, ...}}} as `specrouter profile --json` writes it') from None
    return profile


def _write(file: Path, data: dict) -> None:
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp = file.with_name(file.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, file)  # atomic: a crash never leaves a half-written profile
    except OSError as exc:
        warnings.warn(f"could not save profile {file}: {exc}", stacklevel=2)


# Online refinement -------------------------------------------------------------------
class OnlineCosts:
    """The profile, corrected by observed forwards: seconds(m, n) = profile_m(n) * level_m * shape_m(n).

    level_m, an EMA of observed/profiled time over every forward of m, follows a model
    that slows down or speeds up as a whole (another process on the cores, a longer
    context) at every n after a few forwards at any n; shape_m(n), a slower EMA per
    (model, n), corrects the profile's curve where cycles show it is off.
    """

    ALPHA = 0.3  # a few observations move the level; one outlier does not
    SHAPE_ALPHA = 0.1
    ROW_ALPHA = 0.1

    def __init__(self, profile: CostProfile, overhead_per_forward: float = 0.0) -> None:
        self.profile = profile
        self._level: dict[str, float] = {}
        self._shape: dict[tuple[str, int], float] = {}
        self.overhead_per_forward = overhead_per_forward  # Python work around each forward (feeding, bookkeeping)
        #: Python work per logits row (warp, sample, verify), per kind of sampling (row_kind):
        #: ~0.02 ms greedy, ~0.5 ms at a temperature, ~1 ms with top-p, on a 150k vocabulary.
        self._row: dict[str, float] = {}

    def _shape_at(self, name: str, n: float) -> float:
        lo = int(n)
        frac = n - lo
        s_lo = self._shape.get((name, lo), 1.0)
        return s_lo if frac < 1e-9 else (1 - frac) * s_lo + frac * self._shape.get((name, lo + 1), 1.0)

    def seconds(self, name: str, n: float, batch: float = 1) -> float:
        """One call of `batch` sequences with n tokens each (see CostProfile.seconds)."""
        if name == NGRAM_NAME:
            return self.profile.ngram_seconds * self._level.get(name, 1.0)
        base = self.profile.seconds(name, n, batch)
        return base * self._level.get(name, 1.0) * self._shape_at(name, n) + self.overhead_per_forward

    def observe(self, name: str, n: int, seconds: float, batch: int = 1) -> None:
        """A call of `batch` sequences feeding n tokens in all took `seconds`."""
        if name not in self.profile.tables and name != NGRAM_NAME:
            return
        if batch > 1:  # the level follows every call; shapes stay a single-sequence correction
            base = self.profile.seconds(name, max(n / batch, 1), batch)
            level = self._level.get(name, 1.0)
            self._level[name] = level + self.ALPHA * (seconds / base - level)
            return
        base = self.profile.seconds(name, max(n, 1))
        r = seconds / base if base > 0 else 1.0
        shape = self._shape.get((name, n), 1.0) if name != NGRAM_NAME else 1.0
        level = self._level.get(name, 1.0)
        self._level[name] = level = level + self.ALPHA * (r / shape - level)
        if name != NGRAM_NAME:
            self._shape[(name, n)] = shape + self.SHAPE_ALPHA * (r / level - shape)
            # Shapes average 1 over the sizes seen: a common factor belongs to the level
            # (it then applies at every n), only the relative curve stays in the shapes.
            keys = [k for k in self._shape if k[0] == name]
            mean = sum(self._shape[k] for k in keys) / len(keys)
            for k in keys:
                self._shape[k] /= mean
            self._level[name] *= mean

    def snapshot(self) -> dict:
        """The numbers predictions depend on; the router re-plans when they move enough."""
        return {**self._level, **{f"{m}@{n}": v for (m, n), v in self._shape.items()},
                "overhead": self.overhead_per_forward}

    def set_overhead(self, seconds: float) -> None:
        self.overhead_per_forward = seconds

    def row_seconds(self, kind: str) -> float:
        return self._row.get(kind, 0.0)

    def observe_rows(self, kind: str, rows: int, seconds: float) -> None:
        """The Python work on `rows` logits rows took `seconds` (an EMA per row, from the first)."""
        if rows > 0:
            per_row = seconds / rows
            old = self._row.get(kind)
            self._row[kind] = per_row if old is None else old + self.ROW_ALPHA * (per_row - old)


def row_kind(params) -> str:
    """What a logits row's Python work depends on: greedy (an argmax), or the warp's filters."""
    if params.greedy:
        return "greedy"
    return "sampled" + "+top_k" * bool(params.top_k) + "+top_p" * (params.top_p < 1.0)
