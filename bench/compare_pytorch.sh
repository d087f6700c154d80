#!/usr/bin/env bash
# Training throughput of Foundry (bf16 and fp32 GEMMs) against the eager PyTorch fp32
# reference (bench/pytorch_reference.py) on configs/moe-bench.json, run one after the other
# in one invocation so the ratio is measured on the same machine state. Prints a Markdown
# table with a provenance header.
#
#   bash bench/compare_pytorch.sh                       # ~2-3 minutes on 2 cores
#   FOUNDRY_STEPS=30 TORCH_STEPS=12 CONFIG=configs/moe-bench.json bash bench/compare_pytorch.sh
#
# Foundry: tokens/s per step from RUN_DIR/metrics.jsonl, first 2 steps skipped, median.
# PyTorch: the same statistic from its per-step timings (median; mean printed alongside).
# Numbers mean something only on an otherwise idle machine: the header records the load.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
PY=/usr/bin/python3
CONFIG="${CONFIG:-configs/moe-bench.json}"
FOUNDRY_STEPS="${FOUNDRY_STEPS:-30}"
TORCH_STEPS="${TORCH_STEPS:-12}"
THREADS="${THREADS:-2}"
[ -x build/foundry ] || bash scripts/setup.sh build >/dev/null
"$PY" -c "import torch" 2>/dev/null || { echo "error: $PY has no torch (apt-get install python3-torch)" >&2; exit 2; }

work="$(mktemp -d /tmp/foundry-compare.XXXXXX)"
trap 'rm -rf "$work"' EXIT

median_after_two() {  # metrics.jsonl -> median tokens_per_s of steps > 2
  "$PY" -c "
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rates = [r['tokens_per_s'] for r in rows if r['step'] > 2]
print(f'{statistics.median(rates):.1f} {statistics.fmean(rates):.1f} {len(rates)}')" "$1"
}

load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
torch_version="$("$PY" -c 'import torch; print(torch.__version__)')"
blas="$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || echo unknown)"

# Interference: CPU time the whole machine spent busy (/proc/stat) minus the CPU time of
# our own benchmark process (bash `times`, children), per second of wall time = how many
# cores other processes kept busy while a benchmark ran.
busy_ticks() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9}' /proc/stat; }
children_cpu() {  # sets child_cpu: user+sys seconds of finished children of this shell
  times >"$work/times"  # a builtin in this shell (inside $(...) it would see no children)
  child_cpu=$("$PY" -c "
import re, sys
print(sum(float(m) * 60 + float(s) for m, s in re.findall(r'(\d+)m([\d.]+)s', open(sys.argv[1]).read().splitlines()[-1])))" "$work/times")
}
hz=$(getconf CLK_TCK)
declare -A rate mean count other
seg_start() { seg_t0=$(date +%s.%N); seg_busy0=$(busy_ticks); children_cpu; seg_child0=$child_cpu; }
seg_end() {  # sets seg_other: cores other processes kept busy during the segment
  local t1 busy1
  t1=$(date +%s.%N); busy1=$(busy_ticks); children_cpu
  seg_other=$("$PY" -c "import sys; t0,t1,b0,b1,c0,c1,hz = map(float, sys.argv[1:]); \
print(f'{max(0.0, (b1 - b0) / hz - (c1 - c0)) / (t1 - t0):.2f}')" \
    "$seg_t0" "$t1" "$seg_busy0" "$busy1" "$seg_child0" "$child_cpu" "$hz")
}
for precision in bf16 fp32; do
  run="$work/foundry-$precision"
  echo "running foundry train ($precision, $FOUNDRY_STEPS steps)..." >&2
  seg_start
  build/foundry train --config "$CONFIG" --synthetic-data --steps "$FOUNDRY_STEPS" -q \
    --set train.precision="$precision" train.run_dir="$run" >"$work/foundry-$precision.out" 2>&1 \
    || { cat "$work/foundry-$precision.out" >&2; exit 1; }
  seg_end; other[$precision]=$seg_other
  read -r rate[$precision] mean[$precision] count[$precision] < <(median_after_two "$run/metrics.jsonl")
done
echo "running pytorch reference (fp32, $TORCH_STEPS steps)..." >&2
seg_start
"$PY" bench/pytorch_reference.py bench --config "$CONFIG" --steps "$TORCH_STEPS" \
  --threads "$THREADS" >"$work/torch.json" 2>"$work/torch.err" || { cat "$work/torch.err" >&2; exit 1; }
seg_end; other[torch]=$seg_other
read -r rate[torch] mean[torch] count[torch] < <("$PY" -c "
import json, sys
d = json.loads(open(sys.argv[1]).read().splitlines()[-1])
print(f\"{d['tokens_per_s_median']:.1f} {d['tokens_per_s_mean']:.1f} {d['timed_steps']}\")" "$work/torch.json")
load_after="$(cut -d' ' -f1-3 /proc/loadavg)"

ratio() { "$PY" -c "import sys; print(f'{float(sys.argv[1]) / float(sys.argv[2]):.2f}x')" "$1" "${rate[torch]}"; }
cat <<EOF
## Foundry vs PyTorch: training throughput on $CONFIG

- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')
- command: bash bench/compare_pytorch.sh (FOUNDRY_STEPS=$FOUNDRY_STEPS TORCH_STEPS=$TORCH_STEPS THREADS=$THREADS)
- foundry: build/foundry train --config $CONFIG --synthetic-data --steps $FOUNDRY_STEPS -q --set train.precision={bf16,fp32}
- pytorch: /usr/bin/python3 bench/pytorch_reference.py bench --config $CONFIG --steps $TORCH_STEPS --threads $THREADS
- CPU: $cpu, $(nproc) cores (nproc)
- torch $torch_version (Debian python3-torch), eager fp32, BLAS: $blas
- OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset}
- load average (1/5/15 min): before $load_before, after $load_after
- statistic: tokens/s per step, first 2 steps skipped, median (mean in brackets)
- other load: cores kept busy by other processes while each benchmark ran (0 = idle machine)

| system | precision | tokens/s | ratio vs PyTorch | other load (cores) |
| --- | --- | ---: | ---: | ---: |
| Foundry | bf16 | ${rate[bf16]} (${mean[bf16]}) | $(ratio "${rate[bf16]}") | ${other[bf16]} |
| Foundry | fp32 | ${rate[fp32]} (${mean[fp32]}) | $(ratio "${rate[fp32]}") | ${other[fp32]} |
| PyTorch (eager) | fp32 | ${rate[torch]} (${mean[torch]}) | 1.00x | ${other[torch]} |
EOF
