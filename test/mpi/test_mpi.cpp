// Tests that need several ranks: run by ctest under mpirun at 2 and 4 ranks.
//
// Collectives, the shared-sweep stream (identical batches on every rank, every row exactly
// once), data-parallel replicas (bitwise equal, and equal to a one-process reference), the
// rank grid's communicators and the hybrid layout. Every rank runs every test; gtest output comes
// from rank 0 only.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>

#include "saetrain/arch/switch.h"
#include "saetrain/backend.h"
#include "saetrain/checkpoint.h"
#include "saetrain/checkpoint_parts.h"
#include "saetrain/checkpointer.h"
#include "saetrain/comm_choice.h"
#include "saetrain/error.h"
#include "saetrain/loader.h"
#include "saetrain/mpi_world.h"
#include "saetrain/rank_grid.h"
#include "saetrain/sae_math.h"
#include "saetrain/sharded_topk.h"
#include "saetrain/shared_source.h"
#include "saetrain/synth.h"
#include "saetrain/train_state.h"
#include "saetrain/trainer.h"
#include "saetrain/trainer_io.h"
#include "shard_oracle.h"

namespace fs = std::filesystem;
using namespace saetrain;

namespace {

std::unique_ptr<Communicator> g_world;

uint64_t fnv1a(const void* p, size_t n, uint64_t h = 1469598103934665603ull) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

// A temporary directory's path, the same on every rank (collective): rank 0's pid, broadcast,
// keeps concurrent runs of the suite apart.
fs::path common_temp_dir(const std::string& name) {
    int64_t pid = getpid();
    g_world->bcast(&pid, sizeof(pid), 0);
    return fs::temp_directory_path() / ("saetrain_mpi_" + name + "_" + std::to_string(pid));
}

// Synthetic shards written once by rank 0 into a directory every rank sees.
std::string common_dataset(const std::string& name, int64_t rows, int64_t d,
                           DType dtype = DType::f32, bool chunked = false) {
    const fs::path dir = common_temp_dir(name);
    if (g_world->rank() == 0) {
        fs::remove_all(dir);
        SynthOptions so;
        so.out_dir = dir.string();
        so.d_model = d;
        so.n_features = 4 * d;
        so.rows = rows;
        so.shards = 3;
        so.seed = 11;
        so.dtype = dtype;
        so.chunked = chunked;
        so.chunk_rows = 70;
        if (dtype != DType::f32) so.noise_std = 0.5;  // distinct rows even in 16 bits
        synth_write(so);
    }
    g_world->barrier();
    return dir.string();
}

TEST(Mpi, Collectives) {
    Communicator& w = *g_world;
    const int r = w.rank(), n = w.size();
    std::vector<float> f = {float(r), 1.0f};
    w.allreduce_sum(f.data(), 2);
    EXPECT_EQ(f[0], float(n * (n - 1) / 2));
    EXPECT_EQ(f[1], float(n));
    int64_t mx = 10 * r;
    w.allreduce_max(&mx, 1);
    EXPECT_EQ(mx, 10 * (n - 1));
    std::vector<int32_t> all(n);
    const int32_t mine = 100 + r;
    w.allgather(&mine, all.data(), sizeof(int32_t));
    for (int p = 0; p < n; ++p) EXPECT_EQ(all[p], 100 + p);  // rank order
    int64_t b = r == n - 1 ? 42 : 0;
    w.bcast(&b, sizeof(b), n - 1);
    EXPECT_EQ(b, 42);
    // Split into even/odd ranks, ordered by descending key.
    auto sub = w.split(r % 2, -r);
    const int members = (n + 1 - r % 2) / 2;
    EXPECT_EQ(sub->size(), members);
    double one = 1.0;
    sub->allreduce_sum(&one, 1);
    EXPECT_EQ(one, double(members));
    int32_t top = -1;
    if (sub->rank() == 0) top = r;
    sub->bcast(&top, sizeof(top), 0);
    EXPECT_EQ(top % 2, r % 2);
    EXPECT_GE(top, r);  // key -r: the highest rank of the group is its rank 0
}

// Large float all-reduces take the node-local shared-memory path (all ranks of the test share
// a node), across more than one pass of its window: the sums must be exact and identical.
TEST(Mpi, LargeAllReduceIsExactOnEveryRank) {
    Communicator& w = *g_world;
    const int64_t n = (int64_t{1} << 24) + 1000;  // more than one 2^24-float pass
    const int r = w.rank(), p = w.size();
    std::vector<float> x(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(i % 1000) * 0.5f + float(r);
    w.allreduce_sum(x.data(), n);
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) {
        const float want = static_cast<float>(p) * static_cast<float>(i % 1000) * 0.5f +
                           static_cast<float>(p * (p - 1) / 2);
        wrong += x[i] != want;
    }
    EXPECT_EQ(wrong, 0);
    const uint64_t h = fnv1a(x.data(), x.size() * 4);
    std::vector<uint64_t> hs(p);
    w.allgather(&h, hs.data(), sizeof(h));
    for (int q = 0; q < p; ++q) EXPECT_EQ(hs[q], hs[0]);
}

// Shared sweep: every rank gets bitwise-identical batches in the same order, and one epoch of
// the global stream holds every row of the dataset exactly once.
TEST(Mpi, SharedStreamIsIdenticalAndExactlyOnce) {
    Communicator& w = *g_world;
    const int64_t d = 8, total = 5003, batch = 256;  // rows not divisible by ranks or batch
    const DatasetInfo data = dataset_open(common_dataset("shared", total, d));
    LoaderOptions lo;
    lo.shuffle_rows = 700;
    lo.seed = 5 + static_cast<uint64_t>(w.rank());
    ShardBatchSource local(data, partition_rows(total, w.rank(), w.size()), lo);
    SharedBatchSource stream(local, w, batch);
    EXPECT_EQ(stream.total_rows(), total);
    std::vector<float> buf(batch * d), seen;
    int64_t steps = 0;
    for (;;) {
        const int64_t rows = stream.next(buf.data(), batch);
        int64_t any = rows > 0;
        w.allreduce_max(&any, 1);
        if (!any) break;
        ++steps;
        const uint64_t h = fnv1a(buf.data(), static_cast<size_t>(rows * d) * 4, uint64_t(rows));
        std::vector<uint64_t> hs(w.size());
        w.allgather(&h, hs.data(), sizeof(h));
        for (int p = 0; p < w.size(); ++p) ASSERT_EQ(hs[p], hs[0]) << "step " << steps;
        seen.insert(seen.end(), buf.begin(), buf.begin() + rows * d);
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), total * d);
    // Same multiset of rows as the dataset read in order.
    std::vector<float> disk(total * d);
    saetrain::testing::ShardOracle reader(data, {0, total});
    ASSERT_EQ(reader.read(disk.data(), total), total);
    auto sorted_rows = [d](const std::vector<float>& v) {
        std::vector<std::vector<float>> rows;
        for (size_t i = 0; i < v.size(); i += d)
            rows.emplace_back(v.begin() + i, v.begin() + i + d);
        std::sort(rows.begin(), rows.end());
        return rows;
    };
    EXPECT_TRUE(sorted_rows(seen) == sorted_rows(disk));
    EXPECT_NE(std::vector<float>(seen.begin(), seen.begin() + d * 50),
              std::vector<float>(disk.begin(), disk.begin() + d * 50))
        << "the stream should be shuffled";
}

