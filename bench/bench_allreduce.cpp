// bench_allreduce — run under mpirun: the float all-reduce saetrain's replicas use (MpiComm), as
// bus bandwidth, NCCL's measure and what sae-perfmodel's --nic-gbps and --nvlink-gbps take:
// 2 (R - 1) / R x bytes / time, R ranks. One rank a host measures the link between hosts; all
// ranks on one host, its shared-memory path.
//
//   mpirun -np 2 bench_allreduce [--mb 16] [--reps 20]
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <vector>

#include "saetrain/mpi_world.h"

using namespace saetrain;

int main(int argc, char** argv) {
    MpiScope mpi(&argc, &argv);
    auto world = make_mpi_world();
    double mb = 16;
    int reps = 20;
    CLI::App app{"bench_allreduce: MPI float all-reduce bus bandwidth (GB/s)"};
    app.add_option("--mb", mb, "message size in MB (float32)")->capture_default_str();
    app.add_option("--reps", reps, "timed all-reduces (median reported)")->capture_default_str();
    CLI11_PARSE(app, argc, argv);
    const int R = world->size();
    if (R < 2) {
        if (world->rank() == 0) fmt::print(stderr, "bench_allreduce: run it on 2 or more ranks\n");
        return 2;
    }
    const auto n = static_cast<int64_t>(mb * 1e6 / sizeof(float));
    std::vector<float> buf(static_cast<size_t>(n), 1.0f);
    world->allreduce_sum(buf.data(), n);  // warm-up: connections, pages
    std::vector<double> secs;
    for (int r = 0; r < reps; ++r) {
        world->barrier();
        const auto t0 = std::chrono::steady_clock::now();
        world->allreduce_sum(buf.data(), n);
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        world->allreduce_sum(&s, 1);  // the ranks' mean: each waits for the slowest anyway
        secs.push_back(s / R);
    }
    std::sort(secs.begin(), secs.end());
    const double t = secs[secs.size() / 2];
    const double bytes = static_cast<double>(n) * sizeof(float);
    const double bus = 2.0 * (R - 1) / R * bytes / t / 1e9;
    if (world->rank() == 0) {
        fmt::print("bench_allreduce | {} ranks | {:.1f} MB float32 | median of {}: {:.2f} ms\n", R,
                   bytes / 1e6, reps, t * 1e3);
        fmt::print("RESULT bus_GBps={:.3f} algorithm_GBps={:.3f}\n", bus, bytes / t / 1e9);
    }
    return 0;
}
