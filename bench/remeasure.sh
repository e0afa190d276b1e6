#!/usr/bin/env bash
# Measure again every figure the docs quote from this machine, one section after another, print the numbers
# with the machine's facts, and write each section's output with its date and load into docs/measurements.md
# (bench/remeasure_doc.py) and its figures into bench/figures.json, the file every page quotes (bench/figures.py;
# REMEASURE_DOC=0: print only). Run it on a quiet machine: bench/quiet.sh waits for one first (and stops
# the script if none comes; QUIET_STRICT=0 measures anyway, but then the figures are not to be quoted).
# A section's figures are its `figure: KEY = VALUE` lines (and, for suite and demo, what pytest and the demo
# print: bench/figures.py's PATTERNS); a page quotes one as {{ fig.SECTION.KEY }}.
#
#   sudo bash bench/remeasure.sh                 # every section (the lab ones need root); about an hour
#   bash bench/remeasure.sh setup demo           # only these
#
# Sections:
#   setup     scripts/setup.sh into a new venv with empty caches: each step's time, the Horovod CPU build and,
#             with DPCOMPARE_HOROVOD_GPU=1, the NCCL build (docs/measurements.md)                   ~15 min
#   demo      a fresh clone, empty caches: `time make demo`, set-up and comparison (README.md)     ~7 min
#   concepts  traced ÷ untraced step time, ddp and horovod (concepts.md)                            ~4 min
#   predict   the np=2 mlp traces, predict's example table and its self-check (predict.md)          ~2 min
#   lab       raw TCP through a 1 Gbit/s link; the lab bench sweep times (lab.md; root)             ~4 min
#   trackers  wandb/mlflow import and start-up costs (trackers.md)                                  ~1 min
#   steadiness  a fixed workload on every core: how this machine's own speed drifts (measurements.md) ~3 min
#   tests     the lab and predict tests' durations, parity in the lab (lab.md, predict.md; root)    ~6 min
#   suite     the whole test suite: `make test` (docs/measurements.md)                                ~22 min
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${VENV:-$ROOT/.venv}
DPC=$VENV/bin/dpcompare
PY=$VENV/bin/python
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONPATH=$ROOT
T=$(mktemp -d /tmp/remeasure.XXXX)
trap 'rm -rf "$T"' EXIT
ALL=(setup demo concepts predict lab trackers steadiness tests suite)
SECTIONS=("${@:-${ALL[@]}}")

section() { printf '\n\033[1m== %s\033[0m: %s\n' "$1" "$2"; bash "$ROOT/bench/quiet.sh"; }
timed() { local t0=$SECONDS; "$@"; echo "   ($((SECONDS - t0)) s: $*)" >&2; }  # on stderr: the command's own output may be redirected
mpi2() { mpirun -np 2 --oversubscribe --bind-to none "$DPC" "$@"; }

