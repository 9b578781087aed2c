"""Forward cost of torch models, as JSON in the router's cost-profile format.

Randomly initialised models with the published shapes of Qwen2.5(-Coder) 0.5B and 1.5B
(the default pool's models), Llama-3.2-1B and Llama-3.1-8B (no weights are needed: cost
depends on shapes, not values), or a real model folder. Three tables per model:

- "models" (CostProfile.tables): one sequence, n new tokens after a cached prefix, timed
  the way the cascade uses a forward, through TorchBackend.decode: logits for all n copied
  to host numpy (the last n_batch = 512 of them above that: the backend feeds the rest
  in forwards of its own first, as in use), then the n positions removed again. n runs over every size a cycle feeds
  (1..32 and each block's bonus row) and the sizes of a batch's tokens together (up to
  2,048), which is what the simulator prices a batched forward at when no batched table
  is given (specrouter/sim/batched.py).
- "batched" (CostProfile.batch_tables, {model: {B: {k: seconds}}}): B sequences, each with
  its own cached prefix, k new tokens each, in one TorchBackend.decode_batch (its cache
  gather and write-back included).
- "capture" ({model: {graphs, seconds}}): with --torch-runtime static on CUDA, the graphs
  the runtime captured (one per bucket, on first use: inside the warm-up calls, outside the
  timings) and the seconds capturing took.
- "device_seconds" ({model: {n: seconds}}, not read by the router): the same forward as
  "models" on the model itself, logits left on the device, timed to a device synchronize.
  The difference from "models" is what the host copy of the logits costs, that is what a
  device-resident cascade (cascade work on the logits' device) would save per forward.

Medians of `repeats` timed calls after one warm-up call per size. "device" says what ran it.

    python scripts/torch_profile.py --device cuda --out profile.json          # the GPU check
    python scripts/torch_profile.py --device cpu --tiny --out /tmp/p.json      # a CPU smoke test
    python scripts/torch_profile.py --folder DIR --dtype float32 --ks 1,4,8,16 # a real model

Nothing is downloaded: the script works offline.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout, installed or not

#: Published configurations (config.json of Qwen/Qwen2.5-Coder-0.5B and -1.5B, which share
#: Qwen2.5-0.5B's and -1.5B's; meta-llama/Llama-3.2-1B and Llama-3.1-8B), by architecture.
SHAPES = {
    "qwen2.5-coder-0.5b": ("qwen2", dict(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
        rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    )),
    "qwen2.5-coder-1.5b": ("qwen2", dict(
        vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
        rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    )),
    "llama-3.2-1b": ("llama", dict(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
        rms_norm_eps=1e-5, tie_word_embeddings=True,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    )),
    "llama-3.1-8b": ("llama", dict(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072,
        rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    )),
}
#: --tiny: same structure, sizes cut so a CPU runs the whole sweep in seconds.
TINY = dict(vocab_size=4096, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32)
#: Tokens per forward of one sequence: every draft block (1..32) and its bonus row, then
#: what a batch's sequences feed together (B sequences of k + 1 tokens).
SIZES = (*range(1, 33), 33, 48, 49, 64, 65, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048)
BATCHES = (2, 4, 8, 16, 32)
BATCH_KS = (1, 2, 4, 8, 17)


class _Tokenizer:
    """Enough of a tokenizer for TorchBackend: the profile feeds token ids only (and the
    router's profiler tokenizes its prefix text: one id per byte)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.eos_token_id = None
        self.bos_token = self.eos_token = None
        self.added_tokens_decoder: dict = {}
        self.all_special_ids: list[int] = []

    def __len__(self) -> int:
        return self.n

    def __call__(self, text: str, **_) -> dict:
        """One id per byte (what the router's profiler feeds: any ids cost the same)."""
        return {"input_ids": [b % self.n for b in text.encode()]}

    def get_vocab(self) -> dict:
        return {}


def device_info(device: str) -> dict:
    import torch
    import transformers

    from specrouter.router.estimates.profiler import cpu_model

    info = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": device,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": sys.version.split()[0],
        "host_cpu": cpu_model(),
        "cpu_threads": torch.get_num_threads(),
    }
    if device.startswith("cuda"):
        idx = torch.device(device).index or 0
        props = torch.cuda.get_device_properties(idx)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    compute_capability=f"{props.major}.{props.minor}", cuda=torch.version.cuda,
                    gpus_visible=torch.cuda.device_count())
    return info


