// param_store.cpp — the three placements of an SAE's parameters (see param_store.h).
#include "saetrain/param_store.h"

#include <unistd.h>  // gethostname

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "saetrain/comm.h"
#include "saetrain/error.h"
#include "saetrain/optimizer.h"  // defines: OptimizerOps

namespace saetrain {

namespace {

constexpr int64_t kChunkElements = int64_t{1} << 24;  // a gather's chunk: 64 MiB of floats

}  // namespace

// --- what every placement shares ---------------------------------------------------------------

ParamStore::ParamStore(ParamLayout layout, ParamLayout whole, const LatentShard& latent_shard,
                       Backend& be, Communicator& replicas, bool normalize_decoder)
    : layout_(std::move(layout)),
      whole_layout_(std::move(whole)),
      latent_shard_(latent_shard),
      be_(be),
      replicas_(replicas),
      normalize_decoder_(normalize_decoder),
      owned_hi_(latent_shard.n_local()) {}

ParamStore::~ParamStore() = default;

float* ParamStore::pointer(Buffer which) const {
    switch (which) {
        case Buffer::params:
            return p_;
        case Buffer::grads:
            return g_;
        case Buffer::opt_m:
            return m_;
        case Buffer::opt_v:
            return v_;
    }
    return nullptr;
}

std::vector<AdamRange> ParamStore::ranges(int64_t lo, int64_t hi, bool with_non_latent) const {
    std::vector<AdamRange> out;
    for (const ParamSegment& s : layout_.segments()) {
        if (s.per_latent)
            out.push_back({s.offset + lo * s.cols, (hi - lo) * s.cols, s.decay, s.lr_scale});
        else
            out.push_back({s.offset, with_non_latent ? s.size() : 0, s.decay, s.lr_scale});
    }
    return out;
}

UnitRows ParamStore::unit_rows() const {
    UnitRows u;
    if (!normalize_decoder_) return u;
    const ParamSegment* unit = nullptr;  // the decoder, whose rows are unit (W_dec)
    for (const ParamSegment& s : layout_.segments()) {
        if (!s.unit_rows || !s.per_latent) continue;
        SAE_ENFORCE(!unit,
                    "sae.normalize_decoder keeps one tensor's rows at unit norm; the SAE "
                    "declares two ({} and {})",
                    unit ? unit->name : "", s.name);
        unit = &s;
    }
    if (unit)
        u.offset = unit->offset + owned_lo_ * unit->cols, u.rows = owned_hi_ - owned_lo_,
        u.cols = unit->cols;
    return u;
}

void ParamStore::update(OptimizerOps& ops, const math::AdamScalars& s, float weight_decay) {
    // Weights (W_enc, W_dec) get weight decay, biases and thresholds do not.
    ops.apply(p_, g_, m_, v_, owned_ranges(), unit_rows(), s, weight_decay);
}

void ParamStore::swap(Buffer a, Buffer b) { be_.swap(pointer(a), pointer(b), size()); }

std::vector<float> ParamStore::host(Buffer which) const {
    std::vector<float> out(static_cast<size_t>(size()));
    be_.download(out.data(), pointer(which), size() * static_cast<int64_t>(sizeof(float)));
    return out;
}

void ParamStore::write(Buffer which, const std::vector<float>& values) {
    SAE_ENFORCE(static_cast<int64_t>(values.size()) == size(),
                "parameter buffer has {} values, expected {}", values.size(), size());
    be_.upload(pointer(which), values.data(), size() * static_cast<int64_t>(sizeof(float)));
}

void ParamStore::sum_over_latent_shards(double*, int64_t) const {}
void ParamStore::sum_over_latent_shards_on_backend(float*, int64_t) const {}
std::vector<double> ParamStore::all_latents(const std::vector<double>& mine) const { return mine; }

template <class T>
void ParamStore::gather(const T* mine, int64_t cols, const RowSink<T>& sink) const {
    const int64_t n = latent_shard_.n_local();
    const int64_t rows = std::max<int64_t>(1, kChunkElements / std::max<int64_t>(1, cols));
    const bool first = !latent_sharded() || latent_shard_.group->rank() == 0;
    std::vector<T> buf;
    for (int64_t q = 0; q < latent_shard_.count; ++q)
        for (int64_t r0 = 0; r0 < n; r0 += rows) {
            const int64_t count = std::min(rows, n - r0) * cols;
            buf.resize(static_cast<size_t>(count));
            if (q == latent_shard_.index) std::copy_n(mine + r0 * cols, count, buf.begin());
            if (latent_sharded())
                latent_shard_.group->bcast(buf.data(), count * static_cast<int64_t>(sizeof(T)),
                                           static_cast<int>(q));
            if (first) sink((q * n + r0) * cols, count, buf.data());
        }
}

void ParamStore::gather_latents(const float* mine, int64_t cols, const RowSink<float>& sink) const {
    gather(mine, cols, sink);
}

void ParamStore::gather_latents(const int64_t* mine, int64_t cols,
                                const RowSink<int64_t>& sink) const {
    gather(mine, cols, sink);
}

void ParamStore::gather_parts(int64_t count, const std::function<void(float*)>& make,
                              const std::function<void(int64_t, const float*)>& take) const {
    const bool first = !latent_sharded() || latent_shard_.group->rank() == 0;
    std::vector<float> part;
    for (int64_t q = 0; q < latent_shard_.count; ++q) {
        part.resize(static_cast<size_t>(count));
        if (q == latent_shard_.index) make(part.data());
        if (latent_sharded())
            latent_shard_.group->bcast(part.data(), count * int64_t{sizeof(float)},
                                       static_cast<int>(q));
        if (first) take(q, part.data());
    }
}

namespace {

// --- own copy: every rank the whole SAE (or its latent shard), replicas all-reduce ------------

class OwnCopy : public ParamStore {
public:
    OwnCopy(const ParamLayout& layout, const ParamLayout& whole, const LatentShard& latent_shard,
            Backend& be, Communicator& replicas, bool normalize_decoder)
        : ParamStore(layout, whole, latent_shard, be, replicas, normalize_decoder),
          params_(be, size()),
          grads_(be, size()),
          m_buf_(be, size()),
          v_buf_(be, size()) {
        p_ = params_.data(), g_ = grads_.data(), m_ = m_buf_.data(), v_ = v_buf_.data();
        for (float* a : {p_, g_, m_, v_}) be_.fill(a, size(), 0.0f);
    }

