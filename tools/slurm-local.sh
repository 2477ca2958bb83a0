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
# Two nodes: with SLURM_LOCAL_CLUSTER=CDIR, the two hosts tools/cluster-local.sh started in CDIR
# (DIR must be visible in them: under /tmp, inside CDIR or CLUSTER_LOCAL_SHARE) are the nodes,
# saetrain-h0 and saetrain-h1 at their link addresses: slurmctld and a slurmd run in host 0,
# another slurmd in host 1 (munged stays outside: its socket is a file both reach). Clients then
# run inside host 0 (tools/cluster-local.sh exec 0 sbatch ...), where the controller is.
#
# SLURM_LOCAL_SLURMD_TIMEOUT (default 300, Slurm's): seconds before slurmctld sets a node that
# stopped answering DOWN and ends its jobs.
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
cluster=${SLURM_LOCAL_CLUSTER:-}
nodes=("$host")
if [ -n "$cluster" ]; then
    cluster=$(cd "$cluster" && pwd) || exit 1
    nodes=(saetrain-h0 saetrain-h1)
fi

die() {
    echo "slurm-local: error: $*" >&2
    exit 1
}

# on NODE CMD...: CMD on that node (inside its host with SLURM_LOCAL_CLUSTER, else here).
on() {
    local n=$1
    shift
    if [ -n "$cluster" ]; then
        CLUSTER_LOCAL_DIR=$cluster bash "$(dirname "$0")/cluster-local.sh" exec "${n#saetrain-h}" "$@"
    else
        "$@"
    fi
}
# A daemon's pid file: slurmd's is one a node.
slurmd_pid() { echo "$dir/slurmd-$1.pid"; }

for exe in munged slurmctld slurmd sinfo; do
    command -v "$exe" >/dev/null 2>&1 ||
        die "$exe not found; install Debian's slurm-wlm and munge (bash tools/install-deps.sh)"
done

pid_of() { if [ -s "$1" ]; then cat "$1" 2>/dev/null || true; fi; }
alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }

# steps_of_this_cluster: the pids of the slurmstepd processes of this cluster's jobs, found by
# the SLURM_CONF in their environment (slurmd starts them detached, so their parent is init).
steps_of_this_cluster() {
    local p
    for p in $(pgrep -x slurmstepd 2>/dev/null); do
        { tr '\0' '\n' <"/proc/$p/environ"; } 2>/dev/null | grep -qx "SLURM_CONF=$dir/slurm.conf" &&
            echo "$p"
    done
    return 0
}

# tree PID...: the pids and every descendant of each.
tree() {
    local p
    for p in "$@"; do
        echo "$p"
        # shellcheck disable=SC2046  # one pid a word
        tree $(pgrep -P "$p" 2>/dev/null)
    done
}

# end_jobs: cancel every job of the cluster and wait about KillWait + 5 s for its steps to end;
# any step still there (or orphaned by a slurmd that died) is then killed with its tasks, so no
# training process outlives the cluster and no PMIx directory is left to the next one.
end_jobs() {
    local left
    [ -z "$(steps_of_this_cluster)" ] && return 0
    if alive "$(pid_of "$dir/slurmctld.pid")" && alive "$(pid_of "$(slurmd_pid "${nodes[0]}")")"; then
        # shellcheck disable=SC2046  # one job id a word
        on "${nodes[0]}" env SLURM_CONF="$dir/slurm.conf" scancel --full --quiet \
            $(on "${nodes[0]}" env SLURM_CONF="$dir/slurm.conf" squeue -h -o %A 2>/dev/null) \
            2>/dev/null || true
        for _ in $(seq 1 75); do
            [ -z "$(steps_of_this_cluster)" ] && return 0
            sleep 0.2
        done
    fi
    # shellcheck disable=SC2046
    left=$(tree $(steps_of_this_cluster))
    if [ -n "$left" ]; then
        # shellcheck disable=SC2086  # one pid a word
        kill -KILL $left 2>/dev/null || true
        echo "slurm-local: killed $(echo "$left" | wc -w) process(es) of jobs that did not end"
    fi
}

stop() {
    local pids=() p
    end_jobs
    local files=()
    for n in "${nodes[@]}"; do files+=("$(slurmd_pid "$n")"); done
    for f in "${files[@]}" "$dir/slurmctld.pid" "$dir/munge/munged.pid"; do
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
SlurmctldHost=${nodes[0]}
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
SlurmdTimeout=${SLURM_LOCAL_SLURMD_TIMEOUT:-300}
MinJobAge=600
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
EOF
    if [ -n "$cluster" ]; then
        while read -r name addr; do
            echo "NodeName=$name NodeAddr=$addr CPUs=$cpus RealMemory=$mem State=UNKNOWN"
        done < <(bash "$(dirname "$0")/cluster-local.sh" hosts "$cluster") >>"$dir/slurm.conf"
    else
        echo "NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN" >>"$dir/slurm.conf"
    fi
    echo "PartitionName=local Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >>"$dir/slurm.conf"
    # PMIx's per-step directories under DIR, not /tmp/spmix_appdir_<uid>_<job>.<step>: each new
    # cluster numbers its jobs from 1, and a step directory another cluster left behind in /tmp
    # fails the launch ("Cannot create client cli tmpdir ... File exists").
    # On two hosts each node's /tmp is its own and new: PMIx's default is kept there.
    if [ -z "$cluster" ]; then
        mkdir -p "$dir/pmix"
        echo "PMIxCliTmpDirBase=$dir/pmix" >"$dir/mpi.conf"
    fi
}

start() {
    for f in "$dir/slurmctld.pid" "$(slurmd_pid "${nodes[0]}")"; do
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
    on "${nodes[0]}" slurmctld -f "$SLURM_CONF" -i ||
        die "slurmctld did not start (see $dir/slurmctld.log)"
    for n in "${nodes[@]}"; do
        mkdir -p "$dir/spool/$n"
        on "$n" slurmd -f "$SLURM_CONF" -N "$n" || die "slurmd did not start (see $dir/slurmd-$n.log)"
    done
    for _ in $(seq 1 300); do
        if [ "$(on "${nodes[0]}" sinfo -h -N -o %T 2>/dev/null | grep -c '^idle$')" = "${#nodes[@]}" ]; then
            echo "slurm-local: node(s) ${nodes[*]} idle ($cpus CPUs each, partition local);" \
                "export SLURM_CONF=$SLURM_CONF"
            return 0
        fi
        sleep 0.1
    done
    stop >/dev/null
    die "the node(s) did not become idle in 30 s (see $dir/slurmctld.log and $dir/slurmd-*.log)"
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
