#!/usr/bin/env bash
# gpu-modes.sh — every parallel mode on 2-4 ranks sharing one GPU, against one rank.
#
#   bash tools/gpu-modes.sh BIN_DIR [OUT_DIR]        (BIN_DIR holds saetrain, sae-synth, sae-inspect)
#
# On a GPU machine the ranks share the device, so gradients go through MPI staged through host
# memory, and SAETRAIN_DEBUG_COLLECTIVE_DELAY_US (default 20000 here) poisons each device buffer
# before every collective until the producing stream has caught up: a collective that is not
# ordered after its producer reads NaN, and its run fails (non-finite steps, a NaN FVU).
# The runs (TopK, d 128, 1,024 latents, k 16 or 32, AuxK active: latents die after 8 steps of
# 1024 rows without firing), each judged by its held-out FVU against the one-rank run of the
# same SAE with the same rows per step:
#   dp2      data_parallel, 2 replicas of 512 rows       vs one rank of 1024       within BOUND
#   ls2      2 latent shards (the same batches)           vs one rank               within BOUND/10
#   sweep2   shared sweep of k 16 and 32 on 2 ranks       vs each k on one rank     within BOUND
#   hybrid4  2 configs x 2 replicas of 512 on 4 ranks     vs each k on one rank     within BOUND
#   resume   dp2 stopped by SIGTERM at iteration 40 (exit 75) and resumed: bit for bit equal to
#            the uninterrupted dp2 (sae-inspect --compare)
# Data-parallel and sweep runs see other rows in each step than one rank reading in order (each
# rank reads its own slice), so they agree in distribution, not step by step: BOUND (default
# 0.02) is a relative difference of held-out FVU. Latent shards train on identical batches and
# differ only in the order of float sums. Exit 0 only when every check passes.
# Environment: BACKEND (cuda; cpu runs the same matrix without a GPU), DELAY_US, BOUND,
# MPIRUN (default: mpirun --oversubscribe --bind-to none).
set -uo pipefail
bin=$(cd "${1:?usage: gpu-modes.sh BIN_DIR [OUT_DIR]}" && pwd)
out=${2:-/tmp/gpu-modes}
backend=${BACKEND:-cuda}
bound=${BOUND:-0.02}
read -r -a mpirun <<< "${MPIRUN:-mpirun --oversubscribe --bind-to none}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export SAETRAIN_DEBUG_COLLECTIVE_DELAY_US=${DELAY_US:-20000}
rm -rf "$out" && mkdir -p "$out"

"$bin/sae-synth" --out "$out/data" --d-model 128 --features 512 --active 8 --rows 44000 \
    --shards 11 --seed 3 > "$out/synth.log" || { echo "gpu-modes: sae-synth failed"; exit 1; }
mkdir -p "$out/eval" && mv "$out/data/shard_00010.h5" "$out/eval/" && rm -f "$out/data/ground_truth.h5"

cat > "$out/base.yaml" <<EOF
run: {out_dir: $out/runs/unset, seed: 0}
data: {path: $out/data, eval_path: $out/eval, batch_size: 1024, epochs: 3, shuffle_buffer_rows: 0}
sae: {arch: topk, expansion: 8, k: 16}
train: {lr: 2.0e-3, warmup_steps: 20, lr_decay: cosine, grad_clip: 1.0, dead_tokens: 8192}
backend: $backend
log: {every_steps: 10}
checkpoint: {every_steps: 20, keep: 2}
EOF

