#!/usr/bin/env bash
# Training throughput of configs/moe-bench.json (synthetic tokens), bf16 and fp32 side by
# side in one run, with a per-operation breakdown of a step for each. Several configs are
# measured one after the other in the same run (e.g. moe-bench and its ZAYA1 counterpart).
#   scripts/bench_train.sh [steps=30] [config=configs/moe-bench.json ...]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
steps="${1:-30}"
shift || true
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(configs/moe-bench.json)
foundry=build/foundry
[ -x "$foundry" ] || bash scripts/setup.sh build
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

echo "# foundry training benchmark"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC') | host: $(hostname) | cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) | cores: $(nproc)"
echo "command: scripts/bench_train.sh $steps ${configs[*]} | OMP_NUM_THREADS=$OMP_NUM_THREADS | load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
runs=()
for config in "${configs[@]}"; do
  name="$(basename "$config" .json)"
  for precision in bf16 fp32; do
    "$foundry" train --config "$config" --synthetic-data --steps "$steps" -q --op-breakdown \
      --set train.precision=$precision --set train.run_dir="$tmp/$name-$precision" \
      --set train.checkpoint_every=0 >"$tmp/$name-$precision.out" 2>"$tmp/$name-$precision.err"
    runs+=("$name-$precision")
  done
done
python3 - "$tmp" "${runs[@]}" <<'PY'
import json, re, statistics, sys
tmp, runs = sys.argv[1], sys.argv[2:]
print("| config | precision | tokens/s (median of steps 3..N) | step time (ms) | MFU | GEMM peak (GFLOP/s, measured) |")
print("|---|---|---|---|---|---|")
for run in runs:
    name, p = run.rsplit("-", 1)
    rows = [json.loads(l) for l in open(f"{tmp}/{run}/metrics.jsonl")][2:]
    tps = statistics.median(r["tokens_per_s"] for r in rows)
    st = statistics.median(r["step_time_s"] for r in rows) * 1e3
    mfu = statistics.median(r["mfu"] for r in rows)
    peak = re.search(r"of ([0-9.]+) GFLOP/s", open(f"{tmp}/{run}.out").read()).group(1)
    print(f"| {name} | {p} | {tps:.0f} | {st:.0f} | {100 * mfu:.1f}% | {peak} |")
print()
for run in runs:
    print(f"per-operation time, {run}:")
    print("```")
    text = open(f"{tmp}/{run}.err").read()
    print(text[text.index("per-operation"):].rstrip())
    print("```")
PY
