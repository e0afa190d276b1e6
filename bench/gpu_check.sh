#!/usr/bin/env bash
# One command for a machine with one or more NVIDIA GPUs: set up what is missing, then check everything a GPU
# makes possible (DDP on NCCL, gloo on CUDA tensors, Horovod's NCCL operations, FSDP and ZeRO on CUDA, parity on
# GPU, a short compare with --trace, predict from its GPU traces). Every step runs whatever happened before it
# (no fail-fast); the summary (GPU_OUT/summary.txt and summary.json) gives each step's outcome, seconds and, if it
# failed, its error.
# On a machine without a GPU it says "no GPU" and exits 0.
#
#   bash bench/gpu_check.sh                  # results in runs/gpu-check
#   GPU_OUT=/tmp/gc PYTHON=/opt/conda/bin/python bash bench/gpu_check.sh
#
# Environment: PYTHON (the Python that has torch; default: .venv/bin/python if present, else python3),
# GPU_OUT (output folder), GPU_SETUP=0 (check only, install nothing), GPU_STEPS (space-separated subset of
# the step names below). Exit status: 0 when no step failed, 1 otherwise.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${GPU_OUT:-$ROOT/runs/gpu-check}
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1} OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
export PYTHONUNBUFFERED=1
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x "$ROOT/.venv/bin/python" ]; then PY=$ROOT/.venv/bin/python
else PY=$(command -v python3 || true)
fi
say() { printf '\033[1m[gpu-check]\033[0m %s\n' "$*"; }

# -- 0. is there a GPU at all? (before installing anything) ----------------------------------------------
gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
fi
if [ "$gpus" = 0 ] && [ -n "$PY" ]; then
  gpus=$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
fi
if [ "$gpus" = 0 ]; then
  say "no GPU (nvidia-smi lists none and torch sees none): nothing to check"
  exit 0
fi
mkdir -p "$OUT/logs"
say "$gpus GPU(s): $(nvidia-smi -L 2>/dev/null | head -4 | tr '\n' ' ')"
QUIET_STRICT=0 bash "$ROOT/bench/quiet.sh" | tee "$OUT/logs/quiet.log"  # the checks pass or fail either way; timings say so

