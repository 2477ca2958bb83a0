#!/usr/bin/env bash
# same-results.sh — do two builds of saetrain train bitwise the same SAEs?
#
#   tools/same-results.sh REFERENCE_BUILD [CANDIDATE_BUILD]     (default candidate: build/cpu)
#
# For refactors that must not change results (issue 16): builds REFERENCE_BUILD from an older
# commit (git worktree add /tmp/ref <commit> && cmake --preset cpu there), then this script runs
# the same matrix of small runs with both builds and compares every SAE's final.h5 with
# `sae-inspect --compare` (bitwise) and the loss columns of metrics.jsonl (as text). The matrix:
# every architecture (a sweep rank each) with held-out rows, normalization, AuxK and the
# decorrelation penalty; bf16 and chunked f16 shards; a 2-rank data-parallel run, a 2-rank
# sweep of replicas sharing the stream, a 4-rank hybrid, and a run resumed from a checkpoint;
# 16-bit rows through data parallelism and through a shared sweep of latent-sharded SAEs (the
# all-gather and the shard broadcast, issue 27); schedule-free signum (resumed: its average's
# weights replayed); Matryoshka, transcoders and skip-transcoders, and a 2-layer CLT of each
# activation, resumed too.
# Exit status 0 only when every file matches.
set -euo pipefail

