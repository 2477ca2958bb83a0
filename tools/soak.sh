#!/usr/bin/env bash
# soak.sh — a long 2-rank data-parallel run, SIGKILLed again and again and restarted.
#
#   tools/soak.sh [--minutes 30] [--build build/cpu] [--dir /tmp/saetrain_soak] [--seed 1]
#
# One job (the same command, resumed each time) trains a small TopK SAE (d_model 64, 512
# latents) with a checkpoint every CKPT_EVERY steps. Until --minutes have passed, each start is
# killed after a random 5-45 s by SIGKILL to one of its two ranks (chosen at random), and then
# the script checks that:
#   - the job ended (the launcher or the watchdog) within parallel.timeout_s + 5 s, naming the
#     dead rank;
#   - every committed checkpoint loads and its checksum verifies (sae-inspect);
#   - no temp files pile up (a kill mid-write leaves one; the next start removes it);
# and records each rank's resident memory (VmRSS) every 2 s. After the last kill the job runs to
# the end, and its final weights are compared bitwise with an uninterrupted run of the same
# config (started beside it, at the same low priority). Outside CI; quoted in docs/reliability.md.
# Everything runs under nice 19 with one thread per rank: it is meant to share a machine.
set -u
minutes=30 build=build/cpu dir=/tmp/saetrain_soak seed=1
while [ $# -gt 0 ]; do
    case "$1" in
    --minutes) minutes=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    *) echo "usage: $0 [--minutes M] [--build DIR] [--dir DIR] [--seed N]" >&2; exit 2 ;;
    esac
done
bin=$(cd "$build/apps" && pwd) || { echo "soak: no $build/apps; build first" >&2; exit 2; }
ROWS=${ROWS:-100000} EPOCHS=${EPOCHS:-200} CKPT_EVERY=${CKPT_EVERY:-100} TIMEOUT_S=${TIMEOUT_S:-10}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
RANDOM=$seed
rm -rf "$dir" && mkdir -p "$dir" || exit 2
log="$dir/soak.log"
say() { echo "$*" | tee -a "$log"; }

nice -n 19 "$bin/sae-synth" --out "$dir/data" --d-model 64 --features 256 --rows "$ROWS" \
    --shards 4 --seed 11 >/dev/null || exit 1
config() {  # config NAME -> path
    cat >"$dir/$1.yaml" <<EOF
run: {out_dir: $dir/$1, seed: 7}
data: {path: $dir/data, batch_size: 256, epochs: $EPOCHS, shuffle_buffer_rows: 16384}
sae: {arch: topk, n_latents: 512, k: 16}
train: {lr: 0.001, warmup_steps: 100}
parallel: {mode: data_parallel, timeout_s: $TIMEOUT_S}
log: {every_steps: 200}
checkpoint: {every_steps: $CKPT_EVERY, keep: 3}
EOF
    echo "$dir/$1.yaml"
}
job() {  # job CONFIG LOG: the 2-rank job in the background; sets $job_pid
    nice -n 19 mpirun --oversubscribe -np 2 "$bin/saetrain" "$1" --threads 1 >"$2" 2>&1 &
    job_pid=$!
}
ranks_of() {  # the saetrain processes under launcher pid $1 (by parentage, never by name)
    local p kids
    for p in $(pgrep -P "$1"); do
        if [ "$(cat /proc/$p/comm 2>/dev/null)" = saetrain ]; then echo "$p"; else ranks_of "$p"; fi
    done
}
rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
now() { date +%s.%N; }
id=topk-n512-k16
id_dir() { echo "$dir/$1/sae/$id"; }

