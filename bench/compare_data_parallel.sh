#!/usr/bin/env bash
# Data parallel on this host, side by side in one run: one process with all cores against
# N ranks with one core each (overlap of the gradient reduction off and on, ZeRO-1 and
# replicated), and the bytes each rank sends per step (Open MPI's pml monitoring) against
# the theoretical volume. Prints Markdown tables for docs/PERFORMANCE.md.
#   bench/compare_data_parallel.sh [config=configs/moe-bench.json] [steps=12] [ranks=2]
# Extra arguments after the third go to every `foundry train` (e.g. --set train.optimizer=muon).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
config="${1:-configs/moe-bench.json}"
steps="${2:-12}"
np="${3:-2}"
shift $(( $# < 3 ? $# : 3 ))
foundry="$root/build/foundry"
[ -x "$foundry" ] || bash scripts/setup.sh build
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cores="$(nproc)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "# data parallel: $config, $steps steps, 1 process x $cores threads vs $np ranks | $(date -u '+%Y-%m-%d %H:%M UTC') | $(hostname) | load $(cut -d' ' -f1 /proc/loadavg)"

run() {  # run NAME NP THREADS [train args]: the log in $work/NAME.log
  local name="$1" n="$2" threads="$3"
  shift 3
  local cmd=("$foundry" train --config "$config" --synthetic-data --steps "$steps" -q --op-breakdown
             --set train.run_dir="$work/$name" "$@")
  if [ "$n" = 1 ]; then
    OMP_NUM_THREADS=$threads "${cmd[@]}" >"$work/$name.log" 2>&1
  else
    OMP_NUM_THREADS=$threads mpirun --bind-to none -np "$n" -x OMP_NUM_THREADS "${cmd[@]}" \
      >"$work/$name.log" 2>&1
  fi || { echo "run $name failed:" >&2; cat "$work/$name.log" >&2; exit 1; }
}

threads=$(( cores / np > 0 ? cores / np : 1 ))
run single 1 "$cores" "$@"
run off "$np" "$threads" --set train.overlap_grad_reduce=false "$@"
run on "$np" "$threads" "$@"
run replicated_off "$np" "$threads" --set train.zero1=false --set train.overlap_grad_reduce=false "$@"
run replicated "$np" "$threads" --set train.zero1=false "$@"

python3 - "$work" "$np" "$cores" "$threads" <<'PY'
import re, sys
work, np, cores, threads = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def parse(name):
    text = open(f"{work}/{name}.log").read()
    ops = {m.group(1).strip(): float(m.group(2))
           for m in re.finditer(r"^  (\S.*?)\s+([0-9.]+) ms\s+[0-9.]+%$", text, re.M)}
    tok = float(re.search(r"\| ([0-9.]+) tokens/s", text).group(1))
    total = float(re.search(r"^  total\s+([0-9.]+) ms", text, re.M).group(1))
    mem = re.search(r"^memory per rank: optimizer state ([0-9.]+) MiB.*?peak RSS before the final checkpoint (.*)$", text, re.M)
    rss = [int(x) for x in re.findall(r"([0-9]+) MiB", mem.group(2))]
    grad = ops.get("comm: gradient reduce-scatter", ops.get("comm: gradient all-reduce", 0.0))
    inback = ops.get("comm: gradient buckets in backward", 0.0)
    gather = ops.get("comm: weight all-gather", 0.0)
    return dict(tok=tok, total=total, grad=grad, inback=inback, gather=gather,
                other=ops.get("comm: norm and boundary exchange", 0.0),
                state=float(mem.group(1)), rss=max(rss))
rows = [("1 process x %s threads" % cores, "single"),
        ("%d ranks x %s thread, ZeRO-1, reduction after backward" % (np, threads), "off"),
        ("%d ranks x %s thread, ZeRO-1, overlapped (default)" % (np, threads), "on"),
        ("%d ranks x %s thread, replicated (train.zero1=false), reduction after backward" % (np, threads), "replicated_off"),
        ("%d ranks x %s thread, replicated, overlapped" % (np, threads), "replicated")]
r = {k: parse(k) for _, k in rows}
print("| layout | tokens/s | gradient comm in backward (ms/step) | gradient comm exposed after backward (ms/step) | weight all-gather (ms/step) | optimizer state per rank (MiB) | peak RSS per rank (MiB) |")
print("|---|---:|---:|---:|---:|---:|---:|")
for label, k in rows:
    x = r[k]
    dash = k == "single"
    f = lambda v: "—" if dash else f"{v:.1f}"
    print(f"| {label} | {x['tok']:,.0f} | {f(x['inback'])} | {f(x['grad'])} | {f(x['gather'])} | {x['state']:.1f} | {x['rss']:,} |")
print()
for name, off, on in (("ZeRO-1", "off", "on"), ("Replicated", "replicated_off", "replicated")):
    base, exposed, inside = r[off]["grad"], r[on]["grad"], r[on]["inback"]
    if base <= 0:
        print(f"{name}: no gradient reduction time measured after backward")
        continue
    print(f"{name}: the gradient reduction waited {base:.1f} ms/step after backward without "
          f"overlap and {exposed:.1f} ms/step with it ({100 * (1 - exposed / base):.0f}% of it "
          f"hidden behind backward), at the price of {inside:.1f} ms/step spent inside backward "
          f"starting and progressing buckets; step time {r[off]['total']:.0f} -> "
          f"{r[on]['total']:.0f} ms, tokens/s x{r[on]['tok'] / r[off]['tok']:.2f}.")
PY

# Bytes: runs of S and S+2 steps under pml monitoring (collectives and point to point); the
# difference is two steps' traffic, free of start-up and the final checkpoint.
bytes_run() {  # bytes_run NAME STEPS [args]: total bytes rank 0 sent (all communicators)
  local name="$1" s="$2"
  shift 2
  OMP_NUM_THREADS=$threads mpirun --bind-to none -np "$np" -x OMP_NUM_THREADS \
    --mca pml_monitoring_enable 2 --mca pml_monitoring_enable_output 3 \
    --mca pml_monitoring_filename "$work/$name" \
    "$foundry" train --config "$config" --synthetic-data --steps "$s" -q \
    --set train.run_dir="$work/$name-run" "$@" >"$work/$name.log" 2>&1 \
    || { echo "monitored run $name failed:" >&2; cat "$work/$name.log" >&2; exit 1; }
  awk '$1 == "E" || $1 == "I" { sum += $4 } END { print sum }' "$work/$name.0.prof"
}
slab="$("$foundry" model info --config "$config" "$@" 2>/dev/null | sed -n 's/^  weights fp32 *\([0-9.]*\) MiB/\1/p')"
echo
echo "| bytes rank 0 sends per step | measured (MB) | theoretical (MB) | ratio |"
echo "|---|---:|---:|---:|"
for mode in "ZeRO-1 (reduce-scatter + all-gather), overlapped:" "replicated (all-reduce), overlapped:--set train.zero1=false" \
            "ZeRO-1, after backward:--set train.overlap_grad_reduce=false"; do
  label="${mode%%:*}"
  extra=(${mode#*:})
  a="$(bytes_run m3 3 "${extra[@]}" "$@")"
  b="$(bytes_run m5 5 "${extra[@]}" "$@")"
  python3 -c "
import sys
a, b, slab_mib, np = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
measured = (b - a) / 2 / 1e6
# Ring minimum per rank and step: reduce-scatter + all-gather, or all-reduce, each
# 2 (p-1)/p of the fp32 slab.
theory = 2 * (np - 1) / np * slab_mib * 2**20 / 1e6
print(f'| {sys.argv[5]} | {measured:.1f} | {theory:.1f} | {measured / theory:.3f} |')
" "$a" "$b" "$slab" "$np" "$label"
done
