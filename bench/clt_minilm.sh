#!/usr/bin/env bash
# bench/clt_minilm.sh — a cross-layer transcoder on all six MLPs of all-MiniLM-L6-v2 beside six
# per-layer transcoders trained on the same rows with the same settings, from extraction to
# circuit-tracer export and the replacement-model splice: held-out FVU per layer and in total,
# L0 per layer, dead %, replacement-model fidelity, tokens/s and peak memory in one table
# (bench/clt_table.py), and the plain-PyTorch CLT step at the same shape (tools/bench_torch_clt.py).
#
#   bash bench/clt_minilm.sh                 # everything, on an idle machine; prints the table
#   STEPS="train table" bash bench/clt_minilm.sh      # reuse the extraction
#   TOKENS=40000 EXPANSION=2 OUT=/tmp/clt-smoke bash bench/clt_minilm.sh   # a smoke run
#
# Steps (STEPS, default all, in this order: extract train export splice torch table):
#   extract   MiniLM's MLP input (encoder.layer.l.attention.output: the attention block's output
#             after its LayerNorm) and output (encoder.layer.l.output.dense: before the residual
#             add and LayerNorm) of every layer l = 0..5, twelve hooks in one forward pass
#             (tools/extract_activations.py, float16, context CONTEXT), TOKENS tokens of the text
#             files of TEXT_DIR (every HOLDOUT_EVERY-th file held out for the splice step).
#   train     configs/clt-minilm.yaml with the same rows, batch, epochs and seed (the last
#             EVAL_ROWS rows held out, never trained on): a CLT (sae.expansion EXPANSION per layer, sae.k K per
#             token and layer) for each activation of ACTS and each sae.k_scope of SCOPES; one
#             more of the first ACTS at the compact parameter count of the per-layer set (12 F d
#             of six transcoders = 27 F' d of a CLT: F' = 12 F / 27, the EQUAL_PARAMS run); and
#             for each activation of ACTS six transcoders (sae.arch transcoder, layer l's pair,
#             sae.k K): at equal L0, K a token and layer for both.
#   export    each BatchTopK / JumpReLU CLT to circuit-tracer's layout (sae-export --format
#             circuit_tracer) and each such per-layer set to the same layout (sae-export --format
#             circuit_tracer --layer l, then bench/clt_from_transcoders.py: a CLT with no
#             cross-layer decoders).
#   splice    tools/splice_eval.py on those directories over the held-out text files: the
#             replacement model (every MLP output replaced at once) and each layer alone, both
#             against mean ablation (a TopK model has no threshold to splice and is skipped).
#   torch     tools/bench_torch_clt.py at the CLT's shape (L 6, d 384, F = EXPANSION x 384, K,
#             BATCH) on THREADS threads: plain PyTorch's step of the same math.
#   table     bench/clt_table.py OUT: one Markdown table, also in OUT/table.md.
#
# Sizes and settings (environment): TOKENS=330000 EVAL_ROWS=20000 BATCH=4096 EPOCHS=1
#   EXPANSION=8 K=16 THREADS=2 SEED=0 ACTS="topk batchtopk" SCOPES="token layer" EQUAL_PARAMS=1
#   CONTEXT=128 TEXT_DIR=/usr/share/doc/python3.11/html/_sources HOLDOUT_EVERY=10
#   SPLICE_TOKENS=20000 OUT=runs/clt-minilm PYTHON (.venv/bin/python, else python3)
#   SAETRAIN=build/cpu/apps/saetrain SAE_EXPORT=build/cpu/apps/sae-export
# tok/s is each run's own (summary.csv: tokens over the training loop's wall time, reading
# included); host memory is each run's peak RSS (summary.csv host_mem_peak_GB). A run that fails
# is reported and skipped; the script then exits 1 after the table.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if [ -z "${PYTHON:-}" ]; then
    if [ -x "$root/.venv/bin/python" ]; then PYTHON="$root/.venv/bin/python"; else PYTHON=python3; fi
fi
OUT="${OUT:-runs/clt-minilm}"
TOKENS="${TOKENS:-330000}"
EVAL_ROWS="${EVAL_ROWS:-20000}"
BATCH="${BATCH:-4096}"
EPOCHS="${EPOCHS:-1}"
EXPANSION="${EXPANSION:-8}"
K="${K:-16}"
THREADS="${THREADS:-2}"
SEED="${SEED:-0}"
ACTS="${ACTS:-topk batchtopk}"
SCOPES="${SCOPES:-token layer}"
EQUAL_PARAMS="${EQUAL_PARAMS:-1}"
CONTEXT="${CONTEXT:-128}"
TEXT_DIR="${TEXT_DIR:-/usr/share/doc/python3.11/html/_sources}"
HOLDOUT_EVERY="${HOLDOUT_EVERY:-10}"
SPLICE_TOKENS="${SPLICE_TOKENS:-20000}"
SAETRAIN="${SAETRAIN:-build/cpu/apps/saetrain}"
SAE_EXPORT="${SAE_EXPORT:-build/cpu/apps/sae-export}"
STEPS="${STEPS:-extract train export splice torch table}"
LAYERS=6
D=384