failed=()
# train NAME NP ARGS...: one run into $out/runs/NAME.
train() {
    local name=$1 np=$2
    shift 2
    local cmd=("$bin/saetrain" "$out/base.yaml" --set "run.out_dir=$out/runs/$name" "$@")
    [ "$np" -gt 1 ] && cmd=("${mpirun[@]}" -np "$np" "${cmd[@]}")
    if ! "${cmd[@]}" > "$out/$name.log" 2>&1; then
        echo "gpu-modes: $name FAILED (exit $?): $(tail -2 "$out/$name.log" | tr '\n' ' ')"
        failed+=("$name")
        return 1
    fi
}
# fvu NAME K: the held-out FVU of the run's SAE with that k (summary.csv).
fvu() {
    python3 - "$out/runs/$1/summary.csv" "$2" <<'EOF'
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r.get("k") == sys.argv[2]]
print((rows[0]["eval_fvu"] or "nan") if rows else "nan")  # empty: FVU undefined (no variance)
EOF
}
# check WHAT GOT WANT LIMIT
check() {
    local verdict
    verdict=$(python3 -c "import math,sys; g,w,l=map(float,sys.argv[1:]); \
r=abs(g-w)/w if w>0 else math.inf; print(('ok' if math.isfinite(g) and r<=l else 'FAILED'), f'{r:.4f}')" \
        "$2" "$3" "$4")
    echo "gpu-modes: $1: held-out fvu $2 vs one rank $3: relative difference ${verdict#* } (limit $4): ${verdict% *}"
    [[ $verdict == ok* ]] || failed+=("$1")
}

train ref16 1 --set sae.k=16
train ref32 1 --set sae.k=32
train dp2 2 --set sae.k=16 --set parallel.mode=data_parallel --set parallel.replicas=2 \
    --set data.batch_size=512 && check dp2 "$(fvu dp2 16)" "$(fvu ref16 16)" "$bound"
train ls2 2 --set sae.k=16 --set parallel.latent_shards=2 &&
    check ls2 "$(fvu ls2 16)" "$(fvu ref16 16)" "$(python3 -c "print($bound / 10)")"
if train sweep2 2 --set 'sae.k=[16,32]'; then
    check "sweep2 k16" "$(fvu sweep2 16)" "$(fvu ref16 16)" "$bound"
    check "sweep2 k32" "$(fvu sweep2 32)" "$(fvu ref32 32)" "$bound"
fi
if train hybrid4 4 --set 'sae.k=[16,32]' --set parallel.mode=hybrid --set parallel.replicas=2 \
    --set data.batch_size=512; then
    check "hybrid4 k16" "$(fvu hybrid4 16)" "$(fvu ref16 16)" "$bound"
    check "hybrid4 k32" "$(fvu hybrid4 32)" "$(fvu ref32 32)" "$bound"
fi

# Stopped by SIGTERM at iteration 40, resumed: the same SAE as dp2, bit for bit.
dp=(--set sae.k=16 --set parallel.mode=data_parallel --set parallel.replicas=2
    --set data.batch_size=512)
SAETRAIN_FAULT=0:40:TERM "${mpirun[@]}" -np 2 "$bin/saetrain" "$out/base.yaml" \
    --set "run.out_dir=$out/runs/resume" "${dp[@]}" > "$out/resume-stop.log" 2>&1
stop=$?
if [ "$stop" -ne 75 ]; then
    echo "gpu-modes: resume: the stopped run exited $stop, not 75 (checkpoint and stop)"
    failed+=(resume)
elif train resume 2 "${dp[@]}" && [ -d "$out/runs/dp2" ]; then
    a=$(ls "$out"/runs/dp2/sae/*/final.h5) b=$(ls "$out"/runs/resume/sae/*/final.h5)
    if "$bin/sae-inspect" "$a" --compare "$b" > "$out/resume-compare.log" 2>&1; then
        echo "gpu-modes: resume: stopped at iteration 40 (exit 75), resumed: final.h5 bit for bit equal to dp2's: ok"
    else
        echo "gpu-modes: resume: final.h5 differs from dp2's: FAILED ($(tail -1 "$out/resume-compare.log"))"
        failed+=(resume)
    fi
fi

if [ "${#failed[@]}" -gt 0 ]; then
    echo "gpu-modes: FAILED: ${failed[*]} (logs in $out)"
    exit 1
fi
echo "gpu-modes: every mode agrees with one rank (backend $backend, delay ${SAETRAIN_DEBUG_COLLECTIVE_DELAY_US} us)"
