#!/usr/bin/env bash
# Training throughput of configs/moe-bench.json (synthetic tokens), bf16 and fp32 side by
# side in one run, with a per-operation breakdown of a step for each.
#   scripts/bench_train.sh [steps=30] [config=configs/moe-bench.json]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
steps="${1:-30}"
config="${2:-configs/moe-bench.json}"
foundry=build/foundry
[ -x "$foundry" ] || bash scripts/setup.sh build
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

echo "# foundry training benchmark"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC') | host: $(hostname) | cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) | cores: $(nproc)"
echo "command: scripts/bench_train.sh $steps $config | OMP_NUM_THREADS=$OMP_NUM_THREADS | load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
for precision in bf16 fp32; do
  "$foundry" train --config "$config" --synthetic-data --steps "$steps" -q --op-breakdown \
    --set train.precision=$precision --set train.run_dir="$tmp/$precision" \
    --set train.checkpoint_every=0 >"$tmp/$precision.out" 2>"$tmp/$precision.err"
done
python3 - "$tmp" <<'PY'
import json, re, statistics, sys
tmp = sys.argv[1]
print("| precision | tokens/s (median of steps 3..N) | step time (ms) | MFU | GEMM peak (GFLOP/s, measured) |")
print("|---|---|---|---|---|")
for p in ("bf16", "fp32"):
    rows = [json.loads(l) for l in open(f"{tmp}/{p}/metrics.jsonl")][2:]
    tps = statistics.median(r["tokens_per_s"] for r in rows)
    st = statistics.median(r["step_time_s"] for r in rows) * 1e3
    mfu = statistics.median(r["mfu"] for r in rows)
    peak = re.search(r"of ([0-9.]+) GFLOP/s", open(f"{tmp}/{p}.out").read()).group(1)
    print(f"| {p} | {tps:.0f} | {st:.0f} | {100 * mfu:.1f}% | {peak} |")
print()
for p in ("bf16", "fp32"):
    print(f"per-operation time, {p}:")
    print("```")
    text = open(f"{tmp}/{p}.err").read()
    print(text[text.index("per-operation"):].rstrip())
    print("```")
PY
