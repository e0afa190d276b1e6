#!/usr/bin/env bash
# Wait for a quiet machine, then say what the machine is: every benchmark script runs this first, and every
# figure in the docs is stated with what it prints (cores, CPU model, load average).
#
#   bash bench/quiet.sh            # waits until the 1-minute load average is below 0.5, at most 10 minutes
#   QUIET_LOAD=0.3 QUIET_MAX_WAIT=1200 bash bench/quiet.sh
#
# A figure taken under load is not a figure: on 2 cores another job's process takes a rank's time slice, and a
# busy-polling rank (Horovod's background thread, Open MPI's progress) loses whole slices. When the wait runs
# out the last line says NOT QUIET and the exit code is 3 (QUIET_STRICT=0: 0), so a caller can refuse to go on.
set -euo pipefail
LIMIT=${QUIET_LOAD:-0.5}
MAX_WAIT=${QUIET_MAX_WAIT:-600}
STEP=${QUIET_POLL:-10}

load1() { cut -d' ' -f1 /proc/loadavg; }
below() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }

waited=0
while ! below "$(load1)" "$LIMIT" && [ "$waited" -lt "$MAX_WAIT" ]; do
  [ "$waited" = 0 ] && echo "[quiet] load average $(load1) ≥ $LIMIT: waiting for a quiet machine (at most ${MAX_WAIT} s) ..."
  sleep "$STEP"  # polling the load average: nothing to wait on but time
  waited=$((waited + STEP))
done

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
busy=$(ps -eo pcpu=,comm= --sort=-pcpu | awk '$1 >= 5 { printf "%s%s %s%%", n++ ? ", " : "", $2, $1 }' | head -c 300)
echo "[quiet] machine: $(nproc) cores, ${cpu:-unknown CPU}, $(free -g | awk '/^Mem:/ { print $2 " GiB" }'), $(uname -r)"
if below "$(load1)" "$LIMIT"; then
  echo "[quiet] quiet: load average $(cut -d' ' -f1-3 /proc/loadavg) (waited ${waited} s)"
else
  echo "[quiet] NOT QUIET: load average $(cut -d' ' -f1-3 /proc/loadavg) after ${waited} s; busiest: ${busy:-none}."
  echo "[quiet] NOT QUIET: figures measured now are taken under load; do not quote them."
  [ "${QUIET_STRICT:-1}" = 1 ] && exit 3
fi
exit 0