ref=$(cd "${1:?usage: same-results.sh REFERENCE_BUILD [CANDIDATE_BUILD]}" && pwd)
cand=$(cd "${2:-build/cpu}" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OPENBLAS_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun_n() { mpirun --oversubscribe --bind-to none -np "$@"; }

"$ref/apps/sae-synth" --out "$work/f32" --rows 24000 --d-model 32 --features 128 >/dev/null
"$ref/apps/sae-synth" --out "$work/bf16" --rows 12000 --d-model 32 --features 128 --dtype bf16 \
    --seed 1 >/dev/null
"$ref/apps/sae-synth" --out "$work/f16" --rows 12000 --d-model 32 --features 128 --dtype f16 \
    --chunked --chunk-rows 300 --seed 2 >/dev/null
"$ref/apps/sae-synth" --out "$work/tc-in" --target "$work/tc-out" --rows 12000 --d-model 32 \
    --features 128 --seed 3 >/dev/null
for l in 0 1; do  # a 2-layer CLT's pairs
    "$ref/apps/sae-synth" --out "$work/clt-in$l" --target "$work/clt-out$l" --rows 12000 \
        --d-model 32 --features 64 --seed $((4 + l)) >/dev/null
done

common=(--set data.batch_size=256 --set log.every_steps=5 --set checkpoint.every_steps=20
        --set sae.expansion=4 --set sae.k=8 --set train.lr=2e-3)
# name | ranks | extra --set options
cases=(
  "archs|3|data.path=$work/f32 sae.arch=[relu,topk,batchtopk] data.eval_rows=2000 data.normalize=expected_average_only_in train.decorr_coeff=0.01 data.epochs=2"
  "archs2|3|data.path=$work/f32 sae.arch=[jumprelu,gated,switch] sae.n_experts=4 data.eval_rows=2000 train.auxk_coeff=0.03"
  "bf16|1|data.path=$work/bf16 sae.arch=topk data.shuffle_buffer_rows=0"
  "f16|2|data.path=$work/f16 sae.arch=[batchtopk,relu]"
  "dp2|2|data.path=$work/f32 sae.arch=topk parallel.mode=data_parallel data.eval_rows=1000"
  "shared2|2|data.path=$work/f32 sae.arch=topk sae.k=[4,8] parallel.mode=sweep"
  "hybrid4|4|data.path=$work/f32 sae.arch=[topk,switch] sae.n_experts=2 parallel.mode=hybrid parallel.replicas=2"
  "f16dp2|2|data.path=$work/f16 sae.arch=topk parallel.mode=data_parallel data.eval_rows=1000"
  "bf16shards4|4|data.path=$work/bf16 sae.arch=topk sae.k=[4,8] parallel.latent_shards=2 data.eval_rows=1000"
  "signum|3|data.path=$work/f32 sae.arch=[topk,relu,jumprelu] train.optimizer=signum data.eval_rows=1000"
  "matryoshka|1|data.path=$work/f32 sae.arch=matryoshka_batchtopk sae.matryoshka_prefixes=[16,64] data.eval_rows=1000"
  "transcoders|4|data.path=$work/tc-in data.target_path=$work/tc-out sae.arch=[transcoder,skip_transcoder] sae.transcoder_activation=[topk,jumprelu] data.eval_rows=1000"
  "clt|3|data.path=[$work/clt-in0,$work/clt-in1] data.target_path=[$work/clt-out0,$work/clt-out1] sae.arch=clt sae.expansion=2 sae.k=4 sae.transcoder_activation=[topk,batchtopk,jumprelu] data.eval_rows=1000"
)

cfg="$(cd "$(dirname "$0")/.." && pwd)/configs/quickstart.yaml"
run_case() {  # build out ranks sets...: train into $out, print its log on failure
    local build=$1 out=$2 ranks=$3
    shift 3
    local sets=()
    for s in "$@"; do sets+=(--set "$s"); done
    local cmd=("$build/apps/saetrain" "$cfg" --threads 1 "${common[@]}" "${sets[@]}"
               --set "run.out_dir=$out")
    mkdir -p "$(dirname "$out")"
    if [ "$ranks" = 1 ]; then "${cmd[@]}" >>"$out.log" 2>&1; else mpirun_n "$ranks" "${cmd[@]}" >>"$out.log" 2>&1; fi
}
same() {  # reference-run candidate-run label: compare every final.h5
    local n=0
    for fa in "$1"/sae/*/final.h5; do
        local id
        id=$(basename "$(dirname "$fa")")
        if "$cand/apps/sae-inspect" "$fa" --compare "$2/sae/$id/final.h5" >/dev/null 2>&1; then
            n=$((n + 1))
        else
            echo "$3: $id/final.h5 differs"
            fail=1
        fi
    done
    echo "$3: $n SAE(s) bitwise equal"
}
# metrics.jsonl without the fields that measure time, memory or the threads the cores left
losses() { sed -E 's/"[A-Za-z_]*(per_s|MBps|tflops|mfu|wait_fraction|elapsed_s|_GB|cpu_threads)":[^,}]*,?//g' "$1/metrics.jsonl"; }

fail=0
for c in "${cases[@]}"; do
    IFS='|' read -r name ranks sets <<<"$c"
    read -r -a set_list <<<"$sets"
    a="$work/ref/$name" b="$work/cand/$name"
    run_case "$ref" "$a" "$ranks" "${set_list[@]}" || { cat "$a.log"; echo "$name: reference run failed"; fail=1; continue; }
    run_case "$cand" "$b" "$ranks" "${set_list[@]}" || { cat "$b.log"; echo "$name: candidate run failed"; fail=1; continue; }
    same "$a" "$b" "$name ($ranks rank(s))"
    diff <(losses "$a") <(losses "$b") >/dev/null || { echo "$name: metrics.jsonl differs"; fail=1; }
    if [ "$name" = archs ] || [ "$name" = signum ] || [ "$name" = clt ]; then
        # Stopped by SIGTERM after 30 iterations (exit 75), then run again to the end.
        r="$work/cand/$name-resumed"
        SAETRAIN_FAULT=0:30:TERM run_case "$cand" "$r" "$ranks" "${set_list[@]}" && { echo "$name: the stop did not stop"; fail=1; }
        run_case "$cand" "$r" "$ranks" "${set_list[@]}" || { cat "$r.log"; echo "$name: resumed run failed"; fail=1; }
        same "$a" "$r" "$name, stopped at 30 and resumed"
    fi
done
[ "$fail" = 0 ] && echo "same results: every SAE bitwise equal" || echo "same results: DIFFERENCES"
exit "$fail"
