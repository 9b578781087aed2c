"""llama.cpp backend through llama-cpp-python's low-level (ctypes) API.

The high-level `Llama` class keeps one sequence and its own token bookkeeping; we need
logits for every position of a verified run and per-sequence KV removal, so we drive
llama_decode with our own batch: each token carries its absolute position and its
sequence id, and only the positions whose logits are needed are marked as outputs.
One context holds up to n_seq_max sequences in a unified KV cache (exact mode: a stream each).

Exact kernels (`exact=True`, docs/cascade-and-exactness.md has the kernel paths and what
they cost): llama.cpp's CPU backend computes a row of a forward with other kernels depending
on how many rows the forward has, so a token verified in a block of k gets logits that differ
by rounding from the same token decoded alone, and greedy near-ties flip.
In exact mode every row is computed by one path whatever the batch:
- repacked quantized weights run their 4-row GEMM on every group of 4 rows and a GEMV on
  the rest (ggml-cpu/repack.cpp, forward_mul_mat), so every run of a forward is padded to a
  multiple of EXACT_ROWS rows with rows of its own sequence (the positions after its tokens,
  with logits, removed after: causal, so no real row sees them), and asks for logits on as
  many of its last real rows as leave a multiple of EXACT_ROWS without: the rows with logits
  (which go through the last layer's FFN and the output matrix as a batch of their own) are
  then a multiple too, in every ubatch llama.cpp cuts;
- every sequence has a KV stream of its own (`kv_unified = false`): attention sums a row's
  cells in cell order, so a sequence must find its cells where it finds them alone, and in
  a shared cache its next token's cell lies behind whatever other sequences took meanwhile
  (docs/cascade-and-exactness.md); llama.cpp then cuts a batch into ubatches of equal tokens per
  sequence (each a multiple of EXACT_ROWS with the padding above), and shares no cells
  between streams, so share_prefix declines (a choice prefills its prompt itself);
- ggml's tiled K-quant matmul (ggml-cpu/tiled, used from 8 rows on for weights that are
  not repacked) is switched off for the process (GGML_CPU_TILED_MM=0, read once by ggml:
  exact mode must be chosen before any llama.cpp forward runs in the process);
- flash attention is off: its CPU kernel splits the KV range of a single row across
  threads (from 512 KV cells) and tiles 64 rows and more, three orders of summation;
  without it attention is two matmuls (tinyBLAS from 2 rows on) and a row-wise softmax.
Then every row equals one-token decoding's bit for bit, at any block size and context (the
real-model tests check it); a one-row forward costs a four-row one (it runs EXACT_ROWS rows).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from specrouter.backends.base import ForwardBackend, Run, SavedKV, TimingKey
from specrouter.errors import BackendError, InvalidParameterError, ModelFileError

try:
    import llama_cpp as _ll
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the llama.cpp backend needs llama-cpp-python: pip install 'specrouter[llama]'"
    ) from exc

_INITIALISED = False
#: An exact backend pads every forward to a multiple of this many rows (the repacked GEMM's group).
EXACT_ROWS = 4
#: ggml's switch of its tiled K-quant matmul, read once per process at the first forward.
_TILED_ENV = "GGML_CPU_TILED_MM"
_FORWARDS_RAN = False  # whether any llama.cpp forward ran in this process


def _exact_process() -> None:
    """The process-wide part of exact mode: ggml's tiled matmul off, before its first use."""
    if os.environ.get(_TILED_ENV) == "0":
        return
    if _FORWARDS_RAN:
        raise BackendError("exact kernels must be chosen before any llama.cpp model runs in this process "
                           f"(ggml reads {_TILED_ENV} once): load the exact model first, or set {_TILED_ENV}=0")
    os.environ[_TILED_ENV] = "0"


@_ll.llama_log_callback
def _quiet_log(level, text, user_data):  # llama.cpp logs every tensor load to stderr otherwise
    if os.environ.get("SPECROUTER_LLAMA_LOG"):
        print(text.decode("utf-8", "replace"), end="")


def _layers(n_gpu_layers: int) -> str:
    return "every layer" if n_gpu_layers < 0 else f"{n_gpu_layers} layers"


def _init_once() -> None:
    global _INITIALISED
    if not _INITIALISED:
        _ll.llama_log_set(_quiet_log, ctypes.c_void_p())
        _ll.llama_backend_init()
        _INITIALISED = True


