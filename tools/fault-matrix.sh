#!/usr/bin/env bash
# fault-matrix.sh — injects every fault saetrain handles and prints one table: the fault, what
# should happen, what did, the time to exit, and whether any data was lost.
#
#   tools/fault-matrix.sh [--short] [--build build/cpu] [--dir DIR] [--kills N] [--seed S]
#
# "data lost" is checked, never assumed: after each fault every committed checkpoint must load
# and verify its checksum (sae-inspect), and the same command run again must finish with final
# weights bitwise equal to an uninterrupted run of the same config (sae-inspect --compare). It
# says "none" only when those checks pass; the script exits 1 if any row says otherwise or a
# row's observed behaviour differs from the expected one.
#
# --short (CI: ctest -L faults) runs every fault once but only 3 random SIGKILL points (in 2-epoch
# runs), and leaves the per-mode-and-phase kills to test_resume (which CI runs); the full matrix
# (default: 20 random kill points in 8-epoch runs, every mode x phase) is what
# docs/reliability.md quotes. Faults that need root to set up (a tmpfs, dropping
# to another user) are reported as "skipped" where that is not permitted.
set -u
short=0 build=build/cpu dir="" kills=20 seed=12
while [ $# -gt 0 ]; do
    case "$1" in
    --short) short=1; kills=3; shift ;;
    --build) build=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --kills) kills=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    *) echo "usage: $0 [--short] [--build DIR] [--dir DIR] [--kills N] [--seed S]" >&2; exit 2 ;;
    esac
done
bin=$(cd "$build/apps" 2>/dev/null && pwd) || { echo "fault-matrix: no $build/apps; build first" >&2; exit 2; }
made_dir=0
[ -n "$dir" ] || { dir=$(mktemp -d /tmp/saetrain_faults.XXXXXX); made_dir=1; }
# A directory of a previous matrix (marked) is emptied: old runs there would resume, not rerun.
if [ -e "$dir/.fault-matrix" ]; then
    for m in "$dir"/mnt-*; do [ -d "$m" ] && umount "$m" 2>/dev/null; done
    rm -rf "${dir:?}"/* "$dir"/.fault-matrix
elif [ -n "$(ls -A "$dir" 2>/dev/null)" ]; then
    echo "fault-matrix: $dir is not empty; give a new or empty --dir" >&2
    exit 2
fi
mkdir -p "$dir" && dir=$(cd "$dir" && pwd) && touch "$dir/.fault-matrix"
cleanup() { for m in "$dir"/mnt-*; do [ -d "$m" ] && umount "$m" 2>/dev/null; done; }
bg=""  # the background job under way (in a process group of its own), ended on exit
trap 'cleanup; [ -n "$bg" ] && kill -KILL -- "-$bg" 2>/dev/null' EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
RANDOM=$seed
TIMEOUT_S=3  # parallel.timeout_s of every run: a job must end within TIMEOUT_S + 5 s of a fault
table="$dir/table.tsv"
: >"$table"
failed=0
now() { date +%s.%N; }
secs() { printf '%.1f' "$(echo "$1" | bc -l)"; }

# --- rows ---------------------------------------------------------------------------------------
# row FAULT EXPECTED OBSERVED TIME LOST OK: OK=1 when the observed behaviour is the expected one.
row() {
    printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" >>"$table"
    printf '  %-52.52s %-6s %s\n' "$1" "$4" "$5" >&2
    if [ "$5" != none ] && [ "${5#skipped}" = "$5" ]; then failed=1; fi
    if [ "$6" != 1 ]; then failed=1; echo "fault-matrix: UNEXPECTED: $1: $3" >&2; fi
}
# The one "saetrain: error:" (or "mpirun noticed ...") line of a log, shortened for the table.
first_error() {
    grep -m1 -E "saetrain: error:|noticed that process rank|has waited" "$1" | sed -e "s|$dir/||g" \
        -e 's/^saetrain: error: //' -e 's|[^ ]*/sae/[^/ ]*/|.../|g' | cut -c1-90
}

# --- data, configs, runs ------------------------------------------------------------------------
"$bin/sae-synth" --out "$dir/data" --d-model 64 --features 128 --rows 12000 --shards 3 \
    --seed 5 >/dev/null || exit 1
"$bin/sae-synth" --out "$dir/data32" --d-model 32 --features 64 --rows 12000 --shards 3 \
    --seed 5 >/dev/null || exit 1
cp -a "$dir/data" "$dir/data.orig"
# config NAME MODE [extra yaml]: a 2-epoch run (375 steps on one rank), a checkpoint every 7.
config() {
    local par
    case "$2" in
    one) par="parallel: {mode: sweep, timeout_s: $TIMEOUT_S}" ;;
    sweep) par="parallel: {mode: sweep, timeout_s: $TIMEOUT_S}" ;;
    dp) par="parallel: {mode: data_parallel, timeout_s: $TIMEOUT_S}" ;;
    hybrid) par="parallel: {mode: hybrid, replicas: 2, timeout_s: $TIMEOUT_S}" ;;
    esac
    local k=6
    case "$2" in sweep | hybrid) k="[4, 6]" ;; esac
    local data="data: {path: $dir/data, batch_size: 64, epochs: 2, shuffle_buffer_rows: 1500}"
    case "${3:-}" in data:*) data=$3 ;; esac  # an extra data: line replaces the default one
    cat >"$dir/$1.yaml" <<EOF
