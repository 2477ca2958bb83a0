#!/usr/bin/env bash
# bench/peers/transcoder.sh — saetrain's TopK transcoder and skip-transcoder against sparsify's
# own transcoder trainer (SparseCoderConfig(transcode=True, skip_connection=False|True)) on the
# same paired rows (an MLP's input x and output y of the same tokens), in the same order, for
# the same number of tokens; every transcoder is then written in sparsify's format (saetrain:
# sae-export --format sparsify; sparsify: its own save_to_disk) and judged by one evaluator
# (bench/peers/sae_eval.py) on held-out pairs. Prints one Markdown table: tool, arch, setting,
# tokens, tok/s, speed vs sparsify, eval FVU (of y), eval L0, dead %, dense %, and saetrain's
# own held-out FVU / L0 (the cross-check).
#
#   bash bench/peers/transcoder.sh           # extracts MiniLM layer-3 MLP pairs, trains, table
#   RAW_TRAIN=data/minilm/train RAW_EVAL=data/minilm/eval bash bench/peers/transcoder.sh
#                                            # an extraction made before (one sub-directory per hook)
#   TOKENS=20000 THREADS=1 SPARSIFY_OPTIMIZERS=adam OUT=/tmp/tc-smoke bash bench/peers/transcoder.sh
#
# Steps (STEPS, default all, in this order: extract shuffle saetrain sparsify table):
#   extract   unless RAW_TRAIN and RAW_EVAL name an extraction already made: all-MiniLM-L6-v2
#             activations at X_HOOK (the MLP's input) and Y_HOOK (its output) in one forward
#             pass (tools/extract_activations.py, both hooks, float32, context CONTEXT), from
#             the text files of TEXT_DIR split by file as in run.sh (every HOLDOUT_EVERY-th
#             file held out); TOKENS train tokens, EVAL_TOKENS held-out ones. Reused when a
#             previous run made them with the same settings (OUT/data/STAMP).
#   shuffle   bench/peers/shuffle_shards.py --target: ONE global permutation (SEED) applied to
#             both X_HOOK's and Y_HOOK's train rows, written as float32 shards (with the token
#             ids, which saetrain's paired-set check compares) into OUT/data/train/<hook>; every
#             trainer then reads them in order (saetrain with data.shuffle_buffer_rows=0).
#   saetrain  for each arch of ARCHS: saetrain CONFIG with data.path/data.target_path the
#             shuffled pair, data.eval_path/data.eval_target_path the held-out pair, sae.arch,
#             EXPANSION, K, LR, BATCH, EPOCHS, SEED; then sae-export --format sparsify and
#             eval_export.py (the shared evaluator, beside saetrain's own held-out evaluation).
#   sparsify  for each arch and each optimizer of SPARSIFY_OPTIMIZERS: train_peer.py --tool
#             sparsify --arch ARCH (sparsify's Trainer.fit unchanged; adam at LR, signum at
#             SPARSIFY_SIGNUM_LR, default "auto": sparsify's own lr rule).
#   table     bench/peers/table.py OUT/results --reference sparsify, also in OUT/table.md.
#
# Sizes and settings (environment):
#   TOKENS=1000000 EVAL_TOKENS=TOKENS/10 BATCH=4096 EXPANSION=16 K=32 LR=4e-4 THREADS=2 SEED=0
#   EPOCHS=1  ARCHS="transcoder skip_transcoder"
#   SPARSIFY_OPTIMIZERS="adam signum"  SPARSIFY_SIGNUM_LR=auto
#   SPARSIFY_WARMUP_STEPS, SPARSIFY_AUXK_ALPHA: unset = sparsify's defaults (1000 warm-up steps
#   for adam, more than 1M tokens' ~240 steps: the lr never reaches LR; auxk 0)
#   X_HOOK=encoder.layer.3.attention.output  Y_HOOK=encoder.layer.3.output.dense
#   (in a BERT block, the attention block's output after its LayerNorm feeds the MLP,
#   intermediate.dense -> GELU -> output.dense; output.dense is the MLP's output before the
#   residual and LayerNorm)
#   RAW_TRAIN, RAW_EVAL: directories holding <X_HOOK>/ and <Y_HOOK>/ shard directories of one
#   extraction (both hooks in one pass; any dtype the reader takes); unset: the extract step
#   makes them in OUT/data
#   CONTEXT=128 TEXT_DIR=/usr/share/doc/python3.11/html/_sources HOLDOUT_EVERY=10
#   OUT=runs/peers-tc  CONFIG=configs/minilm.yaml (configs/quickstart.yaml when absent)
#   PYTHON (default .venv/bin/python, else python3)
#   SAETRAIN=build/cpu/apps/saetrain SAE_EXPORT=build/cpu/apps/sae-export
#   SAETRAIN_EXTRA="--set key=value ...": more overrides for every saetrain run; the default
#   turns off the periodic held-out evaluations and checkpoints CONFIG may ask for (the peers
#   have none): --set log.eval_every_steps=0 --set checkpoint.every_steps=1000000
# Timings: tok/s is tokens / wall seconds of the training loop (sparsify: its Trainer's fit(),
# data already in memory; saetrain: its own tokens_per_s, which includes reading the shards).
# THREADS CPU threads for every tool; run on an idle machine. A trainer that fails is reported
# and skipped; the script then exits 1 after the table.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
if [ -z "${PYTHON:-}" ]; then
    if [ -x "$root/.venv/bin/python" ]; then PYTHON="$root/.venv/bin/python"; else PYTHON=python3; fi
