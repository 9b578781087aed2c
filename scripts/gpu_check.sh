#!/usr/bin/env bash
# The device check, on a machine with one NVIDIA GPU and no network: one command, under 8 minutes,
# nothing downloaded, every model with random weights of the real shapes. Each part runs under its
# own time limit (`timeout`; exit 124 = cut there) and writes its files as it goes, so a part cut
# short keeps what it measured and the next part still runs:
#   a. (100 s) the static torch runtime's cost profile, CUDA graphs (scripts/torch_profile.py
#      --torch-runtime static): the Qwen2.5-Coder 0.5B / 1.5B, Llama-3.2-1B and Llama-3.1-8B
#      shapes, bf16, one sequence's forward of n = 1..64 tokens after 256 cached ones, and
#      B = 2..32 sequences of k tokens each; the graphs captured and what capturing took.
#      The router's CostProfile format: `specrouter profile --load` shows it.
#   b, c. (2 x 75 s) the real engine in trace-forced mode (scripts/forced_run.py): the 1.5B-shaped
#      target and 0.5B-shaped draft on the static runtime, the first-turn and the copy traces
#      recorded from the real models on a CPU, ms per token of the target alone, the best fixed
#      2- and 3-level chains and auto at batch 1, 8 and 32 (each run cut after 4 s), each beside
#      the simulator's prediction on part a's profile and the ratio measured / predicted;
#   d. (100 s) the exactness tests on cuda, the static runtime's included (its runtime replays
#      CUDA graphs there), the sampled chi-square tests at 1,000 runs (SPECROUTER_TORCH_RUNS);
#   e. (450 s, started first, in the background at the lowest CPU priority: a CUDA build takes
#      minutes) llama.cpp on CUDA (scripts/gpu_llamacpp.py run): where nvcc exists, the pinned
#      llama-cpp-python built for this GPU's architecture from the source brought along
#      (`make gpu-source` beforehand, then carry .gpu-source), random-weight GGUF files of the
#      pool's shapes, profiled with --gpu-layers -1; where nvcc is absent, the report says so.
#      A build cut at its limit resumes on the next run on the same machine.
# Then scripts/gpu_report.py writes one JSON and one markdown (each part's limit, elapsed seconds
# and exit status) to OUT_DIR and benchmarks/results/.
#
# Usage: scripts/gpu_check.sh [OUT_DIR]        (default OUT_DIR: $OUT or ./gpu_check_out)
#        GPU_CHECK_DEVICE=cpu scripts/gpu_check.sh   a rehearsal on a CPU: tiny shapes, fewer sizes,
#        batches and runs, every part's code path but the graphs (parts a, b, d; e reports no nvcc)
#        GPU_CHECK_PARTS=a,d scripts/gpu_check.sh   runs only those parts (default a,b,d,e; also:
#        engine = scripts/gpu_engine.py, diag = scripts/gpu_diag.py, host = benchmarks.host_work)
# Needs a Python with a CUDA build of torch, transformers, numpy, scipy, pytest, click, tqdm,
# platformdirs, jinja2 and llguidance (PYTHON=..., default .venv/bin/python, else python3).
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
OUT_DIR="${1:-${OUT:-gpu_check_out}}"
PARTS=",${GPU_CHECK_PARTS:-a,b,d,e},"
mkdir -p "$OUT_DIR"
: > "$OUT_DIR/parts.tsv"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
start=$(date +%s)
status=0
DEV="${GPU_CHECK_DEVICE:-cuda}"
if [ "$DEV" = cpu ]; then
  DTYPE=float32 TINY=(--tiny) KS=1,2,4,8,16,33,64 BATCHES=2,4 BATCH_KS=1,4 RUNS=200
  FORCED=(--tiny --requests 2 --batches 1,2)
else
  DTYPE=bfloat16 TINY=() KS="$(seq -s, 1 33),40,48,56,64" BATCHES=2,4,8,16,32 BATCH_KS=1,2,4,8,16 RUNS=1000
  FORCED=(--batches 1,8,32)
fi
TRACE_FIRST=benchmarks/results/simulation-2026-12-03-epyc-trace.json
TRACE_COPY=benchmarks/results/simulation-2026-12-05-epyc2-copy8-trace.json

# part NAME LIMIT LOG COMMAND...: run COMMAND under LIMIT seconds, log it, record the part.
part() {
  local name=$1 limit=$2 log=$3
  shift 3
  [[ "$PARTS" == *",$name,"* ]] || return 0
  echo "== part $name (limit ${limit} s)"
  local t0 rc
  t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$OUT_DIR/$log"
  rc=${PIPESTATUS[0]}
  printf '%s\t%s\t%s\t%s\n' "$name" "$limit" "$(( $(date +%s) - t0 ))" "$rc" >> "$OUT_DIR/parts.tsv"
  [ "$rc" -eq 0 ] || { echo "gpu_check: part $name exited $rc (124: cut at ${limit} s)" >&2; status=1; }
}