// 16-bit words widened one by one with sae_math.h's reference conversions.
std::vector<float> widened(DType t, const uint16_t* w, int64_t n) {
    std::vector<float> out(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
        out[i] = t == DType::bf16 ? math::bf16_bits_to_float(w[i]) : math::fp16_bits_to_float(w[i]);
    return out;
}

// The shared sweep's all-gather of 16-bit rows (LoaderOptions::widen = false, as saetrain
// reads): every step's batch is the same on every rank and, widened, bit for bit the batch
// of the float32 stream over the same slices; the exchange moves half the bytes (a block per
// other rank of its row count and max_share rows of 2-byte values).
TEST(Mpi, SharedStreamOfSixteenBitRowsIsTheWidenedStream) {
    Communicator& w = *g_world;
    const int64_t d = 8, total = 4003, batch = 250;  // rows not divisible by ranks or batch
    const int64_t g = w.size(), max_share = (batch + g - 1) / g;
    for (DType t : {DType::bf16, DType::f16}) {
        const bool chunked = t == DType::f16;
        SCOPED_TRACE(::testing::Message() << dtype_name(t) << " chunked " << chunked);
        const DatasetInfo data = dataset_open(
            common_dataset(std::string("shared16_") + dtype_name(t), total, d, t, chunked));
        LoaderOptions wide;
        wide.shuffle_rows = 700;
        wide.seed = 5 + static_cast<uint64_t>(w.rank());
        LoaderOptions kept = wide;
        kept.widen = false;
        const RowRange mine = partition_rows(total, w.rank(), w.size());
        ShardBatchSource local_f32(data, mine, wide), local_16(data, mine, kept);
        SharedBatchSource s32(local_f32, w, batch), s16(local_16, w, batch);
        ASSERT_EQ(s16.dtype(), t);
        EXPECT_EQ(s16.total_rows(), total);
        std::vector<float> f(static_cast<size_t>(batch * d));
        std::vector<uint16_t> h(static_cast<size_t>(batch * d));
        int64_t steps = 0, rows_seen = 0;
        for (;;) {
            const int64_t n32 = s32.next(f.data(), batch), n16 = s16.next(h.data(), batch);
            ASSERT_EQ(n16, n32);
            int64_t any = n16 > 0;
            w.allreduce_max(&any, 1);
            if (!any) break;
            ++steps, rows_seen += n16;
            const std::vector<float> wide16 = widened(t, h.data(), n16 * d);
            ASSERT_EQ(std::memcmp(wide16.data(), f.data(), wide16.size() * 4), 0)
                << "step " << steps;
            const uint64_t hash = fnv1a(h.data(), static_cast<size_t>(n16 * d) * 2, uint64_t(n16));
            std::vector<uint64_t> hs(w.size());
            w.allgather(&hash, hs.data(), sizeof(hash));
            for (int p = 0; p < w.size(); ++p) ASSERT_EQ(hs[p], hs[0]) << "step " << steps;
        }
        EXPECT_EQ(rows_seen, total);
        const int64_t block16 = 8 * (1 + (max_share * d * 2 + 7) / 8);
        const int64_t block32 = 8 * (1 + (max_share * d * 4 + 7) / 8);
        EXPECT_EQ(s16.bytes_exchanged(), (steps + 1) * (g - 1) * block16);  // + the empty last
        EXPECT_EQ(s32.bytes_exchanged(), (steps + 1) * (g - 1) * block32);
    }
}

// Ranks of one stream that deliver different element types are refused on every rank (the
// all-gather copies bytes).
TEST(Mpi, SharedStreamRefusesMixedElementTypes) {
    Communicator& w = *g_world;
    const int64_t d = 4;
    std::unique_ptr<MemoryBatchSource> local;
    if (w.rank() == 0)
        local =
            std::make_unique<MemoryBatchSource>(std::vector<uint16_t>(40, 0x3c00), DType::f16, d);
    else
        local = std::make_unique<MemoryBatchSource>(std::vector<float>(40, 1.0f), d);
    std::string error;
    try {
        SharedBatchSource s(*local, w, 8);
    } catch (const Error& e) {
        error = e.what();
    }
    EXPECT_NE(error.find("another type"), std::string::npos) << "rank " << w.rank() << error;
}

SaeConfig small_sae(const std::string& arch) {
    SaeConfig c;
    c.arch = arch;
    c.n_latents = 32;
    c.k = 4;
    c.l1_coeff = 0.5;
    c.lr = 1e-2;
    c.warmup_steps = 0;
    c.l1_warmup_fraction = 0;     // the reference trainer starts at step 0: the same coefficient
    c.normalize_decoder = false;  // keep the raw summed gradient in the buffer for comparison
    return c;
}

// Data parallel: replicas that see different rows stay bitwise identical, and their averaged
// gradient equals the one computed in one process from the same rows.
TEST(Mpi, DataParallelReplicasAgreeWithOneProcessReference) {
    Communicator& w = *g_world;
    const int64_t d = 16, rows = 64;
    // Every architecture; "auxk": TopK with latents dead from the first step (AuxK active);
    // "switch": 4 experts without the balance loss, "switch-balanced" with it.
    for (const char* name_c :
         {"topk", "relu", "batchtopk", "jumprelu", "gated", "auxk", "switch", "switch-balanced"}) {
        const std::string name = name_c;
        const std::string arch = name == "auxk" ? "topk" : name.substr(0, name.find('-'));
        SaeConfig cfg = small_sae(arch);
        if (name == "auxk") {
            cfg.dead_tokens = 1;
            cfg.set("sae.k_aux", 3);
        }
        cfg.set("sae.n_experts", 4);
        cfg.set("train.balance_coeff", name == "switch-balanced" ? 0.1 : 0.0);
        // The one-process reference sees the replicas' rows as one batch: BatchTopK's selection
        // over that batch differs from each replica's over its own, the reference has no
        // history of dead latents, and the balance loss weighs each replica's own token
        // fractions; for those only replica equality is checked.
        const bool has_reference =
            name != "batchtopk" && name != "auxk" && name != "switch-balanced";
        auto be = make_cpu_backend(1);
        SaeTrainer tr(cfg, d, 20, 3, *be, w);
        // One node: the optimizer update is split over node memory unless the environment
        // asks for message passing (the test_mpi_np2_messages run); as two nodes of two
        // (test_mpi_np4_two_nodes) it is split within each and summed across them.
        const bool two_nodes = std::getenv("SAETRAIN_TEST_NODES") && w.size() == 4;
        EXPECT_EQ(tr.splits_update(), std::getenv("SAETRAIN_NO_SHM") == nullptr &&
                                          (two_nodes || !std::getenv("SAETRAIN_TEST_NODES")));
        EXPECT_EQ(tr.store().nodes(), two_nodes ? 2 : 1);
        std::mt19937 rng(100 + w.rank());  // each replica its own rows
        std::normal_distribution<float> normal(0.0f, 1.0f);
        std::vector<float> x(rows * d);
        for (float& v : x) v = normal(rng);
        tr.init(x.data(), rows);
        for (int s = 0; s < 5; ++s) {
            for (float& v : x) v = normal(rng);
            if (!has_reference) {
                tr.step(x.data(), rows);
                continue;
            }
            // Reference, on every rank: the concatenated batch of all replicas in one process.
            std::vector<float> all(x.size() * w.size());
            w.allgather(x.data(), all.data(), static_cast<int64_t>(x.size() * 4));
            auto self = make_self_comm();
            SaeTrainer ref(cfg, d, 20, 3, *be, *self);
            ref.set_params_host(tr.params_host());
            ref.compute_gradients(all.data(), rows * w.size(), 1);
            const std::vector<float> want = ref.grads_host();

            tr.step(x.data(), rows);
            const std::vector<float> got = tr.grads_host();  // summed over replicas
            double worst = 0, scale = 0;
            for (size_t i = 0; i < want.size(); ++i) {
                worst = std::max(worst, double(std::abs(got[i] - want[i])));
                scale = std::max(scale, double(std::abs(want[i])));
            }
            // Same sums in another order (per-replica GEMMs, then the all-reduce): float
            // round-off of ~1e-6 relative; a missing or doubled replica is off by O(1).
            EXPECT_LT(worst, 1e-5 * scale) << name << " step " << s;
        }
        const std::vector<float> p = tr.params_host();
        const uint64_t h = fnv1a(p.data(), p.size() * 4);
        std::vector<uint64_t> hs(w.size());
        w.allgather(&h, hs.data(), sizeof(h));
        for (int q = 0; q < w.size(); ++q)
            EXPECT_EQ(hs[q], hs[0]) << name << ": replica " << q << " drifted";
    }
}

// The Switch router's start (sae.router_init: kmeans): the clusters fitted over the replicas'
// rows, each replica holding its share, are those one process fits on all of them, and the same
// on every replica (the trainer's check of that is the replica hash above).
TEST(Mpi, RouterClustersOverReplicasAreOneProcesssClusters) {
    Communicator& w = *g_world;
    const int64_t d = 12, per = 300, E = 4, rows = per * w.size();
    // Rows about 6 directions of uneven weight, so the biases have work to do.
    std::mt19937 rng(21);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> dirs(6 * d), all(rows * d);
    for (float& v : dirs) v = normal(rng);
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t j = (r * 7) % 10 < 5 ? 0 : (r % 5) + 1;
        for (int64_t c = 0; c < d; ++c) all[r * d + c] = dirs[j * d + c] + 0.3f * normal(rng);
    }
    std::vector<double> start(E * d);
    for (double& v : start) v = normal(rng);
    for (int64_t e = 0; e < E; ++e) {
        double s = 0;
        for (int64_t c = 0; c < d; ++c) s += start[e * d + c] * start[e * d + c];
        for (int64_t c = 0; c < d; ++c) start[e * d + c] /= std::sqrt(s);
    }
    auto self = make_self_comm();
    const RouterClusters one = balanced_router_clusters(all.data(), rows, d, start, *self);
    const RouterClusters mine =
        balanced_router_clusters(all.data() + w.rank() * per * d, per, d, start, w);
    EXPECT_EQ(mine.counts, one.counts);
    EXPECT_EQ(mine.iterations, one.iterations);
    double worst = 0;
    for (size_t i = 0; i < one.centroids.size(); ++i)
        worst = std::max(worst, std::abs(mine.centroids[i] - one.centroids[i]));
    for (size_t e = 0; e < one.bias.size(); ++e)
        worst = std::max(worst, std::abs(mine.bias[e] - one.bias[e]));
    EXPECT_LT(worst, 1e-9) << "sums in another order only";
    const uint64_t h = fnv1a(mine.centroids.data(), mine.centroids.size() * sizeof(double)) ^
                       fnv1a(mine.bias.data(), mine.bias.size() * sizeof(double));
    std::vector<uint64_t> hs(w.size());
    w.allgather(&h, hs.data(), sizeof(h));
    for (int q = 0; q < w.size(); ++q) EXPECT_EQ(hs[q], hs[0]) << "replica " << q;
}

