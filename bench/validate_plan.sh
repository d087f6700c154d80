#!/usr/bin/env bash
# Validates `foundry plan`'s performance model on this machine: for each config, the step time
# plan predicts from a hardware profile against the step time `foundry train` measures
# (median of steps 3..N on synthetic tokens), side by side.
#   bench/validate_plan.sh PROFILE [steps=20] [config ...]
# PROFILE is a profile.json from `foundry bench all` run on this machine.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
profile="${1:?usage: bench/validate_plan.sh PROFILE [steps] [config ...]}"
steps="${2:-20}"
shift 2 || shift $#
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(configs/moe-bench.json configs/zaya-bench.json configs/demo-moe.json)
foundry=build/foundry
[ -x "$foundry" ] || bash scripts/setup.sh build
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

echo "# plan validation: predicted against measured step time"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC') | host: $(hostname) | cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) | cores: $(nproc)"
echo "command: bench/validate_plan.sh $profile $steps ${configs[*]} | OMP_NUM_THREADS=$OMP_NUM_THREADS | load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "profile: $profile ($(python3 -c "import json,sys; p=json.load(open(sys.argv[1]))['provenance']; print(p.get('date'), p.get('host'))" "$profile"))"
echo
for config in "${configs[@]}"; do
  name="$(basename "$config" .json)"
  "$foundry" plan --profile "$profile" --config "$config" --json >"$tmp/$name.plan.json"
  "$foundry" train --config "$config" --synthetic-data --steps "$steps" -q --op-breakdown \
    --set train.run_dir="$tmp/$name" --set train.checkpoint_every=0 --set train.eval_every=0 \
    >"$tmp/$name.out" 2>"$tmp/$name.err"
done
python3 - "$tmp" "${configs[@]}" <<'PY'
import json, os, statistics, sys
tmp, configs = sys.argv[1], sys.argv[2:]
print("| config | predicted step (ms) | measured step (ms, median) | predicted / measured | GEMMs | attention | elementwise | optimizer |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
worst = 0
for config in configs:
    name = os.path.basename(config)[:-5]
    plan = json.load(open(f"{tmp}/{name}.plan.json"))
    rows = [json.loads(l) for l in open(f"{tmp}/{name}/metrics.jsonl")][2:]
    measured = statistics.median(r["step_time_s"] for r in rows)
    b = plan["breakdown_s"]
    ratio = plan["step_s"] / measured
    worst = max(worst, abs(ratio - 1))
    print(f"| {name} | {1e3 * plan['step_s']:.0f} | {1e3 * measured:.0f} | {ratio:.2f} | "
          f"{1e3 * b['gemm']:.0f} | {1e3 * b['attention']:.0f} | {1e3 * b['elementwise']:.0f} | {1e3 * b['optimizer']:.0f} |")
print(f"\nworst deviation: {100 * worst:.1f}% (target: within 25%)")
print()
for config in configs:
    name = os.path.basename(config)[:-5]
    text = open(f"{tmp}/{name}.err").read()
    if "per-operation" in text:
        print(f"measured per-operation time, {name}:")
        print("```")
        print(text[text.index("per-operation"):].rstrip())
        print("```")
PY
