"""PyTorch backend over Hugging Face transformers (CPU or CUDA; fp32, bf16 or fp16).

Same contract as the llama.cpp backend (base.py, whose ForwardBackend splits each call
into catch-up forwards and one forward of every sequence's logit tail); `remove` drops
positions [start, end). How the sequences' KV is held and fed is the runtime's
(kv_runtime.py): `eager`, a transformers DynamicCache per sequence cropped on rollback
(torch_cache.py), or `static`, KV preallocated per slot with bucketed forwards replayed as
CUDA graphs on a GPU (torch_static.py). Loading, and the checks of device, dtype and model
folder, are torch_load.py's.

Token texts and pieces render as llama.cpp renders them (hf_tokens.py), so a GGUF
model and its torch conversion are recognised as sharing a tokenizer.

torch is imported here, and this module is imported only when a torch model is used:
the package works without the `torch` extra.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from specrouter.backends.base import ForwardBackend, Run, TimingKey
from specrouter.backends.hf_tokens import HFTokenTexts
from specrouter.errors import BackendError, ModelFileError

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the torch backend needs torch and transformers: pip install 'specrouter[torch]' "
        "(install the torch build that fits your machine first)"
    ) from exc

from specrouter.backends.kv_runtime import KVRuntime, check_runtime_name  # noqa: E402
from specrouter.backends.torch_cache import DynamicKV, check_croppable  # noqa: E402
from specrouter.backends.torch_load import (DTYPES, check_device, check_dtype_runs, check_runtime,  # noqa: E402
                                            dtype_name, load_folder)
from specrouter.ops.rows_torch import register_tensors  # noqa: E402

__all__ = ["DTYPES", "TorchBackend", "check_device", "check_dtype_runs", "dtype_name"]

register_tensors()  # rows this backend leaves on its device go through ops/rows_torch.py


def _to_host(logits: torch.Tensor) -> np.ndarray:
    """Logits as float32 numpy on the host: copied in the model's dtype, widened there. The
    same values as widening on the device first (bf16 and fp16 widen to fp32 exactly), half
    the bytes across the bus for them: several times faster on a GPU host whose copies are
    slow (scripts/gpu_diag.py copy; benchmarks/results/gpu-check-2026-12-04-h200.md). On a
    CPU both are one and the same."""
    return logits.cpu().float().numpy()


class TorchBackend(ForwardBackend):
    """A transformers causal LM with one DynamicCache per sequence.

    Build it from a model folder (`TorchBackend(path, ...)`) or from objects already in
    memory (`TorchBackend.from_model(model, tokenizer, ...)`, used by tests).
    """

    kind = "torch"

    def __init__(
        self,
        path: str | Path,
        name: str | None = None,
        device: str = "cpu",
        dtype: str = "float32",
        n_ctx: int = 4096,
        n_seq_max: int = 4,
        n_threads: int | None = None,
        rows_on_device: bool | None = None,
        weights: bool = True,
        runtime: str | None = None,
    ) -> None:
        """rows_on_device: hand the cascade its logits rows as tensors left on the device,
        which the cascade then warps, samples and verifies there (ops/rows_torch.py);
        False copies them to host numpy. None (default): on the device unless it is a CPU,
        where the copy costs nothing and numpy's row work is the faster (docs/gpu.md).
        weights=False: the vocabulary only (tokenizer, chat template, context size, end
        tokens, logits width: what a fleet's ingress tokenizes with): the model's modules are
        built on torch's meta device from its config, no weight is read or allocated, and a
        forward raises BackendError. runtime: "eager" or "static" (kv_runtime.py; None: the
        device's default)."""
        path = Path(path)
        runtime = check_runtime_name(runtime, device)
        dev, tdtype = check_runtime(device, dtype, n_threads)
        model, tokenizer = load_folder(path, tdtype, weights)
        self.path = path
        self._setup(model, tokenizer, name or path.name, dev, tdtype, n_ctx, n_seq_max, rows_on_device, runtime)

    @classmethod
    def from_model(cls, model: Any, tokenizer: Any, name: str = "torch", device: str = "cpu",
                   dtype: str = "float32", n_ctx: int = 4096, n_seq_max: int = 4,
                   n_threads: int | None = None, rows_on_device: bool | None = None,
                   runtime: str | None = None) -> TorchBackend:
        """Wrap a model and tokenizer already in memory (moved to device and dtype)."""
        self = cls.__new__(cls)
        runtime = check_runtime_name(runtime, device)
        dev, tdtype = check_runtime(device, dtype, n_threads)
        if tokenizer is None:
            raise ModelFileError(f"{name}: a torch model needs a tokenizer")
        self.path = None
        self._setup(model, tokenizer, name, dev, tdtype, n_ctx, n_seq_max, rows_on_device, runtime)
        return self

    def _setup(self, model: Any, tokenizer: Any, name: str, dev: torch.device, tdtype: torch.dtype,
               n_ctx: int, n_seq_max: int, rows_on_device: bool | None, runtime: str) -> None:
        ForwardBackend.__init__(self)
        self.name = name
        self.device = dev
        self.dtype = tdtype
        #: Whether decode returns its rows as tensors on the device (float32), else host numpy.
        self.rows_on_device = dev.type != "cpu" if rows_on_device is None else bool(rows_on_device)
        #: CPU threads torch computes with (read by the router's profile key); None on a GPU.
        self.n_threads = torch.get_num_threads() if dev.type == "cpu" else None
        #: False: built without weights (the vocabulary only; see __init__).
        self.weights = model.device.type != "meta"
        self._model = (model.to(device=dev, dtype=tdtype) if self.weights else model).eval()
        self._tok = tokenizer
        config = model.config
        self._config = config
        check_croppable(config, name)
        max_pos = getattr(config, "max_position_embeddings", None) or n_ctx
        self.n_ctx = min(n_ctx, int(max_pos))
        self.n_seq_max = n_seq_max
        self.n_vocab = int(config.vocab_size)
        self._n_tokens = len(tokenizer)
        if self._n_tokens > self.n_vocab:
            raise ModelFileError(f"{name}: the tokenizer has {self._n_tokens} tokens but the model only {self.n_vocab} logits")
        self.params_b = sum(p.numel() for p in model.parameters()) / 1e9
        self._kv = self._runtime(runtime)
        self._texts = HFTokenTexts(tokenizer, model, self.n_vocab)
        self.eos_ids = self._texts.eos_ids
        self._closed = False

    def _runtime(self, runtime: str) -> KVRuntime:
        if runtime == "eager" or not self.weights:
            return DynamicKV(self._model, self._config, self.device, self.n_seq_max, self.name)
        from specrouter.backends.torch_static import StaticKV

        return StaticKV(self._model, self._config, self.device, self.dtype, self.n_seq_max, self.n_ctx, self.name,
                        graphs=self.device.type == "cuda")

    @property
    def runtime(self) -> str:
        """The KV runtime's name: "eager" or "static" (kv_runtime.py)."""
        return self._kv.name

    def graph_stats(self) -> Any:
        """The CUDA graphs the runtime has captured (`captured`, `capture_seconds`), or None."""
        return self._kv.graphs

    # KV and compute (decode and decode_batch: ForwardBackend) -------------------------
    def _check_item(self, seq: int, tokens: Sequence[int], pos: int, n_logits: int) -> None:
        if not self.weights:
            raise BackendError(f"{self.name} was loaded without its weights (the vocabulary only): it runs no forward")
        super()._check_item(seq, tokens, pos, n_logits)
        held = self._kv.length(seq)
        if pos != held:
            raise BackendError(f"{self.name}: decode at position {pos} but sequence {seq} holds {held} positions")

    def _feed(self, seq: int, tokens: Sequence[int], pos: int) -> None:
        self._kv.forward([(seq, tokens, pos, 0)])

    def _forward(self, runs: Sequence[Run]) -> list[np.ndarray]:
        return [self._rows(r) for r in self._kv.forward(runs)]

    def _rollback(self, seq: int, pos: int) -> None:
        try:
            self._kv.crop(seq, pos)
        except BackendError:
            pass  # the sequence is gone: nothing to roll back

    def _rows(self, logits: torch.Tensor) -> np.ndarray | torch.Tensor:
        """Logits as the cascade gets them: float32 on the device, or host numpy. Either way
        the call returns once they are computed (a GPU runs asynchronously: without the wait
        a call's wall time would not be its forward's, which the router's costs read)."""
        if not self.rows_on_device:
            return _to_host(logits)
        rows = logits.float()
        if rows.device.type == "cuda":
            torch.cuda.synchronize(rows.device)
        return rows

    def remove(self, seq: int, start: int) -> None:
        self._kv.crop(seq, start)

    def new_sequence(self) -> int:
        return self._kv.new()

    def share_prefix(self, src: int, dst: int, n: int) -> bool:
        """dst holds src's first n positions (copied: each sequence's KV is its own)."""
        self._kv.share(src, dst, n)
        return True

    def free_sequence(self, seq: int) -> None:
        self._kv.free(seq)

    def timing_key(self) -> TimingKey:
        gpu = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else None
        kernels = "default" if self._kv.name == "eager" else self._kv.name
        return TimingKey(self.kind, self.path, dtype_name(self.dtype), self.n_threads, gpu, kernels)

    def kv_length(self, seq: int) -> int:
        return self._kv.length(seq)

    # Tokenizer -----------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return list(self._tok(text, add_special_tokens=add_special, split_special_tokens=not parse_special)["input_ids"])

    def token_text(self, token: int) -> bytes:
        return self._texts.text(token)

    def _piece(self, token: int) -> bytes:
        return self._texts.piece(token)

    @property
    def n_tokens(self) -> int:
        return self._n_tokens

    @property
    def add_bos(self) -> bool:
        ids = self._tok("a", add_special_tokens=True)["input_ids"]
        return bool(ids) and self._tok.bos_token_id is not None and ids[0] == self._tok.bos_token_id

    @property
    def chat_template(self) -> str | None:
        template = getattr(self._tok, "chat_template", None)
        return template if isinstance(template, str) else None

    @property
    def bos_text(self) -> str:
        return self._tok.bos_token or ""

    @property
    def eos_text(self) -> str:
        return self._tok.eos_token or ""

    def close(self) -> None:
        if not getattr(self, "_closed", True):
            self._closed = True
            self._kv.close()
            self._model = None
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