// Hybrid: 2 configs x (world / 2) replicas. Replicas of a config stay equal; the two configs
// (different k) train on the same shared stream and so differ only through k.
TEST(Mpi, HybridSplitsConfigsAndReplicas) {
    Communicator& w = *g_world;
    if (w.size() % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
    Config cfg;
    cfg.parallel.mode = "hybrid";
    cfg.parallel.replicas = w.size() / 2;
    cfg.sweep = {small_sae("topk"), small_sae("topk")};
    cfg.sweep[1].k = 6;
    const RankGrid grid = RankGrid::from_config(cfg, w.size());
    const RankCoords l = grid.at(w.rank());
    EXPECT_EQ(l.configs, 2);
    EXPECT_EQ(l.config, w.rank() / (w.size() / 2));
    GridComms comms = grid.connect(w);
    Communicator& grads = *comms.replicas;
    Communicator& stream = *comms.shared_data;
    EXPECT_EQ(grads.size(), w.size() / 2);
    EXPECT_EQ(stream.size(), 2);

    const int64_t d = 8, batch = 128;
    const DatasetInfo data = dataset_open(common_dataset("hybrid", 3001, d));
    ShardBatchSource local(data, partition_rows(data.total_rows, l.reader(), l.readers()), {});
    SharedBatchSource src(local, stream, batch);
    auto be = make_cpu_backend(1);
    SaeTrainer tr(cfg.sweep[l.config], d, 30, 0, *be, grads);
    std::vector<float> x(batch * d);
    for (int s = 0; s < 6; ++s) {
        const int64_t rows = src.next(x.data(), batch);
        ASSERT_EQ(rows, batch);
        // The replica's batch is the same for both configs.
        const uint64_t h = fnv1a(x.data(), x.size() * 4);
        std::vector<uint64_t> hs(2);
        stream.allgather(&h, hs.data(), sizeof(h));
        EXPECT_EQ(hs[0], hs[1]);
        if (s == 0) tr.init(x.data(), rows);
        tr.step(x.data(), rows);
    }
    const std::vector<float> p = tr.params_host();
    const uint64_t h = fnv1a(p.data(), p.size() * 4);
    std::vector<uint64_t> hs(grads.size());
    grads.allgather(&h, hs.data(), sizeof(h));
    for (uint64_t v : hs) EXPECT_EQ(v, hs[0]);
}

// --- the rank grid's communicators --------------------------------------------------------------

// The world ranks in `comm`, in its rank order (one all-gather through it).
std::vector<int> world_ranks_in(Communicator& comm, int world_rank) {
    std::vector<int> out(static_cast<size_t>(comm.size()));
    comm.allgather(&world_rank, out.data(), sizeof(int));
    return out;
}

// Every grid of G configs x R replicas x S shards that fills the world, with shared and
// disjoint data, with and without a backend (the CPU's gradient_comm takes part in the
// agreement): each communicator RankGrid::connect makes holds exactly the ranks a brute-force
// enumeration (configs, then replicas, then shards, counting up) puts in that group, in that
// order; the groups the grid does not have are absent.
TEST(Mpi, GridBuildsEveryGroupWithTheEnumeratedMembers) {
    Communicator& w = *g_world;
    const int n = w.size();
    auto be = make_cpu_backend(1);
    const NodePlacement place = node_placement();
    for (int G = 1; G <= n; ++G)
        for (int R = 1; R <= n; ++R)
            for (int S = 1; S <= n; ++S) {
                if (G * R * S != n) continue;
                struct Coord {
                    int config, replica, latent_shard;
                };
                std::vector<Coord> all;
                for (int c = 0; c < G; ++c)
                    for (int q = 0; q < R; ++q)
                        for (int s = 0; s < S; ++s) all.push_back({c, q, s});
                const Coord me = all[static_cast<size_t>(w.rank())];
                auto members = [&](auto same) {
                    std::vector<int> out;
                    for (size_t r = 0; r < all.size(); ++r)
                        if (same(all[r])) out.push_back(static_cast<int>(r));
                    return out;
                };
                const std::vector<int> replicas = members([&](const Coord& o) {
                    return o.config == me.config && o.latent_shard == me.latent_shard;
                });
                const std::vector<int> shards = members([&](const Coord& o) {
                    return o.config == me.config && o.replica == me.replica;
                });
                const std::vector<int> shared_data = members([&](const Coord& o) {
                    return o.replica == me.replica && o.latent_shard == me.latent_shard;
                });
                for (bool shared : {true, false})
                    for (bool with_backend : {false, true}) {
                        const RankGrid grid(G, R, S, shared);
                        const std::string what =
                            grid.describe() + (with_backend ? ", CPU backend" : ", host only");
                        BackendGroups how;
                        if (with_backend) how = {be.get(), place.host, 30};
                        GridComms c = grid.connect(w, how);
                        EXPECT_TRUE(c.error.empty()) << what << ": " << c.error;
                        EXPECT_EQ(c.me.config, me.config) << what;
                        EXPECT_EQ(c.me.replica, me.replica) << what;
                        EXPECT_EQ(c.me.latent_shard, me.latent_shard) << what;
                        ASSERT_TRUE(c.replicas) << what;
                        EXPECT_EQ(world_ranks_in(*c.replicas, w.rank()), replicas) << what;
                        if (S > 1) {
                            ASSERT_TRUE(c.latent_shards && c.latent_shards_backend) << what;
                            EXPECT_NE(c.latent_shards.get(), c.latent_shards_backend.get()) << what;
                            EXPECT_EQ(world_ranks_in(*c.latent_shards, w.rank()), shards) << what;
                            EXPECT_EQ(world_ranks_in(*c.latent_shards_backend, w.rank()), shards)
                                << what;
                        } else {
                            EXPECT_FALSE(c.latent_shards || c.latent_shards_backend) << what;
                        }
                        if (shared && G > 1) {
                            ASSERT_TRUE(c.shared_data) << what;
                            EXPECT_EQ(world_ranks_in(*c.shared_data, w.rank()), shared_data)
                                << what;
                        } else {
                            EXPECT_FALSE(c.shared_data) << what;
                        }
                        const LatentShard part = c.latent_shard(64);
                        EXPECT_EQ(part.count, S) << what;
                        EXPECT_EQ(part.index, S > 1 ? me.latent_shard : 0) << what;
                        EXPECT_EQ(part.group, S > 1 ? c.latent_shards.get() : nullptr) << what;
                        EXPECT_EQ(part.backend_group,
                                  S > 1 ? c.latent_shards_backend.get() : nullptr)
                            << what;
                    }
            }
}

// --- latent sharding (issue 15) -----------------------------------------------------------------

// The world as one SAE of R replicas x S latent shards (RankGrid(1, R, S)): this rank's
// coordinates, its replica and shard communicators and its LatentShard.
struct LatentShardGrid {
    int S = 1, R = 1, shard = 0, replica = 0;
    GridComms comms;
    Communicator* replicas = nullptr;  // comms.replicas
    Communicator* shards = nullptr;    // comms.latent_shards
    LatentShard part;
};

LatentShardGrid latent_shard_grid(Communicator& w, int S, int64_t n_total) {
    const RankGrid grid(1, w.size() / S, S, false);
    LatentShardGrid g;
    g.comms = grid.connect(w);
    g.S = S, g.R = grid.replicas();
    g.shard = g.comms.me.latent_shard, g.replica = g.comms.me.replica;
    g.replicas = g.comms.replicas.get();
    g.shards = g.comms.latent_shards.get();
    g.part = g.comms.latent_shard(n_total);
    return g;
}

// The rows of every replica of `g`, concatenated in replica order (x: this replica's).
std::vector<float> all_replicas_rows(const LatentShardGrid& g, const std::vector<float>& x) {
    std::vector<float> all(x.size() * static_cast<size_t>(g.R));
    g.replicas->allgather(x.data(), all.data(), static_cast<int64_t>(x.size() * sizeof(float)));
    return all;
}

double max_abs(const std::vector<float>& v) {
    double m = 0;
    for (float f : v) m = std::max(m, double(std::abs(f)));
    return m;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    double m = 0;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
        m = std::max(m, double(std::abs(a[i] - b[i])));
    return m;
}

// The grids to test at this world size: S shards x (world / S) replicas.
std::vector<int> shard_counts(int world) {
    std::vector<int> out;
    for (int S = 2; S <= world; S *= 2)
        if (world % S == 0) out.push_back(S);
    return out;
}

// This rank's replica's rows: `rows` x d normal values per batch from a stream seeded by
// seed + replica (every shard of a replica draws the same).
struct ReplicaRows {
    ReplicaRows(uint32_t seed, int replica, int64_t rows, int64_t d)
        : rng(seed + static_cast<uint32_t>(replica)), x(static_cast<size_t>(rows * d)) {
        next();
    }
    std::vector<float>& next() {
        for (float& v : x) v = normal(rng);
        return x;
    }
    std::mt19937 rng;
    std::normal_distribution<float> normal{0.0f, 1.0f};
    std::vector<float> x;
};

// Initializes `tr` on the first batch of `data` and trains it `steps` steps on the next ones.
void init_and_train(SaeTrainer& tr, ReplicaRows& data, int64_t rows, int steps) {
    tr.init(data.x.data(), rows);
    for (int s = 0; s < steps; ++s) tr.step(data.next().data(), rows);
}

// A latent-sharded SAE (S shards x R replicas) trains like one process training the whole SAE
// on all replicas' rows: the same loss every step and the same weights after them, for every
// shardable architecture, with AuxK active ("auxk": latents dead from the first step).
//
// The bound: the sharded step computes the same sums in another order (each shard's decoder
// sum, then the all-reduce over shards; per-shard gradient norms, then their sum), so the two
// differ by float32 round-off, ~1e-7 relative per operation. Over 6 Adam steps of lr 1e-2 that
// stays below 1e-5 of the largest weight (measured: ~1e-7). A wrong selection, a b_dec counted
// S times, a missing shard's reconstruction or an unsummed norm moves weights by about one
// step's lr (1e-2) or changes the loss at the first step.
TEST(Mpi, LatentShardsTrainLikeOneProcess) {
    Communicator& w = *g_world;
    const int64_t d = 16, rows = 48;
    for (const int S : shard_counts(w.size()))
        for (const char* name_c :
             {"topk", "auxk", "batchtopk", "relu", "relu+auxk", "jumprelu", "jumprelu+auxk",
              "gated", "gated+auxk", "matryoshka_batchtopk", "transcoder", "skip_transcoder",
              "transcoder/batchtopk", "skip_transcoder/jumprelu"}) {
            // "<arch>/<activation>": a transcoder with that sae.transcoder_activation;
            // "<arch>+auxk" (and "auxk", TopK's): every latent dead after a token, so AuxK runs
            // at every step.
            const std::string name = name_c, arch = name.substr(0, name.find_first_of("/+"));
            const bool auxk = name == "auxk" || name.find("+auxk") != std::string::npos;
            // BatchTopK selects over each replica's batch: the one-process reference over all
            // rows is the same SAE only with one replica.
            if (name.find("batchtopk") != std::string::npos && S != w.size()) continue;
            SaeConfig cfg = small_sae(name == "auxk" ? "topk" : arch);
            if (name.find('/') != std::string::npos)
                cfg.set("sae.transcoder_activation", name.substr(name.find('/') + 1));
            // Matryoshka: a prefix inside the first latent shard and one across a boundary.
            if (name == "matryoshka_batchtopk") cfg.set("sae.matryoshka_prefixes", IntList{6, 20});
            if (auxk) {
                cfg.dead_tokens = 1;
                cfg.set("sae.k_aux", 3);
            }
            cfg.normalize_decoder = true;
            cfg.grad_clip = 0.05;  // clips: the norm summed over shards matters
            LatentShardGrid g = latent_shard_grid(w, S, cfg.n_latents);
            auto be = make_cpu_backend(1);
            auto self = make_self_comm();
            SaeTrainer tr(cfg, d, 20, 3, *be, *g.replicas, &g.part);
            SaeTrainer ref(cfg, d, 20, 3, *be, *self);
            EXPECT_EQ(tr.local_latents(), cfg.n_latents / S);
            std::mt19937 rng(100 + g.replica);  // each replica its own rows, each shard alike
            std::normal_distribution<float> normal(0.0f, 1.0f);
            std::vector<float> x(rows * tr.row_width());  // a transcoder's: [x | y]
            for (float& v : x) v = normal(rng);
            std::vector<float> all = all_replicas_rows(g, x);
            tr.init(x.data(), rows);
            ref.init(all.data(), rows * g.R);
            if (auxk && arch != "topk") {
                // ReLU, JumpReLU and Gated: the even latents silenced (b_enc, Gated's b_gate, at
                // -20), so they are dead from the second step and AuxK selects among them
                // (JumpReLU's among pre-activations that hold b_enc already).
                auto silence = [](SaeTrainer& t, int64_t first) {
                    std::vector<float> p = t.params_host();
                    const int64_t o = t.layout().offset("b_enc");
                    for (int64_t j = 0; j < t.local_latents(); ++j)
                        if ((first + j) % 2 == 0) p[o + j] = -20.0f;
                    t.set_params_host(p);
                };
                silence(tr, g.part.first());
                silence(ref, 0);
            }
            bool ran_auxk = false;
            for (int step = 0; step < 6; ++step) {
                for (float& v : x) v = normal(rng);
                all = all_replicas_rows(g, x);
                if (auxk) ran_auxk |= ref.dead_fraction() > 0;  // dead going into the step
                const StepResult a = tr.step(x.data(), rows);
                const StepResult b = ref.step(all.data(), rows * g.R);
                EXPECT_NEAR(a.loss, b.loss, 1e-5 * b.loss)
                    << name << " S " << S << " step " << step;
                EXPECT_NEAR(a.l0, b.l0, 1e-3) << name << " S " << S << " step " << step;
                EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-5 * b.grad_norm) << name << " S " << S;
                EXPECT_EQ(a.clipped, b.clipped) << name << " S " << S << " step " << step;
            }
            EXPECT_TRUE(ran_auxk || !auxk) << name << ": no latent was dead, AuxK never ran";
            EXPECT_EQ(tr.dead_fraction(), ref.dead_fraction()) << name << " S " << S;
            // Held-out figures and the gates over the whole SAE (the decorrelation of one
            // replica's rows equals the reference's on all rows only with one replica).
            for (float& v : x) v = normal(rng);
            all = all_replicas_rows(g, x);
            // (Only the first shard holds the rows, as saetrain loads them: it broadcasts.)
            const EvalResult ea = tr.evaluate(g.shard == 0 ? x.data() : nullptr, rows, 32);
            const EvalResult eb = ref.evaluate(all.data(), rows * g.R, 32 * g.R);
            EXPECT_NEAR(ea.fvu, eb.fvu, 1e-5 * eb.fvu) << name << " S " << S;
            EXPECT_NEAR(ea.l0, eb.l0, 1e-9) << name << " S " << S;
            EXPECT_EQ(ea.dead_fraction, eb.dead_fraction) << name << " S " << S;
            // The architecture's summary figures (Matryoshka's prefix FVUs) over the whole SAE.
            const auto fa = tr.arch_summary(), fb = ref.arch_summary();
            ASSERT_EQ(fa.size(), fb.size()) << name << " S " << S;
            for (size_t i = 0; i < fa.size(); ++i) {
                EXPECT_EQ(fa[i].first, fb[i].first) << name << " S " << S;
                EXPECT_NEAR(fa[i].second, fb[i].second, 1e-5 * std::abs(fb[i].second))
                    << name << " S " << S << " " << fb[i].first;
            }
            if (name == "matryoshka_batchtopk") {
                // Each prefix's held-out FVU (6 of 20 steps never reach the training window).
                EXPECT_EQ(fb.size(), 2u);
            }
            const QualityGates qa = tr.training_quality(), qb = ref.training_quality();
            EXPECT_NEAR(qa.zeros_frac, qb.zeros_frac, 1e-9) << name << " S " << S;
            if (g.R == 1) {
                EXPECT_GT(qb.decorr_rms, 0.0) << name;
                EXPECT_NEAR(qa.decorr_rms, qb.decorr_rms, 1e-6) << name << " S " << S;
                EXPECT_NEAR(ea.quality.decorr_rms, eb.quality.decorr_rms, 1e-6)
                    << name << " S " << S;
            }
            const SaeWeights got = trainer_weights(tr), want = trainer_weights(ref);
            if (g.shard != 0) {
                EXPECT_EQ(got.n_latents, 0);  // the first shard holds the whole SAE
                continue;
            }
            ASSERT_EQ(got.n_latents, cfg.n_latents);
            const double scale = std::max(max_abs(want.at("W_enc")), max_abs(want.at("W_dec")));
            double worst = 0;  // every tensor: the SAE's four, W_skip held whole by every shard
            ASSERT_EQ(got.tensors.size(), want.tensors.size()) << name;
            for (size_t i = 0; i < got.tensors.size(); ++i) {
                const WeightTensor &a = got.tensors[i], &b = want.tensors[i];
                ASSERT_EQ(a.name, b.name) << name;
                EXPECT_LT(max_diff(a.data, b.data), 1e-5 * scale)
                    << name << " S " << S << " " << a.name;
                worst = std::max(worst, max_diff(a.data, b.data) / scale);
            }
            if (w.rank() == 0)
                std::printf("%s, %d shards x %d replicas: weights within %.2g of the largest\n",
                            name.c_str(), S, g.R, worst);
        }
}

