#!/usr/bin/env bash
# Latent sharding on the CPU backend, 1 thread per rank (issue 15's targets):
#   memory: d 768 x n 196,608, the peak resident memory of the largest of 2 shards against the
#           unsharded SAE on 1 rank (target <= 0.6x);
#   speed:  d 768 x n 98,304, k 32, batch 4096, 2 shards x 1 thread against 1 rank x 1 thread
#           (target >= 1.6x), alternating REPS times (default 2), medians.
#   bench/latent_shards.sh BUILD_DIR
set -euo pipefail
build=${1:?usage: bench/latent_shards.sh BUILD_DIR}
reps=${REPS:-2}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 \
    OPENBLAS_NUM_THREADS=1
bench="$build/bench/bench_latent_shards"
field() { sed -n "s/^RESULT.* $1=\([0-9.]*\).*/\1/p;s/^RESULT $1=\([0-9.]*\).*/\1/p" | head -1; }
run() {  # np, options...: prints the bench's line to stderr, the RESULT line to stdout
    local np=$1
    shift
    mpirun -np "$np" --oversubscribe "$bench" "$@" | tee >(cat >&2) | grep '^RESULT'
}
mem=(--latents 196608 --batch 1024 --steps 1)
one_mem=$(run 1 "${mem[@]}")
two_mem=$(run 2 "${mem[@]}")
ones=() twos=()
for _ in $(seq "${reps}"); do
    ones+=("$(run 1 --latents 98304 --k 32 --batch 4096 --steps 3 | field tokens_per_s)")
    twos+=("$(run 2 --latents 98304 --k 32 --batch 4096 --steps 3 | field tokens_per_s)")
done
python3 - "$(echo "$one_mem" | field peak_bytes)" "$(echo "$two_mem" | field peak_bytes)" \
    "${ones[*]}" "${twos[*]}" <<'PY'
import statistics, sys
one_peak, two_peak = float(sys.argv[1]), float(sys.argv[2])
ones = [float(x) for x in sys.argv[3].split()]
twos = [float(x) for x in sys.argv[4].split()]
one, two = statistics.median(ones), statistics.median(twos)
print(f"memory: d 768 x n 196608, peak resident per rank: 1 rank {one_peak/1e9:.2f} GB, "
      f"2 shards {two_peak/1e9:.2f} GB = {two_peak/one_peak:.2f}x (target <= 0.6x)")
print(f"speed: d 768 x n 98304 k 32 batch 4096: 1 rank x 1 thread "
      f"{' '.join(f'{x:.0f}' for x in ones)} tok/s (median {one:.0f}), 2 shards x 1 thread "
      f"{' '.join(f'{x:.0f}' for x in twos)} tok/s (median {two:.0f}) = {two/one:.2f}x "
      f"(target >= 1.6x)")
PY