fi
OUT="${OUT:-runs/peers-tc}"
TOKENS="${TOKENS:-1000000}"
EVAL_TOKENS="${EVAL_TOKENS:-$((TOKENS / 10))}"
BATCH="${BATCH:-4096}"
EXPANSION="${EXPANSION:-16}"
K="${K:-32}"
LR="${LR:-4e-4}"
THREADS="${THREADS:-2}"
SEED="${SEED:-0}"
EPOCHS="${EPOCHS:-1}"
ARCHS="${ARCHS:-transcoder skip_transcoder}"
SPARSIFY_OPTIMIZERS="${SPARSIFY_OPTIMIZERS:-adam signum}"
SPARSIFY_SIGNUM_LR="${SPARSIFY_SIGNUM_LR:-auto}"
X_HOOK="${X_HOOK:-encoder.layer.3.attention.output}"
Y_HOOK="${Y_HOOK:-encoder.layer.3.output.dense}"
CONTEXT="${CONTEXT:-128}"
TEXT_DIR="${TEXT_DIR:-/usr/share/doc/python3.11/html/_sources}"
HOLDOUT_EVERY="${HOLDOUT_EVERY:-10}"
CONFIG="${CONFIG:-configs/minilm.yaml}"
SAETRAIN="${SAETRAIN:-build/cpu/apps/saetrain}"
SAE_EXPORT="${SAE_EXPORT:-build/cpu/apps/sae-export}"
SAETRAIN_EXTRA="${SAETRAIN_EXTRA---set log.eval_every_steps=0 --set checkpoint.every_steps=1000000}"
STEPS="${STEPS:-extract shuffle saetrain sparsify table}"

say() { echo "peers-tc: $*"; }
die() { echo "peers-tc: error: $*" >&2; exit 1; }
want() { [[ " $STEPS " == *" $1 "* ]]; }
dir_of() { echo "$1" | sed 's/[^A-Za-z0-9_.-]/_/g'; }  # extract_activations.py's hook dirs

if [ ! -f "$CONFIG" ]; then
    say "$CONFIG not found; using configs/quickstart.yaml"
    CONFIG=configs/quickstart.yaml
fi
export OMP_NUM_THREADS="$THREADS" MKL_NUM_THREADS="$THREADS"
export SPARSIFY_DISABLE_TRITON="${SPARSIFY_DISABLE_TRITON:-1}"  # Triton needs a GPU
DATA="$OUT/data"
RAW_TRAIN="${RAW_TRAIN:-$DATA/train-raw}"
RAW_EVAL="${RAW_EVAL:-$DATA/eval}"
X_TRAIN="$DATA/train/$(dir_of "$X_HOOK")"
Y_TRAIN="$DATA/train/$(dir_of "$Y_HOOK")"
X_EVAL="$RAW_EVAL/$(dir_of "$X_HOOK")"
Y_EVAL="$RAW_EVAL/$(dir_of "$Y_HOOK")"
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
        echo "peers-tc: $name FAILED (exit $?); the end of $LOGS/$name.log:" >&2
        tail -15 "$LOGS/$name.log" >&2
        failed+=("$name")
        return 1
    fi
}