// Chaos-free: at every step of a longer run, the sharded gradient equals the one a single
// process computes from the same parameters and dead-latent state on all replicas' rows (the
// whole SAE restored from the shards' trainer_weights() and trainer_state() before each step), with
// AuxK active, gradient accumulation over two chunks and data.normalize. Over many steps two runs
// drift apart through top-k flips at near-ties (round-off decides them); this compares each
// step's gradient alone, where only summation order differs (bound as above).
TEST(Mpi, LatentShardGradientsEqualOneProcessFromTheSameParameters) {
    Communicator& w = *g_world;
    const int64_t d = 16, rows = 48;
    SaeConfig cfg = small_sae("topk");
    cfg.dead_tokens = 1, cfg.k = 2, cfg.accum_steps = 2;  // latents die
    cfg.set("sae.k_aux", 3);
    cfg.normalize = "expected_average_only_in";
    LatentShardGrid g = latent_shard_grid(w, 2, cfg.n_latents);
    auto be = make_cpu_backend(1);
    auto self = make_self_comm();
    SaeTrainer tr(cfg, d, 40, 9, *be, *g.replicas, &g.part);
    std::mt19937 rng(300 + g.replica);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(rows * d);
    for (float& v : x) v = normal(rng);
    tr.init(x.data(), rows);
    double worst = 0;
    bool aux_ran = false;
    for (int step = 0; step < 30; ++step) {
        for (float& v : x) v = normal(rng);
        std::vector<float> all = all_replicas_rows(g, x);
        // The whole SAE as it is now, restored into one process on the first shard.
        const SaeWeights sw = trainer_weights(tr);
        const TrainState st = trainer_state(tr);
        SaeTrainer ref(cfg, d, 40, 9, *be, *self);
        std::vector<float> want(static_cast<size_t>(ref.layout().total()));
        const StepResult r = tr.step(x.data(), rows);
        aux_ran = aux_ran || r.aux > 0;
        if (g.shard == 0) {
            trainer_restore(ref, sw, st);
            for (float& v : all) v *= ref.input_scale();  // as step() uploads them
            ref.compute_gradients(all.data(), rows * g.R, 1);
            want = ref.grads_host();
        }
        g.shards->bcast(want.data(), static_cast<int64_t>(want.size() * sizeof(float)), 0);
        // This shard's rows of every per-latent segment, and the segments all shards hold.
        const std::vector<float> got = tr.grads_host();
        double scale = 0, diff = 0;
        const auto& whole = ref.layout().segments();
        for (size_t i = 0; i < whole.size(); ++i) {
            const ParamSegment& m = tr.layout().segments()[i];
            const int64_t from = whole[i].offset + (m.per_latent ? g.part.first() * m.cols : 0);
            for (int64_t e = 0; e < m.size(); ++e) {
                scale = std::max(scale, double(std::abs(want[from + e])));
                diff = std::max(diff, double(std::abs(got[m.offset + e] - want[from + e])));
            }
        }
        EXPECT_LT(diff, 1e-5 * scale) << "step " << step << " shard " << g.shard;
        worst = std::max(worst, diff / scale);
    }
    EXPECT_TRUE(aux_ran) << "no latent died: AuxK was never exercised";
    if (w.rank() == 0) std::printf("30 steps: gradients within %.2g of the largest\n", worst);
}

