#!/usr/bin/env bash
# test_slurm.sh BUILD_DIR — saetrain the way Slurm users run it, on a one-node Slurm cluster this
# test starts and stops (tools/slurm-local.sh): srun against mpirun, the sweep batch script
# stopped by the time-limit signal and by preemption and requeued until COMPLETE, a rank
# SIGKILLed under srun, and the scaling study's table. ctest label `slurm`; exit 77 (skipped)
# where Slurm is not installed.
#
# The batch scripts run as users submit them, with the options a CPU partition on a site
# without accounts needs (--gpus-per-node=0; account and partition are the site's defaults).
# Two things are shortened only for time: the time limit is one minute (and in case 2 the stop
# signals come from scancel --signal, which sends the same signal to the same steps), and a
# requeued job's start is moved to now (Slurm holds a requeued job for 120 s).
# No wait is a fixed guess at this machine's speed: every wait for training to progress is the
# measured time of the same work run outside Slurm (the reference runs below) times a margin,
# so the test holds on a machine shared with other jobs, only slower.
set -euo pipefail

build=$(cd "${1:?usage: test_slurm.sh BUILD_DIR}" && pwd)
repo=$(cd "$(dirname "$0")/../.." && pwd)
apps=${build}/apps
for exe in srun sbatch munged slurmctld slurmd; do
    if ! command -v "${exe}" >/dev/null 2>&1; then
        echo "test_slurm: ${exe} not installed (Debian's slurm-wlm, munge): skipped"
        exit 77
    fi
done

work=$(mktemp -d "${TMPDIR:-/tmp}/saetrain-slurm-test.XXXXXX")
cluster=${work}/cluster
fail=0
# show_outputs: the last lines of every job's output and every run's log (on a failure).
show_outputs() {
    local f
    for f in "${work}"/*.out "${work}"/*.log; do
        [ -f "${f}" ] || continue
        echo "--- ${f##*/}"
        tail -n 20 "${f}"
    done
}
cleanup() {
    local rc=$?  # a command that failed under set -e ends the script with its status
    bash "${repo}/tools/slurm-local.sh" stop "${cluster}" >/dev/null 2>&1 || true
    if [ "${fail}" -eq 0 ] && [ "${rc}" -eq 0 ]; then
        rm -rf "${work}"
    else
        show_outputs
        echo "test_slurm: kept ${work} (exit ${rc})"
    fi
}
trap cleanup EXIT
test_name=test_slurm
# say, bad, die, bitwise, poll, past_step
source "${repo}/test/shell/common.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 \
    OPENBLAS_NUM_THREADS=1 HDF5_USE_FILE_LOCKING=FALSE
# 64 CPUs on the node (more than the machine has), so that the sweep script's 8 tasks x 8 CPUs
# run unchanged; ports of this process's own, so that two test runs on one machine do not meet.
SLURM_LOCAL_CPUS=64 SLURM_LOCAL_PORT=$((17000 + ($$ % 4000) * 2)) \
    bash "${repo}/tools/slurm-local.sh" start "${cluster}"
export SLURM_CONF=${cluster}/slurm.conf

cd "${work}"
"${apps}/sae-synth" --out data --d-model 16 --features 32 --rows 6000 --shards 4 --seed 3 \
    >/dev/null
# write_config FILE K_LIST EXPANSION_LIST EPOCHS
write_config() {
    cat >"$1" <<EOF
data: {path: ${work}/data, batch_size: 128, shuffle_buffer_rows: 1024, epochs: $4}
sae: {arch: topk, expansion: $3, k: $2}
train: {lr: 0.004, warmup_steps: 4}
log: {every_steps: 20}
checkpoint: {every_steps: 50, keep: 2}
parallel: {timeout_s: 10}
EOF
}
write_config sweep4.yaml "[2, 4, 6, 8]" 2 2
write_config one.yaml 4 2 2
# 30 epochs (1,404 steps): a stop signal sent once training is seen to progress lands well
# before the end of the run.
write_config sweep8.yaml "[2, 4, 6, 8]" "[2, 4]" 30