def random_model(name: str, tiny: bool, device: str, dtype):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    family, shape = SHAPES[name]
    shape = dict(shape)
    if tiny:
        shape.update(TINY)
    config_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[family]
    config = config_cls(**shape)
    torch.manual_seed(0)
    with torch.device(device):  # allocate (and initialise) on the device itself: 16 GB for the 8B in bf16
        model = model_cls._from_config(config, dtype=dtype)
    return model.eval()


def _median_time(call, undo, repeats: int, warmup: int = 1) -> float:
    times = []
    for i in range(warmup + repeats):
        start = time.perf_counter()
        call()
        elapsed = time.perf_counter() - start
        undo()
        if i >= warmup:
            times.append(elapsed)
    return statistics.median(times)


def profile_backend(model, sizes, prefix: int, repeats: int) -> dict[int, float]:
    """Median seconds of decode(n tokens, logits for all n) after a cached prefix."""
    import numpy as np

    rng = np.random.default_rng(0)
    n_tokens = min(model.n_tokens, model.n_vocab)
    seq = model.new_sequence()
    try:
        model.decode(seq, rng.integers(0, n_tokens, prefix).tolist(), 0, 1)
        table = {}
        for n in sizes:
            tokens = rng.integers(0, n_tokens, n).tolist()
            rows = min(n, model.n_batch)  # over n_batch tokens the backend feeds the rest first, as it does in use
            # decode returns numpy: the device has finished
            table[n] = _median_time(lambda: model.decode(seq, tokens, prefix, rows), lambda: model.remove(seq, prefix), repeats)
    finally:
        model.free_sequence(seq)
    return table


def profile_batched(model, batches, ks, prefix: int, repeats: int) -> dict[int, dict[int, float]]:
    """Median seconds of one decode_batch of B sequences (each its own cached prefix of
    `prefix` tokens) with k new tokens each, logits for all of them."""
    import numpy as np

    rng = np.random.default_rng(1)
    n_tokens = min(model.n_tokens, model.n_vocab)
    seqs = [model.new_sequence() for _ in range(max(batches))]
    try:
        for seq in seqs:
            model.decode(seq, rng.integers(0, n_tokens, prefix).tolist(), 0, 1)
        table: dict[int, dict[int, float]] = {}
        for b in batches:
            table[b] = {}
            for k in ks:
                items = [(seq, rng.integers(0, n_tokens, k).tolist(), prefix, k) for seq in seqs[:b]]

                def undo() -> None:
                    for seq in seqs[:b]:
                        model.remove(seq, prefix)

                table[b][k] = _median_time(lambda: model.decode_batch(items), undo, repeats)
    finally:
        for seq in seqs:
            model.free_sequence(seq)
    return table


def profile_device(hf_model, sizes, prefix: int, repeats: int, device: str) -> dict[int, float]:
    """Median seconds of the model's own forward of n tokens after a cached prefix, logits
    for all n left on the device, timed to a device synchronize (no host copy)."""
    import torch
    from transformers import DynamicCache

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    gen = torch.Generator().manual_seed(2)
    vocab = hf_model.config.vocab_size
    cache = DynamicCache(config=hf_model.config)
    with torch.inference_mode():
        ids = torch.randint(0, vocab, (1, prefix), generator=gen).to(device)
        hf_model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        table = {}
        for n in sizes:
            ids = torch.randint(0, vocab, (1, n), generator=gen).to(device)
            positions = torch.arange(prefix, prefix + n, device=device).unsqueeze(0)

            def call() -> None:
                hf_model(input_ids=ids, position_ids=positions, past_key_values=cache, use_cache=True, logits_to_keep=n)
                sync()

            table[n] = _median_time(call, lambda: cache.crop(-n), repeats)  # transformers 5.x: tokens to drop
    return table


