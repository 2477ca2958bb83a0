# shellcheck shell=bash
# shellcheck disable=SC2154,SC2034  # test_name, apps, fail: the sourcing script's
# test/shell/common.sh — what the shell tests (test_slurm.sh, test_multinode.sh) share; sourced
# after they set `test_name` (the prefix of their lines), `apps` (the built programs) and
# `fail=0`.

say() { echo "${test_name}: $*"; }
bad() {
    echo "${test_name}: FAIL: $*"
    fail=1
}
# die MESSAGE: a failure the rest of the test cannot go on from.
die() {
    bad "$@"
    exit 1
}

# bitwise A B: every SAE's final.h5 under run A equals run B's.
bitwise() {
    local a=$1 b=$2 n=0 f id
    for f in "${a}"/sae/*/final.h5; do
        [ -f "${f}" ] || continue
        id=$(basename "$(dirname "${f}")")
        if ! "${apps}/sae-inspect" "${f}" --compare "${b}/sae/${id}/final.h5" |
            grep -q "weights bitwise identical"; then
            bad "${a} and ${b} differ for ${id}"
            return
        fi
        n=$((n + 1))
    done
    [ "${n}" -gt 0 ] || bad "${a} has no final.h5"
    say "${a} = ${b}: ${n} SAE(s) bitwise identical"
}

# poll SECONDS COMMAND...: until COMMAND succeeds (tried every 0.1 s); false after SECONDS.
poll() {
    local i n=$(($1 * 10))
    shift
    for ((i = 0; i < n; i++)); do
        "$@" && return 0
        sleep 0.1
    done
    return 1
}

# past_step DIR N: DIR/metrics.jsonl has a line past step N (training is under way).
past_step() {
    [ -f "$1/metrics.jsonl" ] &&
        [ "$(grep -o '"step": *[0-9]*' "$1/metrics.jsonl" | tail -n 1 | grep -o '[0-9]*$')" \
            -gt "$2" ] 2>/dev/null
}
