#!/usr/bin/env bash
# GPU readiness check for the torch backend, on a machine with one NVIDIA GPU and no
# network (nothing is downloaded). Under 8 minutes in all (each step has a hard timeout:
# 300 s for the tests, 150 s for the profile; startup checks take seconds):
#   1. the fast exactness tests of the torch backend on cuda (decode/remove semantics,
#      rollback exactness, greedy equality of torch and mixed chains) and the three
#      sampling-distribution tests with 1,500 runs each instead of 10,000
#      (SPECROUTER_TORCH_RUNS; a tiny-model forward costs about 2 ms of Python and kernel
#      launches on any device; measured on the CPU: 2,000 runs of the three took 134 s).
#      The broken-residual control is left to the CPU suite: it checks the test's power,
#      not the device;
#   2. forward cost for k = 1..32 tokens of randomly initialised models with the shapes of
#      Llama-3.2-1B and Llama-3.1-8B in bf16, written as a JSON cost profile
#      ({"models": {model: {k: seconds}}, "device": {...}}; the router's CostProfile format).
#      `specrouter profile --load OUT_DIR/gpu_cost_profile.json` prints it; `--profile FILE`
#      (generate, serve) makes the router use it for the models it names.
#
# Usage: scripts/gpu_check.sh [OUT_DIR]      (default OUT_DIR: $OUT or ./gpu_check_out)
# Needs a Python with a CUDA build of torch, transformers, numpy, scipy, pytest, click,
# tqdm, platformdirs and jinja2 (PYTHON=..., default .venv/bin/python, else python3).
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
OUT_DIR="${1:-${OUT:-gpu_check_out}}"
mkdir -p "$OUT_DIR"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
start=$(date +%s)
status=0

echo "== environment"
if ! "$PY" - <<'PYEOF'
import importlib, sys
missing = [m for m in ("torch", "transformers", "numpy", "scipy", "pytest", "click", "tqdm", "platformdirs", "jinja2")
           if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"missing Python packages: {', '.join(missing)} (this check cannot download them)")
import torch, transformers
print(f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}), transformers {transformers.__version__}")
if not torch.cuda.is_available():
    sys.exit("torch sees no CUDA GPU: nothing to check")
p = torch.cuda.get_device_properties(0)
print(f"GPU: {p.name}, {p.total_memory / 2**30:.0f} GiB, compute capability {p.major}.{p.minor}, {torch.cuda.device_count()} visible")
PYEOF
then
  echo "gpu_check: environment not usable" >&2
  exit 2
fi

echo "== 1. torch exactness tests on cuda"
SPECROUTER_TEST_DEVICE=cuda SPECROUTER_TORCH_RUNS="${SPECROUTER_TORCH_RUNS:-1500}" \
  timeout 300 "$PY" -m pytest -p no:cacheprovider -q -rs --durations=5 \
    tests/unit/backends/test_torch.py tests/unit/backends/test_torch_sampling_exactness.py -k "not broken_residual" \
    --junitxml="$OUT_DIR/gpu_tests.xml" 2>&1 | tee "$OUT_DIR/gpu_tests.log"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || { echo "gpu_check: tests failed (exit $rc; 124 = over 300 s)" >&2; status=1; }

echo "== 2. forward-cost profile, k = 1..32, bf16"
timeout 150 "$PY" scripts/torch_profile.py --device cuda --dtype bfloat16 \
  --models llama-3.2-1b,llama-3.1-8b --kmax 32 --prefix 256 --repeats 5 \
  --out "$OUT_DIR/gpu_cost_profile.json" 2>&1 | tee "$OUT_DIR/gpu_profile.log"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || { echo "gpu_check: profiling failed (exit $rc; 124 = over 150 s)" >&2; status=1; }

echo "== done in $(( $(date +%s) - start )) s, exit $status; results in $OUT_DIR"
exit $status