# --- 1. srun against mpirun ------------------------------------------------------------------
srun_s=0
for mode in sweep data_parallel; do
    cfg=sweep4.yaml
    [ "${mode}" = data_parallel ] && cfg=one.yaml
    t_mode=$(date +%s)
    srun -n 4 --mpi=pmix "${apps}/saetrain" "${cfg}" --threads 1 \
        --set parallel.mode="${mode}" --set run.out_dir="srun-${mode}" >"srun-${mode}.log" 2>&1 ||
        bad "srun -n 4 (${mode}) exited $? (srun-${mode}.log)"
    [ "${mode}" = sweep ] && srun_s=$(($(date +%s) - t_mode))
    mpirun -np 4 --oversubscribe "${apps}/saetrain" "${cfg}" --threads 1 \
        --set parallel.mode="${mode}" --set run.out_dir="mpirun-${mode}" >"mpirun-${mode}.log" 2>&1 ||
        bad "mpirun -np 4 (${mode}) exited $?"
    bitwise "srun-${mode}" "mpirun-${mode}"
done

# --- 2. the sweep script: stopped twice, requeued, COMPLETE ----------------------------------
job_state() { scontrol show job "$1" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }
in_state() { [ "$(job_state "$1")" = "$2" ]; }
# ended JOB: the job is no longer running (requeued, or over).
ended() {
    case "$(job_state "$1")" in
    PENDING | COMPLETED | FAILED | TIMEOUT | CANCELLED) ;;
    *) false ;;
    esac
}
requeued_and_node_idle() {
    in_state "$1" PENDING && [ "$(sinfo -h -N -o %T 2>/dev/null | head -n 1)" = idle ]
}
wait_for() { poll "$3" in_state "$1" "$2"; }  # wait_for JOB STATE SECONDS
# patience: seconds to wait for progress that the reference sweep made in ref_s seconds.
patience=60
wait_steps() { poll "${patience}" past_step "$1" "$2"; }  # wait_steps DIR N
# release JOB: a requeued job is held 120 s (BeginTime); start it sooner, once it is pending and
# the node idle, and 2 s after that: slurmd revokes the job's credential when the old run ends,
# to the second, and refuses a launch whose credential is from that same second ("Job
# credential revoked": the job fails). Slurm's own 120 s hold is what avoids this for users.
release() {
    poll 60 requeued_and_node_idle "$1" || true
    sleep 2
    scontrol update jobid="$1" StartTime=now
}

t_ref=$(date +%s)
mpirun -np 8 --oversubscribe "${apps}/saetrain" sweep8.yaml --threads 1 \
    --set run.out_dir=ref-sweep8 >ref-sweep8.log 2>&1 || bad "the reference sweep exited $?"
ref_s=$(($(date +%s) - t_ref))
# A requeued job starts again (srun, MPI, the data) and resumes: twice the whole reference run,
# plus a minute for Slurm's own scheduling, bounds any wait for its progress.
patience=$((60 + 2 * ref_s))
say "the reference sweep took ${ref_s} s: waits for progress up to ${patience} s"
mkdir -p slurm && cp "${repo}/slurm/sweep-1node.sbatch" "${repo}/slurm/common.sh" slurm/
t0=$(date +%s)
job=$(SAETRAIN="${apps}/saetrain" sbatch --parsable --gpus-per-node=0 --output=sweep-%j.out \
    slurm/sweep-1node.sbatch sweep8.yaml --threads 1 --set run.out_dir=slurm-sweep8 --overwrite)
say "sbatch slurm/sweep-1node.sbatch: job ${job}"
# stop JOB SIGNAL: send SIGNAL to the job's steps (a job that has ended already is a failure).
stop() {
    scancel --signal="$2" "$1" 2>&1 || die "job $1 ended before its SIG$2 came: $(job_state "$1")"
}
# First stop: the time-limit signal (USR1 to every task of the step, as --signal=USR1@T sends it).
wait_steps slurm-sweep8 0 || die "job ${job} did not start training: $(job_state "${job}")"
stop "${job}" USR1
poll 60 grep -q "stopped by a signal after" "sweep-${job}.out" ||
    die "job ${job} did not stop on SIGUSR1: $(job_state "${job}")"
stopped_at=$(grep -o 'stopped by a signal after [0-9]* steps' "sweep-${job}.out" |
    head -n 1 | grep -o '[0-9]\+')
