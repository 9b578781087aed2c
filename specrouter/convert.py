"""Torch variants of the pool models: GGUF -> safetensors conversion, cached, and naming.

Naming: ``<pool name>:torch-<dtype>`` with dtype ``fp32``, ``bf16`` or ``fp16``, e.g.
``qwen2.5-coder-1.5b:torch-fp32``. The part before the colon is the pool model whose
pulled GGUF is converted; the suffix only chooses the dtype the weights are loaded in
(and the device comes from the pool, ``cpu`` by default). Every dtype of one model
shares one converted folder, ``<cache>/torch/<pool name>/``, holding float32 weights:
the GGUF's quantized blocks are dequantized to float32 exactly once, and a bf16 or
fp16 variant is a cast at load time (so the fp32 variant carries the GGUF's weights
without a second rounding).

Conversion goes through transformers' own GGUF loader (``from_pretrained(folder,
gguf_file=...)``, which needs the ``gguf`` package), then ``save_pretrained`` as
safetensors plus the tokenizer. It runs once, explicitly (``specrouter convert NAME``)
or on first use when the pool is allowed to fetch missing models. Loading a GGUF
dequantizes every weight in memory (minutes and several GB at peak for the 1.5B); the saved
folder reloads in seconds. One model is converted at a time so the peak stays that of the
largest one.

Nothing here imports torch at module import time: the package works without the
``torch`` extra, and only converting or loading a torch model needs it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from specrouter.errors import BackendError, ModelFileError, UnknownModelError
from specrouter.model_sources import is_source_spec
from specrouter.models import DEFAULT_POOL, default_cache_dir, resolve_model

#: Name suffix -> torch dtype name.
TORCH_VARIANTS = {"torch-fp32": "float32", "torch-bf16": "bfloat16", "torch-fp16": "float16"}
#: Written last into a converted folder: its presence means the conversion completed.
MARKER = "specrouter-converted.json"
#: Weights of a converted folder are always stored in this dtype (see module doc).
STORED_DTYPE = "float32"


def split_torch_name(spec: str) -> tuple[str, str] | None:
    """``'qwen2.5-coder-1.5b:torch-bf16'`` -> ``('qwen2.5-coder-1.5b', 'bfloat16')``;
    None for a spec that is not a torch name (a source spec such as `ollama:NAME:TAG` is not one).
    Unknown suffixes or models raise."""
    if ":" not in spec or is_source_spec(spec):
        return None
    base, _, variant = spec.partition(":")
    if variant not in TORCH_VARIANTS:
        raise UnknownModelError(
            f"unknown model variant {variant!r} in {spec!r}: known variants are "
            f"{', '.join(TORCH_VARIANTS)} (e.g. {next(iter(DEFAULT_POOL))}:torch-fp32)"
        )
    if base not in DEFAULT_POOL:
        raise UnknownModelError(
            f"unknown model {base!r} in {spec!r}: torch variants exist for the pool models "
            f"{', '.join(DEFAULT_POOL)}"
        )
    return base, TORCH_VARIANTS[variant]


def torch_names() -> list[str]:
    return [f"{name}:{variant}" for name in DEFAULT_POOL for variant in TORCH_VARIANTS]


def converted_dir(name: str, cache_dir: Path | None = None) -> Path:
    """Where pool model `name`'s converted folder lives (it may not exist yet)."""
    if name not in DEFAULT_POOL:
        raise UnknownModelError(f"unknown model {name!r}: known models are {', '.join(DEFAULT_POOL)}")
    return Path(cache_dir or default_cache_dir()) / "torch" / name