s_setup() {
  section setup "scripts/setup.sh from nothing: each step's time; the CPU and the NCCL Horovod builds"
  PIP_NO_CACHE_DIR=1 DPCOMPARE_VENV="$T/venv" DPCOMPARE_CACHE="$T/cache" bash "$ROOT/scripts/setup.sh"
  "$T/venv/bin/python" -m pip uninstall -q -y horovod
  echo "-- the NCCL build of the same Horovod (what a GPU node builds):"
  DPCOMPARE_HOROVOD_GPU=1 DPCOMPARE_VENV="$T/venv" DPCOMPARE_CACHE="$T/cache" bash "$ROOT/scripts/setup.sh" || true
  cat "$T"/cache/wheels/*/build.txt
  echo "-- with the dev extras (what make test adds):"
  PIP_NO_CACHE_DIR=1 DPCOMPARE_EXTRAS=dev DPCOMPARE_VENV="$T/venv" DPCOMPARE_CACHE="$T/cache" bash "$ROOT/scripts/setup.sh"
  du -sh "$T/venv"; rm -rf "$T/venv" "$T/cache"
}

s_demo() {
  section demo "git clone, then make demo, with empty caches (the README's first ten minutes)"
  git clone -q "$ROOT" "$T/clone"
  # without this script's PYTHONPATH: pip would see this checkout's dpcompare metadata and warn of its dependencies
  (cd "$T/clone" && env -u PYTHONPATH PIP_NO_CACHE_DIR=1 DPCOMPARE_CACHE="$T/cache-demo" \
     /usr/bin/time -f "make demo: %e s wall" make demo)
  rm -rf "$T/clone" "$T/cache-demo"
}

s_concepts() {
  section concepts "traced ÷ untraced (--trace 3), mlp 1024, digits, np=2, 120 steps, 5 blocks"
  for s in ddp horovod; do
    timed "$DPC" compare --np 2 --variants "$s=$s" "$s-traced=$s:trace=3" --repeats 5 --model mlp --width 1024 \
      --dataset digits --epochs 0 --max-steps 120 --warmup-steps 5 --out "$T/traced-$s" --progress none \
      | grep -E "^\s+•|per block"
  done
}

s_predict() {
  section predict "the np=2 mlp traces (predict.md's first lines), the example table and the self-check"
  for s in ddp horovod; do
    mpi2 train --strategy "$s" --model mlp --width 1024 --epochs 1 --trace 5 --progress none --out "$T/pred-$s" >/dev/null
  done
  "$DPC" predict "$T/pred-ddp" --strategies ddp,horovod --host-counts 2,4,8,16,32,64,128,256,512,1024 --link 25gbit
  "$DPC" predict "$T/pred-horovod" --strategies horovod --host-counts 2,4,8 --link 25gbit | grep -i -A3 "self-check" || true
}

s_lab() {
  section lab "raw TCP at 1 Gbit/s; how long the lab bench's default sweeps take"
  (cd "$ROOT/bench" && "$PY" lab_tcp.py --link 1gbit)
  "$DPC" lab up --host-count 2 --link 1gbit --name remeasure >/dev/null
  timed "$DPC" lab bench --name remeasure >/dev/null
  "$DPC" lab set-link 200mbit --name remeasure
  timed "$DPC" lab bench --name remeasure --sizes 4K:16M >/dev/null
  "$DPC" lab down --name remeasure >/dev/null
}

s_trackers() {
  section trackers "what wandb and mlflow cost a run"
  (cd "$ROOT/bench" && "$PY" trackers_cost.py)
}

s_steadiness() {
  section steadiness "the demo's convnet step on every core at once, 120 s: the machine's own drift"
  "$PY" "$ROOT/bench/steadiness.py" --seconds 120 --out "$T/steadiness"
}

s_tests() {
  section tests "the lab and predict tests' durations; parity in the lab"
  (cd "$ROOT" && "$PY" -m pytest -q --durations=0 tests/test_lab_run.py tests/test_faults_lab.py \
     tests/test_predict_lab.py 2>&1 | grep -E "^[0-9.]+s (call|setup)|passed|failed")
  timed "$DPC" parity --np 2 --lab hosts=2,link=200mbit --steps 5 --no-single --out "$T/parity-lab" | tail -2
}

s_suite() {
  section suite "the whole test suite, as make test runs it"
  (cd "$ROOT" && /usr/bin/time -f "make test: %e s wall" make test 2>&1 | grep -E "^=+ .*(passed|failed)|make test: ")
  echo "figure: commit = $(git -C "$ROOT" rev-parse --short HEAD)"
}

for s in "${SECTIONS[@]}"; do
  case " ${ALL[*]} " in *" $s "*) ;; *) echo "unknown section '$s'; choose from: ${ALL[*]}" >&2; exit 2 ;; esac
done
for s in "${SECTIONS[@]}"; do
  "s_$s" 2>&1 | tee "$T/$s.log"
  [ "${REMEASURE_DOC:-1}" = 0 ] || { "$PY" "$ROOT/bench/remeasure_doc.py" "$s" "$T/$s.log"
                                     "$PY" "$ROOT/bench/figures.py" "$s" "$T/$s.log"; }
done
