#include <cstring>

#include "saetrain/comm.h"

namespace saetrain {
namespace {

class SelfComm final : public Communicator {
public:
    int rank() const override { return 0; }
    int size() const override { return 1; }
    std::string name() const override { return "self"; }
    void allreduce_sum(float*, int64_t) override {}
    void allreduce_sum(double*, int64_t) override {}
    void allreduce_max(int64_t*, int64_t) override {}
    void allgather(const void* send, void* recv, int64_t bytes) override {
        if (send != recv) std::memmove(recv, send, static_cast<size_t>(bytes));
    }
    void bcast(void*, int64_t, int) override {}
    void barrier() override {}
    std::unique_ptr<Communicator> split(int, int) override { return make_self_comm(); }
};

}  // namespace

std::unique_ptr<Communicator> make_self_comm() { return std::make_unique<SelfComm>(); }

}  // namespace saetrain