def is_converted(name: str, cache_dir: Path | None = None) -> bool:
    """The folder is complete and was made from the GGUF the pool pins today."""
    try:
        meta = json.loads((converted_dir(name, cache_dir) / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return meta.get("source_sha256") == DEFAULT_POOL[name].sha256.lower()


def _require_torch_stack() -> None:
    missing = []
    for module in ("torch", "transformers", "gguf", "safetensors"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise BackendError(
            f"the torch backend needs {', '.join(missing)}: pip install 'specrouter[torch]' "
            "(install torch first from the build that fits your machine)"
        )


def gguf_architecture(path: Path) -> str:
    """The GGUF's `general.architecture`, read from its header only."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path))
        field = reader.fields["general.architecture"]
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    except KeyError:
        raise ModelFileError(f"{path}: GGUF file without general.architecture") from None
    except (ValueError, OSError) as exc:
        raise ModelFileError(f"{path} is not a readable GGUF file: {exc}") from None


def check_convertible(path: Path) -> str:
    """Raise ModelFileError unless transformers can convert this GGUF's architecture."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    arch = gguf_architecture(path)
    # transformers spells some names with '_' where llama.cpp uses '' or '-' (qwen2moe)
    candidates = {arch, arch.replace("-", "_"), arch.replace("moe", "_moe")}
    if not candidates & set(GGUF_SUPPORTED_ARCHITECTURES):
        supported = sorted(set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer"})
        raise ModelFileError(
            f"{path.name}: transformers cannot convert GGUF architecture {arch!r} to torch "
            f"(it converts: {', '.join(supported)})"
        )
    return arch


def convert_gguf(gguf_path: Path, out_dir: Path, *, source_sha256: str = "", progress: bool = True) -> Path:
    """Dequantize `gguf_path` to float32 and save it as a transformers folder at `out_dir`.

    Writes into a temporary folder next to `out_dir` and renames it at the end, so an
    interrupted conversion never leaves a folder that looks complete.
    """
    _require_torch_stack()
    gguf_path = Path(gguf_path)
    arch = check_convertible(gguf_path)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def say(msg: str) -> None:
        if progress:
            print(msg, file=sys.stderr, flush=True)

    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".convert-{out_dir.name}-", dir=out_dir.parent))
    t0 = time.perf_counter()
    try:
        say(f"converting {gguf_path.name} ({arch}) to torch: dequantizing the GGUF (this takes minutes)...")
        kw = {"gguf_file": gguf_path.name, "local_files_only": True}
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), **kw)
            model = AutoModelForCausalLM.from_pretrained(
                str(gguf_path.parent), dtype=getattr(torch, STORED_DTYPE), **kw
            )
        except (ValueError, KeyError, NotImplementedError) as exc:
            raise ModelFileError(f"transformers could not convert {gguf_path.name}: {exc}") from None
        load_s = time.perf_counter() - t0
        say(f"  loaded in {load_s:.0f} s; saving safetensors...")
        # A model loaded from GGUF refuses save_pretrained while it carries the
        # quantizer marker; the weights are already plain tensors.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(str(work), safe_serialization=True)
        tokenizer.save_pretrained(str(work))
        del model
        meta = {
            "source": gguf_path.name,
            "source_sha256": source_sha256,
            "architecture": arch,
            "stored_dtype": STORED_DTYPE,
            "load_seconds": round(load_s, 1),
            "total_seconds": round(time.perf_counter() - t0, 1),
        }
        (work / MARKER).write_text(json.dumps(meta, indent=1) + "\n")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(work, out_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    say(f"  done in {time.perf_counter() - t0:.0f} s: {out_dir}")
    return out_dir


def convert(name: str, cache_dir: Path | None = None, *, pull_missing: bool = False,
            progress: bool = True, force: bool = False) -> Path:
    """Convert pool model `name` (its pulled GGUF) once; return the converted folder."""
    out = converted_dir(name, cache_dir)
    if is_converted(name, cache_dir) and not force:
        return out
    gguf = resolve_model(name, cache_dir, pull_missing=pull_missing)
    return convert_gguf(gguf, out, source_sha256=DEFAULT_POOL[name].sha256.lower(), progress=progress)


def resolve_torch_model(spec: str, cache_dir: Path | None = None, *, convert_missing: bool = False) -> tuple[Path, str]:
    """A torch name -> (converted folder, dtype name). Converts on first use only when
    `convert_missing`; otherwise a missing conversion is an error naming the command."""
    base, dtype = split_torch_name(spec)  # type: ignore[misc]
    if is_converted(base, cache_dir):
        return converted_dir(base, cache_dir), dtype
    if not convert_missing:
        raise ModelFileError(
            f"model {spec!r} is not converted to torch yet: run `specrouter convert {base}` "
            "(once; it dequantizes the pulled GGUF into safetensors)"
        )
    return convert(base, cache_dir, pull_missing=True), dtype
