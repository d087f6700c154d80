#!/usr/bin/env bash
# Heartbeat overhead per step, side by side: training runs with heartbeats every second (the
# default) and without (train.heartbeat_interval_s=0), alternating, on random tokens; prints
# each run's tokens/s (steps after the first) and the medians.
#   bench/heartbeat_overhead.sh FOUNDRY [config=configs/moe-bench.json] [steps=30] [rounds=4]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
foundry="$(realpath "${1:?usage: $0 FOUNDRY [config] [steps] [rounds]}")"
config="${2:-$root/configs/moe-bench.json}" steps="${3:-30}" rounds="${4:-4}"
work="$(mktemp -d "${TMPDIR:-/tmp}/foundry_heartbeat.XXXXXX")"
trap 'rm -rf "$work"' EXIT
echo "# foundry: heartbeat overhead"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC') | host: $(hostname) | cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) | cores: $(nproc)"
echo "command: bench/heartbeat_overhead.sh $foundry $config $steps $rounds | OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset}"
declare -A rates
for round in $(seq "$rounds"); do
  for interval in 1 0; do
    dir="$work/r${round}_$interval"
    out="$("$foundry" train --config "$config" --synthetic-data -q --steps "$steps" \
      --set train.run_dir="$dir" train.heartbeat_interval_s="$interval" 2>&1 | tail -1)"
    rate="$(sed -n 's/.*| \([0-9]*\) tokens\/s.*/\1/p' <<<"$out")"
    rates[$interval]+="$rate "
    echo "round $round, heartbeat_interval_s=$interval: $rate tokens/s"
  done
done
median() { tr ' ' '\n' <<<"$1" | grep . | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
on="$(median "${rates[1]}")" off="$(median "${rates[0]}")"
echo "median tokens/s: heartbeats every 1 s $on, off $off, ratio $(awk -v a="$on" -v b="$off" 'BEGIN {printf "%.3f", a / b}')"