// A sharded SAE's checkpoint holds the whole SAE: restored on the same grid the next step is
// bitwise the one the uninterrupted trainer takes; restored on one process (another shard
// count) it is the same step within round-off (the bound above).
TEST(Mpi, LatentShardedCheckpointResumesBitwiseAndReshards) {
    Communicator& w = *g_world;
    const int64_t d = 16, rows = 40;
    const fs::path dir = common_temp_dir("ckpt");
    SaeConfig cfg = small_sae("topk");
    cfg.dead_tokens = 100;  // some latents die in the window: AuxK state resumes
    cfg.set("sae.k_aux", 3);
    LatentShardGrid g = latent_shard_grid(w, 2, cfg.n_latents);
    auto be = make_cpu_backend(1);
    SaeTrainer tr(cfg, d, 30, 5, *be, *g.replicas, &g.part);
    ReplicaRows data(200, g.replica, rows, d);
    init_and_train(tr, data, rows, 8);
    const SaeWeights sw = trainer_weights(tr);
    const TrainState st = trainer_state(tr);
    if (w.rank() == 0) {
        fs::create_directories(dir);
        sae_write_h5((dir / "w.h5").string(), sw, SaeMeta{"topk", "t", "", cfg.k, st.step, 0});
        train_state_write((dir / "s.h5").string(), sw, st);
    }
    w.barrier();
    const SaeWeights rw = sae_read_h5((dir / "w.h5").string());
    const TrainState rs = train_state_read((dir / "s.h5").string(), rw);
    // The resume path of a run: each shard reads only its blocks of the files (and one rank
    // verifies the checksum); the same trainer as one restored from the whole SAE in memory.
    SaeTrainer from_files(cfg, d, 30, 5, *be, *g.replicas, &g.part);
    {
        CheckpointFiles files((dir / "w.h5").string(), (dir / "s.h5").string());
        if (w.rank() == 0) {
            EXPECT_NO_THROW(files.verify());
        }
        from_files.restore(trainer_read_part(from_files, files), rs.step, rs.tokens);
    }
    w.barrier();
    if (w.rank() == 0) fs::remove_all(dir);

    SaeTrainer resumed(cfg, d, 30, 5, *be, *g.replicas, &g.part);
    trainer_restore(resumed, rw, rs);
    EXPECT_EQ(from_files.params_host(), tr.params_host()) << "rank " << w.rank();
    const TrainState fs_state = trainer_state(from_files);
    if (g.shard == 0) {
        EXPECT_TRUE(fs_state.opt_m == st.opt_m && fs_state.opt_v == st.opt_v &&
                    fs_state.since_fired == st.since_fired && fs_state.step == st.step &&
                    fs_state.tokens == st.tokens);
    }
    EXPECT_EQ(from_files.dead_fraction(), tr.dead_fraction());
    auto self = make_self_comm();
    SaeTrainer one(cfg, d, 30, 5, *be, *self);  // the same SAE unsharded, on all replicas' rows
    trainer_restore(one, rw, rs);
    EXPECT_EQ(resumed.params_host(), tr.params_host()) << "rank " << w.rank();
    EXPECT_EQ(one.dead_fraction(), tr.dead_fraction());
    for (int step = 0; step < 3; ++step) {
        const std::vector<float>& x = data.next();
        const std::vector<float> all = all_replicas_rows(g, x);
        const StepResult a = tr.step(x.data(), rows);
        const StepResult b = resumed.step(x.data(), rows);
        EXPECT_EQ(from_files.step(x.data(), rows).loss, a.loss) << "step " << step;
        const StepResult c = one.step(all.data(), rows * g.R);
        EXPECT_EQ(a.loss, b.loss) << "step " << step;
        EXPECT_NEAR(a.loss, c.loss, 1e-5 * c.loss) << "step " << step;
    }
    EXPECT_EQ(resumed.params_host(), tr.params_host()) << "rank " << w.rank();
    const SaeWeights got = trainer_weights(tr), want = trainer_weights(one);
    if (g.shard == 0) {
        EXPECT_LT(max_diff(got.at("W_dec"), want.at("W_dec")), 1e-5 * max_abs(want.at("W_dec")));
    }
}

// A sharded SAE's checkpoint pair and final.h5, streamed (write_gathered: no rank holds the
// whole SAE), hold what trainer_weights() and trainer_state(), collected in memory and written by
// sae_write_h5 and train_state_write, hold, and pass the same checksum: for an architecture with
// extra per-latent parameters (Gated), one with a buffer (BatchTopK) and data.normalize's scale
// (folded into final.h5).
TEST(Mpi, LatentShardedFilesStreamedEqualGathered) {
    Communicator& w = *g_world;
    const int64_t d = 16, rows = 40;
    const fs::path dir = common_temp_dir("stream");
    for (const int S : shard_counts(w.size()))
        for (const char* arch : {"gated", "batchtopk", "topk"}) {
            SaeConfig cfg = small_sae(arch);
            cfg.normalize = "expected_average_only_in";
            LatentShardGrid g = latent_shard_grid(w, S, cfg.n_latents);
            auto be = make_cpu_backend(1);
            SaeTrainer tr(cfg, d, 30, 5, *be, *g.replicas, &g.part);
            ReplicaRows data(400, g.replica, rows, d);
            init_and_train(tr, data, rows, 3);
            if (g.replica != 0) continue;
            const bool first = g.shard == 0;
            if (first) fs::create_directories(dir);
            g.shards->barrier();
            const SaeMeta meta{arch, "t", "", cfg.k, tr.step_count(), tr.tokens()};
            TrainState header;
            header.step = tr.step_count(), header.tokens = tr.tokens(), header.iteration = 7;
            header.cursors = {1, 2};
            const auto at = [&](const char* f) { return (dir / f).string(); };
            write_gathered(tr, first, at("s.h5"), at("s.state.h5"), meta, header, false);
            write_gathered(tr, first, at("f.h5"), "", meta, {}, true);
            const SaeWeights sw = trainer_weights(tr);
            TrainState st = trainer_state(tr);
            if (!first) continue;
            st.iteration = 7, st.cursors = {1, 2};
            sae_write_h5(at("g.h5"), sw, meta);
            train_state_write(at("g.state.h5"), sw, st);
            sae_write_h5(at("gf.h5"),
                         fold_activation_scale(sw, tr.store().whole_layout().segments()), meta);
            for (const auto& [streamed, gathered] :
                 {std::pair{"s.h5", "g.h5"}, {"f.h5", "gf.h5"}}) {
                const SaeWeights a = sae_read_h5(at(streamed)), b = sae_read_h5(at(gathered));
                EXPECT_TRUE(a == b)
                    << arch << " S " << S << ": " << streamed << " differs from " << gathered;
            }
            try {  // a throw here must not leave the other ranks in the next collective
                const SaeWeights a = sae_read_h5(at("s.h5"));
                const TrainState sa = train_state_read(at("s.state.h5"), a);  // the checksum
                EXPECT_TRUE(sa.opt_m == st.opt_m && sa.opt_v == st.opt_v &&
                            sa.since_fired == st.since_fired && sa.cursors == st.cursors &&
                            sa.iteration == 7 && sa.step == st.step)
                    << arch << " S " << S;
            } catch (const std::exception& e) {
                ADD_FAILURE() << arch << " S " << S << ": " << e.what();
            }
            fs::remove_all(dir);
        }
}

// --- checkpoints in parts (checkpoint_parts.h) --------------------------------------------------

// Counts the bytes this rank receives through a communicator (what other ranks' data a
// collective brings it), around another.
class CountingComm final : public Communicator {
public:
    explicit CountingComm(Communicator& inner) : c_(inner) {}
    int64_t received = 0;
    int rank() const override { return c_.rank(); }
    int size() const override { return c_.size(); }
    std::string name() const override { return c_.name(); }
    void allreduce_sum(float* data, int64_t n) override {
        received += size() > 1 ? n * int64_t{sizeof(float)} : 0;
        c_.allreduce_sum(data, n);
    }
    void allreduce_sum(double* data, int64_t n) override {
        received += size() > 1 ? n * int64_t{sizeof(double)} : 0;
        c_.allreduce_sum(data, n);
    }
    void allreduce_max(int64_t* data, int64_t n) override {
        received += size() > 1 ? n * int64_t{sizeof(int64_t)} : 0;
        c_.allreduce_max(data, n);
    }
    void allgather(const void* send, void* recv, int64_t bytes) override {
        received += (size() - 1) * bytes;
        c_.allgather(send, recv, bytes);
    }
    void bcast(void* data, int64_t bytes, int root) override {
        received += rank() == root ? 0 : bytes;
        c_.bcast(data, bytes, root);
    }
    void barrier() override { c_.barrier(); }
    std::unique_ptr<Communicator> split(int color, int key) override {
        return c_.split(color, key);
    }

private:
    Communicator& c_;
};

// Bytes this process has passed to write(2) and its kin (the kernel's count, /proc/self/io
// "wchar"), or -1 where the kernel does not say.
int64_t bytes_written_by_this_process() {
    std::ifstream f("/proc/self/io");
    std::string key;
    int64_t value = 0;
    while (f >> key >> value)
        if (key == "wchar:") return value;
    return -1;
}

