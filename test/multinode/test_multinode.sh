#!/usr/bin/env bash
# test_multinode.sh BUILD_DIR — saetrain across a real node boundary: two hosts built from
# network, UTS, mount and IPC namespaces (tools/cluster-local.sh), each with its own network
# stack, host name, /tmp and /dev/shm, cabled to a switch of their own. mpirun runs in host 0
# and starts host 1's ranks through the cluster's rsh agent; MPI between the hosts is TCP over
# the link.
# Every job is 2 hosts x 2 ranks beside the same job on one host (4 ranks in host 0):
#
#   sweep            bitwise equal: the ranks never exchange a gradient
#   data parallel    each host keeps one copy in node memory and its 2 replicas split the
#                    update; a replica's range is summed over its host's replicas, then over the
#                    hosts by an all-reduce of that range. Bitwise equal to one host that groups
#                    its ranks as two nodes (SAETRAIN_TEST_NODES=2: the same sums), within float32
#                    rounding of one host's node split (all four in rank order); with
#                    SAETRAIN_NO_SHM=1 all-reduce messages, bitwise equal to one host's
#   hybrid           2 configs x 2 replicas: each config's replicas share a host, so each host
#                    uses the node split for its own: bitwise equal to one host
#   latent shards    2 shards x 2 replicas: each replica's shards share a host, the replicas
#                    span them (messages): bitwise equal to one host
#   staging          data.stage_dir in /tmp: each host stages the shards its own ranks read,
#                    into its own /tmp, once; bitwise equal to reading them in place
#   S3               a store (moto, in host 0) read by the ranks of both hosts: the files' bits
#   a host lost      host 1's processes all SIGKILLed mid-run: the job ends on host 0 within
#                    parallel.timeout_s + 5 s, the last committed checkpoint intact; the same
#                    command on one host resumes from it to the uninterrupted job's bits (both
#                    with SAETRAIN_NO_SHM=1, so that one host and two sum alike)
#   the link cut     the same with both hosts alive but the link down: nothing hangs up, the
#                    timeouts end the job (every process of it, on both hosts) within that bound
#   Slurm            slurm/dp-multinode.sbatch on 2 nodes, stopped by the time-limit signal,
#                    requeued and resumed to the bits of the job never stopped; the scaling study
#                    beside sae-perfmodel; a node lost under srun: the step ends within
#                    parallel.timeout_s + Slurm's KillWait + 5 s, and one host resumes it
#
# ctest label `multinode`; exit 77 (skipped) where the kernel refuses the namespaces or the
# tools are missing.
set -euo pipefail

build=$(cd "${1:?usage: test_multinode.sh BUILD_DIR}" && pwd)
repo=$(cd "$(dirname "$0")/../.." && pwd)
apps=${build}/apps
cl="${repo}/tools/cluster-local.sh"
for exe in unshare nsenter ip mpirun; do
    if ! command -v "${exe}" >/dev/null 2>&1; then
        echo "test_multinode: ${exe} not found: skipped"
        exit 77
    fi
done

work=$(mktemp -d "${TMPDIR:-/tmp}/saetrain-multinode.XXXXXX")
export CLUSTER_LOCAL_DIR=${work}/cluster
fail=0
show_logs() {
    local f
    for f in "${work}"/*.log "${work}"/*.out; do
        [ -f "${f}" ] || continue
        echo "--- ${f##*/}"
        tail -n 15 "${f}"
    done
}
cleanup() {
    local rc=$?
    if [ -d "${work}/slurm" ]; then
        SLURM_LOCAL_CLUSTER="${CLUSTER_LOCAL_DIR}" bash "${repo}/tools/slurm-local.sh" stop \
            "${work}/slurm" >/dev/null 2>&1 || true
    fi
    bash "${cl}" stop >/dev/null 2>&1 || true
    if [ "${fail}" -eq 0 ] && [ "${rc}" -eq 0 ]; then
        rm -rf "${work}"
    else
        show_logs
        echo "test_multinode: kept ${work} (exit ${rc})"
    fi
}
trap cleanup EXIT
test_name=test_multinode
# say, bad, die, bitwise, poll, past_step
source "${repo}/test/shell/common.sh"

