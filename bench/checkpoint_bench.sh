#!/usr/bin/env bash
# Checkpoint figures side by side in one run, per config and rank count:
#   - the disk's sequential write bandwidth (dd, 1 GiB, fsync) in the run directory's file system;
#   - asynchronous against synchronous saves of the same state: the step loop's stall per save,
#     the write time and throughput, and tokens/s against a run without periodic checkpoints;
#   - loading: the same layout against another one (ranks, expert parallel, ZeRO-1);
#   - peak RSS per process (max over ranks) of each run.
#   bench/checkpoint_bench.sh FOUNDRY [steps=12] [every=4] [config ...]
# Default configs: configs/moe-bench.json configs/zaya-bench.json (bf16, random tokens).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
foundry="$(realpath "${1:?usage: $0 FOUNDRY [steps] [every] [config ...]}")"
steps="${2:-12}" every="${3:-4}"
shift $(( $# < 3 ? $# : 3 ))
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=("$root/configs/moe-bench.json" "$root/configs/zaya-bench.json")
work="$(mktemp -d "${TMPDIR:-/tmp}/foundry_ckpt_bench.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

echo "# foundry: checkpoint figures"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC') | host: $(hostname) | cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) | cores: $(nproc)"
echo "command: bench/checkpoint_bench.sh $foundry $steps $every ${configs[*]} | load before: $(cut -d' ' -f1-3 /proc/loadavg)"
dd if=/dev/zero of="$work/dd" bs=4M count=256 conv=fsync 2>"$work/dd.log"
disk=$(awk '/copied/ {print $(NF-1), $NF}' "$work/dd.log")
rm -f "$work/dd"
echo "disk: sequential write with fsync (dd bs=4M count=256 conv=fsync) in $(df --output=target "$work" | tail -1): $disk"
echo

# run NP DIR [args...]: trains, prints its stderr to DIR.log; peak RSS (kB, max over ranks) to DIR.rss
run() {
  local np="$1" dir="$2"; shift 2
  if [ "$np" = 1 ]; then
    OMP_NUM_THREADS=2 /usr/bin/time -f "%M" -o "$dir.rss" "$foundry" train --synthetic-data \
      --set train.run_dir="$dir" "$@" >"$dir.log" 2>&1
  else
    OMP_NUM_THREADS=1 mpirun --oversubscribe --bind-to none -np "$np" -x OMP_NUM_THREADS \
      bash -c '/usr/bin/time -f "%M" -o "$0.rss.$OMPI_COMM_WORLD_RANK" "$@"' "$dir" \
      "$foundry" train --synthetic-data --set train.run_dir="$dir" "$@" >"$dir.log" 2>&1
    sort -n "$dir".rss.* | tail -1 >"$dir.rss"
  fi
}
median() { sort -g | awk '{a[NR]=$1} END {if (NR) print (NR % 2 ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2); else print "nan"}'; }
# Per periodic save (the final one excluded: the end of the run waits for it): field N of the
# "saved checkpoint" line.
saves() { grep 'saved checkpoint' "$1" | grep -v "step_$(printf %08d "$steps")" ; }
blocked() { saves "$1" | sed -E 's/.*blocked ([0-9.]+) s.*/\1/' | median; }
written() { saves "$1" | sed -E 's/.*written in ([0-9.]+) s.*/\1/' | median; }
rate() { saves "$1" | sed -E 's/.*\(([0-9]+) MB\/s.*/\1/' | median; }
megabytes() { grep -m1 'saved checkpoint' "$1" | sed -E 's/.*: ([0-9.]+) MB from.*/\1/'; }
tokens() { grep -E 'trained steps' "$1" | sed -E 's/.* ([0-9]+) tokens\/s.*/\1/'; }
loaded() { grep -m1 'loaded in' "$1" | sed -E 's/.*loaded in ([0-9.]+) s.*/\1/'; }

echo "| config | ranks | MB per save | stall async (s) | stall sync (s) | sync/async | write (s) | MB/s per rank | tokens/s: none / async / sync | peak RSS MiB: none / async / sync |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---|---|"
for config in "${configs[@]}"; do
  name="$(basename "$config" .json)"
  for np in 1 2; do
    base=(--config "$config" --steps "$steps" --set train.keep_checkpoints=0)
    run "$np" "$work/$name-$np-none" "${base[@]}" --set train.checkpoint_every=0
    run "$np" "$work/$name-$np-async" "${base[@]}" --set train.checkpoint_every="$every"
    run "$np" "$work/$name-$np-sync" "${base[@]}" --set train.checkpoint_every="$every" \
      --set train.checkpoint_async=false
    a="$work/$name-$np-async.log" s="$work/$name-$np-sync.log"
    ba=$(blocked "$a") bs=$(blocked "$s")
    ratio=$(awk -v a="$ba" -v s="$bs" 'BEGIN {printf (a > 0 ? "%.0f" : ">%.0f"), s / (a > 0 ? a : 0.001)}')
    rss() { awk '{printf "%.0f", $1 / 1024}' "$work/$name-$np-$1.rss"; }
    echo "| $name | $np | $(megabytes "$a") | $ba | $bs | $ratio | $(written "$s") | $(rate "$s") | $(tokens "$work/$name-$np-none.log") / $(tokens "$a") / $(tokens "$s") | $(rss none) / $(rss async) / $(rss sync) |"
  done
done
echo
echo "Loading the 2-rank checkpoint of step $steps (written with ZeRO-1, expert parallel 1):"
echo
echo "| config | loaded by | seconds | / same layout | peak RSS MiB |"
echo "|---|---|---:|---:|---:|"
for config in "${configs[@]}"; do
  name="$(basename "$config" .json)"
  src="$work/$name-2-async"
  same=""
  for layout in "2 1 true" "1 1 true" "2 2 true" "2 1 false"; do
    set -- $layout
    dir="$work/$name-load-$1-$2-$3"
    mkdir -p "$dir" && cp -r "$src/checkpoints" "$dir/"
    run "$1" "$dir" --config "$config" --steps "$steps" --resume --set train.expert_parallel="$2" \
      --set train.zero1="$3"
    t=$(loaded "$dir.log")
    [ -n "$same" ] || same="$t"
    echo "| $name | $1 ranks, EP $2, ZeRO-1 $3 | $t | $(awk -v t="$t" -v s="$same" 'BEGIN {printf "%.2f", t / s}') | $(awk '{printf "%.0f", $1 / 1024}' "$dir.rss") |"
  done
done
