// comm.h — the communication seam: collectives over a group of ranks.
//
// The trainer is written once against Communicator; implementations are "self" (one rank, no
// MPI needed), MPI (CPU buffers) and, on GPU builds, NCCL (device buffers). Collectives are
// blocking and must be called by every rank of the group in the same order.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace saetrain {

// Node memory: memory that every rank of a group on one node maps (an MPI-3 shared window),
// one `common` area for the group and one segment per rank. Writes are ordered only by fence().
class NodeMemory {
public:
    virtual ~NodeMemory() = default;
    virtual float* common() = 0;
    virtual float* segment(int rank) = 0;
    // Collective over the group: every rank's writes before it are visible to every rank's
    // reads after it.
    virtual void fence() = 0;
    // segment(me)[i] = segment(0)[i] + segment(1)[i] + ... in rank order, for i in
    // [offset, offset + count): a reduce-scatter when each rank sums its own range between two
    // fences. Every rank's sum has the same bits as MPI-free serial addition in rank order.
    virtual void sum_segments(int64_t offset, int64_t count) = 0;
};

class Communicator {
public:
    virtual ~Communicator() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    virtual std::string name() const = 0;

    virtual void allreduce_sum(float* data, int64_t n) = 0;    // in place
    virtual void allreduce_sum(double* data, int64_t n) = 0;   // in place
    virtual void allreduce_max(int64_t* data, int64_t n) = 0;  // in place
    // recv holds size() * bytes, rank r's block at r * bytes.
    virtual void allgather(const void* send, void* recv, int64_t bytes) = 0;
    virtual void bcast(void* data, int64_t bytes, int root) = 0;
    virtual void barrier() = 0;
    // Ranks with the same color form a new group, ordered by key (then by rank).
    virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
    // Collective over every rank of the group (each calls it, wanting it or not). Node memory
    // of `common_floats` + size() x `segment_floats` (zeroed segments; the common area
    // is the caller's to initialize), or nullptr on every rank unless every rank wants it, all
    // share one node, the node has room for it and SAETRAIN_NO_SHM is not set.
    virtual std::unique_ptr<NodeMemory> share_node_memory(int64_t /*common_floats*/,
                                                          int64_t /*segment_floats*/,
                                                          bool /*want*/) {
        return nullptr;
    }
};

// A group of one: every collective is a copy or nothing.
std::unique_ptr<Communicator> make_self_comm();

}  // namespace saetrain
