#!/usr/bin/env bash
# bench_step with no --arch times every architecture of the registry, and each must come back
# with a result (a key with no default, Matryoshka's prefixes, once aborted the whole run; a
# transcoder once got half its paired rows; the CLT runs on 2 layers). Tiny shapes: this checks
# completion, not speed.
# Usage: test/bench_step_every_arch.sh BENCH_STEP
set -euo pipefail
bench=$1
out=$("$bench" --d-model 32 --latents 256 --k 4 --batch 64 --reps 1 --threads 1 --experts 4 --layers 2 \
    --json)
archs=$("$bench" --help | sed -n 's/.*--arch TEXT:{\([^}]*\)}.*/\1/p' | tr ',' ' ')
[ -n "$archs" ] || { echo "bench_step --help lists no architectures"; exit 1; }
json=$(tail -1 <<< "$out")
for a in $archs; do
    if ! grep -q "\"$a\":{\"step_ms\"" <<< "$json"; then
        echo "bench_step: no result for $a"
        echo "$out"
        exit 1
    fi
done
echo "bench_step timed every architecture: $archs"
