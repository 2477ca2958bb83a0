#!/usr/bin/env bash
# Sharing cores (one run, ratios): the same training run alone and beside a competing job that
# keeps every core busy (one busy loop per core), and the tokens/s of 2 and of 4 ranks on the
# machine's cores (sweep, data-parallel and hybrid: latent shards x replicas), each with saetrain's waits (its defaults) and with
# waits that spin (libgomp's default spin count, GOMP_SPINCOUNT=300000, and MPI's busy polling,
# OMPI_MCA_mpi_yield_when_idle=0), and prints each ratio beside its target. The run beside the
# busy loops also runs on 2 fixed threads (--fixed-threads) beside its default, threads that
# follow the cores other processes leave (cores.h, CoreShare).
#   bench/sharing.sh [BUILD_DIR=build/cpu] [WORK_DIR=$TMPDIR/saetrain-sharing]
# Takes 3-5 minutes on 2 cores. Run it on an otherwise idle machine: it makes its own load.
set -euo pipefail
build=${1:-build/cpu}
work=${2:-${TMPDIR:-/tmp}/saetrain-sharing}
bin="${build}/apps"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cores=$(nproc)
rm -rf "${work}" && mkdir -p "${work}"
"${bin}/sae-synth" --out "${work}/data" --d-model 64 --features 512 --rows 60000 --shards 2 \
    --seed 1 > /dev/null

# A config: out_dir, epochs, and extra keys.
config() {
    local name=$1 epochs=$2 extra=${3:-}
    cat > "${work}/${name}.yaml" <<EOF
run: {out_dir: ${work}/runs/${name}}
data: {path: ${work}/data, batch_size: 1024, epochs: ${epochs}, shuffle_buffer_rows: 8192}
sae: {arch: topk, expansion: 8, k: 8}
train: {lr: 0.002}
log: {every_steps: 1000}
checkpoint: {every_steps: 100000}
${extra}
EOF
    echo "${work}/${name}.yaml"
}

# Seconds a command takes (wall), its output in WORK/last.log.
seconds() {
    local t0 t1
    t0=$(date +%s.%N)
    "$@" > "${work}/last.log" 2>&1 || { cat "${work}/last.log"; exit 1; }
    t1=$(date +%s.%N)
    python3 -c "print(f'{${t1} - ${t0}:.2f}')"
}

# The training loop's seconds on rank 0 in WORK/last.log ("rank 0 time: X s"): start-up and
# teardown left out (starting 4 MPI processes on 2 cores takes longer than starting 2, and is
# not tokens/s).
loop_seconds() { sed -n 's/^rank 0 time: \([0-9.]*\) s.*/\1/p' "${work}/last.log"; }

