// shuffle.h — the loader's delivery order (ShufflePlan) and how well an order mixes.
//
// A rank's row range is cut into read chunks; every epoch the chunks are dealt into windows that
// each take one chunk per stratum of the range, and each window's rows are permuted. All of it is
// a pure function of (range size, chunk size, window size, seed, epoch), so the reader's threads,
// the tests and sae-iobench compute the same order, and a cursor restores it. See docs/reader.md.
#pragma once

#include <cstdint>
#include <vector>

namespace saetrain {

struct LoaderOptions;  // loader.h

// The delivery order as a pure function of (range size, chunk size, window size, seed): what
// the reader's threads follow, and what tests and sae-iobench use to measure the shuffle.
class ShufflePlan {
public:
    // rows: the range's rows; chunk_rows: rows per read chunk; window_chunks: chunks per window;
    // shuffle false: chunks in order and rows in order (disk order).
    ShufflePlan(int64_t rows, int64_t chunk_rows, int64_t window_chunks, bool shuffle,
                uint64_t seed);
    // The plan LoaderOptions imply for a range of `rows` rows of `row_bytes` bytes on disk.
    static ShufflePlan from_options(int64_t rows, int64_t row_bytes, const LoaderOptions& opt);

    int64_t rows() const { return rows_; }
    int64_t chunk_rows() const { return chunk_rows_; }
    int64_t window_chunks() const { return window_chunks_; }
    int64_t n_chunks() const { return n_chunks_; }
    int64_t n_windows() const { return (n_chunks_ + window_chunks_ - 1) / window_chunks_; }
    // Most rows any window of any epoch holds (what a window buffer must fit): a shuffled window
    // takes one chunk per stratum, and there are ceil(n_chunks / n_windows) strata, which can be
    // fewer than window_chunks.
    int64_t window_capacity() const;
    bool shuffled() const { return shuffle_; }
    int64_t chunk_size(int64_t c) const;  // rows of chunk c (the last one may be short)

    // One epoch's layout: which chunks each window holds and where it starts in the stream.
    // Windows are stratified: window w takes one chunk from each of window_chunks equal strata
    // of the range (chosen by a per-epoch permutation), so every window samples the whole range.
    struct Epoch {
        int64_t epoch = 0;
        std::vector<int64_t> chunk_order;         // [n_chunks] chunk ids, window by window
        std::vector<int64_t> window_first_chunk;  // [n_windows + 1] index into chunk_order
        std::vector<int64_t> window_begin;        // [n_windows + 1] stream offset of each window
        // Window w's chunks, sorted by disk position (the order they are read and laid out).
        std::vector<int64_t> window_chunks(int64_t w) const;
        int64_t window_of(int64_t offset) const;  // window holding stream offset `offset`
    };
    Epoch epoch(int64_t e) const;
    // Permutation of a window's rows (positions in its chunks laid out in disk order): output
    // row i of the window is laid-out row perm[i]. Identity when not shuffled.
    void row_permutation(int64_t e, int64_t w, int64_t rows, std::vector<uint32_t>* perm) const;
    // Disk rows (0-based within the range) of epoch e in stream order: [rows].
    std::vector<int64_t> epoch_order(int64_t e) const;

private:
    int64_t strata_count() const;  // strata of the range (chunks per window, at most)

    int64_t rows_, chunk_rows_, window_chunks_, n_chunks_;
    bool shuffle_;
    uint64_t seed_;
};

// How well a stream order mixes. displacement: mean |stream position - disk position| divided
// by its expectation under a uniform random permutation (n/3): 0 for disk order, ~1 for a
// perfect shuffle. batch_corr: lag-1 correlation of consecutive batches' means on a dataset
// whose `groups` equal parts (shards) have different means (group g has mean g): ~1 for disk
// order, ~0 for a perfect shuffle. batch_spread: standard deviation of those batch means over
// a perfect shuffle's: 1 is ideal, disk order gives about sqrt(batch_rows).
struct ShuffleQuality {
    double displacement = 0;
    double batch_corr = 0;
    double batch_spread = 0;
};
ShuffleQuality shuffle_quality(const std::vector<int64_t>& order, int64_t batch_rows,
                               int64_t groups);

}  // namespace saetrain