// Issue 59's target: a latent-sharded SAE's checkpoint is written by every latent shard, its own
// part, so no rank writes or receives more than its share of the weights and optimizer state
// (1/S of everything per latent, plus on the first latent shard what belongs to no latent: b_dec
// and its moments) plus the manifest. Bytes written are the kernel's count for this process
// across Checkpointer::save (every file it writes: the part, the manifest, the commit marker),
// which may exceed the tensors by the files' HDF5 metadata and attributes (kMetadata; measured:
// 13 KiB for a part's two files); bytes received are counted in every communicator the save uses.
// The gather this replaced wrote the whole SAE on the first latent shard and broadcast each latent
// shard's rows to all: every rank received (S-1)/S of the whole.
TEST(Mpi, LatentShardedCheckpointEachRankWritesAndReceivesOnlyItsPart) {
    Communicator& w = *g_world;
    const int S = w.size();
    const int64_t d = 64, rows = 32;
    SaeConfig cfg = small_sae("topk");
    cfg.n_latents = 1024;  // 0.8 MB of weights and moments a latent shard at S 4
    LatentShardGrid g = latent_shard_grid(w, S, cfg.n_latents);
    CountingComm world(w), replicas(*g.replicas), shards(*g.shards);
    LatentShard part = g.part;
    part.group = &shards;
    auto be = make_cpu_backend(1);
    SaeTrainer tr(cfg, d, 10, 5, *be, replicas, &part);
    ReplicaRows data(300, g.replica, rows, d);
    init_and_train(tr, data, rows, 2);
    const fs::path dir = common_temp_dir("parts_bytes");
    const std::string sae_dir = (dir / "sae" / "t").string();
    if (w.rank() == 0) fs::remove_all(dir);
    w.barrier();
    int64_t written = 0, received = 0;
    {
        Checkpointer ck(world, replicas, dir.string(), sae_dir,
                        SaeMeta{"topk", "t", "", cfg.k, 0, 0}, 3, g.shard);
        world.received = replicas.received = shards.received = 0;
        const int64_t before = bytes_written_by_this_process();
        ck.save(tr, 2, 0, 0, /*wait=*/true);
        written = bytes_written_by_this_process() - before;
        received = world.received + replicas.received + shards.received;
        if (before < 0) written = -1;
    }
    const int64_t total = tr.store().whole_layout().total();
    const int64_t whole = 3 * total * int64_t{sizeof(float)} + cfg.n_latents * int64_t{8};
    const int64_t no_latent = 3 * d * int64_t{sizeof(float)};  // b_dec, adam_m and adam_v's
    const int64_t share = (whole - no_latent) / S + no_latent;
    std::error_code no_manifest;
    const int64_t manifest = static_cast<int64_t>(
        fs::file_size(checkpoint_manifest_path(sae_dir, tr.step_count()), no_manifest));
    EXPECT_FALSE(no_manifest) << "no manifest";
    constexpr int64_t kMetadata = 32 << 10;
    if (w.rank() == 0)
        std::printf(
            "checkpoint of %lld latents x d %lld over %d latent shards: whole %lld B, a share "
            "%lld B, manifest %lld B\n",
            static_cast<long long>(cfg.n_latents), static_cast<long long>(d), S,
            static_cast<long long>(whole), static_cast<long long>(share),
            static_cast<long long>(manifest));
    std::printf("  rank %d: wrote %lld B, received %lld B\n", w.rank(),
                static_cast<long long>(written), static_cast<long long>(received));
    if (written < 0) {
        GTEST_SKIP() << "no /proc/self/io: bytes written not counted";
    }
    EXPECT_GT(written, (whole - no_latent) / S) << "rank " << w.rank() << " wrote no part";
    EXPECT_LE(written, share + manifest + kMetadata) << "rank " << w.rank();
    // Received: the latent shards' few bytes on their parts (file sizes and checksums) and the
    // agreements, never tensor data.
    EXPECT_LE(received, share + manifest) << "rank " << w.rank();
    EXPECT_LE(received, int64_t{256} * S) << "rank " << w.rank();
    w.barrier();
    if (w.rank() == 0) fs::remove_all(dir);
}

// The parts hold the whole SAE: read back through CheckpointParts on every rank, each tensor
// equals trainer_weights() and trainer_state() collected in memory, bit for bit, every part
// verifies, and a flipped byte fails that part's verification alone, naming its file. Restored
// on the latent shard count that wrote them, on half of it and on one process, the trainer holds
// the written SAE bit for bit: Gated (per-latent parameters), BatchTopK (buffers), a skip
// transcoder (W_skip [d, d], of no latent); the others with data.normalize's scale.
TEST(Mpi, LatentShardedPartsReadBackOnAnyLatentShardCount) {
    Communicator& w = *g_world;
    const int S = w.size();
    // Wide enough that the tensors fill most of a part's file: the flipped bytes below land in
    // them, not in HDF5's metadata or free space.
    const int64_t d = 32, rows = 40;
    const fs::path dir = common_temp_dir("parts");
    for (const std::string arch : {"gated", "batchtopk", "skip_transcoder", "topk"}) {
        SaeConfig cfg = small_sae(arch);
        cfg.n_latents = 256;
        if (arch != "skip_transcoder") cfg.normalize = "expected_average_only_in";
        cfg.dead_tokens = 100;  // since_fired matters
        auto be = make_cpu_backend(1);
        LatentShardGrid g = latent_shard_grid(w, S, cfg.n_latents);
        SaeTrainer tr(cfg, d, 30, 5, *be, *g.replicas, &g.part);
        std::mt19937 rng(7);  // every rank the same rows: one replica
        std::normal_distribution<float> normal(0.0f, 1.0f);
        std::vector<float> x(static_cast<size_t>(rows * tr.row_width()));
        for (float& v : x) v = normal(rng);
        tr.init(x.data(), rows);
        for (int step = 0; step < 3; ++step) {
            for (float& v : x) v = normal(rng);
            tr.step(x.data(), rows);
        }
        const SaeWeights sw = trainer_weights(tr);  // the whole SAE on world rank 0
        const TrainState st = trainer_state(tr);
        if (w.rank() == 0) {
            fs::remove_all(dir);
            fs::create_directories(dir);
        }
        w.barrier();
        TrainState header;
        header.step = tr.step_count(), header.tokens = tr.tokens(), header.iteration = 9;
        header.cursors = std::vector<int64_t>{3, 4};
        const SaeMeta meta{arch, "t", "config: 1\n", cfg.k, header.step, header.tokens};
        EXPECT_NO_THROW(write_checkpoint_parts(tr, dir.string(), meta, header)) << arch;
        w.barrier();
        const std::string manifest = checkpoint_manifest_path(dir.string(), header.step);
        try {  // a throw here must not leave the other ranks in the next collective
            const CheckpointParts parts(manifest);
            EXPECT_EQ(parts.parts(), S);
            for (int k = 0; k < S; ++k) {
                EXPECT_EQ(parts.first_latent(k), k * cfg.n_latents / S);
                EXPECT_NO_THROW(parts.verify(k)) << arch << " part " << k;
            }
            const TrainState h = parts.header();
            EXPECT_TRUE(h.step == header.step && h.tokens == header.tokens && h.iteration == 9 &&
                        h.cursors == header.cursors);
            EXPECT_EQ(parts.meta().config_yaml, meta.config_yaml);
            if (w.rank() == 0) {
                const TensorsInMemory whole(sw, st);
                std::vector<TensorInfo> tensors = trainer_weight_tensors(tr, false);
                tensors.push_back({"adam_m", {}, false});
                tensors.push_back({"adam_v", {}, false});
                for (const TensorInfo& t : tensors) {
                    const auto shape = whole.shape(t.name);
                    if (!shape) {
                        ADD_FAILURE() << t.name;
                        continue;
                    }
                    EXPECT_EQ(parts.shape(t.name), shape) << arch << " " << t.name;
                    int64_t count = 1;
                    for (int64_t s : *shape) count *= s;
                    std::vector<float> a(static_cast<size_t>(count)), b(a.size());
                    const std::vector<int64_t> zero(shape->size(), 0);
                    parts.read(t.name, zero, *shape, a.data());
                    whole.read(t.name, zero, *shape, b.data());
                    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)))
                        << arch << " " << t.name;
                }
                // A block across parts: W_enc's columns and adam_m's elements in the middle.
                const int64_t n = cfg.n_latents, c0 = n / S - 3, cols = n / 2;
                std::vector<float> a(static_cast<size_t>(5 * cols)), b(a.size());
                parts.read("W_enc", {2, c0}, {5, cols}, a.data());
                whole.read("W_enc", {2, c0}, {5, cols}, b.data());
                EXPECT_EQ(a, b) << arch;
                const int64_t m0 = 3 * d * n / (2 * S) + 5, mc = d * n;
                a.resize(static_cast<size_t>(mc)), b.resize(a.size());
                parts.read("adam_v", {m0}, {mc}, a.data());
                whole.read("adam_v", {m0}, {mc}, b.data());
                EXPECT_EQ(a, b) << arch;
                std::vector<int64_t> fa(static_cast<size_t>(n)), fb(fa.size());
                parts.read("since_fired", 0, n, fa.data());
                whole.read("since_fired", 0, n, fb.data());
                EXPECT_EQ(fa, fb) << arch;
            }
        } catch (const std::exception& e) {
            ADD_FAILURE() << arch << ": " << e.what();
        }
        // Restored on S (every rank its own latents), S / 2 (2 replicas of S / 2 latent shards
        // each) and 1 latent shard: the SAE gathered back equals the written one bit for bit.
        std::vector<int> counts = {S};
        if (S / 2 > 1) counts.push_back(S / 2);
        for (const int to : counts) {
            LatentShardGrid g2 = latent_shard_grid(w, to, cfg.n_latents);
            SaeTrainer t2(cfg, d, 30, 5, *be, *g2.replicas, &g2.part);
            CheckpointPart mine;
            try {
                mine = trainer_read_part(t2, CheckpointParts(manifest));
            } catch (const std::exception& e) {
                ADD_FAILURE() << arch << " on " << to << ": " << e.what();
            }
            t2.restore(std::move(mine), header.step, header.tokens);
            const SaeWeights w2 = trainer_weights(t2);
            const TrainState s2 = trainer_state(t2);
            if (w.rank() == 0) {
                EXPECT_TRUE(w2 == sw) << arch << ": " << S << " parts restored on " << to;
                EXPECT_TRUE(s2.opt_m == st.opt_m && s2.opt_v == st.opt_v &&
                            s2.since_fired == st.since_fired)
                    << arch << ": " << S << " parts restored on " << to;
            }
        }
        {
            auto self = make_self_comm();
            SaeTrainer one(cfg, d, 30, 5, *be, *self);
            try {
                one.restore(trainer_read_part(one, CheckpointParts(manifest)), header.step,
                            header.tokens);
                const SaeWeights w1 = trainer_weights(one);
                const TrainState s1 = trainer_state(one);
                if (w.rank() == 0) {
                    EXPECT_TRUE(w1 == sw && s1.opt_m == st.opt_m && s1.opt_v == st.opt_v &&
                                s1.since_fired == st.since_fired)
                        << arch << ": " << S << " parts restored on one process";
                }
            } catch (const std::exception& e) {
                ADD_FAILURE() << arch << " on one process: " << e.what();
            }
        }
        // Damage: 4 bytes in the middle of the last part's weights file.
        w.barrier();
        const std::string last = checkpoint_part_path(dir.string(), header.step, S - 1, S);
        if (w.rank() == 0) {
            std::fstream f(last, std::ios::in | std::ios::out | std::ios::binary);
            f.seekp(static_cast<std::streamoff>(fs::file_size(last) / 2));
            f.write("\x13\x37\x13\x37", 4);
        }
        w.barrier();
        try {
            const CheckpointParts parts(manifest);
            for (int k = 0; k + 1 < S; ++k) EXPECT_NO_THROW(parts.verify(k)) << arch << " " << k;
            try {
                parts.verify(S - 1);
                ADD_FAILURE() << arch << ": a damaged part verified";
            } catch (const Error& e) {
                EXPECT_NE(std::string(e.what()).find("checkpoint part " + last), std::string::npos)
                    << e.what();
            }
        } catch (const std::exception& e) {
            ADD_FAILURE() << arch << ": " << e.what();
        }
        w.barrier();
    }
    if (w.rank() == 0) fs::remove_all(dir);
}

