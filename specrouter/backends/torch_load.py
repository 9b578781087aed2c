"""Loading a transformers model for the torch backend: the device and dtype checked to run,
the model folder checked to hold a config, weights and a tokenizer, and the model built with
or without its weights.

torch is imported here, and this module is imported only when a torch model is used (by
torch.py, which says how to install the extra when torch is missing).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from specrouter.errors import BackendError, InvalidParameterError, ModelFileError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16", "float": "float32"}


def dtype_name(dtype: str | Any) -> str:
    """Normalise 'fp32' / 'bfloat16' / torch.float16 ... to one of DTYPES' keys."""
    if isinstance(dtype, torch.dtype):
        for name, value in DTYPES.items():
            if value == dtype:
                return name
        raise InvalidParameterError(f"dtype {dtype} is not supported: use one of {', '.join(DTYPES)}")
    name = _DTYPE_ALIASES.get(str(dtype).lower(), str(dtype).lower())
    if name not in DTYPES:
        raise InvalidParameterError(f"dtype {dtype!r} is not supported: use one of {', '.join(DTYPES)}")
    return name


def check_device(device: str) -> torch.device:
    """A usable torch device, or BackendError saying why not."""
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise InvalidParameterError(f"device {device!r} is not a torch device: use cpu or cuda[:N]") from None
    if dev.type == "cpu":
        return dev
    if dev.type != "cuda":
        raise InvalidParameterError(f"device {device!r} is not supported: use cpu or cuda[:N]")
    if not torch.cuda.is_available():
        why = "this torch build has no CUDA support" if torch.version.cuda is None else "no CUDA GPU is visible"
        raise BackendError(f"device {device!r} was asked for, but {why} (torch {torch.__version__}); use --device cpu")
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        raise BackendError(f"device {device!r} does not exist: {torch.cuda.device_count()} CUDA device(s) visible")
    return dev


def check_dtype_runs(device: torch.device, dtype: torch.dtype) -> None:
    """Run the operations a decoder needs (matmul, softmax, attention) on a tiny input in
    `dtype` on `device`; BackendError if the device cannot (e.g. bf16 on a GPU without it)."""
    try:
        x = torch.randn(1, 2, 4, 8, device=device).to(dtype)
        y = torch.nn.functional.scaled_dot_product_attention(x, x, x, is_causal=True)
        z = torch.softmax(y @ x.transpose(-1, -2), dim=-1)
        if not torch.isfinite(z.float()).all():
            raise RuntimeError("non-finite results on a tiny input")
    except (RuntimeError, TypeError, NotImplementedError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        shown = str(dtype).removeprefix("torch.")
        raise BackendError(f"device {device} cannot run dtype {shown}: {first}") from None


def check_runtime(device: str, dtype: str, n_threads: int | None) -> tuple[torch.device, torch.dtype]:
    """The device and dtype, checked to run; n_threads set for a CPU (process-wide in torch,
    where llama.cpp sets it per context)."""
    dev = check_device(device)
    tdtype = DTYPES[dtype_name(dtype)]
    check_dtype_runs(dev, tdtype)
    if n_threads and dev.type == "cpu":
        torch.set_num_threads(n_threads)
    return dev, tdtype


def load_folder(path: Path, dtype: torch.dtype, weights: bool) -> tuple[Any, Any]:
    """The model and tokenizer of a transformers model folder (ModelFileError naming what is
    missing or what failed). weights=False: the model's modules on the meta device, no
    weight read (skeleton)."""
    if not path.is_dir():
        raise ModelFileError(f"torch model folder not found: {path}")
    if not (path / "config.json").is_file():
        raise ModelFileError(f"{path} is not a transformers model folder: it has no config.json")
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise ModelFileError(f"{path} has no weights (*.safetensors)")
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")):
        raise ModelFileError(
            f"{path} has no tokenizer (tokenizer.json / tokenizer.model / vocab.json): "
            "a chain needs each model's tokenizer to check they agree"
        )
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, TypeError) as exc:
        raise ModelFileError(f"{path}: could not load its tokenizer: {exc}") from None
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, local_files_only=True) \
            if weights else skeleton(path, dtype)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelFileError(f"{path}: transformers could not load the model: {exc}") from None
    return model, tokenizer


def skeleton(path: Path, dtype: torch.dtype) -> Any:
    """The model a folder's config describes, its modules on the meta device (no weights),
    with the folder's generation config (its end tokens)."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if (path / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(str(path), local_files_only=True)
    return model
