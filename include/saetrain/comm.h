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
};

// A group of one: every collective is a copy or nothing.
std::unique_ptr<Communicator> make_self_comm();

}  // namespace saetrain