    void reduce(std::vector<double>& sums, size_t /*own_at*/) override {
        replicas_.allreduce_sum(g_, size());
        reduced_ = true;
        replicas_.allreduce_sum(sums.data(), static_cast<int64_t>(sums.size()));
    }

    double grad_sum_squares(OptimizerOps& ops) override {
        return ops.grad_sum_squares(p_, g_, size(), unit_rows());
    }

private:
    DeviceArray<float> params_, grads_, m_buf_, v_buf_;
};

// --- latent shards: an own copy of this latent shard's latents, sums over latents over the latent
// shards ----

class LatentShards final : public OwnCopy {
public:
    using OwnCopy::OwnCopy;

    double grad_sum_squares(OptimizerOps& ops) override {
        double sum_sq = OwnCopy::grad_sum_squares(ops);
        if (latent_shard_.index >
            0)  // b_dec and the other segments every latent shard holds: counted once
            for (const ParamSegment& g : layout_.segments())
                if (!g.per_latent) sum_sq -= be_.sum_squares(g_ + g.offset, g.size());
        latent_shard_.group->allreduce_sum(&sum_sq, 1);
        return sum_sq;
    }

    void sum_over_latent_shards(double* v, int64_t n) const override {
        latent_shard_.group->allreduce_sum(v, n);
    }
    void sum_over_latent_shards_on_backend(float* v, int64_t n) const override {
        latent_shard_.backend_group->allreduce_sum(v, n);
    }
    std::vector<double> all_latents(const std::vector<double>& mine) const override {
        std::vector<double> whole(static_cast<size_t>(latent_shard_.n_total));
        latent_shard_.group->allgather(
            mine.data(), whole.data(),
            latent_shard_.n_local() * static_cast<int64_t>(sizeof(double)));
        return whole;
    }
};

// --- node split: one copy per node in node memory, the update split over the replicas ---------
//
// On one node `node` is the replicas' own group and `cross` is null. Across nodes (the same
// number of replicas on each) `node` is this node's replicas and `cross` the replicas of the
// other nodes that own the same range: a replica sums its range over its node's replicas in
// node memory, then over the nodes by an all-reduce of that range alone, and every node updates
// its own copy with the same sums.

class NodeSplit final : public ParamStore {
public:
    NodeSplit(std::unique_ptr<NodeMemory> mem, std::unique_ptr<Communicator> node,
              std::unique_ptr<Communicator> cross, const ParamLayout& layout,
              const ParamLayout& whole, const LatentShard& latent_shard, Backend& be,
              Communicator& replicas, bool normalize_decoder)
        : ParamStore(layout, whole, latent_shard, be, replicas, normalize_decoder),
          mem_(std::move(mem)),
          node_owned_(std::move(node)),
          cross_(std::move(cross)),
          node_(node_owned_ ? *node_owned_ : replicas) {
        p_ = mem_->common();
        m_ = p_ + size();
        v_ = m_ + size();
        g_ = mem_->segment(node_.rank());
        const int64_t r = node_.rank(), R = node_.size(), n = latent_shard_.n_local();
        owned_lo_ = n * r / R, owned_hi_ = n * (r + 1) / R;
        owns_non_latent_ = r == R - 1;
        // Each replica zeroes (first-touches) the ranges it will update.
        for (float* a : {p_, m_, v_})
            for (const AdamRange& g : owned_ranges())
                std::fill(a + g.offset, a + g.offset + g.count, 0.0f);
        mem_->fence();
    }

