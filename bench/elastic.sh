#!/usr/bin/env bash
# When a host dies: torchrun's elastic restart against Horovod Elastic, measured (docs/elastic.md, «remeasure:
# elastic»). Three emulated hosts, one rank each; every arm runs as it is and with host 2 dying at step AT, REPEATS
# blocks; then the commit interval and the model size moved, one at a time. Run it on a quiet machine, as root
# (the lab): bench/quiet.sh waits for one first (QUIET_STRICT=0 measures anyway, not to be quoted).
#
#   sudo bash bench/elastic.sh                  # the table of docs/elastic.md (~15 min on 2 cores)
#   sudo bash bench/elastic.sh sweep            # ... and commit every 5 / 40 steps, and the larger mlp (~40 min)
#
# Knobs: AT (45), COMMIT (10), REPEATS (3), TIMEOUT (10: seconds a collective waits for a lost peer), OUT.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${VENV:-$ROOT/.venv}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONPATH=$ROOT
AT=${AT:-45} COMMIT=${COMMIT:-10} REPEATS=${REPEATS:-3} TIMEOUT=${TIMEOUT:-10}
OUT=${OUT:-$ROOT/runs/elastic-bench}

measure() {  # measure NAME [compare options...]: one comparison into $OUT/NAME, its fault section printed
  local name=$1; shift
  bash "$ROOT/bench/quiet.sh"
  local cmd=("$VENV/bin/dpcompare" compare --lab hosts=3 --np 3 --fault "host=2,at-step=$AT"
             --strategies ddp-elastic,horovod-elastic --repeats "$REPEATS" --timeout "$TIMEOUT"
             --dataset digits --batch-size 16 --epochs 6 --min-steps 0 --progress lines --overwrite
             --out "$OUT/$name" "$@")
  printf '\n\033[1m== %s\033[0m\n%s\n' "$name" "${cmd[*]}"
  local t0=$SECONDS
  "${cmd[@]}" | sed -n '/^Fault /,$p'
  echo "   ($((SECONDS - t0)) s; report: $OUT/$name/report.html)"
}

measure table --model convnet --commit-every "$COMMIT"
if [ "${1:-}" = sweep ]; then
  measure commit-5 --model convnet --commit-every 5      # commits twice as often: fewer steps redone
  measure commit-40 --model convnet --commit-every 40    # rarely: up to 40 steps redone
  measure mlp-2048 --model mlp --width 2048 --commit-every "$COMMIT"   # ~4.3 M parameters: heavier commits
fi
