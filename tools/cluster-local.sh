#!/usr/bin/env bash
# cluster-local.sh — two hosts on one machine for tests: each a network, UTS, mount and IPC
# namespace of its own (its own network stack, host name, /tmp, /dev/shm and System V IPC), its
# eth0 a veth pair's end whose other end is a port of a bridge in a third network namespace (the
# switch), so MPI between them crosses a real (if virtual) node boundary: TCP over the link, not
# shared memory; and a host lost takes only its own cable, the other keeps its interface. No
# traffic leaves them: the link is their only interface besides their own loopback.
#
#   tools/cluster-local.sh start [DIR]     build the two hosts; wait until both answer on the link
#   tools/cluster-local.sh stop [DIR]      kill every process inside them (by namespace) and wait
#   tools/cluster-local.sh env [DIR]       print the export line mpirun inside host 0 needs
#   tools/cluster-local.sh exec I CMD...   run CMD inside host I (0 or 1), in this directory
#   tools/cluster-local.sh kill I          SIGKILL every process of host I: the host lost at once
#                                          (its cable with it; the other host's link stays up)
#                                          (exec and kill find the cluster in $CLUSTER_LOCAL_DIR)
#   tools/cluster-local.sh hosts [DIR]     print the hosts' names and addresses, one a line
#
# DIR defaults to $CLUSTER_LOCAL_DIR, else /tmp/saetrain-cluster-$UID. Host I is named
# saetrain-hI at 10.250.0.(I+1) (CLUSTER_LOCAL_NET, default 10.250.0); both hosts' /etc/hosts
# name both. Each host's /tmp and /dev/shm are empty tmpfs of its own, except that DIR and every
# path in CLUSTER_LOCAL_SHARE (colon-separated) that lies under /tmp stay visible there, bound
# from this machine's; everything outside /tmp is the machine's own file system, shared.
#
# Cores: the CPUs this script may use are split between the hosts, half each (CLUSTER_LOCAL_CPUS=
# all shares them all; one CPU is always shared), and what a host starts (exec, the rsh agent,
# so mpirun's daemons and a slurmd's tasks) is bound to its half, as a real node's processes
# have cores of their own. mpirun's ranks are not: Open MPI binds them by its own view of the
# machine (hwloc), which sees every core.
#
# MPI: run mpirun inside host 0 (exec 0) with the variables `env` prints: OpenMPI's rsh launcher
# reaches host 1 through DIR/rsh-agent (nsenter, no ssh), TCP is kept to the link, and a dead
# link is found by keepalive. Example:
#   eval "$(tools/cluster-local.sh env)"
#   tools/cluster-local.sh exec 0 mpirun --host saetrain-h0:2,saetrain-h1:2 -n 4 saetrain ...
#
# Needs root (or CAP_SYS_ADMIN and CAP_NET_ADMIN) and a kernel that allows the namespaces: where
# it refuses them, start says so in one line and exits 3, which the multinode tests report as
# their reason to skip.
set -euo pipefail

cmd=${1:-}
net=${CLUSTER_LOCAL_NET:-10.250.0}
hosts=2

die() {
    echo "cluster-local: error: $*" >&2
    exit 1
}

usage() {
    echo "usage: cluster-local.sh start|stop|env|hosts [DIR] | exec I CMD... | kill I" >&2
    exit 2
}

dir_of() { echo "${1:-${CLUSTER_LOCAL_DIR:-/tmp/saetrain-cluster-$(id -u)}}"; }
pid_of() { if [ -s "$1" ]; then cat "$1" 2>/dev/null || true; fi; }
alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }

# holder DIR I: the pid of host I's first process (its namespaces' anchor), if it is alive.
holder() {
    local p
    p=$(pid_of "$1/h$2.pid")
    if alive "$p"; then echo "$p"; fi
}

# members PID: every process that shares PID's network namespace (the host's processes).
members() {
    local p
    [ -e "/proc/$1/ns/net" ] || return 0
    for p in /proc/[0-9]*; do
        [ "$p/ns/net" -ef "/proc/$1/ns/net" ] && echo "${p#/proc/}"
    done
    return 0
}

# others PID PIDS: PIDS but the host's first process PID and its parent (unshare, which made the
# namespaces and waits for it): they keep the host until the KILL that ends it.
others() {
    local keep
    keep=$(ps -o ppid= -p "$1" 2>/dev/null | tr -d ' ')
    echo "$2" | grep -vx -e "$1" -e "${keep:-$1}" || true
}

# kill_host DIR I SIGNAL: SIGNAL to every process of host I; with KILL, wait until all are gone.
kill_host() {
    local p pids
    p=$(holder "$1" "$2")
    [ -z "$p" ] && return 0
    pids=$(members "$p")
    [ "$3" = TERM ] && pids=$(others "$p" "$pids")
    # shellcheck disable=SC2086  # one pid a word
    [ -n "$pids" ] && kill "-$3" $pids 2>/dev/null || true
    if [ "$3" = KILL ]; then
        for _ in $(seq 1 100); do
            alive "$p" || break
            sleep 0.05
        done
        rm -f "$1/h$2.pid"
    fi
}