    bool splits_update() const override { return true; }
    int nodes() const override { return cross_ ? cross_->size() : 1; }

    // A reduce-scatter in node memory: this replica's owned ranges summed over the replicas
    // (across nodes: over its node's, then over the nodes), the decoder rows' gradient
    // projected, their squared norm sent with `sums` (by one node's replicas: each range once).
    void reduce(std::vector<double>& sums, size_t own_at) override {
        mem_->fence();  // every replica's gradient is complete
        const std::vector<AdamRange> mine = owned_ranges();
        for (const AdamRange& g : mine) mem_->sum_segments(g.offset, g.count);
        if (cross_)
            for (const AdamRange& g : mine)
                if (g.count > 0) cross_->allreduce_sum(g_ + g.offset, g.count);
        const UnitRows u = unit_rows();
        if (u.any()) be_.project_out_parallel(p_ + u.offset, g_ + u.offset, u.rows, u.cols);
        double partial = 0;
        if (!cross_ || cross_->rank() == 0)
            for (const AdamRange& g : mine) partial += be_.sum_squares(g_ + g.offset, g.count);
        reduced_ = true;
        sums.insert(sums.begin() + static_cast<std::ptrdiff_t>(own_at), partial);
        replicas_.allreduce_sum(sums.data(), static_cast<int64_t>(sums.size()));
        sum_sq_ = sums[own_at];
        sums.erase(sums.begin() + static_cast<std::ptrdiff_t>(own_at));
    }

    double grad_sum_squares(OptimizerOps&) override { return sum_sq_; }

    void update(OptimizerOps& ops, const math::AdamScalars& s, float weight_decay) override {
        ParamStore::update(ops, s, weight_decay);
        mem_->fence();  // every range updated before anyone reads them
    }