say() { echo "clt-minilm: $*"; }
die() { echo "clt-minilm: error: $*" >&2; exit 1; }
want() { [[ " $STEPS " == *" $1 "* ]]; }
failed=()
DATA="$OUT/data"
LOGS="$OUT/logs"
mkdir -p "$DATA" "$LOGS" "$OUT/runs" "$OUT/exports" "$OUT/splice"
export OMP_NUM_THREADS="$THREADS"

# Runs a command with its output in $LOGS/NAME.log; a failure is recorded, not fatal.
run_logged() {
    local name="$1"
    shift
    say "$name"
    if "$@" >"$LOGS/$name.log" 2>&1; then
        return 0
    fi
    echo "clt-minilm: $name FAILED; the end of $LOGS/$name.log:" >&2
    tail -8 "$LOGS/$name.log" >&2
    failed+=("$name")
    return 1
}

[ -d "$TEXT_DIR" ] || die "$TEXT_DIR not found: install Debian's python3.11-doc or set TEXT_DIR"
mapfile -t files < <(find "$TEXT_DIR" -type f -name '*.rst.txt' | LC_ALL=C sort)
[ "${#files[@]}" -ge 2 ] || die "$TEXT_DIR: fewer than 2 .rst.txt files"
train_text=() eval_text=()
for i in "${!files[@]}"; do
    if (( i % HOLDOUT_EVERY == HOLDOUT_EVERY - 1 )); then eval_text+=("${files[$i]}")
    else train_text+=("${files[$i]}"); fi
done
in_hook() { echo "encoder.layer.$1.attention.output"; }
out_hook() { echo "encoder.layer.$1.output.dense"; }

# --- extract ----------------------------------------------------------------------------------
if want extract; then
    stamp="hooks=mlp-in-out-0..5 context=$CONTEXT tokens=$TOKENS text=$TEXT_DIR holdout=$HOLDOUT_EVERY"
    if [ -f "$DATA/STAMP" ] && [ "$(cat "$DATA/STAMP")" = "$stamp" ]; then
        say "extract: reusing $DATA ($stamp)"
    else
        rm -rf "$DATA/train" "$DATA/STAMP"
        hooks=()
        for l in $(seq 0 $((LAYERS - 1))); do hooks+=(--hook "$(in_hook "$l")" --hook "$(out_hook "$l")"); done
        run_logged extract "$PYTHON" tools/extract_activations.py --model minilm "${hooks[@]}" \
            --context "$CONTEXT" --dtype float16 --max-tokens "$TOKENS" --threads "$THREADS" \
            --out "$DATA/train" --text "${train_text[@]}" || die "the extraction failed"
        echo "$stamp" >"$DATA/STAMP"
    fi
fi
xs="" ys=""
for l in $(seq 0 $((LAYERS - 1))); do
    xs+=",$DATA/train/$(in_hook "$l")" ys+=",$DATA/train/$(out_hook "$l")"
done
xs="[${xs#,}]" ys="[${ys#,}]"

# configs/clt-minilm.yaml's settings, these changed as the environment says, for every run.
common=(--threads "$THREADS" --overwrite --set data.eval_rows="$EVAL_ROWS"
    --set data.batch_size="$BATCH" --set data.epochs="$EPOCHS" --set run.seed="$SEED"
    --set sae.expansion="$EXPANSION" --set sae.k="$K")
# The CLT runs: name and extra settings.
clt_runs=()
for act in $ACTS; do
    for scope in $SCOPES; do clt_runs+=("clt-$act-$scope|--set sae.transcoder_activation=$act --set sae.k_scope=$scope"); done
done
if [ "$EQUAL_PARAMS" = 1 ]; then
    act="${ACTS%% *}" scope="${SCOPES##* }"
    f=$((12 * EXPANSION * D / 27))
    clt_runs+=("clt-$act-$scope-params|--set sae.transcoder_activation=$act --set sae.k_scope=$scope --set sae.n_latents=$((LAYERS * f))")
fi