ref_cfg=$(config ref) soak_cfg=$(config soak)
job "$ref_cfg" "$dir/ref.log"
ref_pid=$job_pid
say "soak: $minutes min of SIGKILLs on a 2-rank data-parallel run ($ROWS rows x $EPOCHS epochs, batch 256 per rank, checkpoint every $CKPT_EVERY steps, parallel.timeout_s $TIMEOUT_S); reference run beside it (pid $ref_pid)"
say "restart | ran (s) | killed | exit | exit after kill (s) | committed steps (all verified) | rank RSS at kill (MB) | temp files"
t0=$(date +%s)
n=0 kills=0 bad_ckpt=0 slow_exit=0 verified=0 unnamed=0
rss_first="" rss_last="" rss_max=0
while [ $(($(date +%s) - t0)) -lt $((minutes * 60)) ] && [ ! -e "$dir/soak/COMPLETE" ]; do
    n=$((n + 1))
    job "$soak_cfg" "$dir/job-$n.log"
    delay=$((5 + RANDOM % 41))
    start=$(now)
    ranks=""
    while kill -0 "$job_pid" 2>/dev/null &&
        [ "$(echo "$(now) - $start < $delay" | bc)" = 1 ]; do
        ranks=$(ranks_of "$job_pid" | tr '\n' ' ')
        for p in $ranks; do echo "$n $(echo "$(now) - $start" | bc) $p $(rss_kb "$p")"; done >>"$dir/rss.txt"
        sleep 2
    done
    ran=$(echo "$(now) - $start" | bc)
    set -- $ranks
    if ! kill -0 "$job_pid" 2>/dev/null || [ $# -lt 2 ]; then
        wait "$job_pid"; rc=$?
        say "$n | $(printf %.1f "$ran") | - (ended by itself: exit $rc) | | | |"
        [ -e "$dir/soak/COMPLETE" ] && break
        continue
    fi
    pick=$((RANDOM % 2))
    victim=$([ $pick = 0 ] && echo "$1" || echo "$2")
    # The MPI rank of the victim (ranks_of lists by pid, which is normally, not surely, rank order).
    which=$(tr '\0' '\n' <"/proc/$victim/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
    rss="$(($(rss_kb "$1") / 1024)) / $(($(rss_kb "$2") / 1024))"
    kill -KILL "$victim"
    tk=$(now)
    kills=$((kills + 1))
    wait "$job_pid"; rc=$?
    took=$(echo "$(now) - $tk" | bc)
    [ "$(echo "$took > $TIMEOUT_S + 5" | bc)" = 1 ] && slow_exit=$((slow_exit + 1))
    # The launcher names the dead rank ("rank N" / "exited on signal 9") or the watchdog does.
    grep -q "noticed that process rank $which " "$dir/job-$n.log" || unnamed=$((unnamed + 1))
    steps=""
    for c in "$dir"/soak/checkpoints/step-*.commit; do
        [ -e "$c" ] || continue
        s=$(basename "$c" .commit); s=${s#step-}
        if nice -n 19 "$bin/sae-inspect" "$(id_dir soak)/checkpoint-$s.h5" | grep -q "checksum ok"; then
            verified=$((verified + 1)); steps="$steps $s"
        else
            bad_ckpt=$((bad_ckpt + 1)); steps="$steps $s(UNREADABLE)"
        fi
    done
    tmps=$(find "$dir/soak" -name '*.tmp*' | wc -l)
    m=$(($(rss_kb "$1" 2>/dev/null) + 0))
    say "$n | $(printf %.1f "$ran") | rank $which (pid $victim) | $rc | $(printf %.1f "$took") |$steps | $rss | $tmps"
    r0=${rss%% /*}
    [ -z "$rss_first" ] && rss_first=$rss
    rss_last=$rss
    [ "$r0" -gt "$rss_max" ] && rss_max=$r0
done
say "soak: $kills kills in $(($(date +%s) - t0)) s; now running to the end"
final_start=$(now)
nice -n 19 mpirun --oversubscribe -np 2 "$bin/saetrain" "$soak_cfg" --threads 1 >"$dir/job-final.log" 2>&1
final_rc=$?
say "final resumed run: exit $final_rc after $(printf %.0f "$(echo "$(now) - $final_start" | bc)") s ($(grep -o 'resumed from the checkpoint at step [0-9]*' "$dir/job-final.log"))"
wait "$ref_pid"; ref_rc=$?
say "reference run: exit $ref_rc"
max_rss=$(awk '{print int($4/1024)}' "$dir/rss.txt" | sort -n | tail -1)
say "RSS per rank at kill (rank0 / rank1 MB): first $rss_first, last $rss_last; highest sample over the soak $max_rss MB ($(wc -l <"$dir/rss.txt") samples in $dir/rss.txt)"
say "checkpoints verified after kills: $verified, unreadable: $bad_ckpt; jobs slower than timeout_s + 5 s to exit: $slow_exit; kills whose log names no dead rank: $unnamed"
cmp=$("$bin/sae-inspect" "$(id_dir soak)/final.h5" --compare "$(id_dir ref)/final.h5")
cmp_rc=$?
say "final weights: $cmp"
total=$(($(date +%s) - t0))
say "soak: $total s, $kills SIGKILLs"
if [ $final_rc = 0 ] && [ $ref_rc = 0 ] && [ $cmp_rc = 0 ] && [ $bad_ckpt = 0 ] && [ $slow_exit = 0 ] &&
    [ $kills -gt 0 ]; then
    say "soak: PASS"
else
    say "soak: FAIL"
    exit 1
fi
