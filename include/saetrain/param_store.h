// param_store.h — where one SAE's parameters live, and what the placement changes in a step.
//
// The parameters are one flat buffer of named segments (arch.h's ParamLayout): [W_enc (n x d,
// latent-major) | W_dec (n x d) | b_enc (n) | b_dec (d) | the architecture's own, e.g.
// log_threshold (n)], with the gradient and Adam's moments in the same layout, so the optimizer
// step and the gradient all-reduce are one call each. W_enc is kept latent-major (the transpose
// of the file layout [d, n]) so the sparse TopK backward writes whole contiguous rows per
// latent.
//
// Three placements, one interface (make_param_store picks the placement):
//   own copy       every rank holds the whole SAE in backend memory. Replicas (data parallel on
//                  GPUs or over several nodes) all-reduce the gradient and each applies the same
//                  full update; one rank is the case of one replica.
//   node split     data-parallel replicas on one node with host memory (the CPU backend) keep
//                  one copy of the parameters and moments per node, in node memory every replica
//                  maps, and split the update: each replica owns a contiguous range of latents
//                  (their rows of every per-latent segment; the last one also b_dec and the
//                  segments of no latent), sums its owned range of every replica's gradient (in
//                  rank order) and updates it alone. Nothing is copied back: every replica reads
//                  the same parameters. Across nodes with the same number (2 or more) of
//                  replicas each, every node keeps such a copy and its replicas split the update;
//                  a replica's owned range is summed over its node's replicas in node memory,
//                  then over the nodes by an all-reduce of that range alone (1/L of the gradient
//                  per rank crosses the network, L replicas a node).
//   latent shards  parallel.latent_shards = S: each rank holds n / S latents of every per-latent
//                  segment (b_dec and the segments of no latent whole on each) as an own copy;
//                  the sums over latents (the gradient's norm, L0, dead latents, x_hat) are
//                  summed over the S latent shards, and the whole SAE's tensors are gathered to the
//                  first latent shard chunk by chunk (gather_latents), never whole on one rank.
//
// The step asks, in order: new_gradient (a pass writes this replica's gradient), reduce (over
// the replicas), grad_sum_squares (the whole SAE's, for clipping), update (the optimizer's ops on
// the owned ranges). The policy, the scalars and the ops are the Optimizer's (optimizer.h); this
// places the buffers. Around the step: host copies and writes of the buffers, and the sums and
// gathers over latent shards, which do nothing on a whole SAE.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "saetrain/arch.h"          // defines: ParamLayout
#include "saetrain/backend.h"       // defines: Backend, UnitRows, math::AdamScalars
#include "saetrain/comm.h"          // defines: Communicator
#include "saetrain/config.h"        // defines: SaeConfig
#include "saetrain/sharded_topk.h"  // defines: LatentShard

namespace saetrain {

class OptimizerOps;  // optimizer.h

// Throws Error (prefixed by `where`) when an SAE of `cfg` (d_model d, n_total latents) cannot be
// split into `latent shards` latent shards (parallel.latent_shards): its architecture, a latent
// shard count that does not divide the latents, a k larger than a latent shard.
void check_latent_sharding(const SaeConfig& cfg, int64_t d, int64_t n_total, int64_t latent_shards,
                           const std::string& where);

class ParamStore {
public:
    // opt_m, opt_v: the optimizer's two buffers (AdamW: its moments; signum: its iterate and
    // its average, optimizer.h).
    enum class Buffer { params, grads, opt_m, opt_v };

    virtual ~ParamStore();
    ParamStore(const ParamStore&) = delete;
    ParamStore& operator=(const ParamStore&) = delete;

    // --- the buffers (backend memory, layout()'s segments) --------------------------------
    const ParamLayout& layout() const { return layout_; }              // this rank's latents
    const ParamLayout& whole_layout() const { return whole_layout_; }  // the SAE's
    int64_t size() const { return layout_.total(); }
    float* params() const { return p_; }
    float* grads() const { return g_; }
    float* opt_m() const { return m_; }
    float* opt_v() const { return v_; }
    int replicas() const { return replicas_.size(); }
    // Parameters and moments are in node memory, the update split over the replicas (of each
    // node: across nodes() nodes, each with a copy, the owned ranges' sums all-reduced).
    virtual bool splits_update() const { return false; }
    virtual int nodes() const { return 1; }