    std::vector<float> host(Buffer which) const override {
        if (which != Buffer::grads || !reduced_) return ParamStore::host(which);
        // Each replica's range of the summed gradient sits in that replica's segment; the
        // fences keep every replica out of its next step (which overwrites its segment)
        // meanwhile.
        std::vector<float> g(static_cast<size_t>(size()));
        mem_->fence();
        for (int64_t q = 0; q < node_.size(); ++q) {
            const float* seg = mem_->segment(static_cast<int>(q));
            for (const AdamRange& r : ranges_of(q))
                std::copy(seg + r.offset, seg + r.offset + r.count, g.begin() + r.offset);
        }
        mem_->fence();
        return g;
    }

    // Every replica exchanges the ranges it owns (all of them at once would exchange twice).
    void swap(Buffer a, Buffer b) override {
        for (const AdamRange& r : owned_ranges())
            be_.swap(pointer(a) + r.offset, pointer(b) + r.offset, r.count);
        mem_->fence();
    }

    void write(Buffer which, const std::vector<float>& values) override {
        SAE_ENFORCE(static_cast<int64_t>(values.size()) == size(),
                    "parameter buffer has {} values, expected {}", values.size(), size());
        float* dst = pointer(which);
        for (const AdamRange& r : owned_ranges())
            std::copy(values.begin() + r.offset, values.begin() + r.offset + r.count,
                      dst + r.offset);
        mem_->fence();
    }

private:
    // The ranges the node's replica q owns (the last one also b_dec).
    std::vector<AdamRange> ranges_of(int64_t q) const {
        const int64_t R = node_.size(), n = latent_shard_.n_local();
        return ranges(n * q / R, n * (q + 1) / R, q == R - 1);
    }