busy=()
start_busy() { for _ in $(seq "${cores}"); do (while :; do :; done) & busy+=($!); done; }
stop_busy() { [ ${#busy[@]} -gt 0 ] && kill "${busy[@]}" 2>/dev/null; wait "${busy[@]}" 2>/dev/null || true; busy=(); }
trap stop_busy EXIT

spin=(env GOMP_SPINCOUNT=300000 OMPI_MCA_mpi_yield_when_idle=0)
mine=(env)

echo "sharing cores: ${cores} core(s), $(date -u +%Y-%m-%dT%H:%MZ), build ${build}"
echo
echo "1. a 2-thread TopK run (60,000 rows x 64, x8, k 8, 8 epochs), alone and beside ${cores} busy loop(s)"
cfg=$(config one 8)
# The spinning waits on 2 fixed threads; saetrain's waits on 2 fixed threads (--fixed-threads);
# saetrain's defaults: its waits, and threads that follow the cores the busy loops leave. The
# machine's own noise moves a run alone by a fifth here: saetrain's two are timed 3 times each,
# alone and beside the loops in turn, and the medians compared (the spinning one, 10-50x, once).
median() { python3 -c "import statistics, sys; print(statistics.median(float(v) for v in sys.argv[1:]))" "$@"; }
for variant in spin fixed mine; do
    if [ "${variant}" = spin ]; then wv=("${spin[@]}") extra=(--fixed-threads) label="spinning waits, 2 threads   " reps=1
    elif [ "${variant}" = fixed ]; then wv=(env) extra=(--fixed-threads) label="saetrain waits, 2 threads   " reps=3
    else wv=(env) extra=() label="saetrain waits and threads  " reps=3; fi
    alones=() shareds=()
    for _ in $(seq "${reps}"); do
        alones+=("$(seconds "${wv[@]}" "${bin}/saetrain" "${cfg}" --overwrite --threads 2 "${extra[@]}")")
        start_busy
        shareds+=("$(seconds "${wv[@]}" "${bin}/saetrain" "${cfg}" --overwrite --threads 2 "${extra[@]}")")
        stop_busy
    done
    alone=$(median "${alones[@]}") shared=$(median "${shareds[@]}")
    python3 -c "print(f'   ${label}alone {${alone}:6.2f} s   beside the busy loops {${shared}:6.2f} s   '
                      f'ratio {${shared}/${alone}:5.2f}x   (target <= 2.5x)'
                      + ('   runs: ${alones[*]} / ${shareds[*]}' if ${reps} > 1 else ''))"
done
echo
echo "2. tokens/s of 2 and 4 ranks on ${cores} core(s) (total over the job's training loop; one thread per rank)"
for mode in sweep data_parallel hybrid; do
    if [ "${mode}" = hybrid ]; then
        # One SAE's latents in 2 shards, 1 then 2 replicas of the pair.
        two=$(config hy2 4 "parallel: {mode: hybrid, latent_shards: 2, replicas: 1}")
        four=$(config hy4 4 "parallel: {mode: hybrid, latent_shards: 2, replicas: 2}")
        two_args=() four_args=()
        two_tokens=$((60000 * 4)) four_tokens=$((60000 * 4))
    elif [ "${mode}" = sweep ]; then
        two=$(config sweep2 4 "parallel: {mode: sweep}")
        four=$(config sweep4 4 "parallel: {mode: sweep}")
        two_args=(--set "sae.k=[8,9]") four_args=(--set "sae.k=[8,9,10,11]")
        two_tokens=$((2 * 60000 * 4)) four_tokens=$((4 * 60000 * 4))
    else
        two=$(config dp2 4 "parallel: {mode: data_parallel}")
        four=$(config dp4 4 "parallel: {mode: data_parallel}")
        two_args=() four_args=()
        two_tokens=$((60000 * 4)) four_tokens=$((60000 * 4))
    fi
    for waits in spin mine; do
        declare -n w=${waits}
        # The medians of 3 runs each with saetrain's waits (the spinning ones, 2-7x apart, once).
        reps=$([ "${waits}" = spin ] && echo 1 || echo 3)
        t2s=() t4s=() w2s=() w4s=()
        for _ in $(seq "${reps}"); do
            w2s+=("$(seconds "${w[@]}" mpirun --oversubscribe -np 2 "${bin}/saetrain" "${two}" \
                     --overwrite --threads 1 "${two_args[@]}")")
            t2s+=("$(loop_seconds)")
            w4s+=("$(seconds "${w[@]}" mpirun --oversubscribe -np 4 "${bin}/saetrain" "${four}" \
                     --overwrite --threads 1 "${four_args[@]}")")
            t4s+=("$(loop_seconds)")
        done
        t2=$(median "${t2s[@]}") t4=$(median "${t4s[@]}")
        w2=$(median "${w2s[@]}") w4=$(median "${w4s[@]}")
        python3 -c "r2 = ${two_tokens} / ${t2}; r4 = ${four_tokens} / ${t4}
print(f'   {\"${mode}\":14s}{\"spinning waits \" if \"${waits}\" == \"spin\" else \"saetrain waits  \"}'
      f'2 ranks {r2:9.0f} tok/s ({${t2}:.2f} s)   4 ranks {r4:9.0f} tok/s ({${t4}:.2f} s)   '
      f'ratio {r4 / r2:4.2f}   (target >= 0.8)   whole runs {${w2}:.2f} s / {${w4}:.2f} s')"
    done
done
echo
echo "(1: wall time of whole runs, start-up included; 2: tokens/s over the training loop's time on"
echo " rank 0, beside the whole runs' wall time; the spinning waits are libgomp's and Open MPI's"
echo " defaults, which saetrain replaced)"