def save(result: dict, out: Path | None) -> None:
    """Written after every table: a run cut short keeps what it measured."""
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--models", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    ap.add_argument("--folder", type=Path, help="profile this transformers model folder instead")
    ap.add_argument("--tiny", action="store_true", help="cut the shapes down (CPU smoke test)")
    ap.add_argument("--ks", type=_ints, default=SIZES, help="comma-separated token counts of one sequence's forward")
    ap.add_argument("--batches", type=_ints, default=BATCHES, help="batch sizes of the batched table ('' for none)")
    ap.add_argument("--batch-ks", type=_ints, default=BATCH_KS, help="tokens per sequence in the batched table")
    ap.add_argument("--no-device-table", action="store_true", help="skip the device-only forward table")
    ap.add_argument("--prefix", type=int, default=256, help="cached tokens before the timed ones")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (CPU device)")
    ap.add_argument("--torch-runtime", choices=("eager", "static"), default="eager",
                    help="the backend's KV runtime (static: bucketed forwards, CUDA graphs on a GPU)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    import torch

    from specrouter.backends.torch import TorchBackend

    if args.threads:
        torch.set_num_threads(args.threads)
    result = {"device": device_info(args.device), "lookup_seconds": {"ngram": 2e-5}, "models": {}, "batched": {},
              "device_seconds": {}, "load_seconds": {}, "capture": {}, "settings": {
                  "dtype": args.dtype, "torch_runtime": args.torch_runtime, "prefix_tokens": args.prefix, "repeats": args.repeats, "tiny": args.tiny,
                  "what": {"models": "median seconds of one TorchBackend.decode of n tokens (logits for all n, "
                                     "copied to host) after a cached prefix",
                           "batched": "median seconds of one TorchBackend.decode_batch of B sequences with k tokens "
                                      "each, {B: {k: seconds}}",
                           "device_seconds": "median seconds of the model's forward of n tokens, logits kept on the "
                                             "device, to a synchronize"}}}
    if args.folder:
        jobs = [(args.folder.name, None)]
    else:
        jobs = [(name, name) for name in args.models.split(",")]
    for label, shape in jobs:
        start = time.perf_counter()
        n_seq = max((*args.batches, 1))
        if shape is None:
            backend = TorchBackend(args.folder, device=args.device, dtype=args.dtype, n_seq_max=n_seq,
                                   n_threads=args.threads, runtime=args.torch_runtime)
        else:
            if shape not in SHAPES:
                ap.error(f"unknown model {shape!r}: use {', '.join(SHAPES)}")
            model = random_model(shape, args.tiny, args.device, getattr(torch, args.dtype))
            backend = TorchBackend.from_model(model, _Tokenizer(model.config.vocab_size), name=label,
                                              device=args.device, dtype=args.dtype, n_seq_max=n_seq,
                                              n_threads=args.threads, runtime=args.torch_runtime)
        result["load_seconds"][label] = round(time.perf_counter() - start, 2)
        table = profile_backend(backend, args.ks, args.prefix, args.repeats)
        result["models"][label] = {str(k): round(s, 7) for k, s in table.items()}
        save(result, args.out)
        shown = [k for k in (1, 2, 4, 8, 16, 32, 64, 256, 1024) if k in table]
        print(f"{label}: params {backend.params_b:.2f}B; ms for n = "
              + ", ".join(f"{k}: {table[k] * 1000:.2f}" for k in shown), flush=True)
        if args.batches:
            batched = profile_batched(backend, args.batches, args.batch_ks, args.prefix, args.repeats)
            result["batched"][label] = {str(b): {str(k): round(s, 7) for k, s in t.items()} for b, t in batched.items()}
            save(result, args.out)
            print(f"{label}: batched ms (B x k) " + "; ".join(
                f"{b}x{k}: {s * 1000:.2f}" for b, t in batched.items() for k, s in t.items()), flush=True)
        graphs = backend.graph_stats()
        if graphs is not None:
            result["capture"][label] = {"graphs": graphs.captured, "seconds": round(graphs.capture_seconds, 3)}
            print(f"{label}: {graphs.captured} CUDA graphs captured in {graphs.capture_seconds:.2f} s", flush=True)
        if not args.no_device_table:
            dev = profile_device(backend._model, args.ks, args.prefix, args.repeats, args.device)
            result["device_seconds"][label] = {str(k): round(s, 7) for k, s in dev.items()}
            save(result, args.out)
            print(f"{label}: device-only ms for n = " + ", ".join(f"{k}: {dev[k] * 1000:.2f}" for k in shown), flush=True)
        backend.close()
        del backend
        model = None  # noqa: F841 - drop the last reference before the next model is built
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    if args.out:
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
