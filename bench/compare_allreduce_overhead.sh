#!/usr/bin/env bash
# Is `foundry bench comm` measuring MPI, or itself? Times a 1 MiB all-reduce with a bare
# MPI_Allreduce loop (bench/bare_allreduce.c) and with `foundry bench comm`, alternating the
# two so both see the same machine load, and prints each pair, the medians and their ratio.
#   bash bench/compare_allreduce_overhead.sh [path/to/foundry]
#   NP=2 REPEATS=7 ITERS=500 WARMUP=50 BYTES=1M bash bench/compare_allreduce_overhead.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
foundry="$(realpath "${1:-$root/build/foundry}")"
np="${NP:-2}" repeats="${REPEATS:-7}" iters="${ITERS:-500}" warmup="${WARMUP:-50}"
bytes_flag="${BYTES:-1M}"
bytes=$(( $(sed 's/[Kk]$/*1024/; s/[Mm]$/*1048576/; s/[Gg]$/*1073741824/' <<<"$bytes_flag") ))
export OMP_NUM_THREADS=1
mpirun=(mpirun --allow-run-as-root --oversubscribe -np "$np")

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mpicc -O2 "$root/bench/bare_allreduce.c" -o "$work/bare_allreduce"

echo "# date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "# host: $(hostname) | cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //') | cores: $(getconf _NPROCESSORS_ONLN)"
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# $np ranks, all-reduce of $bytes bytes (fp32), $iters timed iterations after $warmup warm-up, $repeats repeats alternating"
printf "%-8s %14s %14s %8s\n" repeat bare_us foundry_us ratio
bare_all=() foundry_all=()
for r in $(seq 1 "$repeats"); do
  bare=$("${mpirun[@]}" "$work/bare_allreduce" "$bytes" "$iters" "$warmup" | sed -n 's/.*avg_us=\([0-9.]*\).*/\1/p')
  "${mpirun[@]}" "$foundry" bench comm --op all_reduce -b "$bytes_flag" -e "$bytes_flag" \
    -w "$warmup" -n "$iters" --json "$work/f.json" >/dev/null 2>"$work/f.err" \
    || { cat "$work/f.err" >&2; exit 1; }
  ours=$(python3 -c "import json,sys; print('%.3f' % (json.load(open(sys.argv[1]))['collectives'][0]['points'][0]['avg_s'] * 1e6))" "$work/f.json")
  printf "%-8s %14s %14s %8.3f\n" "$r" "$bare" "$ours" "$(awk -v a="$ours" -v b="$bare" 'BEGIN {print a / b}')"
  bare_all+=("$bare") foundry_all+=("$ours")
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
minimum() { printf '%s\n' "$@" | sort -g | head -1; }
mb=$(median "${bare_all[@]}") mf=$(median "${foundry_all[@]}")
printf "%-8s %14s %14s %8.3f\n" median "$mb" "$mf" "$(awk -v a="$mf" -v b="$mb" 'BEGIN {print a / b}')"
# The least disturbed repeat of each: on a shared machine the closest to the true cost.
lb=$(minimum "${bare_all[@]}") lf=$(minimum "${foundry_all[@]}")
printf "%-8s %14s %14s %8.3f\n" minimum "$lb" "$lf" "$(awk -v a="$lf" -v b="$lb" 'BEGIN {print a / b}')"
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
