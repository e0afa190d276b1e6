#!/usr/bin/env bash
# A one-node Slurm on localhost for the tests (and for trying `dpcompare slurm` scripts by hand).
#
#   scripts/slurm-local.sh [start]   install slurm-wlm + munge when missing (apt-get, as root), start munged,
#                                    slurmctld and slurmd with a minimal slurm.conf for this machine, and
#                                    wait until the node is idle
#   scripts/slurm-local.sh stop      stop what `start` started
#   scripts/slurm-local.sh status    print sinfo
#
# The slurm.conf names this host with the CPUs and memory `slurmd -C` reads from it, and uses
# ProctrackType=proctrack/linuxproc, TaskPlugin=task/none (no cgroups needed) and MpiDefault=none.
# It goes to /etc/slurm/slurm.conf (where srun/sbatch look) unless that file exists and was not written by
# this script: then the script stops with a message rather than replacing a real cluster's configuration.
# State and logs live in $SLURM_LOCAL_DIR (default /tmp/dpcompare-slurm).
set -euo pipefail

STATE=${SLURM_LOCAL_DIR:-/tmp/dpcompare-slurm}
CONF=/etc/slurm/slurm.conf
MARK="# written by dpcompare scripts/slurm-local.sh"

die() { echo "slurm-local: $*" >&2; exit 1; }

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...: poll until COMMAND succeeds
    local limit=$1 what=$2; shift 2
    local end=$((SECONDS + limit))
    until "$@" >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$end" ] || return 1
        sleep 0.5
    done
}

install_if_missing() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null \
            && command -v munged >/dev/null; then
        return 0
    fi
    [ "$(id -u)" = 0 ] || die "slurmctld/slurmd/munged are not installed and installing them needs root"
    command -v apt-get >/dev/null || die "slurmctld/slurmd/munged are not installed and there is no apt-get"
    echo "slurm-local: installing slurm-wlm, slurmctld, slurmd and munge with apt-get" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm slurmctld slurmd munge >"$STATE/apt.log" 2>&1 \
        || { DEBIAN_FRONTEND=noninteractive apt-get update -q >>"$STATE/apt.log" 2>&1 \
             && DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm slurmctld slurmd munge \
                >>"$STATE/apt.log" 2>&1; } \
        || die "apt-get install failed (log: $STATE/apt.log)"
}

munge_ok() { munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munge() {
    if munge_ok; then
        return 0
    fi
    if [ ! -s /etc/munge/munge.key ]; then
        mkdir -p /etc/munge
        if command -v mungekey >/dev/null; then
            mungekey --create --keyfile=/etc/munge/munge.key --force
        else
            dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
        fi
    fi
    local user=root
    id munge >/dev/null 2>&1 && user=munge
    mkdir -p /run/munge /var/lib/munge /var/log/munge
    chown "$user" /etc/munge /etc/munge/munge.key /run/munge /var/lib/munge /var/log/munge
    chmod 0700 /etc/munge /var/lib/munge /var/log/munge
    chmod 0755 /run/munge
    chmod 0400 /etc/munge/munge.key
    if [ "$user" = root ]; then
        munged --force
    else
        runuser -u munge -- munged --force
    fi
    touch "$STATE/munge.started"
    wait_for 20 munged munge_ok || die "munged did not start (see /var/log/munge/munged.log)"
}

write_conf() {
    if [ -e "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
        die "$CONF exists and was not written by this script; not replacing a real cluster's configuration"
    fi
    local node host cpus mem
    host=$(hostname -s)
    node=$(slurmd -C | head -n 1)   # NodeName=HOST CPUs=N Boards=... RealMemory=M, read from this machine
    cpus=$(sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' <<<"$node")
    mem=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$node")
    [ -n "$cpus" ] && [ -n "$mem" ] || die "cannot read CPUs and memory from \`slurmd -C\`: $node"
    mkdir -p "$(dirname "$CONF")" "$STATE/ctld" "$STATE/d"
    cat >"$CONF" <<EOF
$MARK (one node on localhost, for tests)
ClusterName=dpcompare-local
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
KillWait=5
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
}

node_idle() { sinfo -h -N -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; }

start() {
    mkdir -p "$STATE"
    install_if_missing
    start_munge
    if node_idle; then
        echo "slurm-local: already running"; sinfo; return 0
    fi
    write_conf
    # -c: a clean start (no jobs or nodes remembered from an earlier run of this script)
    pgrep -F "$STATE/slurmctld.pid" >/dev/null 2>&1 || slurmctld -c
    pgrep -F "$STATE/slurmd.pid" >/dev/null 2>&1 || slurmd
    if ! wait_for 60 "idle node" node_idle; then
        scontrol update nodename="$(hostname -s)" state=resume >/dev/null 2>&1 || true
        wait_for 20 "idle node" node_idle || {
            sinfo -N -l >&2 || true
            tail -n 20 "$STATE/slurmctld.log" "$STATE/slurmd.log" >&2 || true
            die "the node did not become idle (logs in $STATE)"
        }
    fi
    echo "slurm-local: running (srun --mpi=list: $(srun --mpi=list 2>&1 | grep -v 'MPI plugin types' \
        | tr -s ' \n' ' '))"
    sinfo
}

stop_pidfile() {  # stop_pidfile FILE: SIGTERM the daemon, then wait for it to go
    local f=$1 pid
    [ -s "$f" ] || return 0
    pid=$(cat "$f")
    kill "$pid" 2>/dev/null || return 0
    wait_for 30 "exit" bash -c "! kill -0 $pid" || kill -9 "$pid" 2>/dev/null || true
}

stop() {
    stop_pidfile "$STATE/slurmd.pid"
    stop_pidfile "$STATE/slurmctld.pid"
    if [ -e "$STATE/munge.started" ]; then
        stop_pidfile /run/munge/munged.pid
        rm -f "$STATE/munge.started"
    fi
    echo "slurm-local: stopped"
}

case "${1:-start}" in
    start) start ;;
    stop) stop ;;
    status) sinfo ;;
    *) die "usage: $0 [start|stop|status]" ;;
esac