echo "== environment"
if ! "$PY" - "$OUT_DIR/environment.json" "$DEV" <<'PYEOF'
import importlib.util, json, sys
missing = [m for m in ("torch", "transformers", "numpy", "scipy", "pytest", "click", "tqdm", "platformdirs", "jinja2",
                       "llguidance") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"missing Python packages: {', '.join(missing)} (this check cannot download them)")
import torch
sys.path.insert(0, "scripts")
from torch_profile import device_info
if sys.argv[2].startswith("cuda") and not torch.cuda.is_available():
    sys.exit("torch sees no CUDA GPU: nothing to check")
info = device_info(sys.argv[2])
print(json.dumps(info))
open(sys.argv[1], "w").write(json.dumps(info, indent=1) + "\n")
PYEOF
then
  echo "gpu_check: environment not usable" >&2
  exit 2
fi

# Part e in the background (see above); its line in parts.tsv is written when it ends.
if [[ "$PARTS" == *",e,"* ]]; then
  echo "== part e (limit 450 s, in the background)"
  ( t0=$(date +%s)
    nice -n 19 timeout --kill-after=10 450 "$PY" scripts/gpu_llamacpp.py run --out "$OUT_DIR" --build-timeout 330 \
      --model-timeout 40 --profile-timeout 60 > "$OUT_DIR/llamacpp.log" 2>&1
    rc=$?
    printf '%s\t%s\t%s\t%s\n' e 450 "$(( $(date +%s) - t0 ))" "$rc" >> "$OUT_DIR/parts.tsv" ) &
  llamacpp_pid=$!
fi

part a 100 static_profile.log "$PY" scripts/torch_profile.py --device "$DEV" --dtype "$DTYPE" --torch-runtime static \
  --models qwen2.5-coder-0.5b,qwen2.5-coder-1.5b,llama-3.2-1b,llama-3.1-8b --prefix 256 --repeats 5 \
  --ks "$KS" --batches "$BATCHES" --batch-ks "$BATCH_KS" --no-device-table "${TINY[@]}" \
  --out "$OUT_DIR/static_profile.json"

profile_arg=()
[ -s "$OUT_DIR/static_profile.json" ] && profile_arg=(--profile "$OUT_DIR/static_profile.json")
part b 75 forced_first.log "$PY" scripts/forced_run.py "$TRACE_FIRST" --device "$DEV" --dtype "$DTYPE" \
  --torch-runtime static "${FORCED[@]}" --time-limit 4 "${profile_arg[@]}" --out "$OUT_DIR/forced-first-turn.json"
part b 75 forced_copy.log "$PY" scripts/forced_run.py "$TRACE_COPY" --device "$DEV" --dtype "$DTYPE" \
  --torch-runtime static "${FORCED[@]}" --time-limit 4 "${profile_arg[@]}" --out "$OUT_DIR/forced-copy.json"

part d 100 tests.log env SPECROUTER_TEST_DEVICE="$DEV" SPECROUTER_TORCH_RUNS="${SPECROUTER_TORCH_RUNS:-$RUNS}" \
  "$PY" -m pytest -p no:cacheprovider -q -rs --durations=5 \
  tests/unit/backends/test_torch.py tests/unit/backends/test_torch_batch.py tests/unit/backends/test_torch_static.py \
  tests/unit/cascade/test_torch_rows.py tests/unit/cascade/test_device_rows.py \
  tests/unit/backends/test_torch_sampling_exactness.py \
  -k "not broken_residual and not output_follows_target_distribution or torch_chain" \
  --junitxml="$OUT_DIR/tests.xml"

if [ -n "${llamacpp_pid:-}" ]; then
  echo "== waiting for part e (llama.cpp on CUDA)"
  wait "$llamacpp_pid"
  tail -5 "$OUT_DIR/llamacpp.log"
  grep -q "^e	[0-9]*	[0-9]*	0$" "$OUT_DIR/parts.tsv" || status=1
fi

part engine 110 gpu_engine.log "$PY" scripts/gpu_engine.py --device cuda --dtype bfloat16 --tokens 48 --rounds 2 \
  --out "$OUT_DIR/gpu_engine.json"
part diag 45 gpu_diag.log "$PY" scripts/gpu_diag.py all
part host 40 host_work.log bash -c "for rows in host cuda; do \"$PY\" -m benchmarks.host_work --repeats 1 \
  --generations 1 --rows \$rows --out \"$OUT_DIR\" --stem host-work-\$rows || exit; done"

report_to=()
[ "$DEV" = cpu ] && report_to=(--results "$OUT_DIR")  # a rehearsal's report stays out of benchmarks/results
"$PY" scripts/gpu_report.py "$OUT_DIR" "${report_to[@]}" || status=1
echo "== done in $(( $(date +%s) - start )) s, exit $status; results in $OUT_DIR"
exit $status