run: {out_dir: $dir/runs/$1, seed: 3}
$data
sae: {arch: topk, expansion: 4, k: $k}
train: {lr: 0.003, warmup_steps: 10}
$par
log: {every_steps: 50}
checkpoint: {every_steps: 7, keep: 2}
EOF
}
ids_of() { case "$1" in sweep | hybrid) echo "topk-x4-k4 topk-x4-k6" ;; *) echo "topk-x4-k6" ;; esac; }
np_of() { case "$1" in one) echo 1 ;; hybrid) echo 4 ;; *) echo 2 ;; esac; }
mode_of() { local n=${1#ref-}; echo "${n%%-*}"; }  # names: [ref-]MODE[-...]
# cmd NAME [args]: the command line of run NAME (mpirun for more than one rank).
cmd() {
    local name=$1; shift
    local np; np=$(np_of "$(mode_of "$name")")
    local pre=""
    [ "$np" -gt 1 ] && pre="mpirun --oversubscribe -np $np"
    echo "timeout 120 $pre $bin/saetrain $dir/$name.yaml --threads 1 $*"
}
# launch NAME LOG [args]: runs it, waits; sets rc and took (seconds).
launch() {
    local name=$1 log=$2; shift 2
    local t0; t0=$(now)
    eval "$(cmd "$name" "$@")" >"$log" 2>&1
    rc=$?
    ended=$(now)
    took=$(echo "$ended - $t0" | bc)
}
# Seconds from the injected signal (the hook prints its time) to the job's end at $1.
since_fault() {
    local t; t=$(grep -ohE "(raises signal [0-9]+ \([^)]*\)|halfway through .*) at [0-9.]+" "$2" | grep -oE "[0-9.]+$" | head -1)
    [ -n "$t" ] && secs "$1 - $t" || echo "?"
}
# verify NAME: every committed checkpoint of every SAE loads and verifies; prints a problem or "".
verify() {
    local name=$1 out="$dir/runs/$1" c s id
    for c in "$out"/checkpoints/step-*.commit; do
        [ -e "$c" ] || continue
        s=$(basename "$c" .commit); s=${s#step-}
        for id in $(ids_of "$(mode_of "$name")"); do
            "$bin/sae-inspect" "$out/sae/$id/checkpoint-$s.h5" 2>&1 | grep -q "checksum ok" ||
                { echo "checkpoint $s of $id unreadable"; return; }
        done
    done
}
newest() { ls "$dir/runs/$1/checkpoints" 2>/dev/null | sed -n 's/^step-\([0-9]*\)\.commit$/\1/p' | sort -n | tail -1; }
# finish NAME [args]: runs NAME again to the end and compares it with its mode's reference:
# prints "none" or what was lost.
finish() {
    local name=$1; shift
    local mode; mode=$(mode_of "$name")
    local bad; bad=$(verify "$name")
    [ -n "$bad" ] && { echo "YES: $bad"; return; }
    launch "$name" "$dir/$name.rerun.log" "$@"
    [ "$rc" = 0 ] || { echo "YES: rerun exit $rc: $(first_error "$dir/$name.rerun.log")"; return; }
    local id
    for id in $(ids_of "$mode"); do
        "$bin/sae-inspect" "$dir/runs/$name/sae/$id/final.h5" \
            --compare "$dir/runs/ref-$mode${ref_suffix:-}/sae/$id/final.h5" >/dev/null 2>&1 ||
            { echo "YES: final weights of $id differ from the uninterrupted run"; return; }
    done
    echo none
}
# finish_done NAME: NAME already ran to the end: its checkpoints verify and its final weights
# equal the uninterrupted run's? Prints "none" or what was lost.
finish_done() {
    local name=$1 mode; mode=$(mode_of "$1")
    local bad; bad=$(verify "$name")
    [ -n "$bad" ] && { echo "YES: $bad"; return; }
    local id
    for id in $(ids_of "$mode"); do
        "$bin/sae-inspect" "$dir/runs/$name/sae/$id/final.h5" \
            --compare "$dir/runs/ref-$mode${ref_suffix:-}/sae/$id/final.h5" >/dev/null 2>&1 ||
            { echo "YES: final weights of $id differ from the uninterrupted run"; return; }
    done
    echo none
}
has() { grep -qF -- "$2" "$1"; }

echo "fault-matrix: $([ $short = 1 ] && echo short || echo full) run in $dir" >&2
# (--short leaves out hybrid: its rows are test_resume's in CI.)
for mode in one sweep dp $([ $short = 1 ] || echo hybrid); do
    config "ref-$mode" "$mode"
    launch "ref-$mode" "$dir/ref-$mode.log"
    [ "$rc" = 0 ] || { echo "fault-matrix: the reference run ref-$mode failed:" >&2; cat "$dir/ref-$mode.log" >&2; exit 1; }
    eval "dur0_$mode=$took"
done
# The random kills use runs 4 times as long (8 epochs: 1500 steps on one rank), so that most kill
# points fall in training, not in start-up.
# (--short: the 2-epoch runs, whose references exist anyway.)
LONG="data: {path: $dir/data, batch_size: 64, epochs: 8, shuffle_buffer_rows: 1500}" long=-long
[ $short = 1 ] && LONG="" long=""
for mode in one sweep dp; do
    [ -n "$long" ] || { eval "dur_$mode=\$dur0_$mode"; continue; }
    config "ref-$mode-long" "$mode" "$LONG"
    launch "ref-$mode-long" "$dir/ref-$mode-long.log"
    [ "$rc" = 0 ] || { cat "$dir/ref-$mode-long.log" >&2; exit 1; }
    eval "dur_$mode=$took"
done
# Disk order, small reads (the shard faults below): a reader that is not far ahead.
DISK="data: {path: $dir/data, batch_size: 64, epochs: 2, shuffle_buffer_rows: 0, read_bytes: 4096, prefetch_bytes: 1048576}"
config ref-one-disk one "$DISK"
launch ref-one-disk "$dir/ref-one-disk.log"
[ "$rc" = 0 ] || { cat "$dir/ref-one-disk.log" >&2; exit 1; }

# --- SIGKILL at random points -------------------------------------------------------------------
# Runs of each mode are killed again and again (a random rank, after a random delay: start-up,
# a step, a checkpoint write, whatever is under way), each start resuming the previous one.
ranks_of() {  # saetrain processes under pid $1, by parentage
    local p
    for p in $(pgrep -P "$1"); do
        if [ "$(cat /proc/$p/comm 2>/dev/null)" = saetrain ]; then echo "$p"; else ranks_of "$p"; fi
    done
}
# Each kill lands at a uniformly random moment of a whole run's duration (start-up, a step, a
# checkpoint write: whatever is under way); the next start resumes. When a start runs to the end
# before its kill, that sequence is over: its final weights are compared with the uninterrupted
# run's (one "the same command to the end" row), and a fresh sequence begins.
modes=(one sweep dp)
for m in 0 1 2; do
    mode=${modes[$m]}
    want=$(((kills + 2 - m) / 3))
    [ "$want" -gt 0 ] || continue
    dur=$(eval echo "\$dur_$mode")
    landed=0 tries=0 seq=1 in_seq=0
    ref_suffix=$long
    name="$mode-kills$seq"; config "$name" "$mode" "$LONG"
    while [ $landed -lt "$want" ] && [ $tries -lt $((4 * want)) ]; do
        tries=$((tries + 1))
        before=$(newest "$name")
        delay=$(echo "0.1 + $RANDOM / 32768 * $dur" | bc -l)
        log="$dir/$name.$tries.log"
        setsid bash -c "$(cmd "$name")" >"$log" 2>&1 &
        bg=$!
        sleep "$delay"
        victims=$(ranks_of "$bg")
        for _ in $(seq 30); do  # the launcher may not have started the ranks yet
            [ -n "$victims" ] || ! kill -0 "$bg" 2>/dev/null && break
            sleep 0.1; victims=$(ranks_of "$bg")
        done
        set -- $victims
        if [ $# -eq 0 ] || [ -e "$dir/runs/$name/COMPLETE" ]; then
            { wait "$bg"; } 2>/dev/null; bg=""
            if [ -e "$dir/runs/$name/COMPLETE" ]; then  # ran to the end: compare, start afresh
                row "after $in_seq SIGKILL(s) ($mode): ran to the end" "final bitwise = uninterrupted" \
                    "completed before the next kill" "-" "$(finish_done "$name")" 1
                seq=$((seq + 1)) in_seq=0
                name="$mode-kills$seq"; config "$name" "$mode" "$LONG"
                # This run was quicker than the reference (a loaded machine timed that one slow):
                # halve the span the next kill is drawn from, so a sequence of misses cannot use
                # up the tries (the short matrix's sub-second runs missed 4 times in a row).
                dur=$(echo "$dur / 2" | bc -l)
            fi
            continue
        fi
        r=$((RANDOM % $#)); shift $r; victim=$1
        vrank=$(tr '\0' '\n' <"/proc/$victim/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
        kill -KILL "$victim"
        tk=$(now)
        { wait "$bg"; } 2>/dev/null; rc=$?; bg=""
        took=$(secs "$(now) - $tk")
        landed=$((landed + 1)) in_seq=$((in_seq + 1))
        after=$(newest "$name")
        bad=$(verify "$name")
        lost=none
        [ -n "$bad" ] && lost="YES: $bad"
        [ -n "$before" ] && [ "${after:-0}" -lt "$before" ] && lost="YES: newest checkpoint went from $before to $after"
        ok=1
        named="SIGKILL"
        if [ "$(np_of "$mode")" -gt 1 ]; then
            has "$log" "noticed that process rank $vrank " || ok=0
            [ "$(echo "$took > $TIMEOUT_S + 5" | bc)" = 1 ] && ok=0
            named="mpirun names rank $(grep -oE "noticed that process rank [0-9]+" "$log" | grep -oE "[0-9]+$")"
        fi
        row "SIGKILL #$landed, $mode${vrank:+, rank $vrank}, at $(secs "$delay") s of $(secs "$dur") s" \
            "job ends, committed checkpoints verify" \
            "exit $rc; $named; newest committed step ${after:-none}" "$took" "$lost" "$ok"
    done
    lost=$(finish "$name")
    from=$(grep -ohE 'resumed from the checkpoint at step [0-9]+' "$dir/$name.rerun.log" | grep -oE '[0-9]+$')
    row "after $in_seq SIGKILL(s) ($mode): the same command to the end" "final bitwise = uninterrupted" \
        "$([ -n "$from" ] && echo "resumed from step $from" || echo "started over (nothing committed)")" \
        "-" "$lost" "$([ "$landed" = "$want" ] && echo 1 || echo 0)"
    ref_suffix=""
done

# --- signals and dead ranks (SAETRAIN_FAULT) ---------------------------------------------------
name=one-term; config $name one
SAETRAIN_FAULT=0:20:TERM launch $name "$dir/$name.log"
ok=0; [ "$rc" = 75 ] && has "$dir/$name.log" "stopped by a signal" && [ -n "$(newest $name)" ] && ok=1
row "SIGTERM (time limit), 1 rank, iteration 20" "checkpoint, exit 75" \
    "exit $rc, checkpoint at step $(newest $name)" "$(secs "$took")" "$(finish $name)" "$ok"

name=dp-usr1; config $name dp
SAETRAIN_FAULT=1:20:USR1 launch $name "$dir/$name.log"
ok=0; [ "$rc" = 75 ] && has "$dir/$name.log" "stopped by a signal" && ok=1
row "SIGUSR1 to rank 1 of 2 (data_parallel)" "all ranks stop, checkpoint, exit 75" \
    "exit $rc, checkpoint at step $(newest $name)" "$(secs "$took")" "$(finish $name)" "$ok"

# Ctrl-C: SIGINT is a stop request like SIGTERM; the same command resumes from the step the stop
# line names. From the hook (iteration 20), then as a terminal sends it (to the process group, at
# a random moment after the first commit), then twice (the second stops at once, naming what is
# kept: exit 130, the shell's code for a death by SIGINT).
resumed_from() { grep -ohE 'resumed from the checkpoint at step [0-9]+' "$1" | grep -oE '[0-9]+$'; }
stopped_at() { grep -ohE 'stopped by a signal after [0-9]+ steps' "$1" | grep -oE '[0-9]+' | head -1; }
name=one-int; config $name one
SAETRAIN_FAULT=0:20:INT launch $name "$dir/$name.log"
n=$(newest $name)
ok=0; [ "$rc" = 75 ] && [ "$(stopped_at "$dir/$name.log")" = 21 ] && [ "$n" = 21 ] && ok=1
lost=$(finish $name)
[ "$(resumed_from "$dir/$name.rerun.log")" = 21 ] || ok=0
row "Ctrl-C (SIGINT), 1 rank, iteration 20" "checkpoint, exit 75, resume there" \
    "exit $rc, checkpoint at step $n, resumed from $(resumed_from "$dir/$name.rerun.log")" \
    "$(secs "$took")" "$lost" "$ok"

# (30 epochs, 5625 steps, and its own reference: the Ctrl-C lands within the run's first second.)
CTRLC="data: {path: $dir/data, batch_size: 64, epochs: 30, shuffle_buffer_rows: 1500}"
config ref-one-ctrlc one "$CTRLC"
launch ref-one-ctrlc "$dir/ref-one-ctrlc.log"
[ "$rc" = 0 ] || { cat "$dir/ref-one-ctrlc.log" >&2; exit 1; }
name=one-ctrlc; config $name one "$CTRLC"
setsid bash -c "$(cmd $name)" >"$dir/$name.log" 2>&1 &
bg=$!
for _ in $(seq 200); do [ -n "$(newest $name)" ] && break; sleep 0.02; done
sleep "$(echo "$RANDOM / 32768" | bc -l)"
kill -INT -- "-$bg"; tk=$(now)
{ wait "$bg"; } 2>/dev/null; rc=$?; bg=""
t=$(secs "$(now) - $tk")
at=$(stopped_at "$dir/$name.log")
ok=0; [ "$rc" = 75 ] && [ -n "$at" ] && [ "$(newest $name)" = "$at" ] && ok=1
ref_suffix=-ctrlc
lost=$(finish $name)
ref_suffix=""
[ "$(resumed_from "$dir/$name.rerun.log")" = "$at" ] || ok=0
row "Ctrl-C to a 1-rank run's process group (a terminal)" "checkpoint, exit 75, resume there" \
    "exit $rc, stopped after ${at:-?} steps, resumed from $(resumed_from "$dir/$name.rerun.log")" \
    "$t" "$lost" "$ok"

name=one-int2; config $name one
SAETRAIN_FAULT=0:40:INTx2 launch $name "$dir/$name.log"
kept=$(grep -ohE 'kept: the checkpoint at step [0-9]+' "$dir/$name.log" | grep -oE '[0-9]+$')
n=$(newest $name)
ok=0; [ "$rc" = 130 ] && [ -n "$kept" ] && [ "$n" = "$kept" ] && ! has "$dir/$name.log" "stopped by a signal" && ok=1
lost=$(finish $name)
[ "$(resumed_from "$dir/$name.rerun.log")" = "$kept" ] || ok=0
row "Ctrl-C twice, 1 rank, iteration 40" "stops at once, names the kept step" \
    "exit $rc, kept step ${kept:-?} (newest committed $n), resumed from $(resumed_from "$dir/$name.rerun.log")" \
    "$(secs "$took")" "$lost" "$ok"

# The launcher: Open MPI's mpirun takes a Ctrl-C itself (its ranks are in process groups of their
# own), stops relaying their output, sends them SIGTERM and a second later SIGKILL, and exits 1
# whatever they return; SIGUSR1 it forwards, and then returns the ranks' 75. Console lines every
# step, so that a rank blocked writing to mpirun's pty would show.
# (The 30-epoch runs, 2812 steps on 2 ranks, and their own reference: a 2-epoch run on a loaded
# machine could finish before mpirun forwarded the signal.)
config ref-dp-ctrlc dp "$CTRLC"
launch ref-dp-ctrlc "$dir/ref-dp-ctrlc.log"
[ "$rc" = 0 ] || { cat "$dir/ref-dp-ctrlc.log" >&2; exit 1; }
mpi_signal() {  # mpi_signal NAME SIGNAL: to mpirun, after the first commit
    local name=$1
    config "$name" dp "$CTRLC"
    setsid bash -c "$(cmd "$name" --set log.every_steps=1)" >"$dir/$name.log" 2>&1 &
    bg=$!
    for _ in $(seq 300); do [ -n "$(newest "$name")" ] && break; sleep 0.02; done
    kill "-$2" "$(pgrep -s "$bg" -x mpirun)"; tk=$(now)
    { wait "$bg"; } 2>/dev/null; rc=$?; bg=""
    t=$(secs "$(now) - $tk")
}
ref_suffix=-ctrlc
name=dp-mpirun-int; mpi_signal $name INT
at=$(stopped_at "$dir/$name.log")
ok=0; { [ "$rc" = 1 ] || [ "$rc" = 75 ]; } && [ -n "$at" ] && [ "$(newest $name)" = "$at" ] && ok=1
lost=$(finish $name)
[ "$(resumed_from "$dir/$name.rerun.log")" = "$at" ] || ok=0
row "Ctrl-C to mpirun (2 ranks, data_parallel)" "ranks stop, commit; mpirun's own exit code" \
    "exit $rc (mpirun), ranks stopped after ${at:-?} steps, resumed from $(resumed_from "$dir/$name.rerun.log")" \
    "$t" "$lost" "$ok"
name=dp-mpirun-usr1; mpi_signal $name USR1
at=$(stopped_at "$dir/$name.log")
ok=0; [ "$rc" = 75 ] && [ -n "$at" ] && [ "$(newest $name)" = "$at" ] && ok=1
lost=$(finish $name)
[ "$(resumed_from "$dir/$name.rerun.log")" = "$at" ] || ok=0
row "SIGUSR1 to mpirun (2 ranks, data_parallel)" "forwarded: ranks stop, exit 75" \
    "exit $rc (mpirun), ranks stopped after ${at:-?} steps, resumed from $(resumed_from "$dir/$name.rerun.log")" \
    "$t" "$lost" "$ok"
ref_suffix=""

# SIGKILL right after a checkpoint's write finished (SAETRAIN_FAULT phase `written`: the writer
# waits for the write of checkpoint 21 and dies at the start of iteration 22): the checkpoint is
# committed by then, so the resume loses 1 step, not up to two checkpoint.every_steps intervals.
for mode in one dp; do
    name=$mode-written; config $name $mode
    SAETRAIN_FAULT=0:21:KILL:written launch $name "$dir/$name.log"
    it=$(grep -ohE 'raises signal 9 \(iteration [0-9]+\)' "$dir/$name.log" | grep -oE '[0-9]+\)' | tr -d ')')
    n=$(newest $name)
    ok=0; [ "$rc" != 0 ] && [ "$rc" != 124 ] && [ "$it" = 22 ] && [ "$n" = 21 ] && ok=1
    lost=$(finish $name)
    from=$(resumed_from "$dir/$name.rerun.log")
    [ "$from" = 21 ] || ok=0
    row "SIGKILL after checkpoint 21's write finished ($mode)" "resume loses < 1 interval (7 steps)" \
        "exit $rc, killed at iteration ${it:-?}, newest committed $n, resumed from ${from:-?}: $((${it:-0} - ${from:-0})) step(s) lost" \
        "-" "$lost" "$ok"
done

# SIGKILL of one rank in each mode: at start-up, mid-step, mid-checkpoint (a writer, halfway
# through its temp file) and at a checkpoint's collective (a rank that writes nothing: hybrid).
cases=()
for mode in sweep dp hybrid; do
    last=$(($(np_of $mode) - 1))
    cases+=("$mode $last startup:KILL start-up" "$mode $last 20:KILL mid-step"
        "$mode 0 21:KILL:checkpoint writing-a-checkpoint")
    [ $mode = hybrid ] && cases+=("$mode $last 28:KILL:checkpoint in-a-checkpoint's-collective")
done
i=0
for c in "${cases[@]}"; do
    set -- $c
    mode=$1 rank=$2 spec=$3 when=${4//-/ }
    i=$((i + 1))
    # --short: test_resume RankKilledInEveryModeAndPhase... runs all of these in CI.
    if [ $short = 1 ]; then
        row "SIGKILL rank $rank of $(np_of $mode) ($mode) $when" "all exit < timeout_s+5, rank named" \
            "not run by --short: test_resume RankKilledInEveryModeAndPhase... in CI" "-" "skipped" 1
        continue
    fi
    name="$mode-k$i"; config "$name" "$mode"
    SAETRAIN_FAULT=$rank:$spec launch $name "$dir/$name.log"
    t=$(since_fault "$ended" "$dir/$name.log")
    ok=1
    [ "$t" = "?" ] || [ "$(echo "$t > $TIMEOUT_S + 5" | bc)" = 1 ] && ok=0
    [ "$rc" = 0 ] && ok=0
    [ "$rc" = 124 ] && ok=0
    grep -qE "noticed that process rank $rank " "$dir/$name.log" || ok=0
    tmp=$(find "$dir/runs/$name" -name '*.tmp.*' 2>/dev/null | wc -l)
    [ "$spec" = 21:KILL:checkpoint ] && [ "$tmp" = 0 ] && ok=0  # it must have died mid-write
    obs="exit $rc; mpirun names rank $(grep -oE "noticed that process rank [0-9]+" "$dir/$name.log" | grep -oE "[0-9]+$")"
    [ "$spec" = 21:KILL:checkpoint ] && obs="$obs; $tmp half-written temp file left"
    row "SIGKILL rank $rank of $(np_of $mode) ($mode) $when" "all exit < timeout_s+5, rank named" \
        "$obs" "$t" "$(finish $name)" "$ok"
    [ -z "$(find "$dir/runs/$name" -name '*.tmp.*')" ] || { failed=1; echo "fault-matrix: $name: temp files left after the rerun" >&2; }
done

# Rank 0 killed after all ranks agreed a checkpoint is written, before its commit marker: the
# other writers must not yet have deleted what the markers on disk point at.
name=sweep-commit; config $name sweep
SAETRAIN_FAULT_KILL_BEFORE_COMMIT=21 launch $name "$dir/$name.log"
t=$(since_fault "$ended" "$dir/$name.log")
ok=0
[ "$rc" != 0 ] && has "$dir/$name.log" "before the commit marker of step 21" &&
    has "$dir/$name.log" "noticed that process rank 0 " && [ "$t" != "?" ] &&
    [ "$(echo "$t <= $TIMEOUT_S + 5" | bc)" = 1 ] && ok=1
row "SIGKILL rank 0 of 2 (sweep) before a commit marker" "all exit < timeout_s+5, rank named" \
    "exit $rc; mpirun names rank $(grep -oE "noticed that process rank [0-9]+" "$dir/$name.log" | grep -oE "[0-9]+$"); committed: $(ls "$dir/runs/$name/checkpoints" | tr '\n' ' ')" \
    "$t" "$(finish $name)" "$ok"

name=dp-stop; config $name dp
SAETRAIN_FAULT=1:20:STOP launch $name "$dir/$name.log"
ok=0; [ "$rc" != 0 ] && [ "$rc" != 124 ] && has "$dir/$name.log" "has waited" && ok=1
row "SIGSTOP of rank 1 of 2 (a hung rank)" "the watchdog ends the job after timeout_s" \
    "exit $rc: $(first_error "$dir/$name.log" | cut -c1-88)" "$(secs "$took")" "$(finish $name)" "$ok"

name=dp-error; config $name dp
SAETRAIN_FAULT=1:5 launch $name "$dir/$name.log"
ok=0; [ "$rc" != 0 ] && has "$dir/$name.log" "rank 1: injected fault at iteration 5" && ok=1
row "an error on rank 1 of 2 mid-run" "its message, every rank ends" \
    "exit $rc: $(first_error "$dir/$name.log" | cut -c1-88)" "$(secs "$took")" "$(finish $name)" "$ok"

# --- full disk ----------------------------------------------------------------------------------
name=one-fullckpt; config $name one
SAETRAIN_FAULT_DISK_FULL=checkpoint-:4 launch $name "$dir/$name.log"
ok=0; [ "$rc" = 1 ] && has "$dir/$name.log" "checkpoint-21.h5.tmp" && has "$dir/$name.log" "No space left on device" && ok=1
row "disk full writing a checkpoint (injected)" "1 line naming the file, exit 1" \
    "exit $rc: $(first_error "$dir/$name.log")" "$(secs "$took")" "$(finish $name)" "$ok"

name=one-fullfinal; config $name one
SAETRAIN_FAULT_DISK_FULL=final.h5:0 launch $name "$dir/$name.log"
ok=0; [ "$rc" = 1 ] && has "$dir/$name.log" "final.h5.tmp" && has "$dir/$name.log" "No space left on device" && ok=1
row "disk full writing final.h5 (injected)" "1 line naming the file, exit 1" \
    "exit $rc: $(first_error "$dir/$name.log")" "$(secs "$took")" "$(finish $name)" "$ok"

mkdir -p "$dir/mnt-small"
if mount -t tmpfs -o size=1m tmpfs "$dir/mnt-small" 2>/dev/null; then
    name=one-tmpfs; config $name one
    sed -i "s|out_dir: $dir/runs/$name|out_dir: $dir/mnt-small/run|" "$dir/$name.yaml"
    launch $name "$dir/$name.log"
    ok=0; [ "$rc" = 1 ] && has "$dir/$name.log" "No space left on device" && has "$dir/$name.log" "$dir/mnt-small/run" && ok=1
    mount -o remount,size=64m "$dir/mnt-small"
    mkdir -p "$dir/runs" && ln -sfn "$dir/mnt-small/run" "$dir/runs/$name"
    row "disk full (a real 1 MiB tmpfs)" "1 line naming the file, exit 1" \
        "exit $rc: $(first_error "$dir/$name.log")" "$(secs "$took")" "$(finish $name)" "$ok"
else
    row "disk full (a real 1 MiB tmpfs)" "1 line naming the file, exit 1" "cannot mount a tmpfs here" "-" "skipped" 1
fi

# --- shards changing during the run ---------------------------------------------------------------
# The run stops itself at iteration 2 (SAETRAIN_FAULT=0:2:STOP); the third shard (rows 8000 on,
# not yet opened in disk order) is changed; the run continues and meets it.
shard="$dir/data/shard_00002.h5"
shard_case() {  # shard_case NAME LABEL EXPECT_TEXT CHANGE...
    local name=$1 label=$2 text=$3; shift 3
    config "$name" one "$DISK"
    local t0; t0=$(now)
    SAETRAIN_FAULT=0:2:STOP setsid bash -c "$(cmd "$name")" >"$dir/$name.log" 2>&1 &
    local pid=$!
    bg=$pid
    for _ in $(seq 200); do grep -q '^State:.*T' /proc/"$(ranks_of $pid)"/status 2>/dev/null && break; sleep 0.05; done
    "$@"
    kill -CONT "$(ranks_of $pid)"
    wait $pid; rc=$?; bg=""
    took=$(echo "$(now) - $t0" | bc)
    local ok=0
    [ "$rc" = 1 ] && has "$dir/$name.log" "shard $shard: " && has "$dir/$name.log" "$text" && ok=1
    rm -f "$shard" && cp -p "$dir/data.orig/shard_00002.h5" "$shard"  # restored
    ref_suffix=-disk
    row "$label" "1 line naming shard and row" "exit $rc: $(first_error "$dir/$name.log")" \
        "$(secs "$took")" "$(finish "$name")" "$ok"
    ref_suffix=""
}
shard_case one-shardgone "a shard deleted mid-run" "No such file or directory" rm -f "$shard"
shard_case one-shardswap "a shard replaced (damaged header) mid-run" "another file now" \
    sh -c "cp '$shard' '$shard.new' && printf XXXXXXXX | dd of='$shard.new' conv=notrunc status=none && mv '$shard.new' '$shard'"
shard_case one-shardtrunc "a shard truncated in place mid-run" "truncated to" \
    truncate -s 100000 "$shard"

# --- bad inputs at start-up ---------------------------------------------------------------------
startup_case() {  # startup_case NAME LABEL EXPECT_TEXT SETUP_CMD
    local name=$1 label=$2 text=$3 setup=$4
    rm -rf "$dir/bad" && cp -a "$dir/data.orig" "$dir/bad"
    eval "$setup"
    config "$name" one
    sed -i "s|path: $dir/data,|path: $dir/bad,|" "$dir/$name.yaml"
    launch "$name" "$dir/$name.log"
    local ok=0 lost=none
    [ "$rc" = 1 ] && has "$dir/$name.log" "$text" && [ "$(grep -c 'saetrain: error:' "$dir/$name.log")" = 1 ] && ok=1
    [ -e "$dir/runs/$name/metrics.jsonl" ] && lost="YES: wrote into out_dir"
    row "$label" "1 line naming it, exit 1, nothing written" "exit $rc: $(first_error "$dir/$name.log")" \
        "$(secs "$took")" "$lost" "$ok"
}
startup_case one-trunc "a truncated shard at start" "shard_00001.h5" "truncate -s 50000 $dir/bad/shard_00001.h5"
startup_case one-garbage "a shard that is not HDF5" "shard_00001.h5" "head -c 100000 /dev/urandom > $dir/bad/shard_00001.h5"

# --- checkpoints and out_dir --------------------------------------------------------------------
name=one-damaged; config $name one
launch $name "$dir/$name.log"
rm -f "$dir/runs/$name/COMPLETE" "$dir/runs/$name/sae/topk-x4-k6/final.h5"
s=$(newest $name)
f="$dir/runs/$name/sae/topk-x4-k6/checkpoint-$s.h5"
printf '\x13\x37\x13\x37' | dd of="$f" bs=1 seek=$(($(stat -c %s "$f") / 2)) conv=notrunc status=none
launch $name "$dir/$name.log2"
ok=0; [ "$rc" = 0 ] && has "$dir/$name.log2" "unusable" && has "$dir/$name.log2" "resumed from the checkpoint" && ok=1
prev=$(grep -ohE 'resumed from the checkpoint at step [0-9]+' "$dir/$name.log2" | grep -oE '[0-9]+$')
lost=none
"$bin/sae-inspect" "$dir/runs/$name/sae/topk-x4-k6/final.h5" --compare "$dir/runs/ref-one/sae/topk-x4-k6/final.h5" >/dev/null || lost="YES: final differs"
row "the newest checkpoint damaged (4 bytes flipped)" "warning, falls back to the previous" \
    "exit $rc; checkpoint $s unusable, resumed from step $prev" "$(secs "$took")" "$lost" "$ok"

name=one-lock; config $name one
SAETRAIN_FAULT=0:20:STOP setsid bash -c "$(cmd $name)" >"$dir/$name.log" 2>&1 &
pid=$! bg=$!
for _ in $(seq 200); do [ -n "$(newest $name)" ] && grep -q '^State:.*T' /proc/"$(ranks_of $pid)"/status 2>/dev/null && break; sleep 0.05; done
launch $name "$dir/$name.second.log"
ok=0; [ "$rc" = 1 ] && has "$dir/$name.second.log" "is in use by another saetrain run (pid" && ok=1
obs="second: exit $rc: $(first_error "$dir/$name.second.log" | cut -c1-80)"
t2=$took
kill -KILL "$(ranks_of $pid)"; { wait $pid; } 2>/dev/null; bg=""  # the first run dies; its lock file stays
lock_left=$([ -e "$dir/runs/$name/.saetrain.lock" ] && echo yes || echo no)
lost=$(finish $name)
row "two runs on one out_dir at once" "the second refuses, 1 line" "$obs" "$(secs "$t2")" "$lost" "$ok"
row "  ... then the holder is SIGKILLed; run again" "its lock file blocks nothing" \
    "lock file left: $lock_left; rerun completed: $([ -e "$dir/runs/$name/COMPLETE" ] && echo yes || echo no)" \
    "-" "$lost" "$([ -e "$dir/runs/$name/COMPLETE" ] && echo 1 || echo 0)"

name=one-nan; config $name one "$DISK"
rm -rf "$dir/nan" && cp -a "$dir/data.orig" "$dir/nan"
sed -i "s|path: $dir/data,|path: $dir/nan,|" "$dir/$name.yaml"
f="$dir/nan/shard_00000.h5"  # the first value of its 4000 x 64 floats: the first batch
printf '\x00\x00\xc0\x7f' | dd of="$f" bs=1 seek=$(($(stat -c %s "$f") - 4000 * 64 * 4)) conv=notrunc status=none
launch $name "$dir/$name.log"
ok=0; [ "$rc" = 0 ] && grep -qE "skipped [12] batch\(es\) holding NaN/Inf" "$dir/$name.log" && ok=1  # once per epoch
row "NaN in the first batch (nonfinite: skip)" "skips it, trains from the next" \
    "exit $rc: $(grep -m1 -oE 'skipped [0-9]+ batch\(es\) holding NaN/Inf' "$dir/$name.log")" "$(secs "$took")" \
    "$([ -e "$dir/runs/$name/COMPLETE" ] && echo none || echo 'YES: no final weights')" "$ok"

name=one-width; config $name one
rm -rf "$dir/wdata" && cp -a "$dir/data.orig" "$dir/wdata"
sed -i "s|path: $dir/data,|path: $dir/wdata,|" "$dir/$name.yaml"
SAETRAIN_FAULT=0:30:TERM launch $name "$dir/$name.log"
rm -rf "$dir/wdata" && cp -a "$dir/data32" "$dir/wdata"  # the same path, another model's shards
launch $name "$dir/$name.log2"
ok=0; [ "$rc" = 1 ] && has "$dir/$name.log2" "holds an SAE of d_model 64" && has "$dir/$name.log2" "now has d_model 32" && ok=1
rm -rf "$dir/wdata" && cp -a "$dir/data.orig" "$dir/wdata"  # restored
row "the data's d_model changes between runs" "refused, 1 line, checkpoints kept" \
    "exit $rc: ...$(grep -m1 -oE "holds an SAE of d_model [0-9]+.*now has d_model [0-9]+" "$dir/$name.log2")" \
    "$(secs "$took")" "$(finish $name)" "$ok"

name=one-cfg; config $name one
SAETRAIN_FAULT=0:30:TERM launch $name "$dir/$name.log"
launch $name "$dir/$name.log2" --set train.lr=0.01
ok=0; [ "$rc" = 1 ] && has "$dir/$name.log2" "train.lr" && ok=1
row "resume with a result-changing config key" "refused, naming the key" \
    "exit $rc: $(first_error "$dir/$name.log2" | cut -c1-88)" "$(secs "$took")" "$(finish $name)" "$ok"

outdir_case() {  # outdir_case LABEL OUT_DIR EXPECT_TEXT [runner prefix] [binary dir]
    local label=$1 out=$2 text=$3 pre=${4:-} exe=${5:-$bin}
    config one-outdir one
    sed -i "s|out_dir: $dir/runs/one-outdir|out_dir: $out|" "$dir/one-outdir.yaml"
    local t0; t0=$(now)
    eval "$pre timeout 60 $exe/saetrain $dir/one-outdir.yaml --threads 1" >"$dir/outdir.log" 2>&1
    rc=$?; took=$(echo "$(now) - $t0" | bc)
    local ok=0
    [ "$rc" = 1 ] && has "$dir/outdir.log" "run.out_dir $out" && has "$dir/outdir.log" "$text" && ok=1
    row "$label" "1 line naming out_dir, exit 1" "exit $rc: $(first_error "$dir/outdir.log" | cut -c1-88)" \
        "$(secs "$took")" none "$ok"
}
echo "a file" >"$dir/afile"
outdir_case "out_dir under a regular file" "$dir/afile/run" "Not a directory"
mkdir -p "$dir/mnt-ro"
if mount -t tmpfs -o ro,size=1m tmpfs "$dir/mnt-ro" 2>/dev/null; then
    outdir_case "out_dir on a read-only file system" "$dir/mnt-ro/run" "Read-only file system"
else
    row "out_dir on a read-only file system" "1 line naming out_dir, exit 1" "cannot mount here" "-" "skipped" 1
fi
mkdir -p "$dir/locked" && chmod 755 "$dir/locked" && chmod o+rx "$dir"
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
    # nobody runs a copy of the binary: the build tree may sit in a directory only root may
    # enter (a clone in mktemp -d's 0700 directory, as CI makes).
    mkdir -p "$dir/nobody-bin" && cp "$bin/saetrain" "$dir/nobody-bin/" && chmod -R o+rx "$dir/nobody-bin"
    outdir_case "out_dir not writable (permission denied)" "$dir/locked/run" "Permission denied" \
        "HOME=/tmp setpriv --reuid=65534 --regid=65534 --clear-groups" "$dir/nobody-bin"
else
    row "out_dir not writable (permission denied)" "1 line naming out_dir, exit 1" "needs root and setpriv" "-" "skipped" 1
fi

# --- the table ----------------------------------------------------------------------------------
echo
awk -F'\t' 'BEGIN { printf "%-58s | %-42s | %-98s | %-8s | %s\n", "fault", "expected", "observed", "exit (s)", "data lost"
    s = ""; for (i = 0; i < 225; i++) s = s "-"; print s }
    { printf "%-58s | %-42s | %-98s | %-8s | %s\n", $1, $2, $3, $4, $5 }' "$table"
rows=$(wc -l <"$table")
if [ $failed = 0 ]; then
    echo "fault-matrix: $rows rows, every fault behaved as expected, data lost: none"
    cleanup
    if [ $made_dir = 1 ]; then rm -rf "$dir"; fi
    exit 0
else
    echo "fault-matrix: FAILED (see the rows above; logs in $dir)"
    exit 1
fi
