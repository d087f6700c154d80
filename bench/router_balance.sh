#!/usr/bin/env bash
# The ZAYA1 router's balance on the demo: trains configs/demo.json with the ZAYA1
# description's balancing (AdamW at lr 1e-3 on a bias added to the probabilities, router MLP
# initialized at init_std 0.02), with a proportional bias step (gain 1) on the logits and
# with the defaults (the newton step on the logits; both with fan-in router initialization),
# then plots the max load error and the training loss of the three against the step
# (docs/figures/router_balance.png) and prints a Markdown table. The runs are deterministic;
# a finished run is kept (FRESH=1 retrains).
#   bench/router_balance.sh [steps=1600]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
steps="${1:-1600}"
foundry=build/foundry
[ -x "$foundry" ] || bash scripts/setup.sh build
[ -f data/nlp-corpus/meta.json ] || { echo "router_balance: run scripts/demo.sh once to prepare data/nlp-corpus" >&2; exit 1; }
out=runs/router-balance
mkdir -p "$out" docs/figures

echo "# router balance on configs/demo.json: $steps steps | $(date -u '+%Y-%m-%d %H:%M UTC') | $(hostname)"
train() {  # train NAME [--set ...]
  local name="$1"; shift
  local run="$out/$name"
  local last
  last="$(tail -n1 "$run/metrics.jsonl" 2>/dev/null | python3 -c "import json,sys; print(json.loads(sys.stdin.read())['step'])" 2>/dev/null || true)"
  if [ "${FRESH:-0}" != 1 ] && [ "$last" = "$steps" ]; then
    echo "keeping $run (finished, $steps steps)" >&2
    return
  fi
  echo "training $name" >&2
  "$foundry" train --config configs/demo.json --steps "$steps" -q --overwrite \
    --set train.log_every=20 --set train.checkpoint_every=0 --set train.keep_checkpoints=1 \
    --set train.run_dir="$run" "$@" >"$run.log" 2>&1
}
train old --set model.balance_rule=adamw --set model.balance_bias_on=probs \
  --set model.balance_bias_lr=0.001 --set model.router_init_std=0.02
train proportional --set model.balance_rule=proportional
train new

# Per-step series (step, max load error, loss, skip share) and the validation losses.
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
for name in ("old", "proportional", "new"):
    rows = [json.loads(l) for l in open(f"{out}/{name}/metrics.jsonl")]
    with open(f"{out}/{name}.dat", "w") as f:
        for r in rows:
            f.write(f"{r['step']} {r['max_load_error']} {r['loss']} {r.get('skip_fraction', 0)}\n")
PY

gnuplot <<GP
set terminal pngcairo size 1000,760
set output 'docs/figures/router_balance.png'
set multiplot layout 2,1 title 'ZAYA1 router on the demo (configs/demo.json): three balancing rules'
set grid
set key top right
set ylabel 'max load error (worst class, all sublayers)'
set yrange [0:1]
set arrow from graph 0, first 0.2 to graph 1, first 0.2 nohead dashtype 2 lc rgb 'gray40'
plot '$out/old.dat' using 1:2 with lines lw 1 lc rgb '#c0392b' title 'description: AdamW (lr 1e-3) on a bias added to p, router init 0.02', \
     '$out/proportional.dat' using 1:2 with lines lw 1 lc rgb '#7f8c8d' title 'proportional step (gain 1) on the logits, fan-in init', \
     '$out/new.dat' using 1:2 with lines lw 1 lc rgb '#2471a3' title 'default: newton step (damping 0.5) on the logits, fan-in init'
unset arrow
set ylabel 'training loss'
set xlabel 'step (2,048 tokens each)'
set yrange [3.5:8]
plot '$out/old.dat' using 1:3 with lines lw 1 lc rgb '#c0392b' title 'description', \
     '$out/proportional.dat' using 1:3 with lines lw 1 lc rgb '#7f8c8d' title 'proportional', \
     '$out/new.dat' using 1:3 with lines lw 1 lc rgb '#2471a3' title 'newton (default)'
unset multiplot
GP
echo "wrote docs/figures/router_balance.png" >&2

python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
print("| settings | max load error at 100 / 200 / 400 | worst from step 300 | steps from 300 above 0.2 | mean skip share from 300 | final val loss |")
print("|---|---|---|---|---|---|")
for name, label in (("old", "description (adamw on p, init 0.02)"),
                    ("proportional", "proportional gain 1 on the logits, fan-in"),
                    ("new", "newton on the logits, fan-in (default)")):
    rows = [json.loads(l) for l in open(f"{out}/{name}/metrics.jsonl")]
    by = {r["step"]: r for r in rows}
    late = [r for r in rows if r["step"] >= 300]
    worst = max(r["max_load_error"] for r in late)
    above = sum(r["max_load_error"] > 0.2 for r in late)
    skip = sum(r.get("skip_fraction", 0) for r in late) / len(late)
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    at = " / ".join(f"{by[s]['max_load_error']:.2f}" for s in (100, 200, 400) if s in by)
    print(f"| {label} | {at} | {worst:.3f} | {above} of {len(late)} | {100 * skip:.1f}% | {val[-1]:.4f} |")
PY