// Checkpoints written before the parts (one pair whatever the latent shard count, as
// write_gathered still writes it: the same files as sae_write_h5 and train_state_write,
// LatentShardedFilesStreamedEqualGathered) resume through Checkpointer::resume onto latent
// shards, bitwise; the Checkpointer then writes parts, which resume bitwise too, and the pair
// rotated out is deleted.
TEST(Mpi, CheckpointerResumesPairsWrittenBeforePartsAndItsOwnParts) {
    Communicator& w = *g_world;
    const int S = w.size();
    const int64_t d = 16, rows = 40;
    const fs::path dir = common_temp_dir("ckpt_pair");
    const std::string sae_dir = (dir / "sae" / "t").string();
    SaeConfig cfg = small_sae("jumprelu");
    cfg.dead_tokens = 100;
    LatentShardGrid g = latent_shard_grid(w, S, cfg.n_latents);
    auto be = make_cpu_backend(1);
    SaeTrainer tr(cfg, d, 30, 5, *be, *g.replicas, &g.part);
    ReplicaRows data(500, g.replica, rows, d);
    init_and_train(tr, data, rows, 4);
    if (w.rank() == 0) fs::remove_all(dir);
    w.barrier();
    const SaeMeta meta{"jumprelu", "t", "", cfg.k, tr.step_count(), tr.tokens()};
    TrainState header;
    header.step = tr.step_count(), header.tokens = tr.tokens(), header.iteration = 4;
    header.cursors = std::vector<int64_t>{5, 6};
    write_gathered(tr, g.shard == 0, checkpoint_weights_path(sae_dir, header.step),
                   checkpoint_state_path(sae_dir, header.step), meta, header, false);
    if (w.rank() == 0) {
        fs::create_directories(dir / "checkpoints");
        std::ofstream(dir / "checkpoints" / fmt::format("step-{}.commit", header.step)) << "{}\n";
    }
    w.barrier();
    SaeTrainer from_pair(cfg, d, 30, 5, *be, *g.replicas, &g.part);
    {
        Checkpointer ck(w, *g.replicas, dir.string(), sae_dir, meta, 1, g.shard);
        const auto at = ck.resume(from_pair, "", false);
        ASSERT_TRUE(at.has_value()) << ck.newest_failure();
        EXPECT_TRUE(at->step == header.step && at->iteration == 4 && at->epoch == 5 &&
                    at->offset == 6);
        EXPECT_EQ(from_pair.params_host(), tr.params_host()) << "rank " << w.rank();
        const std::vector<float>& x = data.next();
        EXPECT_EQ(from_pair.step(x.data(), rows).loss, tr.step(x.data(), rows).loss);
        // Parts now, at the next step; keep 1 rotates the pair out.
        ck.save(from_pair, 5, 7, 8, /*wait=*/true);
    }
    EXPECT_TRUE(fs::exists(checkpoint_manifest_path(sae_dir, tr.step_count())));
    EXPECT_FALSE(fs::exists(checkpoint_weights_path(sae_dir, header.step)));
    EXPECT_FALSE(fs::exists(checkpoint_state_path(sae_dir, header.step)));
    SaeTrainer from_parts(cfg, d, 30, 5, *be, *g.replicas, &g.part);
    {
        Checkpointer ck(w, *g.replicas, dir.string(), sae_dir, meta, 1, g.shard);
        const auto at = ck.resume(from_parts, "", false);
        ASSERT_TRUE(at.has_value()) << ck.newest_failure();
        EXPECT_TRUE(at->step == tr.step_count() && at->iteration == 5 && at->epoch == 7 &&
                    at->offset == 8);
    }
    EXPECT_EQ(from_parts.params_host(), tr.params_host()) << "rank " << w.rank();
    const std::vector<float>& x = data.next();
    EXPECT_EQ(from_parts.step(x.data(), rows).loss, tr.step(x.data(), rows).loss);
    EXPECT_EQ(from_parts.params_host(), tr.params_host()) << "rank " << w.rank();
    w.barrier();
    if (w.rank() == 0) fs::remove_all(dir);
}

// The first shard's reader feeds every shard of its group the same rows, and the end of the
// data reaches all of them together.
TEST(Mpi, BroadcastBatchSourceGivesEveryShardTheReadersRows) {
    Communicator& w = *g_world;
    const int64_t d = 3, rows = 10;
    auto group = w.split(w.rank() / 2, w.rank());  // pairs of ranks
    std::vector<float> data(static_cast<size_t>(rows * d));
    std::iota(data.begin(), data.end(), 100.0f * static_cast<float>(w.rank() / 2));
    std::unique_ptr<MemoryBatchSource> reader;
    if (group->rank() == 0) reader = std::make_unique<MemoryBatchSource>(data, d);
    BroadcastBatchSource src(reader.get(), *group, d);
    EXPECT_EQ(src.total_rows(), rows);
    std::vector<float> got(static_cast<size_t>(4 * d));
    int64_t seen = 0;
    for (int64_t n; (n = src.next(got.data(), 4)) > 0; seen += n)
        for (int64_t i = 0; i < n * d; ++i) ASSERT_EQ(got[i], data[seen * d + i]);
    EXPECT_EQ(seen, rows);
}

// The same with 16-bit rows: the other shards learn the reader's element type and receive its
// words as they are (a NaN's bits included: nothing is converted on the way).
TEST(Mpi, BroadcastBatchSourcePassesSixteenBitRowsAsTheyAre) {
    Communicator& w = *g_world;
    const int64_t d = 3, rows = 10;
    auto group = w.split(w.rank() / 2, w.rank());  // pairs of ranks
    std::vector<uint16_t> data(static_cast<size_t>(rows * d));
    std::iota(data.begin(), data.end(), static_cast<uint16_t>(0x3c00 + 64 * (w.rank() / 2)));
    data[7] = 0x7fc1;  // a bf16 NaN with a payload
    std::unique_ptr<MemoryBatchSource> reader;
    if (group->rank() == 0) reader = std::make_unique<MemoryBatchSource>(data, DType::bf16, d);
    BroadcastBatchSource src(reader.get(), *group, d);
    EXPECT_EQ(src.dtype(), DType::bf16);
    EXPECT_EQ(src.total_rows(), rows);
    std::vector<uint16_t> got(static_cast<size_t>(4 * d + 1), 0xABCD);
    int64_t seen = 0;
    for (int64_t n; (n = src.next(got.data(), 4)) > 0; seen += n) {
        for (int64_t i = 0; i < n * d; ++i) ASSERT_EQ(got[i], data[seen * d + i]);
        ASSERT_EQ(got[4 * d], 0xABCD);  // 2 bytes a value, not 4
    }
    EXPECT_EQ(seen, rows);
}

}  // namespace

// The latent-sharded TopK over the world (each rank one latent shard, uneven when the world
// does not divide n) equals topk_forward over all the latents on every rank, bit for bit, on
// tie-heavy inputs (issue 15).
TEST(Mpi, ShardedTopkEqualsTheUnshardedSelection) {
    const int P = g_world->size(), me = g_world->rank();
    const int64_t rows = 37, n = 1001, k = 16;
    std::mt19937 rng(7);  // the same inputs on every rank
    std::uniform_int_distribution<int> q(-8, 8);
    std::vector<float> pre(static_cast<size_t>(rows * n)), bias(static_cast<size_t>(n));
    for (float& v : pre) v = 0.25f * static_cast<float>(q(rng));
    for (int64_t r = 0; r < rows; r += 4)  // rows with fewer than k positive values
        for (int64_t i = 0; i < n; ++i) pre[r * n + i] = -std::abs(pre[r * n + i]);
    for (float& v : bias) v = 0.0625f * static_cast<float>(q(rng));
    auto be = make_cpu_backend(1);
    std::vector<int32_t> want_idx(rows * k), got_idx(rows * k);
    std::vector<float> want_val(rows * k), got_val(rows * k);
    be->topk_forward(pre.data(), bias.data(), rows, n, k, want_idx.data(), want_val.data(), true);
    const int64_t lo = n * me / P, hi = n * (me + 1) / P, nl = hi - lo;
    std::vector<float> mine(static_cast<size_t>(rows * nl));
    for (int64_t r = 0; r < rows; ++r)
        std::copy(pre.begin() + r * n + lo, pre.begin() + r * n + hi, mine.begin() + r * nl);
    ShardedTopkScratch scratch;
    sharded_topk_forward(*be, *g_world, mine.data(), bias.data() + lo, rows, nl, k,
                         static_cast<int32_t>(lo), got_idx.data(), got_val.data(), true, scratch);
    EXPECT_EQ(got_idx, want_idx) << "rank " << me;
    EXPECT_EQ(got_val, want_val) << "rank " << me;
}