# What else ran as a training run started (the timing caveat): top's summary and busiest
# processes into $LOGS/NAME.load, the load averages on the console.
note_load() {
    { date; top -bn1 | head -20; } >"$LOGS/$1.load" 2>&1 || true
    say "$1: load average $(cut -d' ' -f1-3 /proc/loadavg) before the run (top: $LOGS/$1.load)"
}

# --- extract ----------------------------------------------------------------------------------
if want extract; then
    if [ "$RAW_TRAIN" != "$DATA/train-raw" ] || [ "$RAW_EVAL" != "$DATA/eval" ]; then
        say "extract: using the extraction in $RAW_TRAIN and $RAW_EVAL"
    else
        [ -d "$TEXT_DIR" ] || die "$TEXT_DIR not found: install Debian's python3.11-doc or set TEXT_DIR (or RAW_TRAIN/RAW_EVAL)"
        mapfile -t files < <(find "$TEXT_DIR" -type f -name '*.rst.txt' | LC_ALL=C sort)
        [ "${#files[@]}" -ge 2 ] || die "$TEXT_DIR: fewer than 2 .rst.txt files"
        train_text=() eval_text=()
        for i in "${!files[@]}"; do
            if (( i % HOLDOUT_EVERY == HOLDOUT_EVERY - 1 )); then eval_text+=("${files[$i]}")
            else train_text+=("${files[$i]}"); fi
        done
        stamp="model=minilm hooks=$X_HOOK,$Y_HOOK context=$CONTEXT tokens=$TOKENS eval_tokens=$EVAL_TOKENS text=$TEXT_DIR files=${#files[@]} holdout=$HOLDOUT_EVERY"
        if [ -f "$DATA/STAMP" ] && [ "$(cat "$DATA/STAMP")" = "$stamp" ] && [ -d "$X_EVAL" ] \
            && [ -d "$RAW_TRAIN" ]; then
            say "extract: reusing $DATA ($stamp)"
        else
            rm -rf "$RAW_TRAIN" "$RAW_EVAL" "$DATA/STAMP" "$DATA/train" "$RES" "$OUT/saetrain"
            mkdir -p "$RES"
            for part in train eval; do
                if [ $part = train ]; then text=("${train_text[@]}") n=$TOKENS dst=$RAW_TRAIN
                else text=("${eval_text[@]}") n=$EVAL_TOKENS dst=$RAW_EVAL; fi
                run_logged "extract-$part" "$PYTHON" tools/extract_activations.py --model minilm \
                    --hook "$X_HOOK" --hook "$Y_HOOK" --context "$CONTEXT" --dtype float32 \
                    --max-tokens "$n" --threads "$THREADS" --out "$dst" --text "${text[@]}" \
                    || die "extraction of the $part text failed"
            done
            echo "$stamp" >"$DATA/STAMP"
        fi
    fi
fi
for d in "$X_EVAL" "$Y_EVAL"; do
    [ -d "$d" ] || die "$d not found: run the extract step or set RAW_EVAL"
done

# --- shuffle ----------------------------------------------------------------------------------
if want shuffle; then
    for d in "$RAW_TRAIN/$(dir_of "$X_HOOK")" "$RAW_TRAIN/$(dir_of "$Y_HOOK")"; do
        [ -d "$d" ] || die "$d not found: run the extract step or set RAW_TRAIN"
    done
    run_logged shuffle "$PYTHON" bench/peers/shuffle_shards.py "$RAW_TRAIN/$(dir_of "$X_HOOK")" \
        "$X_TRAIN" --target "$RAW_TRAIN/$(dir_of "$Y_HOOK")" "$Y_TRAIN" --seed "$SEED" \
        || die "shuffle failed"
