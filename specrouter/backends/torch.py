"""PyTorch backend over Hugging Face transformers (CPU or CUDA; fp32, bf16 or fp16).

Same contract as the llama.cpp backend (base.py, whose ForwardBackend splits each call
into catch-up forwards and one forward of every sequence's logit tail); `remove` drops
positions [start, end). Each sequence owns one transformers
`DynamicCache`; rollback crops it. transformers 5.x changed `DynamicCache.crop`: it
now takes a *negative* count of tokens to drop (the 4.x meaning, "keep the first n",
raises), so `remove` crops by `start - length` (reference notes, pitfalls). Layers
that cannot be cropped exactly (sliding-window or linear-attention caches) are
refused at load time rather than rolled back approximately.

Token texts and pieces render as llama.cpp renders them (hf_tokens.py), so a GGUF
model and its torch conversion are recognised as sharing a tokenizer.

torch is imported here, and this module is imported only when a torch model is used:
the package works without the `torch` extra.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from specrouter.backends.base import ForwardBackend, Run, TimingKey
from specrouter.backends.hf_tokens import HFTokenTexts
from specrouter.ops.rows_torch import register_tensors
from specrouter.errors import BackendError, InvalidParameterError, ModelFileError

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the torch backend needs torch and transformers: pip install 'specrouter[torch]' "
        "(install the torch build that fits your machine first)"
    ) from exc

register_tensors()  # rows this backend leaves on its device go through ops/rows_torch.py

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


def _to_host(logits: torch.Tensor) -> np.ndarray:
    """Logits as float32 numpy on the host: copied in the model's dtype, widened there. The
    same values as widening on the device first (bf16 and fp16 widen to fp32 exactly), half
    the bytes across the bus for them: several times faster on a GPU host whose copies are
    slow (scripts/gpu_diag.py copy; benchmarks/results/gpu-check-2026-12-04-h200.md). On a
    CPU both are one and the same."""
    return logits.cpu().float().numpy()


def _skeleton(path: Path, dtype: torch.dtype) -> Any:
    """The model a folder's config describes, its modules on the meta device (no weights),
    with the folder's generation config (its end tokens)."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if (path / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(str(path), local_files_only=True)
    return model


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
    ) -> None:
        """rows_on_device: hand the cascade its logits rows as tensors left on the device,
        which the cascade then warps, samples and verifies there (ops/rows_torch.py);
        False copies them to host numpy. None (default): on the device unless it is a CPU,
        where the copy costs nothing and numpy's row work is the faster (docs/host-work.md).
        weights=False: the vocabulary only (tokenizer, chat template, context size, end
        tokens, logits width: what a fleet's ingress tokenizes with): the model's modules are
        built on torch's meta device from its config, no weight is read or allocated, and a
        forward raises BackendError."""
        path = Path(path)
        dev, tdtype = self._check_runtime(device, dtype, n_threads)
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
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=tdtype, local_files_only=True) \
                if weights else _skeleton(path, tdtype)
        except (OSError, ValueError, KeyError) as exc:
            raise ModelFileError(f"{path}: transformers could not load the model: {exc}") from None
        self.path = path
        self._setup(model, tokenizer, name or path.name, dev, tdtype, n_ctx, n_seq_max, rows_on_device)

    @classmethod
    def from_model(cls, model: Any, tokenizer: Any, name: str = "torch", device: str = "cpu",
                   dtype: str = "float32", n_ctx: int = 4096, n_seq_max: int = 4,
                   n_threads: int | None = None, rows_on_device: bool | None = None) -> TorchBackend:
        """Wrap a model and tokenizer already in memory (moved to device and dtype)."""
        self = cls.__new__(cls)
        dev, tdtype = self._check_runtime(device, dtype, n_threads)
        if tokenizer is None:
            raise ModelFileError(f"{name}: a torch model needs a tokenizer")
        self.path = None
        self._setup(model, tokenizer, name, dev, tdtype, n_ctx, n_seq_max, rows_on_device)
        return self

    @staticmethod
    def _check_runtime(device: str, dtype: str, n_threads: int | None) -> tuple[torch.device, torch.dtype]:
        dev = check_device(device)
        tdtype = DTYPES[dtype_name(dtype)]
        check_dtype_runs(dev, tdtype)
        if n_threads and dev.type == "cpu":
            torch.set_num_threads(n_threads)  # process-wide in torch (llama.cpp sets it per context)
        return dev, tdtype

    def _setup(self, model: Any, tokenizer: Any, name: str, dev: torch.device, tdtype: torch.dtype,
               n_ctx: int, n_seq_max: int, rows_on_device: bool | None) -> None:
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
        self._check_croppable()
        max_pos = getattr(config, "max_position_embeddings", None) or n_ctx
        self.n_ctx = min(n_ctx, int(max_pos))
        self.n_seq_max = n_seq_max
        self.n_vocab = int(config.vocab_size)
        self._n_tokens = len(tokenizer)
        if self._n_tokens > self.n_vocab:
            raise ModelFileError(f"{name}: the tokenizer has {self._n_tokens} tokens but the model only {self.n_vocab} logits")
        self.params_b = sum(p.numel() for p in model.parameters()) / 1e9
        self._caches: dict[int, Any] = {}
        self._free_slots = list(range(n_seq_max))
        self._texts = HFTokenTexts(tokenizer, model, self.n_vocab)
        self.eos_ids = self._texts.eos_ids
        self._closed = False

    def _check_croppable(self) -> None:
        from transformers import DynamicCache

        cache = DynamicCache(config=self._config)
        bad = {type(layer).__name__ for layer in getattr(cache, "layers", [])
               if getattr(layer, "is_sliding", False) or not getattr(layer, "is_croppable", True)}
        if bad:
            raise ModelFileError(
                f"{self.name}: its KV cache layers ({', '.join(sorted(bad))}) cannot be rolled back exactly "
                "(sliding-window or recurrent attention); speculative decoding needs exact rollback"
            )

    def _new_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache(config=self._config)

    # KV and compute (decode and decode_batch: ForwardBackend) -------------------------
    def _check_item(self, seq: int, tokens: Sequence[int], pos: int, n_logits: int) -> None:
        if not self.weights:
            raise BackendError(f"{self.name} was loaded without its weights (the vocabulary only): it runs no forward")
        super()._check_item(seq, tokens, pos, n_logits)
        held = self._cache(seq).get_seq_length()
        if pos != held:
            raise BackendError(f"{self.name}: decode at position {pos} but sequence {seq} holds {held} positions")

    def _feed(self, seq: int, tokens: Sequence[int], pos: int) -> None:
        self._run(self._cache(seq), tokens, pos, 0)

    def _forward(self, runs: Sequence[Run]) -> list[np.ndarray]:
        if len(runs) == 1:
            seq, tokens, pos, n_logits = runs[0]
            return [self._run(self._cache(seq), tokens, pos, n_logits)]
        rows = self._forward_batch([self._cache(seq) for seq, *_ in runs], [list(t) for _, t, _, _ in runs])
        return [r[len(r) - n_logits :] for r, (*_, n_logits) in zip(rows, runs)]

    def _rollback(self, seq: int, pos: int) -> None:
        if seq in self._caches:
            self._truncate(self._caches[seq], pos)

    def _forward_batch(self, caches: list[Any], runs: list[list[int]]) -> list[np.ndarray]:
        """Feed runs[i] to caches[i] in ONE forward; return every run's logits (len(run), n_vocab).

        Layout, the usual one of batched generation with a cache: row i holds its past
        (p_i positions) left-padded to the longest past P, then its run right-padded to the
        longest run N. The 2-D attention mask is 1 exactly on the real columns
        [P - p_i, P + n_i), so padding is never attended to; the causal part compares
        column indices, which is right for every row because all runs start at column P.
        Position ids are each row's own absolute positions p_i + j (RoPE sees no padding).
        Each row's query j >= n_i is padding whose output is dropped; it still attends to
        column P (its first real token), so no row of the mask is empty (no NaN)."""
        past = [cache.get_seq_length() for cache in caches]
        lens = [len(run) for run in runs]
        b, p_max, n_max = len(runs), max(past), max(lens)
        ids = torch.zeros(b, n_max, dtype=torch.long)
        mask = torch.zeros(b, p_max + n_max, dtype=torch.long)
        for i, (run, p, n) in enumerate(zip(runs, past, lens)):
            ids[i, :n] = torch.tensor(run)
            mask[i, p_max - p : p_max + n] = 1
        positions = torch.tensor(past).unsqueeze(1) + torch.arange(n_max)
        with torch.inference_mode():
            batched = self._gather(caches, past, p_max)
            try:
                out = self._model(
                    input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                    position_ids=positions.to(self.device), past_key_values=batched, use_cache=True,
                    logits_to_keep=n_max,
                )
            except torch.cuda.OutOfMemoryError:
                raise BackendError(
                    f"{self.name}: out of GPU memory decoding {sum(lens)} tokens of {b} sequences"
                ) from None
            logits = self._rows(out.logits)
            del out
            # Write back each row's real span (own past + own run, no padding) as the
            # sequence's cache, copied out so the padded tensors are freed layer by layer.
            for li, layer in enumerate(batched.layers):
                for i, (cache, p, n) in enumerate(zip(caches, past, lens)):
                    keys = layer.keys[i : i + 1, :, p_max - p : p_max + n].clone()
                    values = layer.values[i : i + 1, :, p_max - p : p_max + n].clone()
                    own = cache.layers[li]
                    if not own.is_initialized:
                        own.lazy_initialization(keys, values)
                    own.keys, own.values = keys, values
                layer.keys = layer.values = None
        return [logits[i, :n] for i, n in enumerate(lens)]

    def _gather(self, caches: list[Any], past: list[int], p_max: int) -> Any:
        """A new DynamicCache holding every sequence's past as one row, left-padded with
        zeros to p_max (a copy: the sequences keep their own caches until the write-back)."""
        batched = self._new_cache()
        if p_max == 0:
            return batched
        for li, layer in enumerate(batched.layers):
            like = next(c.layers[li].keys for c, p in zip(caches, past) if p)
            keys = like.new_zeros(len(caches), like.shape[1], p_max, like.shape[3])
            values = keys.clone()
            for i, (cache, p) in enumerate(zip(caches, past)):
                if p:
                    keys[i, :, p_max - p :] = cache.layers[li].keys[0]
                    values[i, :, p_max - p :] = cache.layers[li].values[0]
            layer.lazy_initialization(keys, values)
            layer.keys, layer.values = keys, values
        return batched

    def _run(self, cache: Any, tokens: Sequence[int], pos: int, n_logits: int) -> np.ndarray | None:
        """One sequence's forward; its last n_logits rows (None for 0)."""
        ids = torch.tensor([list(tokens)], dtype=torch.long, device=self.device)
        positions = torch.arange(pos, pos + len(tokens), device=self.device).unsqueeze(0)
        try:
            with torch.inference_mode():
                out = self._model(
                    input_ids=ids, position_ids=positions, past_key_values=cache, use_cache=True,
                    logits_to_keep=max(n_logits, 1),
                )
        except torch.cuda.OutOfMemoryError:
            raise BackendError(f"{self.name}: out of GPU memory decoding {len(tokens)} tokens at {pos}") from None
        if n_logits == 0:
            return None
        return self._rows(out.logits[0, -n_logits:])

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

    @staticmethod
    def _truncate(cache: Any, length: int) -> None:
        """Crop every layer back to `length` positions (a failed forward may leave some longer)."""
        for layer in cache.layers:
            extra = layer.get_seq_length() - length
            if extra > 0:
                layer.crop(-extra)

    def _cache(self, seq: int) -> Any:
        try:
            return self._caches[seq]
        except KeyError:
            raise BackendError(f"{self.name}: sequence {seq} does not exist") from None

    def remove(self, seq: int, start: int) -> None:
        cache = self._cache(seq)
        held = cache.get_seq_length()
        start = max(int(start), 0)
        if start == 0:
            self._caches[seq] = self._new_cache()
        elif start < held:
            cache.crop(start - held)  # transformers 5.x: a negative count of tokens to drop

    def new_sequence(self) -> int:
        if not self._free_slots:
            raise BackendError(f"{self.name}: all {self.n_seq_max} sequence slots are in use")
        seq = self._free_slots.pop(0)
        self._caches[seq] = self._new_cache()
        return seq

    def share_prefix(self, src: int, dst: int, n: int) -> bool:
        """A copy of src's cache, cut to n positions (a DynamicCache's tensors are its own)."""
        cache = copy.deepcopy(self._cache(src))
        self._truncate(cache, n)
        self._caches[dst] = cache
        return True

    def free_sequence(self, seq: int) -> None:
        self._caches.pop(seq, None)
        if seq not in self._free_slots and 0 <= seq < self.n_seq_max:
            self._free_slots.append(seq)

    def timing_key(self) -> TimingKey:
        gpu = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else None
        return TimingKey(self.kind, self.path, dtype_name(self.dtype), self.n_threads, gpu)

    def kv_length(self, seq: int) -> int:
        return int(self._cache(seq).get_seq_length())

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
            self._caches.clear()
            self._model = None
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