release "${job}"
# Second stop: preemption (SIGTERM to the steps), once the requeued run has trained 40 steps
# past the first stop (its checkpoint; the resumed run drops the metrics lines after it).
wait_for "${job}" RUNNING 60 || die "job ${job} was not started again after its requeue"
wait_steps slurm-sweep8 $((stopped_at + 40)) || die "job ${job} did not train after its first requeue"
stop "${job}" TERM
release "${job}"
wait_for "${job}" RUNNING 60 || die "job ${job} was not started again after its second requeue"
wait_for "${job}" COMPLETED $((300 + patience)) || bad "job ${job} did not complete: $(job_state "${job}")"
job_s=$(($(date +%s) - t0))
say "job ${job}: $(job_state "${job}") after ${job_s} s"
# The same sweep under srun, stops and restarts included, runs many times slower than under
# mpirun on an oversubscribed machine (8 ranks bound by Slurm on 2 cores): from here on a wait
# for progress also allows for the whole of that job's measured time.
patience=$((patience + job_s))
out=sweep-${job}.out
stops=$(grep -c "requeueing job ${job}" "${out}" || true)
dropped=$(grep -c "ignoring --overwrite" "${out}" || true)
resumed=$(grep -c "resumed from the checkpoint" "${out}" || true)
say "job ${job}: ${stops} stop(s) requeued, ${resumed} resume line(s), --overwrite dropped ${dropped} time(s)"
[ "${stops}" -eq 2 ] || bad "expected 2 requeues, saw ${stops} (${out})"
[ "${dropped}" -eq 2 ] || bad "expected --overwrite dropped twice, saw ${dropped} (${out})"
[ "${resumed}" -ge 2 ] || bad "expected the requeued jobs to resume (${out})"
[ -f slurm-sweep8/COMPLETE ] || bad "slurm-sweep8 has no COMPLETE"
bitwise slurm-sweep8 ref-sweep8

# --- 3. a real time limit, then preemption by a plain scancel and scontrol requeue ---------
# --time=1 --signal=USR1@40: Slurm signals the steps 20-40 s into the job (its timer checks
# about every 30 s), saetrain stops with a checkpoint and the script requeues. The requeued job
# gets 10 minutes, is cancelled outright mid-run (scancel: SIGTERM, then SIGKILL after
# KillWait), requeued by hand and completes.
job=$(SAETRAIN="${apps}/saetrain" sbatch --parsable --gpus-per-node=0 --time=1 \
    --signal=USR1@40 --output=limit-%j.out slurm/sweep-1node.sbatch sweep8.yaml --threads 1 \
    --set run.out_dir=slurm-limit)
say "sbatch --time=1 --signal=USR1@40 slurm/sweep-1node.sbatch: job ${job}"
wait_for "${job}" RUNNING 60 || bad "job ${job} did not start: $(job_state "${job}")"
poll 90 ended "${job}" || true
if grep -q "requeueing job ${job}" "limit-${job}.out"; then
    say "job ${job}: stopped by the time-limit signal and requeued: $(grep -o 'stopped by a signal after [0-9]* steps' "limit-${job}.out")"
    scontrol update jobid="${job}" TimeLimit=10
    release "${job}"
    wait_for "${job}" RUNNING 60 || bad "job ${job} was not started again after its requeue"
    # Training again: 20 steps past where the signal stopped it (then it is cancelled mid-run).
    stopped_at=$(grep -o 'stopped by a signal after [0-9]* steps' "limit-${job}.out" |
        head -n 1 | grep -o '[0-9]\+')
    wait_steps slurm-limit $((stopped_at + 20)) || bad "job ${job} did not train after its requeue"
    scancel "${job}"
    wait_for "${job}" CANCELLED 60 || bad "job ${job} was not cancelled: $(job_state "${job}")"
    scontrol requeue "${job}"
    release "${job}"
    wait_for "${job}" COMPLETED $((300 + patience)) ||
        bad "job ${job} did not complete after scancel and requeue"
    say "job ${job}: time limit, requeue, scancel, scontrol requeue: $(job_state "${job}")"
else
    # A machine fast enough to train the sweep before the signal: the time limit is not seen.
    say "job ${job}: $(job_state "${job}") before the time-limit signal came; not tested"
    wait_for "${job}" COMPLETED "${patience}" ||
        bad "job ${job} ended $(job_state "${job}") (limit-${job}.out)"
fi
bitwise slurm-limit ref-sweep8

