#!/usr/bin/env bash
# Weak scaling of data-parallel training on the CPU backend, 1 thread per rank: runs
# bench_scaling at 1 and at N ranks and prints N-rank tokens/s against N x the 1-rank figure.
#   bench/scaling.sh BUILD_DIR [N=2] [extra bench_scaling options...]
set -euo pipefail
build=${1:?usage: bench/scaling.sh BUILD_DIR [N] [options]}
n=${2:-2}
shift $(( $# >= 2 ? 2 : 1 ))
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
one=$(mpirun -np 1 "$build/bench/bench_scaling" "$@" | tee /dev/stderr | sed -n 's/^RESULT dp_tokens_per_s=\([0-9.]*\).*/\1/p')
many=$(mpirun -np "$n" --oversubscribe "$build/bench/bench_scaling" "$@" | tee /dev/stderr | sed -n 's/^RESULT dp_tokens_per_s=\([0-9.]*\).*/\1/p')
python3 - "$one" "$many" "$n" <<'PY'
import sys
one, many, n = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
print(f"\nweak scaling: {n} ranks {many:.0f} tok/s vs {n} x 1 rank {n*one:.0f} tok/s "
      f"= {100*many/(n*one):.1f}% (target >= 90%)")
PY
