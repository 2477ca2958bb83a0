#!/usr/bin/env bash
# s3-bench.sh — issue 31's throughput figures against a local S3-compatible store: moto's S3
# server (the .venv's moto_server) on 127.0.0.1, synthetic shards uploaded to it, then
#   1. sae-iobench s3://...: the reader's MB/s beside a plain parallel range-GET pass over the
#      same objects (same store, connections and request size; no HDF5, no loader);
#   2. bench_reader_train with AWS_ENDPOINT_URL: CPU training fed by the reader from the store
#      beside the same training fed from memory, with the reader's wait fraction;
#   3. saetrain from s3:// (one TopK SAE): its summary's wait % (the trainer's time blocked on
#      the reader).
# Run it on a quiet machine: the figures are the machine's, not the code's, when other work
# shares the cores (moto itself is a Python process competing with the reader).
#
#   tools/s3-bench.sh [--build build/cpu] [--dir DIR] [--rows 1000000] [--d-model 768]
#                     [--dtype bf16] [--shards 8] [--connections 16] [--request-mib 8]
#                     [--passes 3] [--steps 200]
#
# --rows 20000 --passes 1 --steps 20 checks that it works in seconds. Prints each program's
# table and, last, one line per figure. Leaves nothing running; DIR (default: a new temp dir) is
# removed unless given.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build=build/cpu dir="" rows=1000000 d_model=768 dtype=bf16 shards=8 conns=16 req_mib=8 passes=3
steps=200
while [ $# -gt 0 ]; do
    case "$1" in
    --build) build=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --rows) rows=$2; shift 2 ;;
    --d-model) d_model=$2; shift 2 ;;
    --dtype) dtype=$2; shift 2 ;;
    --shards) shards=$2; shift 2 ;;
    --connections) conns=$2; shift 2 ;;
    --request-mib) req_mib=$2; shift 2 ;;
    --passes) passes=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    *) echo "usage: $0 [--build DIR] [--dir DIR] [--rows N] [--d-model D] [--dtype f32|f16|bf16]" \
        "[--shards N] [--connections N] [--request-mib M] [--passes N] [--steps N]" >&2; exit 2 ;;
    esac
done
cd "$root"
bin=$(cd "$build/apps" 2>/dev/null && pwd) || { echo "s3-bench: no $build/apps; build first" >&2; exit 2; }
py="$root/.venv/bin/python"
[ -x "$root/.venv/bin/moto_server" ] || { echo "s3-bench: no .venv/bin/moto_server; run bash tools/setup-venv.sh" >&2; exit 2; }
keep=1
[ -n "$dir" ] || { dir=$(mktemp -d /tmp/saetrain_s3bench.XXXXXX); keep=0; }
mkdir -p "$dir"
port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$root/.venv/bin/moto_server" -H 127.0.0.1 -p "$port" > "$dir/moto.log" 2>&1 &
moto=$!
cleanup() {
    kill "$moto" 2>/dev/null || true
    wait "$moto" 2>/dev/null || true
    [ "$keep" = 1 ] || rm -rf "$dir"
}
trap cleanup EXIT
export AWS_ENDPOINT_URL="http://127.0.0.1:$port" AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench
for _ in $(seq 100); do "$py" -c "import socket; socket.create_connection(('127.0.0.1', $port), 1)" 2>/dev/null && break; sleep 0.1; done

echo "s3-bench: $rows rows x d_model $d_model ($dtype) in $shards shards, moto on $AWS_ENDPOINT_URL"
"$bin/sae-synth" --out "$dir/data" --rows "$rows" --d-model "$d_model" --dtype "$dtype" \
    --shards "$shards" --seed 1 > /dev/null
"$py" - "$dir/data" <<'EOF'
import os, sys, boto3
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")
s3.create_bucket(Bucket="bench")
for f in sorted(os.listdir(sys.argv[1])):
    if f.startswith("shard_"):
        s3.upload_file(os.path.join(sys.argv[1], f), "bench", "data/" + f)
EOF

echo; echo "== sae-iobench s3://bench/data/ (reader beside plain range GETs)"
"$bin/sae-iobench" s3://bench/data/ --s3-connections "$conns" --s3-request-mib "$req_mib" \
    --passes "$passes" --json | tee "$dir/iobench.txt"

echo; echo "== bench_reader_train (training fed from the store beside from memory)"
"$root/$build/bench/bench_reader_train" s3://bench/data/ --steps "$steps" | tee "$dir/train.txt"

echo; echo "== saetrain from s3:// (wait %: the trainer blocked on the reader)"
cat > "$dir/cfg.yaml" <<EOF
run: {out_dir: $dir/run, seed: 0}
data: {path: 's3://bench/data/', batch_size: 4096, max_tokens: $((steps * 4096)),
       s3_connections: $conns, s3_request_bytes: $((req_mib << 20))}
sae: {arch: topk, expansion: 8, k: 32}
log: {every_steps: 50}
checkpoint: {every_steps: 100000}
EOF
"$bin/saetrain" "$dir/cfg.yaml" --overwrite | tee "$dir/saetrain.txt"

echo; echo "== figures"
"$py" - "$dir" <<'EOF'
import csv, json, sys, pathlib
d = pathlib.Path(sys.argv[1])
j = json.loads([l for l in (d / "iobench.txt").read_text().splitlines() if l.startswith("{")][-1])
print(f"plain range GET          {j['s3_range_get_MBps']:9.1f} MB/s")
print(f"reader, first pass       {j['s3_reader_MBps']:9.1f} MB/s")
print(f"reader, epochs 2-4       {j['s3_reader_epochs2to4_MBps']:9.1f} MB/s"
      f"  ({100 * j['s3_reader_fraction_of_range_get']:.1f}% of plain; target >= 90%)")
for row in csv.DictReader(open(d / "run" / "summary.csv")):
    print(f"saetrain from s3 wait    {100 * float(row['wait_fraction']):9.1f} %"
          f"  (target <= 5% where the plain rate exceeds the step's need)")
EOF