fi
if want saetrain || want sparsify; then
    [ -d "$X_TRAIN" ] && [ -d "$Y_TRAIN" ] || die "$X_TRAIN or $Y_TRAIN missing: run the shuffle step"
fi

# --- saetrain ---------------------------------------------------------------------------------
if want saetrain; then
    for arch in $ARCHS; do
        name="$arch-k$K-lr$LR"
        out="$OUT/saetrain/$name"
        rm -f "$RES/saetrain-$name.json"  # a failed rerun leaves no stale row behind
        [ -x "$SAETRAIN" ] || { echo "peers-tc: $SAETRAIN not built; skipping saetrain" >&2; failed+=("saetrain-$name"); continue; }
        note_load "saetrain-$name"
        # Which build trained it (results change with the init between commits).
        say "saetrain-$name: $("$SAETRAIN" --version 2>&1 | head -1)" | tee -a "$LOGS/saetrain-$name.load"
        # shellcheck disable=SC2086  # SAETRAIN_EXTRA is a list of words
        run_logged "saetrain-$name" "$SAETRAIN" "$CONFIG" --overwrite --threads "$THREADS" \
            --set "data.path=$X_TRAIN" --set "data.target_path=$Y_TRAIN" \
            --set "data.eval_path=$X_EVAL" --set "data.eval_target_path=$Y_EVAL" \
            --set data.eval_rows=0 --set data.shuffle_buffer_rows=0 --set "data.epochs=$EPOCHS" \
            --set data.max_tokens=0 --set "data.batch_size=$BATCH" --set "sae.arch=$arch" \
            --set "sae.expansion=$EXPANSION" --set "sae.k=$K" --set "train.lr=$LR" \
            --set "run.seed=$SEED" --set "run.out_dir=$out" $SAETRAIN_EXTRA || continue
        ids=$(ls "$out/sae" 2>/dev/null || true)
        if [ "$(echo "$ids" | wc -w)" -ne 1 ]; then
            echo "peers-tc: $out/sae holds '$ids', not one transcoder" >&2
            failed+=("saetrain-$name")
            continue
        fi
        rm -rf "$out/export"
        run_logged "export-$name" "$SAE_EXPORT" "$out/sae/$ids/final.h5" --format sparsify \
            --out "$out/export" --hook-name "$X_HOOK" || continue
        run_logged "eval-saetrain-$name" "$PYTHON" bench/peers/eval_export.py "$out/export" \
            --eval "$X_EVAL" --eval-target "$Y_EVAL" --summary "$out/summary.csv" \
            --sae-id "$ids" --threads "$THREADS" --batch-size "$BATCH" \
            --json "$RES/saetrain-$name.json" || continue
    done
fi

# --- sparsify ---------------------------------------------------------------------------------
if want sparsify; then
    for arch in $ARCHS; do
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
            name="sparsify-$arch-k$K-$opt$tag"
            rm -f "$RES/$name.json"
            note_load "$name"
            run_logged "$name" "$PYTHON" bench/peers/train_peer.py --tool sparsify --arch "$arch" \
                --train "$X_TRAIN" --train-target "$Y_TRAIN" --eval "$X_EVAL" \
                --eval-target "$Y_EVAL" --batch-size "$BATCH" --expansion "$EXPANSION" \
                --k "$K" --lr "$lr" --optimizer "$opt" --threads "$THREADS" --seed "$SEED" \
                --epochs "$EPOCHS" --tmp-dir "$OUT/scratch" --export-dir "$OUT/sparsify/$name" \
                --json "$RES/$name.json" "${extra[@]}" || continue
        done
    done
fi

# --- table ------------------------------------------------------------------------------------
if want table; then
    "$PYTHON" bench/peers/table.py "$RES" --reference sparsify | tee "$OUT/table.md"
    say "table written to $OUT/table.md; per-transcoder JSON in $RES; logs in $LOGS"
fi
if [ "${#failed[@]}" -gt 0 ]; then
    echo "peers-tc: failed: ${failed[*]}" >&2
    exit 1
fi
