#!/usr/bin/env bash
# Training throughput of two foundry binaries side by side: the runs alternate (A, B, A, B, …)
# so that a noisy shared machine slows both alike, and each run's median tokens/s over its
# steps after the first two is reported, with the median over rounds and the ratio B/A.
# Also checks that both binaries produce the same losses (bitwise) for each config.
#   bench/compare_builds.sh OLD_FOUNDRY NEW_FOUNDRY [steps=20] [rounds=3] [config ...]
# Default configs: configs/moe-bench.json configs/zaya-bench.json (bf16, synthetic tokens).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
[ $# -ge 2 ] || { echo "usage: $0 OLD_FOUNDRY NEW_FOUNDRY [steps] [rounds] [config ...]" >&2; exit 2; }
old="$1" new="$2"
steps="${3:-20}" rounds="${4:-3}"
shift $(( $# < 4 ? $# : 4 ))
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(configs/moe-bench.json configs/zaya-bench.json)
for b in "$old" "$new"; do [ -x "$b" ] || { echo "error: '$b' is not an executable" >&2; exit 2; }; done
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

echo "# foundry: two builds side by side"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC') | host: $(hostname) | cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) | cores: $(nproc)"
echo "command: bench/compare_builds.sh $old $new $steps $rounds ${configs[*]} | OMP_NUM_THREADS=$OMP_NUM_THREADS | load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
for config in "${configs[@]}"; do
  name="$(basename "$config" .json)"
  for r in $(seq 1 "$rounds"); do
    for which in old new; do
      bin="$old"; [ "$which" = new ] && bin="$new"
      "$bin" train --config "$config" --synthetic-data --steps "$steps" -q \
        --set train.run_dir="$tmp/$name-$which-$r" --set train.checkpoint_every=0 \
        --set train.peak_gflops=1000 >/dev/null 2>"$tmp/$name-$which-$r.err" ||
        { echo "error: $bin failed on $config:" >&2; cat "$tmp/$name-$which-$r.err" >&2; exit 1; }
    done
  done
done
python3 - "$tmp" "$rounds" "${configs[@]}" <<'PY'
import json, os, statistics, sys
tmp, rounds, configs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
print("| config | old tokens/s (per round) | new tokens/s (per round) | old median | new median | new/old | losses |")
print("|---|---|---|---:|---:|---:|---|")
for config in configs:
    name = os.path.basename(config).removesuffix(".json")
    def run(which, r):
        return [json.loads(l) for l in open(f"{tmp}/{name}-{which}-{r}/metrics.jsonl")]
    tps = {w: [statistics.median(m["tokens_per_s"] for m in run(w, r)[2:]) for r in range(1, rounds + 1)]
           for w in ("old", "new")}
    same = all([m["loss"] for m in run("old", r)] == [m["loss"] for m in run("new", r)]
               for r in range(1, rounds + 1))
    med = {w: statistics.median(v) for w, v in tps.items()}
    print(f"| {name} | {', '.join(f'{v:.0f}' for v in tps['old'])} | {', '.join(f'{v:.0f}' for v in tps['new'])} "
          f"| {med['old']:.0f} | {med['new']:.0f} | {med['new'] / med['old']:.3f} | {'bitwise equal' if same else 'DIFFER'} |")
PY
