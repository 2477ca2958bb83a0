# shellcheck shell=bash
# slurm/common.sh — what the batch scripts share; sourced from the submit directory (the
# repository root) by slurm/*.sbatch.
#
#   SAETRAIN    the binary: $SAETRAIN, else the CUDA build, else the CPU build
#   CPU_BIND    srun's binding options: --cpu-bind=cores, or none where the cluster has no task
#               plugin to bind with (srun would warn "lacks support for cpu binding")
#   ARGS        the script's saetrain arguments; in a requeued job (SLURM_RESTART_COUNT > 0)
#               --overwrite is dropped with one line, so a requeue resumes the run instead of
#               starting it over
#   requeue_if_stopped RC   exit code 75 (a stop signal, a checkpoint committed): requeue the job
#               so that it resumes

if [ -z "${SAETRAIN:-}" ]; then
    SAETRAIN=./build/cuda/apps/saetrain
    [ -x "${SAETRAIN}" ] || SAETRAIN=./build/cpu/apps/saetrain
fi

# shellcheck disable=SC2034  # CPU_BIND is used by the scripts that source this file
if scontrol show config 2>/dev/null | grep -Eq '^TaskPlugin +=.*task/none'; then
    CPU_BIND=()
else
    CPU_BIND=(--cpu-bind=cores)
fi

ARGS=()
for a in "$@"; do
    if [ "${a}" = "--overwrite" ] && [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then
        echo "saetrain job ${SLURM_JOB_ID}: requeued (restart ${SLURM_RESTART_COUNT}): ignoring" \
            "--overwrite so that the run resumes instead of starting over"
        continue
    fi
    ARGS+=("${a}")
done

requeue_if_stopped() {
    if [ "$1" -eq 75 ]; then
        echo "saetrain stopped by a signal with a checkpoint committed; requeueing job" \
            "${SLURM_JOB_ID} to resume"
        scontrol requeue "${SLURM_JOB_ID}"
    fi
}