# --- the two hosts -----------------------------------------------------------------------------
# Without the privilege to make namespaces (a user's, here nobody's), start is one line and exit 3,
# the code this test skips on.
if command -v setpriv >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
    # A copy nobody can read: the checkout itself may be in a directory only its owner enters.
    mkdir -p "${work}/nobody" && chmod 711 "${work}" && chmod 777 "${work}/nobody"
    cp "${cl}" "${work}/nobody/cluster-local.sh" && chmod 755 "${work}/nobody/cluster-local.sh"
    rc=0
    refusal=$(cd "${work}/nobody" && setpriv --reuid=65534 --regid=65534 --clear-groups \
        bash "${work}/nobody/cluster-local.sh" start "${work}/nobody/cluster" 2>&1) || rc=$?
    [ "${rc}" -eq 3 ] && [ "$(echo "${refusal}" | wc -l)" -eq 1 ] &&
        echo "${refusal}" | grep -q "refuses new network, UTS, mount and IPC namespaces" ||
        bad "start without the privilege exited ${rc}, not 3 with one line: ${refusal}"
    chmod 700 "${work}"
fi
t0=$(date +%s.%N)
rc=0
CLUSTER_LOCAL_SHARE="${work}:${build}:${repo}" bash "${cl}" start >"${work}/cluster-start.log" 2>&1 ||
    rc=$?
if [ "${rc}" -eq 3 ]; then
    say "skipped: $(cat "${work}/cluster-start.log")"
    exit 77
fi
[ "${rc}" -eq 0 ] || die "tools/cluster-local.sh start exited ${rc}: $(cat "${work}/cluster-start.log")"
say "$(cat "${work}/cluster-start.log") in $(echo "$(date +%s.%N) - ${t0}" | bc) s"
eval "$(bash "${cl}" env)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 \
    OPENBLAS_NUM_THREADS=1 HDF5_USE_FILE_LOCKING=FALSE
for i in 0 1; do
    [ "$(bash "${cl}" exec "${i}" hostname)" = "saetrain-h${i}" ] || die "host ${i} has another name"
done
# Each host's /tmp is its own: a file written in one is not in the other, nor on this machine.
bash "${cl}" exec 1 sh -c 'echo h1 >/tmp/only-on-h1'
if bash "${cl}" exec 0 test -e /tmp/only-on-h1 || [ -e /tmp/only-on-h1 ]; then
    bad "host 1's /tmp is visible outside it"
fi

cd "${work}"
"${apps}/sae-synth" --out data --d-model 16 --features 32 --rows 6000 --shards 4 --seed 3 \
    >/dev/null
# write_config FILE K_LIST EPOCHS [EXTRA]
write_config() {
    cat >"$1" <<EOF
data: {path: ${work}/data, batch_size: 128, shuffle_buffer_rows: 1024, epochs: $3}
sae: {arch: topk, expansion: 2, k: $2}
train: {lr: 0.004, warmup_steps: 4}
log: {every_steps: 20}
checkpoint: {every_steps: 25, keep: 2}
parallel: {timeout_s: 10}
EOF
}
write_config sweep.yaml "[2, 4, 6, 8]" 2
write_config one.yaml 4 2
write_config two.yaml "[2, 4]" 2
write_config long.yaml 4 40

# run_on HOSTS NAME CONFIG [--set ...]: the job in 4 ranks, on 2 hosts (2 a host) or 1 (4 in
# host 0); its output in NAME.log, its run directory NAME.
run_on() {
    local hosts=$1 name=$2 cfg=$3 spread=saetrain-h0:4
    shift 3
    [ "${hosts}" = 2 ] && spread=saetrain-h0:2,saetrain-h1:2
    bash "${cl}" exec 0 timeout 300 mpirun --host "${spread}" -n 4 "${apps}/saetrain" "${cfg}" \
        --threads 1 --set run.out_dir="${work}/${name}" "$@" >"${name}.log" 2>&1
}