    std::unique_ptr<NodeMemory> mem_;
    std::unique_ptr<Communicator> node_owned_, cross_;  // across nodes only
    Communicator& node_;                                // the replicas that share mem_
    double sum_sq_ = 0;  // of the reduced gradient's owned ranges, summed over the replicas
};

// The node split across nodes: `replicas` grouped by host name, when there are several hosts with
// the same number (2 or more) of replicas each and every node gives its group node memory;
// else nothing (on every rank: each step agrees). Collective over `replicas`.
std::unique_ptr<ParamStore> split_across_nodes(const SaeConfig& cfg, const ParamLayout& layout,
                                               const ParamLayout& whole,
                                               const LatentShard& latent_shard, Backend& be,
                                               Communicator& replicas) {
    const int R = replicas.size();
    struct Host {
        char name[256];
    } mine{};
    // SAETRAIN_TEST_NODES=N: ranks in N equal blocks count as N hosts (the node split across
    // nodes tested on one machine, test_mpi).
    const char* test_nodes = std::getenv("SAETRAIN_TEST_NODES");
    if (test_nodes && std::atoi(test_nodes) > 0)
        std::snprintf(mine.name, sizeof(mine.name), "test-node-%d",
                      replicas.rank() * std::atoi(test_nodes) / R);
    else
        gethostname(mine.name, sizeof(mine.name) - 1);
    std::vector<Host> all(static_cast<size_t>(R));
    replicas.allgather(&mine, all.data(), sizeof(Host));
    // Each rank's host index (in order of first appearance) and its place among its host's ranks.
    std::vector<int> host_of(static_cast<size_t>(R)), per_host;
    std::vector<std::string> names;
    for (int q = 0; q < R; ++q) {
        const std::string name(all[q].name, strnlen(all[q].name, sizeof(all[q].name)));
        const auto at = std::find(names.begin(), names.end(), name);
        host_of[q] = static_cast<int>(at - names.begin());
        if (at == names.end()) names.push_back(name), per_host.push_back(0);
        ++per_host[host_of[q]];
    }
    const int hosts = static_cast<int>(names.size());
    if (hosts < 2 || per_host[0] < 2 ||
        std::any_of(per_host.begin(), per_host.end(), [&](int c) { return c != per_host[0]; }))
        return nullptr;  // the same answer on every rank: all saw the same names
    const int me = replicas.rank();
    auto node = replicas.split(host_of[me], me);
    const int64_t n = layout.total();
    auto mem = node->share_node_memory(3 * n, n, true);
    int64_t missing = mem ? 0 : 1;
    replicas.allreduce_max(&missing, 1);
    if (missing) return nullptr;
    auto cross = replicas.split(node->rank(), host_of[me]);
    return std::make_unique<NodeSplit>(std::move(mem), std::move(node), std::move(cross), layout,
                                       whole, latent_shard, be, replicas, cfg.normalize_decoder);
}

}  // namespace

std::unique_ptr<ParamStore> make_param_store(const SaeConfig& cfg, const ParamLayout& layout,
                                             const ParamLayout& whole,
                                             const LatentShard& latent_shard, Backend& be,
                                             Communicator& replicas) {
    // The placements split a per-latent tensor by its rows: one a latent (a layered model's
    // per-layer tensors, whose rows are one layer's latents, need a placement of their own).
    for (const auto* l : {&layout, &whole})
        for (const ParamSegment& s : l->segments())
            SAE_ENFORCE(
                !s.per_latent ||
                    s.rows == (l == &layout ? latent_shard.n_local() : latent_shard.n_total),
                "parameter '{}' is declared per latent with {} rows, but the SAE has {} "
                "latents here: the parameter stores place one row a latent",
                s.name, s.rows, l == &layout ? latent_shard.n_local() : latent_shard.n_total);
    if (latent_shard.count > 1)
        return std::make_unique<LatentShards>(layout, whole, latent_shard, be, replicas,
                                              cfg.normalize_decoder);
    if (replicas.size() > 1) {
        const int64_t n = layout.total();
        const bool test_nodes = std::getenv("SAETRAIN_TEST_NODES") != nullptr;  // same on all
        if (auto mem = replicas.share_node_memory(3 * n, n, be.host_memory() && !test_nodes))
            return std::make_unique<NodeSplit>(std::move(mem), nullptr, nullptr, layout, whole,
                                               latent_shard, be, replicas, cfg.normalize_decoder);
        if (be.host_memory())
            if (auto split = split_across_nodes(cfg, layout, whole, latent_shard, be, replicas))
                return split;
    }
    return std::make_unique<OwnCopy>(layout, whole, latent_shard, be, replicas,
                                     cfg.normalize_decoder);
}

// --- latent sharding's preconditions -----------------------------------------------------------

void check_latent_sharding(const SaeConfig& cfg, int64_t d, int64_t n_total, int64_t latent_shards,
                           const std::string& where) {
    if (latent_shards <= 1) return;
    const Architecture& a = arch_get(cfg.arch);
    if (!a.latent_shardable()) {
        std::string can;  // from the registry, so the list stays true
        for (const std::string& name : arch_names())
            if (arch_get(name).latent_shardable()) can += (can.empty() ? "" : ", ") + name;
        throw Error(fmt::format(
            "{}parallel.latent_shards = {}: a {} SAE cannot be latent-sharded yet (these can: {})",
            where, latent_shards, cfg.arch, can));
    }
    SAE_ENFORCE(n_total % latent_shards == 0,
                "{}parallel.latent_shards = {} does not divide the SAE's {} latents", where,
                latent_shards, n_total);
    SAE_ENFORCE(cfg.decorr_coeff == 0,
                "{}train.decorr_coeff needs every latent's activations in one place; it is not "
                "available with parallel.latent_shards = {}",
                where, latent_shards);
    // Each top-k selection (sae.k, sae.k_aux) runs within a latent shard before the merge.
    const int64_t n_local = n_total / latent_shards;
    for (const Architecture::OpUse& use : a.limited_ops(cfg, d, n_total))
        SAE_ENFORCE(use.op != BackendOp::topk_forward || use.shape.k <= n_local,
                    "{}{} = {} exceeds the {} latents of one of the {} latent shards", where,
                    use.key, use.shape.k, n_local, latent_shards);
}

}  // namespace saetrain
