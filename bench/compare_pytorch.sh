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

declare -A rate mean count
for precision in bf16 fp32; do
  run="$work/foundry-$precision"
  echo "running foundry train ($precision, $FOUNDRY_STEPS steps)..." >&2
  build/foundry train --config "$CONFIG" --synthetic-data --steps "$FOUNDRY_STEPS" -q \
    --set train.precision="$precision" train.run_dir="$run" >"$work/foundry-$precision.out" 2>&1 \
    || { cat "$work/foundry-$precision.out" >&2; exit 1; }
  read -r rate[$precision] mean[$precision] count[$precision] < <(median_after_two "$run/metrics.jsonl")
done
echo "running pytorch reference (fp32, $TORCH_STEPS steps)..." >&2
"$PY" bench/pytorch_reference.py bench --config "$CONFIG" --steps "$TORCH_STEPS" \
  --threads "$THREADS" >"$work/torch.json" 2>"$work/torch.err" || { cat "$work/torch.err" >&2; exit 1; }
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

| system | precision | tokens/s | ratio vs PyTorch |
| --- | --- | ---: | ---: |
| Foundry | bf16 | ${rate[bf16]} (${mean[bf16]}) | $(ratio "${rate[bf16]}") |
| Foundry | fp32 | ${rate[fp32]} (${mean[fp32]}) | $(ratio "${rate[fp32]}") |
| PyTorch (eager) | fp32 | ${rate[torch]} (${mean[torch]}) | 1.00x |
EOF
