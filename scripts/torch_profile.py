"""Forward cost of torch models for k = 1..K new tokens on a cached prefix, as JSON.

Randomly initialised models with the published shapes of Llama-3.2-1B and Llama-3.1-8B
(no weights are needed: cost depends on shapes, not values), or a real model folder.
Each forward is timed the way the cascade uses it, through TorchBackend.decode: k new
tokens after a cached prefix, logits for all k, then the k positions are removed again.
The output's "models" part is the router's CostProfile format ({model: {k: seconds}},
specrouter.router.costs.CostProfile.from_dict reads it); "device" says what ran it.

    python scripts/torch_profile.py --device cuda --out profile.json          # the GPU check
    python scripts/torch_profile.py --device cpu --tiny --out /tmp/p.json      # a CPU smoke test
    python scripts/torch_profile.py --folder DIR --dtype float32 --ks 1,4,8,16 # a real model

Nothing is downloaded: the script works offline.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout, installed or not

#: Published configurations (config.json of meta-llama/Llama-3.2-1B and Llama-3.1-8B).
SHAPES = {
    "llama-3.2-1b": dict(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
        rms_norm_eps=1e-5, tie_word_embeddings=True,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    ),
    "llama-3.1-8b": dict(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072,
        rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    ),
}
#: --tiny: same structure, sizes cut so a CPU runs the whole sweep in seconds.
TINY = dict(vocab_size=4096, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32)


class _Tokenizer:
    """Enough of a tokenizer for TorchBackend: the profile feeds token ids only."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.eos_token_id = None
        self.bos_token = self.eos_token = None
        self.added_tokens_decoder: dict = {}
        self.all_special_ids: list[int] = []

    def __len__(self) -> int:
        return self.n

    def get_vocab(self) -> dict:
        return {}


def device_info(device: str) -> dict:
    import torch
    import transformers

    info = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": device,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": sys.version.split()[0],
        "host_cpu": platform.processor() or platform.machine(),
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
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = dict(SHAPES[name])
    if tiny:
        shape.update(TINY)
    config = LlamaConfig(**shape)
    torch.manual_seed(0)
    with torch.device(device):  # allocate (and initialise) on the device itself: 16 GB for the 8B in bf16
        model = LlamaForCausalLM._from_config(config, dtype=dtype)
    return model.eval()


def profile_backend(model, ks, prefix: int, repeats: int, warmup: int = 1) -> dict[int, float]:
    """Median seconds of decode(k tokens, logits for all k) after a cached prefix."""
    import numpy as np

    rng = np.random.default_rng(0)
    n_tokens = min(model.n_tokens, model.n_vocab)
    seq = model.new_sequence()
    try:
        model.decode(seq, rng.integers(0, n_tokens, prefix).tolist(), 0, 1)
        table = {}
        for k in ks:
            tokens = rng.integers(0, n_tokens, k).tolist()
            times = []
            for i in range(warmup + repeats):
                start = time.perf_counter()
                model.decode(seq, tokens, prefix, k)  # returns numpy: the device has finished
                elapsed = time.perf_counter() - start
                model.remove(seq, prefix)
                if i >= warmup:
                    times.append(elapsed)
            table[k] = statistics.median(times)
    finally:
        model.free_sequence(seq)
    return table


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--models", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    ap.add_argument("--folder", type=Path, help="profile this transformers model folder instead")
    ap.add_argument("--tiny", action="store_true", help="cut the shapes down (CPU smoke test)")
    ap.add_argument("--kmax", type=int, default=32)
    ap.add_argument("--ks", help="comma-separated k values (default 1..kmax)")
    ap.add_argument("--prefix", type=int, default=256, help="cached tokens before the timed ones")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (CPU device)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    import torch

    from specrouter.backends.torch import TorchBackend

    if args.threads:
        torch.set_num_threads(args.threads)
    ks = [int(k) for k in args.ks.split(",")] if args.ks else list(range(1, args.kmax + 1))
    result = {"device": device_info(args.device), "lookup_seconds": {"ngram": 2e-5}, "models": {}, "settings": {
        "dtype": args.dtype, "prefix_tokens": args.prefix, "repeats": args.repeats, "tiny": args.tiny,
        "what": "median seconds of one TorchBackend.decode of k tokens (logits for all k) after a cached prefix",
    }, "load_seconds": {}}
    if args.folder:
        jobs = [(args.folder.name, None)]
    else:
        jobs = [(name, name) for name in args.models.split(",")]
    for label, shape in jobs:
        start = time.perf_counter()
        if shape is None:
            backend = TorchBackend(args.folder, device=args.device, dtype=args.dtype, n_seq_max=1,
                                   n_threads=args.threads)
        else:
            if shape not in SHAPES:
                ap.error(f"unknown model {shape!r}: use {', '.join(SHAPES)}")
            dtype = getattr(torch, args.dtype)
            model = random_model(shape, args.tiny, args.device, dtype)
            backend = TorchBackend.from_model(model, _Tokenizer(model.config.vocab_size), name=label,
                                              device=args.device, dtype=args.dtype, n_seq_max=1,
                                              n_threads=args.threads)
        result["load_seconds"][label] = round(time.perf_counter() - start, 2)
        table = profile_backend(backend, ks, args.prefix, args.repeats)
        result["models"][label] = {str(k): round(s, 6) for k, s in table.items()}
        print(f"{label}: params {backend.params_b:.2f}B; ms for k = "
              + ", ".join(f"{k}: {s * 1000:.1f}" for k, s in table.items()), flush=True)
        backend.close()
        del backend
        model = None  # noqa: F841 - drop the last reference before the next model is built
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