# --- train ------------------------------------------------------------------------------------
if want train; then
    [ -x "$SAETRAIN" ] || die "$SAETRAIN not built (cmake --preset cpu && cmake --build --preset cpu)"
    for entry in "${clt_runs[@]}"; do
        name="${entry%%|*}"
        # shellcheck disable=SC2206  # the settings are words
        extra=(${entry#*|})
        run_logged "train-$name" "$SAETRAIN" configs/clt-minilm.yaml "${common[@]}" \
            --set "data.path=$xs" --set "data.target_path=$ys" \
            --set run.out_dir="$OUT/runs/$name" "${extra[@]}" || continue
    done
    for act in $ACTS; do
        for l in $(seq 0 $((LAYERS - 1))); do
            name="tc-$act-layer$l"
            run_logged "train-$name" "$SAETRAIN" configs/clt-minilm.yaml "${common[@]}" \
                --set data.path="$DATA/train/$(in_hook "$l")" \
                --set data.target_path="$DATA/train/$(out_hook "$l")" --set sae.arch=transcoder \
                --set sae.transcoder_activation="$act" --set run.out_dir="$OUT/runs/$name" \
                || continue
        done
    done
fi

# --- export -----------------------------------------------------------------------------------
# The one SAE directory of a run.
sae_of() { ls -d "$OUT/runs/$1"/sae/*/ 2>/dev/null | head -1; }
if want export; then
    for entry in "${clt_runs[@]}"; do
        name="${entry%%|*}"
        [[ "$name" == clt-topk-* ]] && continue  # a per-token top-k has no threshold
        sae="$(sae_of "$name")"
        [ -n "$sae" ] || { say "export: $name has no SAE (train it first)"; continue; }
        rm -rf "$OUT/exports/$name"
        run_logged "export-$name" "$SAE_EXPORT" "$sae" --format circuit_tracer \
            --out "$OUT/exports/$name" --input-hook mlp.hook_in --output-hook hook_mlp_out \
            || continue
    done
    for act in $ACTS; do
        [ "$act" = topk ] && continue
        set_dir="$OUT/exports/set-tc-$act"  # circuit-tracer's transcoder set, one file a layer
        rm -rf "$set_dir" "$OUT/exports/tc-$act"
        for l in $(seq 0 $((LAYERS - 1))); do
            sae="$(sae_of "tc-$act-layer$l")"
            [ -n "$sae" ] || { say "export: tc-$act-layer$l has no SAE"; continue 2; }
            run_logged "export-tc-$act-layer$l" "$SAE_EXPORT" "$sae" --format circuit_tracer \
                --layer "$l" --out "$set_dir" --input-hook mlp.hook_in \
                --output-hook hook_mlp_out || continue 2
        done
        run_logged "export-tc-$act" "$PYTHON" bench/clt_from_transcoders.py \
            "$OUT/exports/tc-$act" "$set_dir" || continue
    done
fi

# --- splice -----------------------------------------------------------------------------------
if want splice; then
    for dir in "$OUT"/exports/clt-* "$OUT"/exports/tc-*; do  # not set-tc-*, the raw sets
        [ -f "$dir/config.yaml" ] || continue
        name="$(basename "$dir")"
        rm -f "$OUT/splice/$name.json"
        run_logged "splice-$name" "$PYTHON" tools/splice_eval.py "$dir" --text "${eval_text[@]}" \
            --max-tokens "$SPLICE_TOKENS" --threads "$THREADS" --json "$OUT/splice/$name.json" || continue
    done
fi

# --- torch ------------------------------------------------------------------------------------
if want torch; then
    torch_acts=""
    for act in $ACTS; do
        torch_acts+=",$act"
        [ "$act" = topk ] && [[ " $SCOPES " == *" layer "* ]] && torch_acts+=",topk-layer"
    done
    run_logged torch "$PYTHON" tools/bench_torch_clt.py --device cpu --threads "$THREADS" \
        --layers "$LAYERS" --d-model "$D" --features $((EXPANSION * D)) --k "$K" \
        --batch "$BATCH" --reps 3 --warmup 1 --activation "${torch_acts#,}" \
        --variants dense,sparse --json && cp "$LOGS/torch.log" "$OUT/torch.jsonl" || true
fi

# --- table ------------------------------------------------------------------------------------
if want table; then
    "$PYTHON" bench/clt_table.py "$OUT" | tee "$OUT/table.md"
fi
if [ "${#failed[@]}" -gt 0 ]; then
    echo "clt-minilm: failed: ${failed[*]}" >&2
    exit 1
fi
