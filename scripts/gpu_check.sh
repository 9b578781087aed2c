#!/usr/bin/env bash
# GPU check for the torch backend, on a machine with one NVIDIA GPU and no network (nothing
# is downloaded; every model has random weights). Under 8 minutes in all; each step has a
# hard timeout and writes its files as it goes, so a step cut short keeps what it measured:
#   1. cost profile (scripts/torch_profile.py, 150 s): models shaped like Qwen2.5-Coder 0.5B
#      and 1.5B (the default pool), Llama-3.2-1B and Llama-3.1-8B, bf16: one sequence's
#      forward of n = 1..32 tokens and the sizes of a batch's tokens together (to 2,048), B = 2..32
#      sequences of k tokens in one batched call, and the same forwards with the logits left
#      on the device (what the host copy costs). The router's CostProfile format:
#      `specrouter profile --load OUT_DIR/gpu_cost_profile.json` prints it, `--profile FILE`
#      (generate, serve) routes with it, benchmarks/simulation.py --gpu-profile replays with it;
#   2. the engine end to end (scripts/gpu_engine.py, 2 rounds, 110 s; an H200 fits one): the 1.5B-shaped target alone
#      against suffix, 0.5B and 3-level chains, greedy and sampled, interleaved, with the logits
#      rows copied to the host and left on the device: the engine's host work per cycle on that
#      machine, and what the device-resident cascade saves of it;
#   3. the torch exactness tests on cuda (135 s; 76 s on an H200 before the device rows' tests):
#      decode/remove semantics, rollback, greedy equality of torch and mixed chains, batched
#      sequences, the row operations on the GPU against numpy's, the same tokens with rows on the
#      host or the device, and the three sampling-distribution tests (rows on the device, the
#      backend's default there) with 1,000 runs each instead of 10,000
#      (SPECROUTER_TORCH_RUNS; measured on this project's 2-core CPU: 600 runs of the three
#      took 18 s). The broken-residual control is left to the CPU suite: it checks the
#      test's power, not the device;
#   4. host-side diagnostics (scripts/gpu_diag.py, 45 s): kernel launches per forward against
#      the GPU's busy time, and the cost of bringing logits rows to the host, by strategy;
#   5. the cascade's own work per cycle (benchmarks/host_work.py, 40 s): models that cost
#      nothing, rows as numpy on the host and as tensors on the GPU.
#
# Usage: scripts/gpu_check.sh [OUT_DIR]      (default OUT_DIR: $OUT or ./gpu_check_out)
#        GPU_CHECK_STEPS=2,3 scripts/gpu_check.sh   runs only those steps (default: 1,2,3,4,5)
# Needs a Python with a CUDA build of torch, transformers, numpy, scipy, pytest, click,
# tqdm, platformdirs, jinja2 and llguidance (PYTHON=..., default .venv/bin/python, else python3).
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
OUT_DIR="${1:-${OUT:-gpu_check_out}}"
STEPS=",${GPU_CHECK_STEPS:-1,2,3,4,5},"
step() { [[ "$STEPS" == *",$1,"* ]]; }
mkdir -p "$OUT_DIR"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
start=$(date +%s)
status=0

echo "== environment"
if ! "$PY" - <<'PYEOF'
import importlib, sys
missing = [m for m in ("torch", "transformers", "numpy", "scipy", "pytest", "click", "tqdm", "platformdirs", "jinja2",
                       "llguidance")
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

if step 1; then
echo "== 1. forward-cost profile, bf16"
timeout 150 "$PY" scripts/torch_profile.py --device cuda --dtype bfloat16 \
  --models qwen2.5-coder-0.5b,qwen2.5-coder-1.5b,llama-3.2-1b,llama-3.1-8b --prefix 256 --repeats 5 \
  --out "$OUT_DIR/gpu_cost_profile.json" 2>&1 | tee "$OUT_DIR/gpu_profile.log"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || { echo "gpu_check: profiling failed (exit $rc; 124 = over 150 s)" >&2; status=1; }
fi

if step 2; then
echo "== 2. the engine end to end, random weights, bf16"
timeout 110 "$PY" scripts/gpu_engine.py --device cuda --dtype bfloat16 --tokens 48 --rounds 2 \
  --out "$OUT_DIR/gpu_engine.json" 2>&1 | tee "$OUT_DIR/gpu_engine.log"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || { echo "gpu_check: engine run failed (exit $rc; 124 = over 110 s)" >&2; status=1; }
fi

if step 3; then
echo "== 3. torch exactness tests on cuda"
SPECROUTER_TEST_DEVICE=cuda SPECROUTER_TORCH_RUNS="${SPECROUTER_TORCH_RUNS:-1000}" \
  timeout 135 "$PY" -m pytest -p no:cacheprovider -q -rs --durations=5 \
    tests/unit/backends/test_torch.py tests/unit/backends/test_torch_batch.py \
    tests/unit/cascade/test_torch_rows.py tests/unit/cascade/test_device_rows.py \
    tests/unit/backends/test_torch_sampling_exactness.py -k "not broken_residual and not output_follows_target_distribution or torch_chain" \
    --junitxml="$OUT_DIR/gpu_tests.xml" 2>&1 | tee "$OUT_DIR/gpu_tests.log"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || { echo "gpu_check: tests failed (exit $rc; 124 = over 135 s)" >&2; status=1; }
fi

if step 4; then
echo "== 4. host-side diagnostics"
timeout 45 "$PY" scripts/gpu_diag.py all 2>&1 | tee "$OUT_DIR/gpu_diag.log"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || { echo "gpu_check: diagnostics failed (exit $rc; 124 = over 45 s)" >&2; status=1; }
fi

if step 5; then
echo "== 5. the cascade's own work per cycle, rows on the host and on the GPU"
timeout 40 bash -c "for rows in host cuda; do \"$PY\" -m benchmarks.host_work --repeats 1 --generations 1 \
  --rows \$rows --out \"$OUT_DIR\" --stem host-work-\$rows || exit; done" 2>&1 | tee "$OUT_DIR/host_work.log"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || { echo "gpu_check: host work failed (exit $rc; 124 = over 40 s)" >&2; status=1; }
fi

echo "== done in $(( $(date +%s) - start )) s, exit $status; results in $OUT_DIR"
exit $status