stop() {
    local d=$1 i any
    for i in $(seq 0 $((hosts - 1))) sw; do kill_host "$d" "$i" TERM; done
    # Two seconds to end on their own (mpirun ends its ranks, saetrain writes nothing half),
    # then SIGKILL what is left.
    for _ in $(seq 1 40); do
        any=0
        for i in $(seq 0 $((hosts - 1))) sw; do
            p=$(holder "$d" "$i")
            [ -n "$p" ] && [ -n "$(others "$p" "$(members "$p")")" ] && any=1
        done
        [ "$any" = 0 ] && break
        sleep 0.05
    done
    for i in $(seq 0 $((hosts - 1))) sw; do kill_host "$d" "$i" KILL; done
}

# The script a host's first process runs, inside its new namespaces: its name, an empty /tmp
# and /dev/shm (with the shared paths bound back in), /etc/hosts, loopback up; then it writes
# its pid and waits.
host_init() {
    cat <<'EOF'
set -eu
i=$1 d=$2 shares=$3
mount --make-rprivate /
hostname "saetrain-h$i"
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mkdir /dev/shm/.tmp
mount -t tmpfs -o mode=1777 tmpfs /dev/shm/.tmp
old_ifs=$IFS
IFS=:
for p in $shares; do
    case "$p" in
    /tmp/?*)
        [ -d "$p" ] || continue
        mkdir -p "/dev/shm/.tmp/${p#/tmp/}"
        mount --bind "$p" "/dev/shm/.tmp/${p#/tmp/}"
        ;;
    esac
done
IFS=$old_ifs
mount --move /dev/shm/.tmp /tmp
rmdir /dev/shm/.tmp
mount --bind "$d/etc-hosts" /etc/hosts
ip link set lo up
echo $$ >"$d/h$i.pid.new"
mv "$d/h$i.pid.new" "$d/h$i.pid"
exec sleep infinity
EOF
}

