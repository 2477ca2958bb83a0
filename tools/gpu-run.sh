#!/usr/bin/env bash
# gpu-run.sh — run on a lent GPU machine: unpack the bundle from tools/gpu-bundle.sh, then the
# GPU tests (ctest -L gpu), the step benchmarks (saetrain's CUDA backend, its cuBLASLt GEMM bound,
# PyTorch's implementations of the same step), end-to-end training from bf16 shards in page
# cache, two ranks sharing the GPU in a sweep, and the perf model's predictions. Every result
# goes under $OUT (summary.txt last lines = the table; logs.tar.gz = everything).
#
# Usage (from the repository root on the GPU machine; the device tool: carry .gpu-bundle and
# run `OUT=$OUT bash tools/gpu-run.sh`):
#   bash tools/gpu-run.sh [STEPS]     STEPS: comma list of env,test,upload,optimizer,bench,torch,
#                                     databench,e2e,sweep2,model,peers,auxk,target,profile,modes
#                                     (default: all of them, in that order)
# Environment: OUT (results folder; default ./gpu-out), CTEST_TIMEOUT (seconds per GPU test,
# default 300), BUNDLE (default
# .gpu-bundle/saetrain-gpu.tar.xz), E2E_ROWS (default 1000000), E2E_EPOCHS (default 3),
# BENCH_ARGS (extra bench_step arguments), BENCH_MODES (default "fp32 tf32 bf16": GEMM modes
# timed at batch 4096), BENCH_MODES_16K (default "fp32 bf16": at batch 16384), RUN_BACKEND (default cuda; cpu for a dry run of the
# script on a machine without a GPU), PEER_ROWS (default 1000000: train rows of the peers'
# synthetic set, plus a tenth held out), PEER_EPOCHS (default 3), PEERS_SITE (default
# .peers/peers-site.tar.xz: SAELens, sparsify and what they need beyond the GPU machine's
# Python, made by tools/gpu-peers-site.sh), TARGET_ARCHS (the `target` step's architectures;
# default: relu gated jumprelu topk batchtopk switch matryoshka_batchtopk).
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
OUT=${OUT:-$repo/gpu-out}
BUNDLE=${BUNDLE:-.gpu-bundle/saetrain-gpu.tar.xz}
steps=${1:-env,test,upload,optimizer,bench,torch,databench,e2e,sweep2,model,peers,auxk,target,profile,modes}
mkdir -p "$OUT"
logs=$(mktemp -d)
summary="$OUT/summary.txt"
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }
want() { [[ ",$steps," == *",$1,"* ]]; }

# run NAME TIMEOUT CMD...: output to $logs/NAME.log (and the terminal), status into the summary.
run() {
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    echo "=== $name: $*" | tee "$logs/$name.log"
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$logs/$name.log"
    local rc=${PIPESTATUS[0]}
    note "step $name: exit $rc in $((SECONDS - t0)) s"
    return "$rc"
}

finish() {
    tar -C "$logs" -czf "$OUT/logs.tar.gz" . 2>/dev/null
    echo
    echo "===== summary ($summary) ====="
    cat "$summary"
}
trap finish EXIT

# --- unpack; find what the machine provides ---------------------------------------------------
B=/tmp/saetrain-gpu
rm -rf "$B" && mkdir -p "$B"
if ! tar -xJf "$BUNDLE" -C "$B"; then
    note "cannot unpack $BUNDLE: run tools/gpu-bundle.sh here first and carry .gpu-bundle"
    exit 1
fi
sed "s|@B@|$B|g" "$B/CTestTestfile.cmake.in" > "$B/CTestTestfile.cmake"
note "bundle built from $(head -1 "$B/COMMIT") ($(($(wc -l < "$B/COMMIT") - 1)) uncommitted changes)"

