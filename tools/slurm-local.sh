#!/usr/bin/env bash
# slurm-local.sh — a one-node Slurm cluster for tests: munged, slurmctld and slurmd from Debian's
# packages (slurm-wlm, munge; tools/install-deps.sh installs them), with a key, a slurm.conf and
# every state and log file of their own under one directory, so nothing of a system Slurm is
# read or changed.
#
#   tools/slurm-local.sh start [DIR]   start the daemons; wait until the node is idle
#   tools/slurm-local.sh stop [DIR]    stop every daemon this script started (by pid) and wait
#   tools/slurm-local.sh env [DIR]     print the export line clients need (SLURM_CONF)
#
# DIR defaults to $SLURM_LOCAL_DIR, else /tmp/saetrain-slurm-$UID. Clients (srun, sbatch, squeue,
# scontrol, scancel) find the cluster through SLURM_CONF=DIR/slurm.conf.
#
# The node offers SLURM_LOCAL_CPUS CPUs (default 8, more than a small machine has:
# SlurmdParameters=config_overrides), MpiDefault=pmix, requeue allowed, no cgroups (proctrack/
# linuxproc, task/none: works in containers). Ports SLURM_LOCAL_PORT and the next one (default
# 16817, 16818) on 127.0.0.1's host name.
#
# Root: slurmd must run as root to start jobs as their users, and CI runs as root. A developer
# without root runs the daemons as themselves (SlurmUser and SlurmdUser are set to the caller);
# then jobs run only as that user, which is all the tests need.
set -euo pipefail

cmd=${1:-}
dir=${2:-${SLURM_LOCAL_DIR:-/tmp/saetrain-slurm-$(id -u)}}
cpus=${SLURM_LOCAL_CPUS:-8}
port=${SLURM_LOCAL_PORT:-16817}
host=$(hostname -s)
user=$(id -un)

die() {
    echo "slurm-local: error: $*" >&2
    exit 1
}

for exe in munged slurmctld slurmd sinfo; do
    command -v "$exe" >/dev/null 2>&1 ||
        die "$exe not found; install Debian's slurm-wlm and munge (bash tools/install-deps.sh)"
done

pid_of() { if [ -s "$1" ]; then cat "$1" 2>/dev/null || true; fi; }
alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }

stop() {
    local pids=() p
    for f in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munge/munged.pid"; do
        p=$(pid_of "$f")
        if alive "$p"; then
            kill -TERM "$p" 2>/dev/null || true
            pids+=("$p")
        fi
    done
    for _ in $(seq 1 100); do
        local left=0
        for p in "${pids[@]}"; do alive "$p" && left=1; done
        [ "$left" -eq 0 ] && break
        sleep 0.1
    done
    for p in "${pids[@]}"; do
        if alive "$p"; then kill -KILL "$p" 2>/dev/null || true; fi
    done
    echo "slurm-local: stopped ${#pids[@]} daemon(s) in $dir"
}

write_conf() {
    local mem
    mem=$(awk '/MemTotal/ {print int($2 / 1024 / 2)}' /proc/meminfo)
    cat >"$dir/slurm.conf" <<EOF
# Written by tools/slurm-local.sh: a one-node test cluster, everything under $dir.
ClusterName=saetrain-local
SlurmctldHost=$host
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=$user
SlurmdUser=$user
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
MpiDefault=pmix
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
KillWait=10
MinJobAge=600
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=local Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
}

start() {
    for f in "$dir/slurmctld.pid" "$dir/slurmd.pid"; do
        alive "$(pid_of "$f")" && die "a cluster is already running in $dir; stop it first"
    done
    rm -rf "$dir"
    mkdir -p "$dir/munge" "$dir/state" "$dir/spool"
    chmod 700 "$dir/munge"
    head -c 1024 /dev/urandom >"$dir/munge/munge.key"
    chmod 400 "$dir/munge/munge.key"
    munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
        --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" \
        --seed-file="$dir/munge/munged.seed" ||
        die "munged did not start (see $dir/munge/munged.log)"
    write_conf
    export SLURM_CONF="$dir/slurm.conf"
    slurmctld -f "$SLURM_CONF" -i || die "slurmctld did not start (see $dir/slurmctld.log)"
    slurmd -f "$SLURM_CONF" || die "slurmd did not start (see $dir/slurmd.log)"
    for _ in $(seq 1 300); do
        if [ "$(sinfo -h -N -o %T 2>/dev/null | head -n 1)" = "idle" ]; then
            echo "slurm-local: node $host idle ($cpus CPUs, partition local); export SLURM_CONF=$SLURM_CONF"
            return 0
        fi
        sleep 0.1
    done
    stop >/dev/null
    die "the node did not become idle in 30 s (see $dir/slurmctld.log and $dir/slurmd.log)"
}

case "$cmd" in
start) start ;;
stop) stop ;;
env) echo "export SLURM_CONF=$dir/slurm.conf" ;;
*)
    echo "usage: tools/slurm-local.sh start|stop|env [DIR]" >&2
    exit 2
    ;;
esac