    // --- the step -------------------------------------------------------------------------
    // A pass is about to write this replica's own gradient into grads() (host copies of the
    // gradient read it as it is until reduce).
    void new_gradient() { reduced_ = false; }
    // Collective over the replicas (only called with more than one): every replica's gradient
    // summed (the whole buffer, or at least the ranges this replica owns), and `sums`, the
    // step's other sums, with it in one all-reduce. A placement that measures the gradient
    // while it reduces (the node split: its owned ranges' squared norm) sends its value in the
    // same all-reduce at sums[own_at] and takes it out again, so `sums` keeps its length.
    virtual void reduce(std::vector<double>& sums, size_t own_at) = 0;
    // The squared norm of the SAE's gradient (after reduce, with more than one replica), the
    // unit decoder rows' radial part projected out (OptimizerOps::grad_sum_squares, optimizer.h);
    // collective over the latent shards.
    virtual double grad_sum_squares(OptimizerOps& ops) = 0;
    // Flat-buffer ranges (backend.h's AdamRange: offset, count, weight decay) of latent rows
    // [lo, hi): their rows of every per-latent segment, and the segments of no latent (b_dec,
    // ...) when `with_non_latent`, in segment order; some counts may be 0.
    std::vector<AdamRange> ranges(int64_t lo, int64_t hi, bool with_non_latent) const;
    // The ranges this replica updates: all of them unless the update is split.
    std::vector<AdamRange> owned_ranges() const {
        return ranges(owned_lo_, owned_hi_, owns_non_latent_);
    }
    // The decoder rows this replica updates, when sae.normalize_decoder keeps them at unit norm.
    UnitRows unit_rows() const;
    // The optimizer's update (OptimizerOps::apply, with the step's scalars s) on the owned ranges
    // of the reduced gradient; every replica's update is visible to all when it returns.
    virtual void update(OptimizerOps& ops, const math::AdamScalars& s, float weight_decay);

    // --- host copies ----------------------------------------------------------------------
    // A host copy of one buffer (this latent shard's latents). The gradient after reduce is the sum
    // over replicas (with the node split: collective over the replicas).
    virtual std::vector<float> host(Buffer which) const;
    // Writes a host vector of size() values into one buffer; collective over the replicas,
    // which pass the same values.
    virtual void write(Buffer which, const std::vector<float>& values);
    // Exchanges two buffers' values, bit for bit (signum's average and the parameters the
    // gradient is taken at); collective over the replicas.
    virtual void swap(Buffer a, Buffer b);

    // --- latent shards (a whole SAE is one latent shard: these do nothing)
    // ------------------------
    const LatentShard& latent_shard() const { return latent_shard_; }
    bool latent_sharded() const { return latent_shard_.count > 1; }
    // v[0, n) summed over the latent shards, in place: host memory (the latent shards' host group),
    // or backend memory (the backend group: NCCL on GPUs).
    virtual void sum_over_latent_shards(double* v, int64_t n) const;
    virtual void sum_over_latent_shards_on_backend(float* v, int64_t n) const;
    // The whole SAE's per-latent values from every latent shard's (all-gathered over the latent
    // shards).
    virtual std::vector<double> all_latents(const std::vector<double>& mine) const;
    // Collective over the latent shards: this latent shard's rows [n_local x cols] of a per-latent
    // tensor (host memory), every latent shard's in latent order, in chunks of at most 64 MiB to
    // `sink` on the first latent shard (sink(first_element, count, values), values writable), each
    // tensor's chunks in order. The others send their rows and call no sink.
    template <class T>
    using RowSink = std::function<void(int64_t at, int64_t count, T* values)>;
    void gather_latents(const float* mine, int64_t cols, const RowSink<float>& sink) const;
    void gather_latents(const int64_t* mine, int64_t cols, const RowSink<int64_t>& sink) const;
    // Collective over the latent shards: `count` values from each latent shard in turn, made by
    // make(part) on that latent shard and handed to take(q, part) on the first latent shard (a
    // block of W_enc's file rows: each latent shard's columns).
    void gather_parts(int64_t count, const std::function<void(float* part)>& make,
                      const std::function<void(int64_t q, const float* part)>& take) const;

protected:
    ParamStore(ParamLayout layout, ParamLayout whole, const LatentShard& latent_shard, Backend& be,
               Communicator& replicas, bool normalize_decoder);
    float* pointer(Buffer which) const;
    template <class T>
    void gather(const T* mine, int64_t cols, const RowSink<T>& sink) const;

    ParamLayout layout_, whole_layout_;
    LatentShard latent_shard_;  // count 1: the whole SAE
    Backend& be_;
    Communicator& replicas_;
    bool normalize_decoder_;
    float *p_ = nullptr, *g_ = nullptr, *m_ = nullptr, *v_ = nullptr;
    int64_t owned_lo_ = 0, owned_hi_ = 0;  // this replica's owned latent rows [lo, hi)
    bool owns_non_latent_ = true;          // and b_dec and the segments of no latent
    bool reduced_ = false;                 // grads() holds the replicas' sum (owned ranges)
};

// The placement for one rank of an SAE (cfg; layouts of this rank's latents and of the whole
// SAE): latent shards when `latent shard` has more than one, else the node split when the replicas
// have more than one rank, the backend allocates host memory and the node has room
// (Communicator::share_node_memory; collective over the replicas) or, across nodes, each node
// has as many replicas (2 or more) and room, else an own copy. The buffers start zeroed.
std::unique_ptr<ParamStore> make_param_store(const SaeConfig& cfg, const ParamLayout& layout,
                                             const ParamLayout& whole,
                                             const LatentShard& latent_shard, Backend& be,
                                             Communicator& replicas);

}  // namespace saetrain