# Directory holding the first file named $1 among the usual places (CUDA toolkit, PyTorch's
# nvidia-* wheels, the loader cache).
lib_dir() {
    local name=$1 hit
    hit=$(ldconfig -p 2>/dev/null | awk -v n="$name" '$1 == n {print $NF; exit}')
    if [ -z "$hit" ]; then
        hit=$(find /usr/local/cuda/lib64/ /usr/local/cuda/targets/x86_64-linux/lib/ \
            /usr/local/cuda*/lib64/ /opt /usr/lib/python3*/ /usr/local/lib/python3*/ \
            -name "$name" 2>/dev/null | head -1)
    fi
    [ -n "$hit" ] && dirname "$hit"
}
cublas=$(lib_dir libcublasLt.so.13)
nccl=$(lib_dir libnccl.so.2)
note "libcublasLt.so.13: ${cublas:-NOT FOUND}; libnccl.so.2: ${nccl:-NOT FOUND}"
export LD_LIBRARY_PATH="$B/lib:$B/usr/lib/x86_64-linux-gnu:$B/usr/lib/x86_64-linux-gnu/pmix2/lib${cublas:+:$cublas}${nccl:+:$nccl}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OPAL_PREFIX=$B/usr
export PMIX_INSTALL_PREFIX=$B/usr/lib/x86_64-linux-gnu/pmix2
export PATH=$B/bin:$B/usr/bin:$PATH
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_rmaps_base_oversubscribe=1
# One node, no remote launcher: Open MPI still insists that ssh exists unless told otherwise.
export OMPI_MCA_plm_rsh_agent=false
# PMIx looks for its plugins where Debian installed them; ours are in the bundle.
export PMIX_MCA_mca_base_component_path=$PMIX_INSTALL_PREFIX/lib/pmix
export PMIX_MCA_pcompress_base_silence_warning=1
for b in "$B"/bin/*; do
    missing=$(ldd "$b" 2>&1 | grep "not found" | awk '{print $1}' | sort -u | tr '\n' ' ')
    [ -n "$missing" ] && note "$(basename "$b"): missing libraries: $missing"
done

# --- the peers' data: synthetic d 768 rows with planted features, written on the CPU in the
# background while the GPU steps run (one generator, so train and held-out rows share the
# features; the last of 11 shards is held out).
pdata=/tmp/peers/data
peer_rows=${PEER_ROWS:-1000000}
synth_pid=
if want peers && [ ! -d "$pdata/train" ]; then
    (
        sae-synth --out "$pdata/all" --d-model 768 --features 24576 --active 32 \
            --rows $((peer_rows + peer_rows / 10)) --shards 11 --seed 5 &&
            mkdir -p "$pdata/train" "$pdata/eval/synth" &&
            mv "$pdata"/all/shard_0000[0-9].h5 "$pdata/train/" &&
            mv "$pdata/all/shard_00010.h5" "$pdata/eval/synth/"
    ) > "$logs/peers_synth.log" 2>&1 &
    synth_pid=$!
fi

# --- env: the machine as found ------------------------------------------------------------------
if want env; then
    {
        nvidia-smi
        nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,power.limit \
            --format=csv
        uname -a
        ldd --version | head -1
        nproc
        free -g
        python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'
    } > "$logs/env.log" 2>&1
    note "device: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)"
fi

# --- test: ctest -L gpu over the bundle's test file ---------------------------------------------
if want test; then
    per_test=${CTEST_TIMEOUT:-300}
    run ctest $((per_test + 120)) ctest --test-dir "$B" -L gpu --output-on-failure \
        --timeout "$per_test"
    grep -E "Test +#" "$logs/ctest.log" | sed 's/^ */ctest: /' | tee -a "$summary"
    "$B/bin/test_backend_parity" --gtest_output="xml:$logs/test_backend_parity.xml" \
        --gtest_filter='*HundredTraining*/cuda' > /dev/null 2>&1  # the recorded worst losses
    grep -o 'worst_rel_loss="[^"]*"' "$logs/test_backend_parity.xml" 2>/dev/null |
        sed 's/^/100-step parity: /' | tee -a "$summary"
