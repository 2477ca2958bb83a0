#!/usr/bin/env bash
# Weak scaling of data-parallel training on the CPU backend, 1 thread per rank: runs
# bench_scaling at 1 and at N ranks, alternating, REPS times each (default 3), and prints the
# median N-rank tokens/s against N x the median 1-rank figure. Alternating and taking medians
# keeps a slow moment of a shared machine from deciding the ratio.
#   bench/scaling.sh BUILD_DIR [N=2] [extra bench_scaling options...]     (REPS=5 to change)
set -euo pipefail
build=${1:?usage: bench/scaling.sh BUILD_DIR [N] [options]}
n=${2:-2}
shift $(( $# >= 2 ? 2 : 1 ))
reps=${REPS:-3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
result() { sed -n 's/^RESULT dp_tokens_per_s=\([0-9.]*\).*/\1/p'; }
ones=() manys=()
for _ in $(seq "${reps}"); do
    ones+=("$(mpirun -np 1 "$build/bench/bench_scaling" "$@" | result)")
    manys+=("$(mpirun -np "$n" --oversubscribe "$build/bench/bench_scaling" "$@" | result)")
done
python3 - "$n" "${ones[*]}" "${manys[*]}" <<'PY'
import statistics, sys
n = int(sys.argv[1])
ones = [float(x) for x in sys.argv[2].split()]
manys = [float(x) for x in sys.argv[3].split()]
one, many = statistics.median(ones), statistics.median(manys)
print(f"1 rank:  {' '.join(f'{x:.0f}' for x in ones)} tok/s (median {one:.0f})")
print(f"{n} ranks: {' '.join(f'{x:.0f}' for x in manys)} tok/s (median {many:.0f})")
print(f"weak scaling: {n} ranks {many:.0f} tok/s vs {n} x 1 rank {n*one:.0f} tok/s "
      f"= {100*many/(n*one):.1f}% (target >= 90%)")
PY
