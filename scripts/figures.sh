#!/usr/bin/env bash
# Regenerate the pictures README.md shows (docs/timeline.png): one traced step of DDP and of Horovod at np=2.
#   make figures            (or: bash scripts/figures.sh [OUT_PNG])
# Needs Open MPI and Horovod (make setup). Timings depend on the machine; the picture shows where each
# library communicates, the exact milliseconds are this machine's.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
DPC="$VENV/bin/dpcompare"
OUT_PNG="${1:-$ROOT/docs/timeline.png}"
bash "$ROOT/bench/quiet.sh"  # the picture's milliseconds are this machine's: a quiet one (QUIET_STRICT=0 to draw anyway)
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
FLAGS=(--model mlp --width 1024 --dataset digits --threads 1 --trackers none --warmup-steps 5 --epochs 0
       --max-steps 10 --trace 5 --progress none)
for s in ddp horovod; do
  mpirun -np 2 --oversubscribe --bind-to none "$DPC" train --strategy "$s" "${FLAGS[@]}" --out "$WORK/$s" >/dev/null
done
"$DPC" timeline "$WORK/ddp" "$WORK/horovod" --out-file "$OUT_PNG"