fi

# --- bench: saetrain's step on the GPU beside the cuBLASLt bound --------------------------------
shape="--d-model 768 --latents 24576 --k 32 --batch 4096"  # bench_step's and the torch script's
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
# bench_step's result lines, one pair per architecture: its table row and its streamed step.
arch_lines='^[a-z_]+ +([0-9.]+ +[0-9]+ |streamed:)'
if want bench; then
    for mode in ${BENCH_MODES:-fp32 tf32 bf16}; do
        run "bench_step_$mode" 300 bench_step --backend cuda $shape --reps 30 --breakdown --json \
            --gemm $mode ${BENCH_ARGS:-}
        grep -E "$arch_lines" "$logs/bench_step_$mode.log" | sed "s/^/bench $mode: /" |
            tee -a "$summary"
    done
    for mode in ${BENCH_MODES_16K:-fp32 bf16}; do  # a larger batch spreads Adam over more tokens
        run "bench_step_${mode}_b16k" 300 bench_step --backend cuda --d-model 768 \
            --latents 24576 --k 32 --batch 16384 --reps 20 --json --gemm $mode ${BENCH_ARGS:-}
        grep -E "$arch_lines" "$logs/bench_step_${mode}_b16k.log" |
            sed "s/^/bench $mode batch 16384: /" | tee -a "$summary"
    done
fi

# --- upload: the batch copy on its own stream (the default) against the copy on the compute
# stream (SAETRAIN_DEBUG_SYNC_UPLOAD=1, the path before), bf16 TopK, alternated twice; the
# "streamed" line (steps back to back, as the loop runs them) is where the copy can overlap
# the previous step's optimizer pass.
if want upload; then
    for rep in 1 2; do
        for sync in 1 0; do
            SAETRAIN_DEBUG_SYNC_UPLOAD=$sync run "upload_sync${sync}_$rep" 120 bench_step \
                --backend cuda $shape --arch topk --reps 50 --gemm bf16
            grep -E '^topk ' "$logs/upload_sync${sync}_$rep.log" |
                sed "s/^/upload sync=$sync run $rep: /" | tee -a "$summary"
        done
    done
fi

# --- optimizer: TopK's default optimizer (train.optimizer: auto = signum) against AdamW, the
# bf16 step alternated twice, then end to end (step e2e runs both when this step is asked too).
if want optimizer; then
    for rep in 1 2; do
        for opt in adam signum; do
            run "optimizer_${opt}_$rep" 120 bench_step --backend cuda $shape --arch topk \
                --reps 50 --gemm bf16 --optimizer $opt
            grep -E '^topk ' "$logs/optimizer_${opt}_$rep.log" |
                sed "s/^/optimizer $opt run $rep: /" | tee -a "$summary"
        done
    done
fi

# --- torch: the same steps written as PyTorch users write them ---------------------------------
if want torch; then
    PYTHONUNBUFFERED=1 run torch 420 python3 tools/bench_torch_sae.py $shape --reps 30
    grep -E '^torch ' "$logs/torch.log" | tee -a "$summary"
fi

# --- e2e: saetrain end to end from bf16 shards in page cache -------------------------------------
data=/tmp/saetrain-data
if want e2e || want sweep2 || want databench || want optimizer; then
    rows=${E2E_ROWS:-1000000}
    if [ ! -d "$data" ]; then
        t0=$SECONDS
        for p in 0 1 2 3; do  # four writers in parallel, one folder each (one glob reads all)
            sae-synth --out "$data/p$p" --d-model 768 --features 8192 --active 16 \
                --rows $((rows / 4)) --shards 2 --dtype bf16 --seed $p > "$logs/synth$p.log" 2>&1 &
        done
        wait
        note "synthetic data: $rows rows, d_model 768, bf16 in $((SECONDS - t0)) s"
    fi
    cat "$data"/p*/shard_*.h5 > /dev/null  # into page cache
