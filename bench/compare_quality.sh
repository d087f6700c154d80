#!/usr/bin/env bash
# Quality at equal active parameters and tokens on the demo corpus: validation-loss curves of
# ZAYA1 (configs/demo.json) vs the standard MoE (configs/demo-moe.json), each with AdamW and
# with Muon. Writes docs/figures/quality_arch.png (architectures, same optimizer) and
# docs/figures/quality_optim.png (optimizers, same architecture), and prints a Markdown table.
#   bench/compare_quality.sh [steps=1000] [eval_every=100]
# The runs are deterministic (same seed, data order and thread count give the same curves).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
steps="${1:-1000}"
eval_every="${2:-100}"
foundry=build/foundry
[ -x "$foundry" ] || bash scripts/setup.sh build
[ -f data/nlp-corpus/meta.json ] || { echo "compare_quality: run scripts/demo.sh once to prepare data/nlp-corpus" >&2; exit 1; }
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}"
out=runs/quality
mkdir -p "$out" docs/figures

echo "# quality comparison: $steps steps, eval every $eval_every | $(date -u '+%Y-%m-%d %H:%M UTC') | $(hostname)"
for arch in zaya moe; do
  config=configs/demo.json
  [ "$arch" = moe ] && config=configs/demo-moe.json
  for optimizer in adamw muon; do
    run="$out/$arch-$optimizer"
    # A finished run of the same length is kept (the runs are deterministic); set
    # FRESH=1 to retrain everything.
    last="$(tail -n1 "$run/metrics.jsonl" 2>/dev/null | python3 -c "import json,sys; print(json.loads(sys.stdin.read())['step'])" 2>/dev/null || true)"
    if [ "${FRESH:-0}" != 1 ] && [ "$last" = "$steps" ] && [ -f "$run.val.dat" ]; then
      echo "keeping $run (finished, $steps steps)" >&2
      continue
    fi
    rm -rf "$run"
    echo "training $arch with $optimizer ($config)" >&2
    "$foundry" train --config "$config" --steps "$steps" -q --set train.optimizer=$optimizer \
      --set train.eval_every="$eval_every" --set train.checkpoint_every=0 --set train.keep_checkpoints=1 \
      --set train.run_dir="$run" >"$run.log" 2>&1
    "$foundry" model info --config "$config" --json > "$run.info.json"
    python3 - "$run" > "$run.val.dat" <<'PY'
import json, sys
for line in open(sys.argv[1] + "/metrics.jsonl"):
    r = json.loads(line)
    if "val_loss" in r:
        print(r["step"], r["val_loss"])
PY
  done
done

plot() {  # plot FILE TITLE run:label ...
  local file="$1" title="$2"; shift 2
  local cmd="set terminal pngcairo size 900,560; set output '$file'; set title '$title';"
  cmd+=" set xlabel 'step (2,048 tokens each)'; set ylabel 'validation loss'; set grid; set key top right;"
  cmd+=" set yrange [*:7.5]; plot "
  local first=1
  for spec in "$@"; do
    [ $first = 1 ] || cmd+=", "
    cmd+="'$out/${spec%%:*}.val.dat' with linespoints title '${spec#*:}'"
    first=0
  done
  gnuplot -e "$cmd"
}
plot docs/figures/quality_arch.png "ZAYA1 vs standard MoE at equal active parameters (demo corpus)" \
  zaya-adamw:"ZAYA1, AdamW" moe-adamw:"MoE, AdamW" zaya-muon:"ZAYA1, Muon" moe-muon:"MoE, Muon"
plot docs/figures/quality_optim.png "Muon vs AdamW (demo corpus)" \
  zaya-muon:"ZAYA1, Muon" zaya-adamw:"ZAYA1, AdamW" moe-muon:"MoE, Muon" moe-adamw:"MoE, AdamW"

python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
print("| model | optimizer | params (active) | final val loss | best val loss | max load error (last) |")
print("|---|---|---|---|---|---|")
for arch in ("zaya", "moe"):
    for opt in ("adamw", "muon"):
        run = f"{out}/{arch}-{opt}"
        rows = [json.loads(l) for l in open(run + "/metrics.jsonl")]
        vals = [r["val_loss"] for r in rows if "val_loss" in r]
        info = json.load(open(run + ".info.json"))
        p = info["parameters"]
        load = rows[-1].get("max_load_error", float("nan"))
        print(f"| {'ZAYA1' if arch == 'zaya' else 'MoE'} | {opt} | {p['total']/1e6:.1f} M ({p['active']/1e6:.2f} M) "
              f"| {vals[-1]:.4f} | {min(vals):.4f} | {load:.3f} |")
PY
