// sae-iobench — loader throughput beside raw sequential reads (work in progress).
#include <cstdio>

int main() {
    std::fprintf(stderr, "sae-iobench: not implemented yet\n");
    return 1;
}