# nodes_in LOG N: the run's placement lines name N nodes.
nodes_in() {
    local n
    n=$(grep -c '^node saetrain-h[01]: ' "$1" || true)
    [ "${n}" = "$2" ] || bad "$1 names ${n} node(s), not $2"
}
# path_in LOG node|nodes|messages: which path the replicas' gradients took.
path_in() {
    local want="optimizer state in node memory, the update split"
    [ "$2" = nodes ] && want="optimizer state in each of 2 nodes' memory, the update split among a node's replicas"
    [ "$2" = messages ] && want="summed by all-reduce messages"
    grep -q "^replicas: .*${want}" "$1" || bad "$1 does not say its replicas' gradients went $2"
}

# --- sweep ---------------------------------------------------------------------------------------
run_on 2 sweep-2h sweep.yaml || bad "the sweep on 2 hosts exited $?"
nodes_in sweep-2h.log 2
run_on 1 sweep-1h sweep.yaml || bad "the sweep on 1 host exited $?"
nodes_in sweep-1h.log 1
bitwise sweep-2h sweep-1h

# --- data parallel ---------------------------------------------------------------------------
# near A B: A's weights within float32 rounding of B's (the same sums in another order, grown
# over 94 steps: 1.2e-7 of each tensor's largest value here).
near() {
    local cmp_out rel
    cmp_out=$("${apps}/sae-inspect" "$1"/sae/*/final.h5 --compare "$2"/sae/*/final.h5 || true)
    if echo "${cmp_out}" | grep -q "weights bitwise identical"; then
        say "$1 = $2: bitwise identical (within 1e-5 a fortiori)"
        return
    fi
    rel=$(echo "${cmp_out}" | grep -o 'max relative difference [0-9.e+-]*' | awk '{print $4}')
    if [ -z "${rel}" ]; then
        bad "sae-inspect --compare printed no relative difference: ${cmp_out}"
    elif awk -v r="${rel}" 'BEGIN { exit !(r <= 1e-5) }'; then
        say "$1 ~ $2: max relative difference ${rel} <= 1e-5"
    else
        bad "$1 and $2 differ by ${rel} (> 1e-5)"
    fi
}
run_on 2 dp-2h one.yaml --set parallel.mode=data_parallel || bad "data parallel on 2 hosts exited $?"
path_in dp-2h.log nodes
SAETRAIN_TEST_NODES=2 run_on 1 dp-1h-as2 one.yaml --set parallel.mode=data_parallel ||
    bad "data parallel on 1 host as 2 nodes exited $?"
path_in dp-1h-as2.log nodes
bitwise dp-2h dp-1h-as2
run_on 1 dp-1h one.yaml --set parallel.mode=data_parallel || bad "data parallel on 1 host exited $?"
path_in dp-1h.log node
near dp-2h dp-1h
SAETRAIN_NO_SHM=1 run_on 2 dp-2h-msg one.yaml --set parallel.mode=data_parallel ||
    bad "data parallel on 2 hosts (SAETRAIN_NO_SHM=1) exited $?"
path_in dp-2h-msg.log messages
SAETRAIN_NO_SHM=1 run_on 1 dp-1h-msg one.yaml --set parallel.mode=data_parallel ||
    bad "data parallel on 1 host (SAETRAIN_NO_SHM=1) exited $?"
bitwise dp-2h-msg dp-1h-msg
near dp-2h-msg dp-2h

# --- hybrid: each config's replicas on one host ----------------------------------------------------
run_on 2 hy-2h two.yaml --set parallel.mode=hybrid --set parallel.replicas=2 ||
    bad "hybrid on 2 hosts exited $?"
path_in hy-2h.log node
run_on 1 hy-1h two.yaml --set parallel.mode=hybrid --set parallel.replicas=2 ||
    bad "hybrid on 1 host exited $?"
bitwise hy-2h hy-1h

# --- latent shards: each replica's shards on one host, the replicas across them -----------------
run_on 2 ls-2h one.yaml --set parallel.mode=hybrid --set parallel.replicas=2 \
    --set parallel.latent_shards=2 || bad "latent shards on 2 hosts exited $?"