fi
e2e_config() {  # OUT_DIR EPOCHS [extra yaml lines]
    cat <<EOF
run: {out_dir: $1, seed: 0}
data: {path: "$data/p*/shard_*.h5", batch_size: 4096, epochs: $2, shuffle_buffer_rows: 262144}
sae: {arch: topk, n_latents: 24576, k: 32}
train: {lr: 4.0e-4, warmup_steps: 100, lr_decay: cosine, grad_clip: 1.0, dead_tokens: 1000000}
backend: ${RUN_BACKEND:-cuda}
log: {every_steps: 100}
checkpoint: {every_steps: 100000, keep: 1}
EOF
}
# --- databench: the step on batches of those shards, after training on them, op by op -------
if want databench; then
    for mode in fp32 bf16; do
        run "databench_$mode" 300 bench_step --backend cuda --data "$data/p*/shard_*.h5" \
            --latents 24576 --k 32 --batch 4096 --train-steps 300 --reps 20 --breakdown \
            --gemm $mode
        grep -E "^(topk|relu) " "$logs/databench_$mode.log" | sed "s/^/databench $mode: /" |
            tee -a "$summary"
    done
fi

if want e2e; then
    e2e_config /tmp/run-topk "${E2E_EPOCHS:-3}" > /tmp/e2e-topk.yaml
    run e2e_topk 420 saetrain /tmp/e2e-topk.yaml --overwrite
    grep -A3 -E "^(rank 0 time|sae \(sorted)" "$logs/e2e_topk.log" | sed 's/^/e2e topk: /' >> "$summary"
    cp /tmp/run-topk/metrics.jsonl "$logs/e2e_topk_metrics.jsonl" 2>/dev/null
    run e2e_topk_bf16 420 saetrain /tmp/e2e-topk.yaml --overwrite --set gpu.gemm=bf16
    grep -A3 -E "^(rank 0 time|sae \(sorted)" "$logs/e2e_topk_bf16.log" | sed 's/^/e2e topk bf16: /' >> "$summary"
    cp /tmp/run-topk/metrics.jsonl "$logs/e2e_topk_bf16_metrics.jsonl" 2>/dev/null
    # The same with OpenMP's idle threads sleeping instead of spinning (they share the cores
    # with the reader's threads).
    OMP_WAIT_POLICY=passive run e2e_topk_passive 420 saetrain /tmp/e2e-topk.yaml --overwrite
    grep -A3 -E "^(rank 0 time|sae \(sorted)" "$logs/e2e_topk_passive.log" |
        sed 's/^/e2e topk OMP passive: /' >> "$summary"
    if want optimizer; then  # the defaults' optimizer: lr and lr_decay left to auto (signum)
        run e2e_topk_bf16_signum 420 saetrain /tmp/e2e-topk.yaml --overwrite \
            --set gpu.gemm=bf16 --set train.lr=0 --set train.lr_decay=auto
        grep -A3 -E "^(rank 0 time|sae \(sorted)" "$logs/e2e_topk_bf16_signum.log" |
            sed 's/^/e2e topk bf16 signum: /' >> "$summary"
        cp /tmp/run-topk/metrics.jsonl "$logs/e2e_topk_bf16_signum_metrics.jsonl" 2>/dev/null
    fi
    e2e_config /tmp/run-relu 1 > /tmp/e2e-relu.yaml
    run e2e_relu 300 saetrain /tmp/e2e-relu.yaml --overwrite --set sae.arch=relu --set sae.l1_coeff=5
    grep -A3 -E "^(rank 0 time|sae \(sorted)" "$logs/e2e_relu.log" | sed 's/^/e2e relu: /' >> "$summary"
fi

# --- sweep2: two ranks on the one GPU, one shared data stream (batch all-gathered over MPI) -----
if want sweep2; then
    e2e_config /tmp/run-sweep 1 > /tmp/e2e-sweep.yaml
    run sweep2 300 mpirun -np 2 saetrain /tmp/e2e-sweep.yaml --overwrite --set 'sae.k=[16,32]'
    grep -A4 -E "^(rank 0 time|sae \(sorted)" "$logs/sweep2.log" | sed 's/^/sweep2: /' >> "$summary"
