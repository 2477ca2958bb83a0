#!/usr/bin/env bash
# gpu-bundle.sh — package saetrain for a GPU machine that has a CUDA driver, cuBLASLt and NCCL
# but none of our other libraries (no MPI, HDF5, yaml-cpp, OpenBLAS, fmt, GoogleTest).
#
# Builds the CUDA configuration here for Hopper (sm_90, no -march=native: the GPU machine's CPU
# is not this one), then writes one archive, .gpu-bundle/saetrain-gpu.tar.xz, holding
#   bin/    the apps, the GPU tests and the benchmarks
#   lib/    every shared library they (and Open MPI's plugins) need that a bare CUDA image lacks:
#           all but glibc's own, the driver (libcuda) and cuBLAS/cuBLASLt/NCCL, which are found
#           on the GPU machine (tools/gpu-run.sh searches the CUDA toolkit and PyTorch's wheels)
#   usr/    Open MPI and PMIx as Debian installs them (mpirun, orted, plugins, help texts),
#           relocated at run time with OPAL_PREFIX / PMIX_INSTALL_PREFIX
#   CTestTestfile.cmake  the `gpu`-labelled tests with paths relative to the bundle, so
#           `ctest -L gpu` runs there as it does in a build tree
# The archive travels to the GPU machine as a carried path (docs/cuda.md, "On a lent GPU").
#
# Usage: bash tools/gpu-bundle.sh [BUILD_DIR (build/gpu)] [OUT_DIR (.gpu-bundle)]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/gpu}
out=${2:-.gpu-bundle}

# --- build --------------------------------------------------------------------------------------
if [ ! -f "$build/CMakeCache.txt" ]; then
    cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSAETRAIN_CUDA=ON \
        -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DSAETRAIN_NATIVE=OFF -DSAETRAIN_TESTS=ON -DSAETRAIN_BENCH=ON
fi
cmake --build "$build" -j"$(nproc)" --target saetrain sae-synth sae-inspect sae-perfmodel \
    sae-iobench sae-export test_backend_parity test_cuda_backend test_cuda_comm bench_step

# --- stage --------------------------------------------------------------------------------------
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
for b in apps/saetrain apps/sae-synth apps/sae-inspect apps/sae-perfmodel apps/sae-iobench \
    apps/sae-export test/test_backend_parity test/test_cuda_backend test/test_cuda_comm \
    bench/bench_step; do
    cp "$build/$b" "$stage/bin/"
done

# Open MPI and PMIx, file for file as their Debian packages install them (under usr/).
for pkg in openmpi-bin libopenmpi3 openmpi-common libpmix2; do
    dpkg -L "$pkg" | while read -r f; do
        case "$f" in /usr/share/doc/* | /usr/share/man/* | /usr/share/lintian/*) continue ;; esac
        if [ -f "$f" ] || [ -L "$f" ]; then
            mkdir -p "$stage$(dirname "$f")"
            cp -a "$f" "$stage$f"
        fi
    done
done
# Debian's mpirun is a link through /etc/alternatives, which the GPU machine lacks.
ln -sf orterun "$stage/usr/bin/mpirun"

# Shared libraries: the closure of what the binaries and the MPI plugins load, less what every
# CUDA machine has (glibc, the driver) or what is too large to carry (cuBLAS/cuBLASLt: ~0.5 GB,
# NCCL: ~0.2 GB; both come with the CUDA toolkit or PyTorch there).
skip='^(libc|libm|libdl|librt|libpthread|libresolv|libutil|libanl|libnsl|ld-linux-x86-64|libcuda|libcublas|libcublasLt|libnccl|linux-vdso)\.so'
objs=$(find "$stage/bin" "$stage/usr" -type f \( -perm -u+x -o -name '*.so*' \))
for o in $objs; do
    { ldd "$o" 2>/dev/null || true; } | awk '/=> \// {print $1, $3}'
done | sort -u | while read -r name path; do
    if [[ ! "$name" =~ $skip ]] && [ ! -e "$stage/lib/$name" ] &&
        [ ! -e "$stage/usr/lib/x86_64-linux-gnu/$name" ]; then
        cp -L "$path" "$stage/lib/$name"
    fi
done

# ctest's view of the bundle: the gpu tests as test/tests_cuda.cmake declares them. @B@ is the
# folder the bundle is unpacked into (tools/gpu-run.sh substitutes it).
cat > "$stage/CTestTestfile.cmake.in" <<'EOF'
# The GPU tests of saetrain in the unpacked bundle (written by tools/gpu-bundle.sh).
set(_skip "\\[  SKIPPED \\]")
add_test(test_backend_parity_cuda "@B@/bin/test_backend_parity" "--gtest_filter=*/cuda")
set_tests_properties(test_backend_parity_cuda PROPERTIES LABELS gpu SKIP_REGULAR_EXPRESSION "${_skip}")
add_test(test_cuda_backend "@B@/bin/test_cuda_backend")
set_tests_properties(test_cuda_backend PROPERTIES LABELS gpu SKIP_REGULAR_EXPRESSION "${_skip}")
foreach(np 1 2)
    foreach(comm nccl staged ordered agreed delay)
        if(comm STREQUAL "delay")
            set(_filter "CollectiveDelay*")
        else()
            set(_filter "Comm/GpuCommVsMpi.*/${comm}")
        endif()
        add_test(test_cuda_comm_${comm}_np${np} "@B@/usr/bin/mpirun" "-np" "${np}"
            "--oversubscribe" "@B@/bin/test_cuda_comm" "--gtest_filter=${_filter}")
        set_tests_properties(test_cuda_comm_${comm}_np${np} PROPERTIES LABELS gpu TIMEOUT 300
            SKIP_REGULAR_EXPRESSION "${_skip}")
    endforeach()
endforeach()
EOF
git rev-parse HEAD > "$stage/COMMIT" 2>/dev/null || echo unknown > "$stage/COMMIT"
git status --porcelain >> "$stage/COMMIT" 2>/dev/null || true

mkdir -p "$out"
rm -f "$out/saetrain-gpu.tar.gz"  # the older, gzip bundle: 50 MiB against the carry limit of 64
tar -C "$stage" -cf - . | xz -T0 -6 > "$out/saetrain-gpu.tar.xz"
size=$(stat -c %s "$out/saetrain-gpu.tar.xz")
echo "gpu-bundle: $out/saetrain-gpu.tar.xz, $((size / 1048576)) MiB ($(ls "$stage/lib" | wc -l) libraries)"
if [ "$size" -gt $((56 * 1048576)) ]; then
    echo "gpu-bundle: error: the archive exceeds 56 MiB; the device tool carries 64 MiB in all" >&2
    exit 1
fi