run_on 1 ls-1h one.yaml --set parallel.mode=hybrid --set parallel.replicas=2 \
    --set parallel.latent_shards=2 || bad "latent shards on 1 host exited $?"
bitwise ls-2h ls-1h

# --- staging to each host's own /tmp ---------------------------------------------------------------
run_on 2 stage-2h one.yaml --set parallel.mode=data_parallel --set data.stage_dir=/tmp/stage ||
    bad "the staged run on 2 hosts exited $?"
bitwise stage-2h dp-2h
for i in 0 1; do
    staged=$(bash "${cl}" exec "${i}" sh -c 'ls /tmp/stage/data 2>/dev/null' | tr '\n' ' ')
    # 4 shards, 4 ranks: ranks 2i and 2i+1 (host i) read shards 2i and 2i+1.
    want="shard_$(printf '%05d' $((2 * i))).h5 shard_$(printf '%05d' $((2 * i + 1))).h5 "
    [ "${staged}" = "${want}" ] || bad "host ${i} staged '${staged}', not '${want}'"
done
[ -e /tmp/stage/data ] && bad "staging wrote to this machine's /tmp, not the hosts' own"
say "each host staged its own ranks' 2 shards into its own /tmp"

# --- an S3-compatible store read from both hosts -----------------------------------------------------
# moto's server (.venv) in host 0 on the link's address: host 1's ranks read their shards' bytes
# across the link, host 0's locally; the same bits as the files.
moto=${repo}/.venv/bin/moto_server
if [ -x "${moto}" ]; then
    export AWS_ACCESS_KEY_ID=multinode AWS_SECRET_ACCESS_KEY=multinode-secret
    store=http://10.250.0.1:5000
    bash "${cl}" exec 0 setsid "${moto}" -H 10.250.0.1 -p 5000 </dev/null >moto.log 2>&1 &
    bash "${cl}" exec 0 "${repo}/.venv/bin/python" - "${store}" "${work}/data" <<'PY' ||
import boto3, glob, os, socket, sys, time
url, data = sys.argv[1], sys.argv[2]
for _ in range(300):
    try:
        socket.create_connection(("10.250.0.1", 5000), timeout=0.2).close()
        break
    except OSError:
        time.sleep(0.1)
s3 = boto3.client("s3", endpoint_url=url, region_name="us-east-1")
s3.create_bucket(Bucket="acts")
for f in sorted(glob.glob(os.path.join(data, "shard_*.h5"))):
    s3.upload_file(f, "acts", "data/" + os.path.basename(f))
PY
        die "could not fill the store in host 0 (moto.log)"
    run_on 2 s3-2h one.yaml --set parallel.mode=data_parallel --set data.path=s3://acts/data/ \
        --set data.s3_endpoint="${store}" || bad "the run from the store on 2 hosts exited $?"
    bitwise s3-2h dp-2h
else
    say "no .venv (bash tools/setup-venv.sh): the S3 case skipped"
fi

# --- a host lost mid-run -------------------------------------------------------------------------
# The uninterrupted job, then the same job with host 1 killed once two checkpoints are committed.
SAETRAIN_NO_SHM=1 run_on 1 lost-ref long.yaml --set parallel.mode=data_parallel ||
    bad "the reference long run exited $?"
