#!/usr/bin/env bash
# Horovod Elastic scripts, unchanged, under real Horovod Elastic (horovodrun) and under dpcompare's native layer
# on torchrun's elastic agents, a host lost mid-run (docs/elastic.md, «An elastic script of your own»). Three
# emulated hosts, one rank each; both arms run every script as it is and with host 2 dying at step AT. Run it as
# root (the lab) on a quiet machine: bench/quiet.sh waits for one first (QUIET_STRICT=0 measures anyway, not to
# be quoted).
#
#   sudo bash bench/elastic_script.sh HVD_EXAMPLE_PATH
#
# HVD_EXAMPLE_PATH: Horovod's own examples/elastic/pytorch/pytorch_synthetic_benchmark_elastic.py (from its
# repository, tag v0.28.1; run from there, never copied here), e.g.
#   git clone --branch v0.28.1 https://github.com/horovod/horovod /tmp/horovod
#   sudo bash bench/elastic_script.sh /tmp/horovod/examples/elastic/pytorch/pytorch_synthetic_benchmark_elastic.py
# Without it only our examples/horovod/elastic_mnist.py runs.
#
# Knobs: AT (20), REPEATS (1), TIMEOUT (10: seconds a collective waits for a lost peer), OUT.
# measure NAME SCRIPT [compare options] -- [script arguments]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${VENV:-$ROOT/.venv}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONPATH=$ROOT
AT=${AT:-20} REPEATS=${REPEATS:-1} TIMEOUT=${TIMEOUT:-10}
OUT=${OUT:-$ROOT/runs/elastic-script-bench}
HVD_EXAMPLE=${1:-}
if [ -n "$HVD_EXAMPLE" ] && [ ! -f "$HVD_EXAMPLE" ]; then
  echo "bench/elastic_script.sh: $HVD_EXAMPLE: no such file (Horovod's pytorch_synthetic_benchmark_elastic.py)" >&2
  exit 2
fi

measure() {  # measure NAME SCRIPT [compare options] -- [script arguments]: one comparison into $OUT/NAME
  local name=$1 script=$2; shift 2
  bash "$ROOT/bench/quiet.sh"
  local cmd=("$VENV/bin/dpcompare" compare --script "$script" --strategies horovod-elastic,native-elastic
             --lab hosts=3 --np 3 --fault "host=2,at-step=$AT" --repeats "$REPEATS" --timeout "$TIMEOUT"
             --min-steps 0 --progress lines --overwrite --out "$OUT/$name" "$@")
  printf '\n\033[1m== %s\033[0m\n%s\n' "$name" "${cmd[*]}"
  local t0=$SECONDS
  "${cmd[@]}" | sed -n '/^Fault /,$p'
  echo "   ($((SECONDS - t0)) s; report: $OUT/$name/report.html)"
}

measure mnist "$ROOT/examples/horovod/elastic_mnist.py" --metric val_accuracy -- --epochs 1 --batches-per-commit 5
if [ -n "$HVD_EXAMPLE" ]; then
  # CPU-sized: resnet18 on 2 images of 224x224 per rank, 35 steps, a commit every 5
  measure synthetic "$HVD_EXAMPLE" -- --no-cuda --model resnet18 --batch-size 2 --num-warmup-batches 5 \
    --num-batches-per-iter 5 --num-iters 6 --num-batches-per-commit 5
fi