fi

# --- model: the paper model's predictions for the measured shapes -------------------------------
if want model; then
    for m in fp32 tf32 bf16; do
        for a in topk relu; do
            run "model_${a}_$m" 30 sae-perfmodel --gpu "${gpu_name:-H100}" --math $m --arch $a \
                --d-model 768 --n-latents 24576 --k 32 --batch 4096 --bytes-per-element 2 \
                --disk-gbps 20
        done
    done
fi

# --- peers: saetrain beside sparsify's and SAELens's own trainers, same rows, same GPU --------
# bench/peers/run.sh with DEVICE=cuda: every tool trains d 768 x 24,576 latents, k 32, batch
# 4096 on the same rows in the same order for PEER_EPOCHS passes, and one evaluator measures
# each on the held-out rows. A short sparsify run first fills Triton's kernel cache, so its
# compilation is not timed.
if want peers; then
    [ -n "$synth_pid" ] && wait "$synth_pid"
    [ -d "$pdata/train" ] || note "peers: no synthetic data (see peers_synth.log)"
fi
if want peers && [ -d "$pdata/train" ]; then
    site=/tmp/peers-site
    rm -rf "$site" && mkdir -p "$site"
    if tar -xJf "${PEERS_SITE:-.peers/peers-site.tar.xz}" -C "$site"; then
        export PYTHONPATH=$site
        python3 -c 'import sae_lens, sparsify, torch; print("peers: sae_lens", sae_lens.__version__,
"sparsify", sparsify.__version__, "torch", torch.__version__)' 2>&1 | tee -a "$summary"
        peer_env=(DEVICE=cuda OUT=/tmp/peers HOOK=synth EXPANSION=32 K=32 BATCH=4096 LR=4e-4
            EPOCHS=${PEER_EPOCHS:-3} THREADS=8 SAETRAIN=$B/bin/saetrain
            SAE_EXPORT=$B/bin/sae-export PYTHON=python3 PYTHONUNBUFFERED=1
            "SAETRAIN_EXTRA=--set checkpoint.every_steps=1000000 --set log.eval_every_steps=0")
        env "${peer_env[@]}" STEPS=topk SPARSIFY_OPTIMIZERS=adam EPOCHS=1 \
            bash -c 'python3 bench/peers/train_peer.py --tool sparsify --arch topk --train \
                "$OUT/data/train" --eval "$OUT/data/eval/synth" --max-tokens 16384 \
                --eval-max-rows 4096 --expansion 32 --device cuda --json /tmp/warm.json' \
            > "$logs/peers_warmup.log" 2>&1
        run peers 600 env "${peer_env[@]}" STEPS="topk table" bash bench/peers/run.sh
        sed -n '/^| tool/,$p' /tmp/peers/table.md | tee -a "$summary"
        for f in /tmp/peers/logs/saetrain-*.log; do  # where each saetrain run's seconds went
            grep -h "^rank 0 time" "$f" | sed "s|^|peers $(basename "$f" .log): |" >> "$summary"
        done
        cp -r /tmp/peers/results "$logs/peers_results" 2>/dev/null
        cp -r /tmp/peers/logs "$logs/peers_logs" 2>/dev/null
        unset PYTHONPATH
    else
        note "peers: cannot unpack ${PEERS_SITE:-.peers/peers-site.tar.xz} (make it with tools/gpu-peers-site.sh)"
    fi
fi