# fault_mid_run NAME PID BOUND WHAT COMMAND...: once the job PID (run directory NAME) is past
# step 60, COMMAND (the fault); the job must then end with a non-zero status within BOUND
# seconds. Sets `ended`, the seconds it took.
fault_mid_run() {
    local name=$1 pid=$2 bound=$3 what=$4 t rc=0
    shift 4
    poll 60 past_step "${name}" 60 || die "${name} did not get past step 60"
    t=$(date +%s.%N)
    "$@"
    wait "${pid}" || rc=$?
    ended=$(echo "$(date +%s.%N) - ${t}" | bc)
    [ "${rc}" -ne 0 ] || bad "${name} exited 0 after ${what}"
    say "${what}: ${name} ended in ${ended} s (exit ${rc}; bound ${bound} s)"
    awk -v e="${ended}" -v b="${bound}" 'BEGIN { exit !(e <= b) }' ||
        bad "${name} took ${ended} s to end after ${what} (> ${bound})"
}
SAETRAIN_NO_SHM=1 run_on 2 lost long.yaml --set parallel.mode=data_parallel &
# Bound: parallel.timeout_s 10 + 5.
fault_mid_run lost $! 15 "host 1 killed" bash "${cl}" kill 1
grep -q "saetrain-h1" lost.log || bad "lost.log does not name the host lost (saetrain-h1)"
# resume_on_h0 NAME: host 1 is gone; the same command on host 0 alone resumes the run from its
# last committed checkpoint, to the bits of the run that lost nothing.
resume_on_h0() {
    SAETRAIN_NO_SHM=1 bash "${cl}" exec 0 timeout 300 mpirun --host saetrain-h0:4 -n 4 \
        "${apps}/saetrain" long.yaml --threads 1 --set run.out_dir="${work}/$1" \
        --set parallel.mode=data_parallel >"$1-resume.log" 2>&1 || bad "the resumed $1 exited $?"
    grep -q "^resumed from the checkpoint at step" "$1-resume.log" ||
        bad "the run on one host did not resume ($1-resume.log)"
    bitwise "$1" lost-ref
}
resume_on_h0 lost

# --- the link cut mid-run ----------------------------------------------------------------------
# Both hosts live on, but nothing crosses the link (host 1's end taken down): no peer hangs up, so
# only timeouts can end the job. The cluster's TCP keepalive for mpirun's daemons (oob_tcp_*,
# from `env`) finds the dead link in about 4 s; saetrain's watchdog (parallel.timeout_s) ends a
# rank left waiting in a collective in any case.
bash "${cl}" stop
CLUSTER_LOCAL_SHARE="${work}:${build}:${repo}" bash "${cl}" start >/dev/null
SAETRAIN_NO_SHM=1 run_on 2 cut long.yaml --set parallel.mode=data_parallel &
fault_mid_run cut $! 15 "the link cut" bash "${cl}" exec 1 ip link set eth0 down
# Host 1's own processes end too (its daemon lost mpirun): none of saetrain is left on it.
left=""
for _ in $(seq 1 150); do
    left=$(bash "${cl}" exec 1 sh -c 'pgrep -x saetrain || pgrep -x orted || true')
    [ -z "${left}" ] && break
    sleep 0.1
done
[ -z "${left}" ] || bad "host 1 still runs $(echo "${left}" | wc -l) process(es) of the job"
resume_on_h0 cut