class LlamaCppBackend(ForwardBackend):
    kind = "llama.cpp"

    def __init__(
        self,
        path: str | Path,
        name: str | None = None,
        n_ctx: int = 4096,
        n_seq_max: int = 4,
        n_threads: int | None = None,
        n_batch: int = 512,
        exact: bool = False,
        n_gpu_layers: int = 0,
    ) -> None:
        """exact: every forward's rows bit-identical to one-token decoding (module docstring);
        n_gpu_layers: layers llama.cpp offloads to a GPU (-1: all; specrouter/offload.py),
        refused by a build without a GPU backend and in exact mode (its kernels are the CPU's)."""
        super().__init__()
        if exact and n_batch % EXACT_ROWS:
            raise ValueError(f"exact mode needs n_batch to be a multiple of {EXACT_ROWS}, got {n_batch}")
        path = Path(path)
        self.name = name or path.stem
        self.path = path
        if n_gpu_layers and exact:
            raise InvalidParameterError(f"{self.name}: exact mode runs llama.cpp's CPU kernels "
                                        "(docs/cascade-and-exactness.md); it cannot offload layers to a GPU "
                                        "(--gpu-layers)")
        _init_once()
        if n_gpu_layers and not _ll.llama_supports_gpu_offload():
            raise BackendError(f"{self.name}: --gpu-layers asks llama.cpp to offload {_layers(n_gpu_layers)} to a "
                               "GPU, but this build of llama-cpp-python has no GPU backend (build it with "
                               "`make setup GPU=cuda`; README: GGUF models on a GPU)")
        _check_gguf(path)
        self.n_gpu_layers = n_gpu_layers
        self.exact = exact
        if exact:
            _exact_process()
        mparams = _ll.llama_model_default_params()
        mparams.n_gpu_layers = n_gpu_layers
        self._model = _ll.llama_model_load_from_file(str(path).encode(), mparams)
        if not self._model:
            raise ModelFileError(f"llama.cpp could not load {path} (unsupported architecture or damaged file)")
        self._vocab = _ll.llama_model_get_vocab(self._model)
        n_ctx_train = _ll.llama_model_n_ctx_train(self._model)
        self.n_ctx = min(n_ctx, n_ctx_train) if n_ctx_train > 0 else n_ctx
        self.n_batch = n_batch
        self.n_seq_max = n_seq_max
        self.n_threads = n_threads or os.cpu_count() or 1

        cparams = _ll.llama_context_default_params()
        # Unified cache: any sequence can reach n_ctx. Exact: a stream of n_ctx plus the pad
        # rows per sequence, and a batch with room for every run's pad rows.
        room = EXACT_ROWS - 1 if exact else 0
        batch_rows = n_batch + room * n_seq_max
        cparams.n_ctx = (self.n_ctx + room) * n_seq_max
        cparams.n_batch = cparams.n_ubatch = batch_rows
        cparams.n_seq_max = n_seq_max
        if exact:
            cparams.flash_attn_type = _ll.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cparams.n_threads = self.n_threads
        cparams.n_threads_batch = self.n_threads
        cparams.kv_unified = not exact
        cparams.no_perf = True
        self._ctx = _ll.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            _ll.llama_model_free(self._model)
            raise BackendError(f"llama.cpp could not create a context for {self.name} (out of memory?)")
        self._mem = _ll.llama_get_memory(self._ctx)
        self._batch = _ll.llama_batch_init(batch_rows, 0, 1)
        self._free_slots = list(range(n_seq_max))

        self.n_vocab = _ll.llama_vocab_n_tokens(self._vocab)
        self.params_b = _ll.llama_model_n_params(self._model) / 1e9
        self.eos_ids = frozenset(t for t in range(self.n_vocab) if _ll.llama_vocab_is_eog(self._vocab, t))
        self._closed = False

    # KV and compute (decode and decode_batch: ForwardBackend) -------------------------
    def _feed(self, seq: int, tokens: Sequence[int], pos: int) -> None:
        self._decode_runs([(seq, tokens, pos, 0)])

    def _forward(self, runs: Sequence[Run]) -> list[np.ndarray]:
        layout = self._decode_runs(runs)
        rows = _ll.llama_get_logits(self._ctx)  # the rows of the tokens that asked, in batch order
        flat = np.ctypeslib.as_array(rows, shape=(sum(before + n + after for before, n, after in layout),
                                                  self.n_vocab))
        out, offset = [], 0
        for before, n_logits, after in layout:
            out.append(flat[offset + before : offset + before + n_logits].copy())
            offset += before + n_logits + after
        return out

    def _decode_runs(self, runs: Sequence[Run]) -> list[tuple[int, int, int]]:
        """Fill the batch with runs (seq, tokens, first position, n_logits: a logits row for
        each of its last n_logits tokens) and llama_decode it. Per run, its logits rows in
        the output: (rows before the asked ones, n_logits, rows after); exact mode adds rows
        on both sides (module docstring), the default none."""
        global _FORWARDS_RAN
        _FORWARDS_RAN = True
        b = self._batch
        i = 0
        layout = []
        for seq, tokens, pos, n_logits in runs:
            before = (len(tokens) - n_logits) % EXACT_ROWS if self.exact else 0
            pad = -len(tokens) % EXACT_ROWS if self.exact else 0
            first_row = len(tokens) - n_logits - before
            for j, token in enumerate([*tokens, *[0] * pad]):
                b.token[i] = token
                b.pos[i] = pos + j
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = seq
                b.logits[i] = j >= first_row
                i += 1
            layout.append((before, n_logits, pad))
        b.n_tokens = i
        rc = _ll.llama_decode(self._ctx, b)
        for (seq, tokens, pos, _), (_, _, pad) in zip(runs, layout):
            if pad:
                _ll.llama_memory_seq_rm(self._mem, seq, pos + len(tokens), -1)
        if rc != 0:
            where = ", ".join(f"seq {s} positions {p}..{p + len(t) - 1}" for s, t, p, _ in runs)
            raise BackendError(f"{self.name}: llama_decode failed with code {rc} ({where})")
        return layout

    def remove(self, seq: int, start: int) -> None:
        if not _ll.llama_memory_seq_rm(self._mem, seq, start, -1):
            raise BackendError(f"{self.name}: could not remove positions >= {start} of sequence {seq}")

    def new_sequence(self) -> int:
        if not self._free_slots:
            raise BackendError(f"{self.name}: all {self.n_seq_max} sequence slots are in use")
        return self._free_slots.pop(0)

    def share_prefix(self, src: int, dst: int, n: int) -> bool:
        """The cells of positions [0, n) of src are tagged with dst too (no copy); exact mode
        declines (streams share no cells, and llama.cpp copies between them only whole)."""
        if self.exact:
            return False
        _ll.llama_memory_seq_cp(self._mem, src, dst, 0, n)
        return True

    def save(self, seq: int) -> SavedKV | None:
        """The sequence's cells and their K and V rows (llama_state_seq_get_data); exact mode
        keeps none (each sequence has a stream of its own)."""
        if self.exact:
            return None
        size = _ll.llama_state_seq_get_size(self._ctx, seq)
        data = bytearray(size)
        if size == 0 or _ll.llama_state_seq_get_data(self._ctx, (ctypes.c_uint8 * size).from_buffer(data), size,
                                                     seq) != size:
            return None
        return SavedKV(data, _ll.llama_memory_seq_pos_max(self._mem, seq) + 1)

    def restore(self, saved: SavedKV, dst: int, n: int) -> bool:
        """llama_state_seq_set_data writes the saved cells into free ones (in a run of its
        own, as computed: the logits after them are the same) and fails without room."""
        size = len(saved.data)
        if not _ll.llama_state_seq_set_data(self._ctx, (ctypes.c_uint8 * size).from_buffer(saved.data), size, dst):
            return False
        if n < saved.n_tokens:
            self.remove(dst, n)
        return True

    @property
    def shared_cache(self) -> bool:
        """The unified cache of default mode; exact mode gives each sequence a stream."""
        return not self.exact

    def free_sequence(self, seq: int) -> None:
        _ll.llama_memory_seq_rm(self._mem, seq, -1, -1)
        if seq not in self._free_slots:
            self._free_slots.append(seq)

    def timing_key(self) -> TimingKey:
        gpu = f"llama.cpp offload of {_layers(self.n_gpu_layers)}" if self.n_gpu_layers else None
        return TimingKey(self.kind, self.path, None, self.n_threads, gpu, kernels="exact" if self.exact else "default")

    # Tokenizer -----------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        size = len(data) + 8
        for _ in range(2):
            buf = (_ll.llama_token * size)()
            n = _ll.llama_tokenize(self._vocab, data, len(data), buf, size, add_special, parse_special)
            if n >= 0:
                return list(buf[:n])
            size = -n
        raise BackendError(f"{self.name}: tokenization failed")

    def _piece(self, token: int) -> bytes:
        buf = ctypes.create_string_buffer(256)
        n = _ll.llama_token_to_piece(self._vocab, token, buf, 256, 0, False)
        return buf.raw[: max(n, 0)]

    def token_text(self, token: int) -> bytes:
        return _ll.llama_vocab_get_text(self._vocab, token) or b""

    @property
    def n_tokens(self) -> int:
        return self.n_vocab

    @property
    def add_bos(self) -> bool:
        return bool(_ll.llama_vocab_get_add_bos(self._vocab))

    @property
    def chat_template(self) -> str | None:
        raw = _ll.llama_model_chat_template(self._model, None)
        return raw.decode("utf-8") if raw else None

    @property
    def bos_text(self) -> str:
        return self._special_text(_ll.llama_vocab_bos(self._vocab))

    @property
    def eos_text(self) -> str:
        return self._special_text(_ll.llama_vocab_eos(self._vocab))

    def _special_text(self, token: int) -> str:
        return self.token_text(token).decode("utf-8", "replace") if token >= 0 else ""

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            _ll.llama_batch_free(self._batch)
            _ll.llama_free(self._ctx)
            _ll.llama_model_free(self._model)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def _check_gguf(path: Path) -> None:
    """Fail with a clear message before llama.cpp fails with a vague one."""
    try:
        with path.open("rb") as f:
            magic = f.read(4)
    except FileNotFoundError:
        raise ModelFileError(f"model file not found: {path}") from None
    except OSError as exc:
        raise ModelFileError(f"cannot read model file {path}: {exc.strerror}") from None
    if magic != b"GGUF":
        raise ModelFileError(f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF')")
