// metrics_tail.h — follows a run's metrics.jsonl as saetrain appends to it, in whole steps.
//
// saetrain's rank 0 writes one line per SAE per log interval (metrics.h), all SAEs of a step
// together. The tail reads only what was appended since its last poll (a line without its
// newline yet waits for the next poll) and hands the lines on in *steps*: a step is complete
// once it holds one line per SAE of the run (`saes`, from run.json), or a later step has begun,
// or the run has ended. Clients resume "after step S" (metrics?since=S, the stream's since=S),
// which is exact only because no step is ever handed on in part.
//
// On resume saetrain rewrites metrics.jsonl, keeping the lines up to the checkpoint's step
// (drop_metrics_after). When the file shrinks or is replaced (another inode), the tail reads it
// again from the start and compares it with the lines it had: while they agree nothing is
// handed on twice; where they first differ (a run killed after its last checkpoint logs those
// steps again) the lines after the last common step are dropped and `rewound` reports that
// step, so that a client can drop them too. A line that is not a JSON object with an integer
// "step" and a string "sae" is skipped and counted. The tail never writes and never locks: it
// only opens, reads and closes the file.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace saetrain::serve {

struct MetricsStep {
    int64_t step = 0;
    std::vector<std::string> lines;  // the lines as written (no newline), in file order
    std::vector<std::string> saes;   // the "sae" of each line
};

class MetricsTail {
public:
    // `dir_fd`: the run directory (kept open by the caller); the file is its metrics.jsonl.
    explicit MetricsTail(int dir_fd) : dir_fd_(dir_fd) {}

    struct Update {
        std::optional<int64_t> rewound;  // lines after this step were dropped (-1: all)
        size_t first_new = 0;            // steps()[first_new..] completed in this poll
    };
    // Reads what was appended. `saes`: the lines that make a step (0: unknown); `ended`: the run
    // is over, so a step in part is complete as it is.
    Update poll(size_t saes, bool ended);

    const std::vector<MetricsStep>& steps() const { return steps_; }
    // The index of the first complete step after `since` (steps().size() when none).
    size_t first_after(int64_t since) const;
    // The last complete step (-1: none yet).
    int64_t last_step() const { return steps_.empty() ? -1 : steps_.back().step; }
    int64_t skipped_lines() const { return skipped_; }

private:
    struct Line {
        std::string text, sae;
        int64_t step;
    };
    void take(Line line, size_t saes, Update& up);
    void drop_unmatched(Update& up);
    void complete_pending();
    bool tail_unchanged(int fd) const;

    int dir_fd_;
    uint64_t inode_ = 0;
    int64_t offset_ = 0;   // bytes of the file consumed (up to the last newline read)
    std::string partial_;  // bytes after the last newline
    // The last bytes consumed (up to 256), checked at every poll: a file rewritten in place and
    // grown past offset_ between two polls is caught too.
    std::string consumed_tail_;
    std::vector<Line> lines_;   // every line taken, in file order
    size_t verify_ = SIZE_MAX;  // re-reading a rewritten file: lines_[verify_] is next to match
    std::vector<MetricsStep> steps_;
    MetricsStep pending_;  // the step being filled (lines.empty(): none)
    int64_t skipped_ = 0;
};

}  // namespace saetrain::serve
