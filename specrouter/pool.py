"""Turning chain specs into loaded, checked levels.

A spec is a model-free drafter's name (specrouter.drafters.MODEL_FREE: `ngram`, `suffix`),
a pool name (llama.cpp, GGUF), a pool name with a torch variant
(`qwen2.5-coder-1.5b:torch-fp32`, see specrouter.convert), a GGUF file another tool
downloaded (`ollama:NAME[:TAG]`, `hf:OWNER/REPO/FILE.gguf`, `lmstudio:PUBLISHER/REPO`, see
specrouter.model_sources; llama.cpp), a path to a .gguf file (llama.cpp) or a path to a
transformers model folder (torch). Backends of every kind mix freely in one chain; only
their tokenizers must agree.

Loaded models are kept by the Pool so that a model used by several chains (or by
several requests) is loaded once and keeps one KV cache with one slot per sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from specrouter.allocator import keep_freed_pages
from specrouter.backends.base import Backend
from specrouter.drafters import MODEL_FREE
from specrouter.cascade.chain import Chain, Level
from specrouter.errors import BackendError, InvalidParameterError
from specrouter.convert import resolve_torch_model, split_torch_name
from specrouter.model_sources import is_source_spec
from specrouter.models import model_name, resolve_model
from specrouter.offload import GpuLayers
from specrouter.vocab import check_shared_tokenizer

#: Draft length per level of a fixed chain when none is given: short, because on a CPU a
#: verified block costs more the longer it is while each further drafted token is less
#: likely to be reached; llama.cpp's own speculative example peaks at 4 on a 2-core CPU
#: (docs/journal.md).
DEFAULT_DRAFT_LENGTH = 4


def parse_chain(text: str) -> list[str]:
    specs = [s.strip() for s in text.split(",")]
    if not text.strip() or any(not s for s in specs):
        raise InvalidParameterError(f"--chain must be a comma-separated list of models, got {text!r}")
    return specs


def parse_draft_lengths(text: str | None, n_levels: int) -> list[int]:
    if text is None or not text.strip():
        return [DEFAULT_DRAFT_LENGTH] * (n_levels - 1)
    try:
        values = [int(s) for s in text.split(",")]
    except ValueError:
        raise InvalidParameterError(f"--draft-lengths must be comma-separated integers, got {text!r}") from None
    return values


@dataclass
class Pool:
    cache_dir: Path | None = None
    n_ctx: int = 4096
    n_threads: int | None = None
    n_seq_max: int = 4
    #: Pull (and, for torch variants, convert) missing pool models on first use.
    pull_missing: bool = False
    #: Where torch models run (cpu, cuda, cuda:N); llama.cpp models always run on the CPU.
    device: str = "cpu"
    #: dtype of torch models given as a folder path (pool names carry their own).
    torch_dtype: str = "float32"
    #: How torch models hold their KV: "eager" or "static" (backends/kv_runtime.py); None: the
    #: device's default (static on cuda, eager on a CPU).
    torch_runtime: str | None = None
    #: Exact kernels for llama.cpp models (backends/llamacpp.py): every verified row
    #: bit-identical to one-token decoding; torch models cannot join such a pool.
    exact: bool = False
    #: Layers of each llama.cpp model offloaded to a GPU (specrouter/offload.py; none by default).
    gpu_layers: GpuLayers = GpuLayers()
    _loaded: dict[str, Backend] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # The process that holds a pool serves from it: its cycles' freed arrays stay mapped
        # for the next cycle (specrouter/allocator.py; process-wide, speed only).
        keep_freed_pages()

    def level(self, spec: str) -> Level:
        """A chain level: a fresh model-free drafter, or the (shared) loaded model."""
        if spec in MODEL_FREE:
            return MODEL_FREE[spec]()
        return self.model(spec)

    def model(self, spec: str) -> Backend:
        """The loaded model a spec names (InvalidParameterError for a model-free drafter)."""
        if spec in MODEL_FREE:
            raise InvalidParameterError(f"{spec} is a model-free drafter, not a model")
        torch_model = self._torch_model(spec)
        if torch_model is not None:
            return self._torch(*torch_model)
        path = resolve_model(spec, self.cache_dir, pull_missing=self.pull_missing)
        key = str(path.resolve())
        if key not in self._loaded:
            try:
                from specrouter.backends.llamacpp import LlamaCppBackend  # needs the native library
            except ImportError as exc:
                raise BackendError(str(exc)) from None

            self._loaded[key] = LlamaCppBackend(
                path, name=model_name(spec), n_ctx=self.n_ctx, n_seq_max=self.n_seq_max, n_threads=self.n_threads,
                exact=self.exact, n_gpu_layers=self.gpu_layers.of(spec),
            )
        return self._loaded[key]

    def vocabulary(self, spec: str) -> Backend:
        """The model a spec names as a tokenizer needs it (tokenize, chat template, context
        size, end tokens): a torch model built without its weights (an instance of its own,
        which runs no forward); a llama.cpp model as model() loads it (llama.cpp maps its
        weights from the page cache, which a node's processes share)."""
        torch_model = self._torch_model(spec) if spec not in MODEL_FREE else None
        if torch_model is None:
            return self.model(spec)
        return self._torch(*torch_model, weights=False)

    def _torch_model(self, spec: str) -> tuple[Path, str, str] | None:
        """(folder, name, dtype) of a torch model spec; None for a llama.cpp one."""
        if is_source_spec(spec):
            return None
        if split_torch_name(spec) is not None:
            folder, dtype = resolve_torch_model(spec, self.cache_dir, convert_missing=self.pull_missing)
            return folder, spec, dtype
        if Path(spec).expanduser().is_dir():
            folder = Path(spec).expanduser()
            return folder, folder.name, self.torch_dtype
        return None

    def _torch(self, folder: Path, name: str, dtype: str, weights: bool = True) -> Backend:
        if self.exact:
            raise InvalidParameterError(f"exact mode covers llama.cpp models only, not the torch model {name} "
                                        "(docs/cascade-and-exactness.md)")
        key = f"{folder.resolve()}|torch|{dtype}|{self.device}|{self.torch_runtime}|{'weights' if weights else 'vocabulary'}"
        if key not in self._loaded:
            try:
                from specrouter.backends.torch import TorchBackend  # needs the torch extra
            except ImportError as exc:
                raise BackendError(str(exc)) from None

            self._loaded[key] = TorchBackend(
                folder, name=name, device=self.device, dtype=dtype, n_ctx=self.n_ctx,
                n_seq_max=self.n_seq_max, n_threads=self.n_threads, weights=weights, runtime=self.torch_runtime,
            )
        return self._loaded[key]

    def chain(self, specs: Sequence[str], draft_lengths: Sequence[int] | None = None) -> Chain:
        levels = [self.level(s) for s in specs]
        check_shared_tokenizer([lv for lv in levels if isinstance(lv, Backend)])
        lengths = list(draft_lengths) if draft_lengths is not None else [DEFAULT_DRAFT_LENGTH] * (len(levels) - 1)
        return Chain(levels, lengths)

    def close(self) -> None:
        for model in self._loaded.values():
            model.close()
        self._loaded.clear()