# -- 1. set up what is missing -----------------------------------------------------------------------------
# scripts/setup.sh keeps an installed torch and, the GPU being visible, builds Horovod with NCCL operations
# (a CUDA toolkit, CUDA_HOME or /usr/local/cuda, and NCCL's headers from pip's nvidia-nccl, which torch brings).
setup_log=$OUT/logs/setup.log
if [ "${GPU_SETUP:-1}" = 1 ]; then
  # Where pip may install (PEP 668): an "externally managed" marker beside the stdlib binds the system's Python
  # only, never a virtual environment made from it (a GPU image's torch often lives in one).
  read -r prefix managed < <("$PY" -c 'import os, sys, sysconfig
marker = os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")
print(sys.prefix, int(sys.prefix == sys.base_prefix and os.path.exists(marker)))' 2>/dev/null || echo "- 1")
  if [ "$prefix" != - ] && [ -w "$prefix" ] && [ "$managed" = 0 ]; then
    venv=$prefix              # install into the environment that has torch
  else
    venv=$ROOT/.venv-gpu      # a venv on top of it: its torch stays the system's
    export DPCOMPARE_SYSTEM_SITE=1
  fi
  say "setting up in $venv (log: $setup_log)"
  setup_t0=$SECONDS
  if PYTHON="$PY" DPCOMPARE_VENV="$venv" DPCOMPARE_EXTRAS="" bash "$ROOT/scripts/setup.sh" >"$setup_log" 2>&1; then
    setup_status="ok"
  else
    setup_status="failed: $(grep -v '^\s*$' "$setup_log" | tail -3 | tr '\n' ' ')"
  fi
  setup_seconds=$((SECONDS - setup_t0))
  PY=$venv/bin/python
else
  setup_status="skipped (GPU_SETUP=0)"
fi
BIN=$(dirname "$PY")
export PATH="$BIN:$PATH"
DPC=("$PY" -m dpcompare)
NP=$(( gpus >= 2 ? 2 : 1 ))
MPI=(mpirun --oversubscribe --bind-to none)
TINY=(--model convnet --dataset synthetic --input-shape 3,32,32 --samples 512 --batch-size 32 --epochs 1 --max-steps 30
      --progress lines --overwrite --device cuda)

# -- 2. the steps --------------------------------------------------------------------------------------------
declare -a NAMES STATUS SECONDS_ ERRORS
record() {  # record NAME STATUS SECONDS ERROR
  NAMES+=("$1"); STATUS+=("$2"); SECONDS_+=("$3"); ERRORS+=("$4")
  printf '%-22s %-5s %6ss  %s\n' "$1" "$2" "$3" "$4"
}
wanted() { [ -z "${GPU_STEPS:-}" ] || [[ " $GPU_STEPS " == *" $1 "* ]]; }
step() {  # step NAME COMMAND...: run it, keep its output in logs/NAME.log, never stop the script
  local name=$1; shift
  wanted "$name" || return 0
  local log=$OUT/logs/$name.log t0=$SECONDS rc
  say "$name: $*"
  "$@" >"$log" 2>&1
  rc=$?
  if [ $rc = 0 ]; then record "$name" PASS $((SECONDS - t0)) ""
  else record "$name" FAIL $((SECONDS - t0)) "exit $rc: $(why "$log")"
  fi
}
skip() { wanted "$1" && record "$1" SKIP 0 "$2"; }
why() {  # why LOG: the lines that say what went wrong (dpcompare's one-line errors, exceptions), else the tail
  local lines
  lines=$(grep -E "error|Error|Exception|FAILED|Traceback|mismatch" "$1" | grep -vE "Process name|Exit code|^-+$" | tail -3)
  [ -n "$lines" ] || lines=$(grep -v '^\s*$' "$1" | tail -3)
  tr '\n' ' ' <<<"$lines" | cut -c1-400
}
on_device() {  # on_device RUN_DIR: the run's summary.json says it trained on CUDA
  "$PY" -c 'import json, sys; s = json.load(open(sys.argv[1] + "/summary.json"))
print(s["strategy"], s["world_size"], s["device"], s["samples_per_sec"])
sys.exit(0 if s["device"].startswith("cuda") else "trained on " + s["device"])' "$1"
}
train() {  # train NAME NP STRATEGY [FLAGS...]
  local name=$1 np=$2 strategy=$3; shift 3
  "${MPI[@]}" -np "$np" "$PY" -m dpcompare train --strategy "$strategy" "${TINY[@]}" --out "$OUT/$name" "$@" \
    && on_device "$OUT/$name"
}

record setup "$([ "$setup_status" = ok ] && echo PASS || { [[ $setup_status == skipped* ]] && echo SKIP || echo FAIL; })" \
  "${setup_seconds:-0}" "$([ "$setup_status" = ok ] || echo "$setup_status")"
step doctor "${DPC[@]}" doctor
step ddp-nccl-np1 train ddp-nccl-np1 1 ddp
if [ "$gpus" -ge 2 ]; then step ddp-nccl-np2 train ddp-nccl-np2 2 ddp
else skip ddp-nccl-np2 "one GPU: NCCL refuses two ranks on one device"
fi
step gloo-cuda-np2 "$PY" "$ROOT/bench/gpu_gloo.py" --require-gpu
step horovod-nccl-build "$PY" -c 'import sys, horovod.torch as hvd
print("nccl_built", hvd.nccl_built(), "cuda_built", hvd.cuda_built())
sys.exit(0 if hvd.nccl_built() and hvd.cuda_built() else "Horovod was built without NCCL/CUDA operations")'
step horovod-nccl train "horovod-nccl-np$NP" "$NP" horovod
step fsdp-cuda train "fsdp-cuda-np$NP" "$NP" fsdp
step zero-cuda train "zero-cuda-np$NP" "$NP" zero
if [ "$gpus" -ge 2 ]; then
  step parity-gpu "${DPC[@]}" parity --np 2 --steps 20 --model convnet --dataset synthetic --samples 512 \
    --device cuda --out "$OUT/parity" --overwrite
  step compare-trace "${DPC[@]}" compare --np 2 --strategies ddp,horovod --repeats 2 --epochs 1 --max-steps 40 \
    --model convnet --dataset synthetic --samples 512 --device cuda --trace 5 --out "$OUT/compare" --overwrite
else
  # One GPU: parity of ddp vs single at np=1 (Horovod at np=1 reduces nothing), and compare at np=1.
  step parity-gpu "${DPC[@]}" parity --np 1 --strategies ddp,horovod --steps 20 --model convnet \
    --dataset synthetic --samples 512 --device cuda --out "$OUT/parity" --overwrite
  step compare-trace "${DPC[@]}" compare --np 1 --strategies ddp,horovod --repeats 2 --epochs 1 --max-steps 40 \
    --model convnet --dataset synthetic --samples 512 --device cuda --trace 5 --out "$OUT/compare" --overwrite
fi

# predict from the GPU's traces (compare-trace's folder): the compute phases timed on CUDA, the network modelled
if [ -f "$OUT/compare/results.json" ]; then
  step predict-gpu-trace "${DPC[@]}" predict "$OUT/compare" --host-counts 2,4 --link 100gbit --out "$OUT/predict"
else
  skip predict-gpu-trace "compare-trace left no comparison to predict from"
fi

# -- 3. the summary ------------------------------------------------------------------------------------------
"$PY" - "$OUT" "$gpus" "${#NAMES[@]}" "${NAMES[@]}" "${STATUS[@]}" "${SECONDS_[@]}" "${ERRORS[@]}" <<'EOF'
import json, subprocess, sys
out, gpus, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
cols = [sys.argv[4 + i * n: 4 + (i + 1) * n] for i in range(4)]
steps = [{"step": a, "status": b, "seconds": int(c), "error": d} for a, b, c, d in zip(*cols)]
try:
    names = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.split("\n")
except OSError:
    names = []
doc = {"gpus": gpus, "gpu_names": [x for x in names if x], "steps": steps,
       "failed": sum(s["status"] == "FAIL" for s in steps)}
json.dump(doc, open(f"{out}/summary.json", "w"), indent=1)
with open(f"{out}/summary.txt", "w") as f:
    f.write(f"gpu_check: {gpus} GPU(s) {' | '.join(doc['gpu_names'])}\n")
    for s in steps:
        f.write(f"{s['status']:<5} {s['step']:<22} {s['seconds']:>5}s  {s['error']}\n")
EOF
say "summary: $OUT/summary.txt"
cat "$OUT/summary.txt" 2>/dev/null
grep -q '^FAIL' "$OUT/summary.txt" 2>/dev/null && exit 1
exit 0