# --- Slurm across the two hosts ----------------------------------------------------------------
# A slurmd in each host, slurmctld in host 0 (tools/slurm-local.sh with SLURM_LOCAL_CLUSTER):
# slurm/dp-multinode.sbatch as users submit it, on 2 nodes x 2 tasks (PMIx), stopped by the
# time-limit signal (USR1 to every task, as --signal=USR1@180 sends it; from scancel --signal here,
# for time), requeued by the script and resumed on both nodes to the bits of the same job under
# mpirun that was never stopped (both take the node split across the two nodes).
slurm_case() {
    local sl="${work}/slurm" job out
    if ! command -v sbatch >/dev/null 2>&1 || ! command -v slurmd >/dev/null 2>&1; then
        say "Slurm not installed (Debian's slurm-wlm, munge): its case skipped"
        return
    fi
    SLURM_LOCAL_CLUSTER="${CLUSTER_LOCAL_DIR}" SLURM_LOCAL_PORT=$((17000 + ($$ % 4000) * 2)) \
        bash "${repo}/tools/slurm-local.sh" start "${sl}" >slurm-start.log 2>&1 ||
        die "tools/slurm-local.sh start on the two hosts failed: $(tail -n 1 slurm-start.log)"
    export SLURM_CONF=${sl}/slurm.conf
    h0() { bash "${cl}" exec 0 "$@"; }
    job_state() { h0 scontrol show job "$1" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }
    in_state() { [ "$(job_state "$1")" = "$2" ]; }
    idle_again() {
        in_state "$1" PENDING && [ "$(h0 sinfo -h -N -o %T 2>/dev/null | grep -c '^idle$')" = 2 ]
    }
    run_on 2 long-2h long.yaml --set parallel.mode=data_parallel ||
        bad "the long run on 2 hosts exited $?"
    mkdir -p slurm && cp "${repo}/slurm/dp-multinode.sbatch" "${repo}/slurm/common.sh" slurm/
    job=$(SAETRAIN="${apps}/saetrain" h0 sbatch --parsable --gpus-per-node=0 --nodes=2 \
        --ntasks-per-node=2 --cpus-per-task=1 --output="${work}/dp-%j.out" \
        slurm/dp-multinode.sbatch long.yaml --threads 1 --set run.out_dir="${work}/slurm-dp")
    out="${work}/dp-${job}.out"
    say "sbatch --nodes=2 slurm/dp-multinode.sbatch: job ${job}"
    poll 120 past_step slurm-dp 60 || die "job ${job} did not train past step 60: $(job_state "${job}")"
    h0 scancel --signal=USR1 "${job}" || die "job ${job} ended before its SIGUSR1"
    poll 60 grep -q "requeueing job ${job}" "${out}" ||
        die "job ${job} did not stop and requeue itself on SIGUSR1: $(job_state "${job}")"
    # A requeued job is held 120 s (BeginTime): start it now, once the nodes are idle, and 2 s
    # later (slurmd refuses a credential from the second the old step ended).
    poll 60 idle_again "${job}" || true
    sleep 2
    h0 scontrol update jobid="${job}" StartTime=now
    poll 120 in_state "${job}" COMPLETED || bad "job ${job} did not complete: $(job_state "${job}")"
    grep -q "^job ${job}: 4 ranks on 2 node(s)" "${out}" || bad "job ${job} did not run on 2 nodes"
    [ "$(grep -c "^node saetrain-h[01]: 2 rank(s)" "${out}")" -ge 4 ] ||
        bad "the job's runs did not place 2 ranks on each host ($(basename "${out}"))"
    grep -q "^resumed from the checkpoint at step" "${out}" || bad "job ${job} did not resume"
    grep -q "each of 2 nodes' memory" "${out}" || bad "job ${job} did not split its update per node"
    bitwise slurm-dp long-2h
    scaling_study
    node_lost_under_srun
    SLURM_LOCAL_CLUSTER="${CLUSTER_LOCAL_DIR}" bash "${repo}/tools/slurm-local.sh" stop "${sl}" \
        >/dev/null
    unset SLURM_CONF
}
# The scaling study on the two nodes (slurm/scaling-study.sbatch), one task a node as each host
# has one of the machine's 2 cores: data parallel on 1 and 2 GPUs (ranks) and the grid's 1 and 2
# nodes, beside sae-perfmodel's prediction from this machine's measured figures: the link's
# all-reduce bus bandwidth (bench_allreduce), one thread's GEMM rate (bench_step) and its memory
# copy rate. No timing is asserted; the table is printed, and each point must have run.
scaling_study() {
    local link gemm mem job out predict
    link=$(h0 mpirun --host saetrain-h0:1,saetrain-h1:1 -n 2 "${build}/bench/bench_allreduce" |
        sed -n 's/^RESULT bus_GBps=\([0-9.]*\).*/\1/p')
    gemm=$("${build}/bench/bench_step" --d-model 64 --latents 512 --k 8 --batch 1024 --threads 1 \
        --arch topk --json | tail -n 1 |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["gemm_GFLOPs"])')
    mem=$(python3 -c 'import time
b = bytearray(200_000_000)
t = time.perf_counter(); c = bytes(b); t = time.perf_counter() - t
print(f"{2 * len(b) / t / 1e9:.2f}")')
    say "measured: all-reduce bus bandwidth ${link} GB/s over the link; GEMM ${gemm} GFLOP/s a" \
        "thread; memory copy ${mem} GB/s"
    "${apps}/sae-synth" --out study-data --d-model 64 --features 512 --rows 60000 --shards 4 \
        --seed 5 >/dev/null
    cat >study.yaml <<EOF
data: {path: ${work}/study-data, batch_size: 1024, shuffle_buffer_rows: 8192, epochs: 12}
sae: {arch: topk, expansion: 8, k: 8}
train: {lr: 0.004, warmup_steps: 4}
log: {every_steps: 50}
parallel: {timeout_s: 20}
EOF
    cp "${repo}/slurm/scaling-study.sbatch" slurm/
    mkdir -p tools && cp "${repo}/tools/scaling_table.py" tools/
    predict="${apps}/sae-perfmodel --arch topk --d-model 64 --n-latents 512 --k 8"
    predict+=" --bytes-per-element 4 --tflops $(echo "${gemm} / 1000" | bc -l) --efficiency 1"
    predict+=" --hbm-gbps ${mem} --pcie-gbps 1000 --disk-gbps 10 --nic-gbps ${link}"
    job=$(SAETRAIN="${apps}/saetrain" NODES="1 2" SHARDS=1 BATCHES=1024 PREDICT="${predict}" \
        h0 sbatch --parsable --gpus-per-node=0 --nodes=2 --ntasks-per-node=1 --cpus-per-task=1 \
        --output="${work}/scaling-%j.out" slurm/scaling-study.sbatch study.yaml --threads 1)
    out="${work}/scaling-${job}.out"
    poll 300 in_state "${job}" COMPLETED ||
        bad "the scaling study did not complete: $(job_state "${job}")"
    sed -n '/^ *ranks /,$p' "${out}"
    for point in gpus-1 gpus-2 n1-s1-r1-b1024 n2-s1-r2-b1024; do
        [ -f "runs/scaling-${job}/${point}/summary.csv" ] || bad "the study's ${point} did not run"
    done
    grep -q "pred tok/s/GPU" "${out}" || bad "no prediction beside the study's table"
}
# A node lost under srun (the last Slurm case: host 1 stays lost): host 0's ranks wait in a
# collective until saetrain's watchdog ends them (parallel.timeout_s), then srun waits Slurm's
# KillWait (10 s here) for host 1's tasks before it gives the step up. The same job on host 0
# alone (mpirun) resumes from the last committed checkpoint to the bits of the run that lost
# nothing (both with SAETRAIN_NO_SHM=1, so one host and two sum alike).
node_lost_under_srun() {
    SAETRAIN_NO_SHM=1 h0 timeout 300 srun -N 2 --ntasks-per-node=2 --mpi=pmix "${apps}/saetrain" \
        long.yaml --threads 1 --set run.out_dir="${work}/srun-lost" \
        --set parallel.mode=data_parallel >srun-lost.log 2>&1 &
    # Bound: parallel.timeout_s 10 + KillWait 10 + 5.
    fault_mid_run srun-lost $! 25 "node saetrain-h1 lost under srun" bash "${cl}" kill 1
    grep -q "saetrain: error: rank [0-9] (saetrain-h0): .* has waited" srun-lost.log ||
        bad "no rank on saetrain-h0 said what it waited for (srun-lost.log)"
    resume_on_h0 srun-lost
}
bash "${cl}" stop
CLUSTER_LOCAL_SHARE="${work}:${build}:${repo}" bash "${cl}" start >/dev/null
slurm_case

# --- stopped, nothing left ------------------------------------------------------------------------
t_stop=$(date +%s.%N)
bash "${cl}" stop
say "the cluster stopped in $(echo "$(date +%s.%N) - ${t_stop}" | bc) s"
[ -z "$(pgrep -f "${CLUSTER_LOCAL_DIR}" || true)" ] || bad "processes of the cluster outlived stop"
grep -q " ${work}" /proc/self/mountinfo && bad "a mount under ${work} outlived stop"
ls "${CLUSTER_LOCAL_DIR}"/h*.pid >/dev/null 2>&1 && bad "stop left a host's pid file"

[ "${fail}" -eq 0 ] || exit 1
say "all passed"