# expand LIST: a CPU list (0-3,6) one CPU a word.
expand() {
    local part a b c parts
    IFS=, read -ra parts <<<"$1"
    for part in "${parts[@]}"; do
        if [[ "$part" == *-* ]]; then
            a=${part%-*} b=${part#*-}
            for ((c = a; c <= b; c++)); do echo "$c"; done
        else
            echo "$part"
        fi
    done
}

# write_cpus DIR: DIR/hI.cpus, host I's CPU list.
write_cpus() {
    local all n i
    mapfile -t all < <(expand "$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)")
    n=${#all[@]}
    for i in $(seq 0 $((hosts - 1))); do
        if [ "${CLUSTER_LOCAL_CPUS:-split}" = all ] || [ "$n" -lt "$hosts" ]; then
            echo "${all[*]}" | tr ' ' ,
        else
            echo "${all[@]:$((i * n / hosts)):$(((i + 1) * n / hosts - i * n / hosts))}" | tr ' ' ,
        fi >"$1/h$i.cpus"
    done
}

start() {
    local d=$1 i p p0 p1 psw shares
    for i in $(seq 0 $((hosts - 1))); do
        [ -n "$(holder "$d" "$i")" ] && die "a cluster is already running in $d (stop it first)"
    done
    for exe in unshare nsenter ip; do
        command -v "$exe" >/dev/null 2>&1 || die "$exe not found (Debian's util-linux, iproute2)"
    done
    if ! unshare --net --uts --mount --ipc true 2>/dev/null; then
        echo "cluster-local: this kernel or container refuses new network, UTS, mount and IPC" \
            "namespaces (run as root, or give CAP_SYS_ADMIN and CAP_NET_ADMIN)" >&2
        exit 3
    fi
    mkdir -p "$d"
    d=$(cd "$d" && pwd)
    {
        echo "127.0.0.1 localhost"
        for i in $(seq 0 $((hosts - 1))); do echo "$net.$((i + 1)) saetrain-h$i"; done
    } >"$d/etc-hosts"
    for i in $(seq 0 $((hosts - 1))); do echo "saetrain-h$i"; done >"$d/hostfile"
    host_init >"$d/host-init.sh"
    write_cpus "$d"
    # OpenMPI's rsh launcher calls this as `rsh-agent [options] HOST COMMAND...`: COMMAND is
    # run by a shell inside HOST's namespaces, with the caller's environment.
    cat >"$d/rsh-agent" <<EOF
#!/bin/sh
while [ \$# -gt 0 ]; do case "\$1" in -*) shift ;; *) break ;; esac; done
host=\$1
shift
case "\$host" in
saetrain-h[0-9]) i=\${host#saetrain-h} ;;
$net.[0-9]*) i=\$((\${host##*.} - 1)) ;;
*) echo "rsh-agent: unknown host \$host (this cluster has saetrain-h0 and saetrain-h1)" >&2; exit 1 ;;
esac
pid=\$(cat "$d/h\$i.pid" 2>/dev/null) || { echo "rsh-agent: host \$host is not running" >&2; exit 1; }
exec taskset -c "\$(cat "$d/h\$i.cpus")" nsenter -t "\$pid" --net --uts --ipc --mount --wd="\$PWD" \
    -- /bin/sh -c "\$*"
EOF
    chmod +x "$d/rsh-agent"
    shares="$d:${CLUSTER_LOCAL_SHARE:-}"
    for i in $(seq 0 $((hosts - 1))); do
        rm -f "$d/h$i.pid"
        setsid taskset -c "$(cat "$d/h$i.cpus")" \
            unshare --net --uts --mount --ipc --propagation private --fork \
            sh "$d/host-init.sh" "$i" "$d" "$shares" </dev/null >>"$d/host$i.log" 2>&1 &
    done
    # The switch: a network namespace holding only a bridge.
    rm -f "$d/hsw.pid"
    setsid unshare --net --fork sh -c \
        'ip link set lo up && echo $$ >"$1/hsw.pid.new" && mv "$1/hsw.pid.new" "$1/hsw.pid" &&
         exec sleep infinity' sh "$d" </dev/null >>"$d/switch.log" 2>&1 &
    for _ in $(seq 1 100); do
        [ -s "$d/h0.pid" ] && [ -s "$d/h1.pid" ] && [ -s "$d/hsw.pid" ] && break
        sleep 0.05
    done
    p0=$(holder "$d" 0) p1=$(holder "$d" 1) psw=$(holder "$d" sw)
    if [ -z "$p0" ] || [ -z "$p1" ] || [ -z "$psw" ]; then
        stop "$d"
        die "the hosts did not start: $(tail -n 1 "$d"/host*.log "$d"/switch.log 2>/dev/null |
            tr '\n' ' ')"
    fi
    { nsenter -t "$psw" --net ip link add br0 type bridge &&
        nsenter -t "$psw" --net ip link set br0 up; } ||
        {
            stop "$d"
            die "cannot make the switch's bridge"
        }
    for i in 0 1; do
        p=$(holder "$d" "$i")
        { ip link add eth0 netns "$p" type veth peer name "h$i" netns "$psw" &&
            nsenter -t "$psw" --net ip link set "h$i" master br0 &&
            nsenter -t "$psw" --net ip link set "h$i" up &&
            nsenter -t "$p" --net ip addr add "$net.$((i + 1))/24" dev eth0 &&
            nsenter -t "$p" --net ip link set eth0 up; } ||
            {
                stop "$d"
                die "cannot cable host $i to the switch"
            }
    done
    # Up when both ends are: the carrier (LOWER_UP) on each host's end says its cable works.
    for i in 0 1; do
        p=$(holder "$d" "$i")
        for _ in $(seq 1 100); do
            nsenter -t "$p" --net ip -br link show dev eth0 | grep -q LOWER_UP && break
            sleep 0.05
        done
        nsenter -t "$p" --net ip -br link show dev eth0 | grep -q LOWER_UP ||
            {
                stop "$d"
                die "host $i's link did not come up"
            }
    done
    echo "cluster-local: saetrain-h0 ($net.1, CPUs $(cat "$d/h0.cpus")) and saetrain-h1" \
        "($net.2, CPUs $(cat "$d/h1.cpus")) up in $d"
}

case "$cmd" in
start) start "$(dir_of "${2:-}")" ;;
stop) stop "$(dir_of "${2:-}")" ;;
env)
    d=$(dir_of "${2:-}")
    [ -x "$d/rsh-agent" ] || die "no cluster in $d (run: tools/cluster-local.sh start $d)"
    # TCP keepalive on mpirun's connections to its daemons: a link that goes dead (no peer hangs
    # up) ends the job in about 4 s, not after TCP's retransmission limit (many minutes).
    echo "export CLUSTER_LOCAL_DIR=$d OMPI_MCA_plm_rsh_agent=$d/rsh-agent" \
        "OMPI_MCA_btl_tcp_if_include=$net.0/24 OMPI_MCA_oob_tcp_if_include=$net.0/24" \
        "OMPI_MCA_oob_tcp_keepalive_time=1 OMPI_MCA_oob_tcp_keepalive_intvl=1" \
        "OMPI_MCA_oob_tcp_keepalive_probes=3"
    ;;
hosts)
    d=$(dir_of "${2:-}")
    for i in $(seq 0 $((hosts - 1))); do echo "saetrain-h$i $net.$((i + 1))"; done
    ;;
exec | kill)
    [ $# -ge 2 ] || usage
    i=$2
    case "$i" in 0 | 1) ;; *) die "no host $i (the hosts are 0 and 1)" ;; esac
    d=$(dir_of "")
    p=$(holder "$d" "$i")
    [ -n "$p" ] || die "host $i of $d is not running (tools/cluster-local.sh start $d)"
    if [ "$cmd" = kill ]; then
        kill_host "$d" "$i" KILL
    else
        shift 2
        [ $# -ge 1 ] || usage
        exec taskset -c "$(cat "$d/h$i.cpus")" nsenter -t "$p" --net --uts --ipc --mount \
            --wd="$PWD" -- "$@"
    fi
    ;;
*) usage ;;
esac