// --- the communicator agreement (comm_choice.h)
// ---------------------------------------------------
namespace {

// A faked 16-byte GPU UUID numbered `gpu`.
std::string fake_uuid(int gpu) {
    std::string u(16, '\x5a');
    u[0] = static_cast<char>(gpu);
    return u;
}

CommFacts fake_gpu(int gpu, const std::string& host = "n0") {
    CommFacts f;
    f.world_rank = g_world->rank();
    f.host = host;
    f.device_uuid = fake_uuid(gpu);
    f.device = 0;
    f.nccl = true;
    return f;
}

// Whether every rank of `comm` holds the same text.
bool same_on_every_rank(Communicator& comm, const std::string& text) {
    const uint64_t h = fnv1a(text.data(), text.size());
    std::vector<uint64_t> all(static_cast<size_t>(comm.size()));
    comm.allgather(&h, all.data(), sizeof(h));
    return std::all_of(all.begin(), all.end(), [&](uint64_t x) { return x == h; });
}

// comm_agree's error on this rank, or "" when it agreed.
std::string agree_error(Communicator& group, const CommFacts& mine, CommChoice* out = nullptr) {
    try {
        const CommChoice c = comm_agree(group, mine);
        if (out) *out = c;
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

std::string joined(const std::vector<std::string>& lines) {
    std::string all;
    for (const std::string& l : lines) all += l + "\n";
    return all;
}

}  // namespace

// Every rank feeds its own (faked) facts through the real gather, rule and check; every rank must
// reach the same decision, which follows from all the ranks' facts, not its own.
TEST(Mpi, CommAgreementReachesOneDecisionFromEveryRanksFacts) {
    Communicator& w = *g_world;
    const int r = w.rank(), n = w.size();
    CommChoice c;
    // Per-task binding: one host, every rank its own GPU (each sees it as device 0).
    ASSERT_EQ(agree_error(w, fake_gpu(r), &c), "");
    EXPECT_EQ(c.kind, CommKind::nccl);
    EXPECT_TRUE(c.notes.empty());

    // Two ranks per GPU: staged, and the notes name each pair, the same on every rank.
    ASSERT_EQ(agree_error(w, fake_gpu(r / 2), &c), "");
    EXPECT_EQ(c.kind, CommKind::mpi_staged);
    ASSERT_EQ(c.notes.size(), static_cast<size_t>(n / 2));
    EXPECT_EQ(c.notes[0].rfind("ranks 0,1 share GPU 0 (GPU-005a5a5a) on node n0: gradients go "
                               "through MPI staged through host memory",
                               0),
              0u)
        << c.notes[0];
    EXPECT_TRUE(same_on_every_rank(w, joined(c.notes)));

    // Only the last rank lacks NCCL: every rank falls back with it (a per-rank decision would
    // leave the others in NCCL's bootstrap); CUDA-aware MPI everywhere makes it mpi_device.
    CommFacts f = fake_gpu(r);
    f.nccl = r != n - 1;
    f.mpi_cuda_aware = true;
    ASSERT_EQ(agree_error(w, f, &c), "");
    EXPECT_EQ(c.kind, CommKind::mpi_device);
    f.mpi_cuda_aware = r != 0;  // ... but not when one rank's MPI is not CUDA-aware
    ASSERT_EQ(agree_error(w, f, &c), "");
    EXPECT_EQ(c.kind, CommKind::mpi_staged);
    EXPECT_TRUE(same_on_every_rank(w, joined(c.notes)));

    // Sub-groups decide for themselves: even ranks share GPU 0 on n0, odd ranks each have their
    // own on n1 (with n = 2 each group has one rank: host's decision applies unchanged).
    auto sub = w.split(r % 2, r);
    ASSERT_EQ(agree_error(*sub, r % 2 == 0 ? fake_gpu(0) : fake_gpu(100 + r, "n1"), &c), "");
    const bool shared = r % 2 == 0 && sub->size() > 1;
    EXPECT_EQ(c.kind, shared ? CommKind::mpi_staged : CommKind::nccl) << "rank " << r;
}

// A CPU rank in a group of GPU ranks: the same one-line refusal on every rank, and no rank left
// waiting (the world is usable right after).
TEST(Mpi, CommAgreementRefusesACpuRankInAGpuGroupOnEveryRank) {
    Communicator& w = *g_world;
    const int r = w.rank();
    CommFacts f = fake_gpu(r, r == 0 ? "cpu-node" : "n0");
    if (r == 0) f.device_uuid.clear(), f.nccl = false;
    const std::string what = agree_error(w, f);
    EXPECT_NE(what.find("one group of ranks mixes backends: rank 0 (node cpu-node) on the CPU, "
                        "rank"),
              std::string::npos)
        << what;
    EXPECT_EQ(what.find('\n'), std::string::npos);
    EXPECT_TRUE(same_on_every_rank(w, what));
    w.barrier();
}

// Ranks that decided differently (a different build on one node, say) are caught by the check
// before any communicator is made: every rank throws the same line naming who decided what.
TEST(Mpi, CommDisagreementIsOneLineOnEveryRankWithNoHang) {
    Communicator& w = *g_world;
    const int r = w.rank(), n = w.size();
    std::vector<CommFacts> facts = comm_gather_facts(w, fake_gpu(r));
    auto check = [&](CommKind kind, const std::string& refusal) -> std::string {
        try {
            comm_check_agreement(w, kind, refusal, facts);
        } catch (const Error& e) {
            return e.what();
        }
        return "";
    };
    // Agreement passes quietly.
    EXPECT_EQ(check(CommKind::mpi_staged, ""), "");
    // Rank 0 decided NCCL, the others staged.
    std::string what = check(r == 0 ? CommKind::nccl : CommKind::mpi_staged, "");
    const std::string others = n == 2 ? "rank 1" : fmt::format("ranks 1-{}", n - 1);
    EXPECT_EQ(what, fmt::format("the ranks of one group decided different communicators from the "
                                "same facts ({} chose mpi_staged; rank 0 chose nccl); they would "
                                "hang in different set-up calls, so the run stops here: run one "
                                "saetrain build with the same settings on every rank",
                                others));
    EXPECT_TRUE(same_on_every_rank(w, what));
    // The last rank refused the group, the others did not.
    what = check(CommKind::nccl, r == n - 1 ? "refused here" : "");
    EXPECT_NE(what.find(fmt::format("rank {} refused the group", n - 1)), std::string::npos)
        << what;
    EXPECT_TRUE(same_on_every_rank(w, what));
    // Every rank refused: the refusal itself.
    EXPECT_EQ(check(CommKind::nccl, "the same refusal"), "the same refusal");
    w.barrier();
}

// The CPU backend's gradient_comm takes part in the agreement and hands the group back as it
// is (the CPU path unchanged); the job's warnings come out the same on every rank, once each.
TEST(Mpi, CpuGradientCommIsTheGroupAndJobWarningsAreOnePerGpu) {
    Communicator& w = *g_world;
    const int n = w.size();
    auto be = make_cpu_backend(1);
    auto group = w.split(0, w.rank());
    Communicator* raw = group.get();
    CommChoice choice;
    choice.kind = CommKind::nccl;
    auto comm = be->gradient_comm(std::move(group), w.rank(), "n0", 30, &choice);
    EXPECT_EQ(comm.get(), raw);
    EXPECT_EQ(choice.kind, CommKind::host);
    EXPECT_TRUE(choice.notes.empty());

    // Every rank on GPU 7 of n0; only rank 0 passes a group note, about ranks 0 and 1.
    const std::string note =
        "ranks 0,1 share GPU 0 (GPU-075a5a5a) on node n0: gradients go through MPI staged "
        "through host memory (NCCL refuses two ranks on one GPU)";
    std::vector<std::string> notes;
    if (w.rank() == 0) notes = {note, note};
    const std::vector<std::string> lines = comm_job_warnings(w, fake_gpu(7), notes);
    EXPECT_TRUE(same_on_every_rank(w, joined(lines)));
    ASSERT_EQ(lines.size(), n == 2 ? 1u : 2u) << joined(lines);
    EXPECT_EQ(lines[0], note);
    if (n > 2) {
        EXPECT_EQ(lines[1], fmt::format("ranks 0-{} share GPU 0 (GPU-075a5a5a) on node n0: they "
                                        "take turns on it (each runs slower than on a GPU of its "
                                        "own)",
                                        n - 1));
    }
}

int main(int argc, char** argv) {
    MpiScope mpi(&argc, &argv);
    g_world = make_mpi_world();
    ::testing::InitGoogleTest(&argc, argv);
    if (g_world->rank() != 0) {
        auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
        delete listeners.Release(listeners.default_result_printer());
    }
    const int rc = RUN_ALL_TESTS();
    // A failure on any rank fails the job.
    int64_t worst = rc;
    g_world->allreduce_max(&worst, 1);
    g_world.reset();
    return static_cast<int>(worst);
}