# --- auxk: the TopK step with dead latents present (AuxK's second selection runs) ------------
# Rows made of 1,024 planted features leave most of 24,576 latents without work: with
# dead_tokens 81,920 (20 steps of 4096 rows) many are dead after 300 steps, and AuxK runs.
if want auxk; then
    adata=/tmp/auxk-data
    [ -d "$adata" ] || sae-synth --out "$adata" --d-model 768 --features 1024 --active 8 \
        --rows 200000 --shards 2 --seed 9 > "$logs/auxk_synth.log" 2>&1
    rm -f "$adata/ground_truth.h5"
    for dead in 0 81920; do  # the default (none dead in 300 steps), then 20 steps' worth
        run "auxk_dead$dead" 300 bench_step --backend cuda --data "$adata" --arch topk \
            --latents 24576 --k 32 --batch 4096 --train-steps 300 --reps 20 --breakdown \
            --gemm bf16 --dead-tokens $dead
        grep -E "^topk " "$logs/auxk_dead$dead.log" | sed "s/^/auxk dead_tokens $dead: /" |
            tee -a "$summary"
    done
fi

# --- target: every architecture at L0 32 on the GPU -------------------------------------------
# Planted features (d 768, 4,096 features, 16 active a row), 400K rows, x8, every other key at
# its default: sae.target_l0 32 for the penalized architectures (relu, gated, jumprelu), sae.k 32
# for the others (Matryoshka with prefixes [768,3072]); each one's training L0 of the last
# interval against 32, and its held-out FVU and dead %. TARGET_ARCHS picks (default: all seven).
# RUN_BACKEND=cpu runs the same commands on the CPU backend, for the comparison.
if want target; then
    tdata=/tmp/target-data
    [ -d "$tdata/train" ] || {
        sae-synth --out "$tdata/all" --d-model 768 --features 4096 --active 16 --rows 440000 \
            --shards 11 --seed 4 && mkdir -p "$tdata/train" "$tdata/eval" &&
            mv "$tdata"/all/shard_0000[0-9].h5 "$tdata/train/" &&
            mv "$tdata/all/shard_00010.h5" "$tdata/eval/"
    } > "$logs/target_synth.log" 2>&1
    for arch in ${TARGET_ARCHS:-relu gated jumprelu topk batchtopk switch matryoshka_batchtopk}; do
        case "$arch" in
            relu | gated | jumprelu) sparsity=(--set sae.target_l0=32) ;;
            matryoshka_batchtopk) sparsity=(--set sae.k=32 --set "sae.matryoshka_prefixes=[768,3072]") ;;
            *) sparsity=(--set sae.k=32) ;;
        esac
        run "target_$arch" 300 saetrain configs/quickstart.yaml --overwrite \
            --set "data.path=$tdata/train" --set "data.eval_path=$tdata/eval" \
            --set backend=${RUN_BACKEND:-cuda} --set sae.expansion=8 --set "sae.arch=$arch" \
            "${sparsity[@]}" --set "run.out_dir=/tmp/target-$arch" \
            --set log.eval_every_steps=0 --set checkpoint.every_steps=100000
        grep -E "step [0-9]+/[0-9]+ \|" "$logs/target_$arch.log" | tail -1 | cut -d'|' -f1-6 |
            sed "s/^/target $arch: /" | tee -a "$summary"
        grep -E "held-out \(" "$logs/target_$arch.log" | tail -1 | sed "s/^/target $arch: /" |
            tee -a "$summary"
    done
fi

# --- profile: every kernel of one bf16 TopK step, by Nsight Compute ---------------------------
if want profile; then
    ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    if [ -n "$ncu_bin" ]; then
        run profile 300 "$ncu_bin" --csv --metrics gpu__time_duration.sum bench_step \
            --backend cuda $shape --arch topk --reps 1 --gemm bf16 ${BENCH_ARGS:-}
        python3 tools/ncu_step_table.py "$logs/profile.log" | tee -a "$summary"
    else
        note "profile: ncu not found"
    fi
fi

# --- modes: every parallel mode on 2-4 ranks sharing the GPU, delay mode on, against one rank --
if want modes; then
    run modes 420 bash tools/gpu-modes.sh "$B/bin" /tmp/gpu-modes
    grep "^gpu-modes:" "$logs/modes.log" | tee -a "$summary" > /dev/null
fi