# --- 4. a rank SIGKILLed under srun ends the job -----------------------------------------------
t0=$(date +%s.%N)
rc=0
SAETRAIN_FAULT=2:30:KILL timeout 120 srun -n 4 --mpi=pmix "${apps}/saetrain" sweep4.yaml \
    --threads 1 --set run.out_dir=killed >killed.log 2>&1 || rc=$?
secs=$(echo "$(date +%s.%N) - ${t0}" | bc)
say "rank 2 SIGKILLed under srun: exit ${rc} after ${secs} s"
if [ "${rc}" -eq 0 ] || [ "${rc}" -eq 124 ]; then bad "srun exited ${rc} (124: hung) (killed.log)"; fi
# Slurm's PMIx plugin ends the step as soon as a task dies; srun names it.
grep -q "task 2: Killed" killed.log || bad "no line names task 2 (killed.log)"
# The whole run from start to end, kill included, within the watchdog (10 s) + 5 s of the kill,
# beyond the time the same sweep took to complete under srun in case 1 (start-up and training
# on this machine as loaded now), and a margin of 20 s.
limit=$((srun_s + 35))
[ "$(echo "${secs} < ${limit}" | bc)" -eq 1 ] || bad "the job took ${secs} s to end (limit ${limit} s)"
grep -E "task 2|error" killed.log | head -n 3

# --- 5. the scaling study's table on the CPU backend ----------------------------------------
# 4 tasks on the 2 cores, one thread each: data parallel on 1, 2 and 4 ranks, and the hybrid
# grid at 1 and 2 latent shards with 1, 2 and 4 replicas (8 ranks are skipped). Each run trains
# 1,440,000 rows (about 2 s), long enough for its tokens/s to measure the steps and not the
# start-up; the ratios of 4 ranks to 2 on the 2 cores are printed (no timing is asserted).
"${apps}/sae-synth" --out study-data --d-model 64 --features 512 --rows 60000 --shards 4 \
    --seed 5 >/dev/null
cat >study.yaml <<EOF
data: {path: ${work}/study-data, batch_size: 1024, shuffle_buffer_rows: 8192, epochs: 24}
sae: {arch: topk, expansion: 8, k: 8}
train: {lr: 0.004, warmup_steps: 4}
log: {every_steps: 50}
parallel: {timeout_s: 20}
EOF
cp "${repo}/slurm/scaling-study.sbatch" slurm/
mkdir -p tools && cp "${repo}/tools/scaling_table.py" tools/
job=$(SAETRAIN="${apps}/saetrain" GPU_COUNTS=1 NODES=1 SHARDS="1 2" REPLICAS="1 2 4" \
    BATCHES=1024 sbatch --parsable --gpus-per-node=0 --nodes=1 --ntasks-per-node=4 \
    --cpus-per-task=1 --output=scaling-%j.out slurm/scaling-study.sbatch study.yaml --threads 1)
wait_for "${job}" COMPLETED $((300 + patience)) || bad "the scaling study did not complete: $(job_state "${job}")"
sed -n '/^===/d; /tokens\/s/,$p' "scaling-${job}.out"
grep -q "tokens/s" "scaling-${job}.out" || bad "no table in scaling-${job}.out"
# tokens_per_s DIR: the first SAE's whole-run tokens/s in DIR/summary.csv (0 when absent).
tokens_per_s() {
    python3 -c 'import csv, sys; print(next(csv.DictReader(open(sys.argv[1])))["tokens_per_s"])' \
        "$1/summary.csv" 2>/dev/null || echo 0
}
for pair in "data parallel:gpus-2:gpus-4" "hybrid, 1 latent shard:n1-s1-r2-b1024:n1-s1-r4-b1024" \
    "hybrid, 2 latent shards:n1-s2-r1-b1024:n1-s2-r2-b1024"; do
    IFS=: read -r what two four <<<"${pair}"
    a=$(tokens_per_s "runs/scaling-${job}/${two}")
    b=$(tokens_per_s "runs/scaling-${job}/${four}")
    if [ "${a}" = 0 ] || [ "${b}" = 0 ]; then bad "no tokens/s for ${what} (${two}, ${four})"; fi
    say "$(printf '%-24s 2 ranks %8.0f tok/s, 4 ranks %8.0f tok/s on the 2 cores: ratio %.2f' \
        "${what}" "${a}" "${b}" "$(echo "${b} / (${a} + 0.001)" | bc -l)")"
done

[ "${fail}" -eq 0 ] || exit 1
say "PASS"
