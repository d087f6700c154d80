#!/usr/bin/env bash
# End-to-end checks of `foundry plan`: the ZAYA1-base search on the MI300X reference profile,
# predicting one config, the written run config (which `foundry train` must accept), and the
# errors for bad profiles and budgets.
source "$(dirname "$0")/lib.sh"
cd "$WORK"

# ---- ZAYA1-base's budget on 1,024 MI300X ----
if "$FOUNDRY" plan --profile mi300x --total-params 8.3B --active-params 0.76B --seq 4096 \
     --global-batch 4096 --devices 1024 --tokens 12T \
     --compare "$SRC/configs/zaya1-base.json" --out zaya-plan.json >zaya.txt 2>zaya.err; then
  ok "plan searches ZAYA1-base's budget on mi300x"
else bad "plan failed:"; cat zaya.err; fi
python3 - zaya.txt <<'PY' && ok "ZAYA1-base is within 20% of the best predicted throughput" || bad "ZAYA1-base comparison"
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r"= ([0-9.]+)% of the best shape's", text)
assert m, "no comparison line"
# 80%: the exposed all-gather, launch overhead and attention efficiency charge ZAYA1-base's
# depth (81%; docs/planning.md).
assert float(m.group(1)) >= 80.0, m.group(0)
PY
# Without --vocab the searched shapes take the compared config's vocabulary, and nothing warns.
grep -q "arch zaya1, vocabulary 262272" zaya.txt && ! grep -q "warning" zaya.err \
  && ok "the search takes --compare's vocabulary" || bad "search vocabulary: $(grep budget: zaya.txt) $(cat zaya.err)"
for needle in "Ranked by predicted training throughput" "Pareto front" "Rejected shapes" \
              "head dim not a multiple of 64" "hidden size not a multiple of 128" \
              "break-even step time 0.234 s" "aspect ratio"; do
  grep -qF -- "$needle" zaya.txt || bad "plan output lacks '$needle'"
done
ok "the report has the ranking, the Pareto front, rejections and data loading"
"$FOUNDRY" model info --config zaya-plan.json >/dev/null 2>&1 && ok "the written config is a valid run config" \
  || bad "foundry model info rejects the written config"

# ---- a small plan on a synthetic CPU profile, trained for two steps ----
cat > cpu.json <<'JSON'
{"format": "foundry-hardware-profile", "version": 1, "name": "synthetic cpu",
 "device": {"kind": "cpu", "memory_bytes": 4000000000},
 "compute": {"bf16": {"measured_flops_per_s": 8e11}, "fp32": {"measured_flops_per_s": 4e11}},
 "memory": {"measured_bytes_per_s": 5e10},
 "gemm": {"points": [{"dtype": "bf16", "m": 2048, "n": 2048, "k": 2048, "flops_per_s": 8e11, "kind": "square"},
                     {"dtype": "bf16", "m": 256, "n": 256, "k": 256, "flops_per_s": 2e11, "kind": "square"}]}}
JSON
if "$FOUNDRY" plan --profile cpu.json --arch moe --active-params 2M --total-params 6M --seq 64 \
     --global-batch 4 --vocab 1000 --hidden 128,192,256 --experts 4,8 --top-k 1,2 --aspect-ratio 16,200 \
     --out small.json >small.txt 2>&1; then ok "plan on a CPU profile"
else bad "small plan failed:"; cat small.txt; fi
"$FOUNDRY" train --config small.json --synthetic-data --steps 2 --set train.run_dir=small-run -q \
  >train.log 2>&1 && ok "foundry train runs the planned config" || { bad "training the plan failed"; cat train.log; }

# --out /dev/stdout with stdout redirected to a file: the report and then the config, both there.
"$FOUNDRY" plan --profile cpu.json --arch moe --active-params 2M --total-params 6M --seq 64 \
  --global-batch 4 --vocab 1000 --hidden 128,192,256 --experts 4,8 --top-k 1,2 --aspect-ratio 16,200 \
  --out /dev/stdout >both.txt 2>/dev/null
grep -q "Ranked by predicted training throughput" both.txt && grep -q '"model": {' both.txt \
  && ok "plan --out /dev/stdout into a file keeps the report and appends the config" \
  || { bad "plan --out /dev/stdout > file"; head -5 both.txt; }

# ---- predicting one config ----
out="$("$FOUNDRY" plan --profile cpu.json --config "$SRC/configs/moe-bench.json" 2>&1)"
grep -q "predicted step time:" <<<"$out" && grep -q "expert GEMMs" <<<"$out" \
  && ok "plan --config predicts a step with its breakdown" || { bad "plan --config:"; echo "$out"; }
"$FOUNDRY" plan --profile cpu.json --config "$SRC/configs/moe-bench.json" --json >pred.json 2>&1
python3 -c "import json; d = json.load(open('pred.json')); assert d['step_s'] > 0 and d['items']" \
  && ok "plan --config --json" || bad "plan --config --json"

# A profile that measured no fp32 product (bench gemm --dtype bf16) prices fp32 at its spec peak,
# and says so; bf16, measured, goes without the warning.
python3 - cpu.json bf16-only.json <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
doc["compute"]["fp32"] = {"spec_flops_per_s": 5e11}
json.dump(doc, open(sys.argv[2], "w"))
PY
"$FOUNDRY" plan --profile bf16-only.json --config "$SRC/configs/moe-bench.json" \
  --set train.precision=fp32 >fp32.txt 2>&1
"$FOUNDRY" plan --profile bf16-only.json --config "$SRC/configs/moe-bench.json" >bf16.txt 2>&1
grep -q "warning: profile bf16-only.json measured no fp32 product: every one is priced at its spec peak" fp32.txt \
  && ! grep -q "warning: profile" bf16.txt && ok "an unmeasured dtype is priced at the spec peak, with a warning" \
  || { bad "no warning for an unmeasured dtype"; cat fp32.txt; }

# ---- a measured profile of this machine: bench all -> plan ----
if "$FOUNDRY" bench all --quick --only gemm,membw --out hw >hw.log 2>&1; then
  # The plots need gnuplot (scripts/setup.sh installs it); without it bench all says so.
  pngs="gemm_square.png gemm_offsize.png memory_working_set.png"
  command -v gnuplot >/dev/null || pngs=""
  missing=""
  for f in profile.json report.md gemm.csv memory_stream.csv memory_working_set.csv collectives.csv \
           $pngs; do
    [ -s "hw/$f" ] || missing="$missing $f"
  done
  [ -z "$missing" ] && ok "bench all writes the profile, CSV tables, plots and report" \
    || bad "bench all did not write:$missing"
  [ -n "$pngs" ] || grep -q "install gnuplot-nox for the plots" hw.log \
    && ok "without gnuplot, bench all names the missing package" || bad "no word of the missing gnuplot"
  grep -q "^# command: .*bench all --quick" hw/gemm.csv && grep -q "^command: .*bench all" hw/report.md \
    && ok "outputs carry the provenance header" || bad "no provenance header in gemm.csv / report.md"
  "$FOUNDRY" plan --profile hw/profile.json --config "$SRC/configs/moe-bench.json" >hwplan.txt 2>&1 \
    && grep -q "predicted step time" hwplan.txt && ok "plan reads the measured profile" \
    || { bad "plan on the measured profile:"; cat hwplan.txt; }
  rm -f hw/*.png hw/report.md
  "$FOUNDRY" bench report --profile hw/profile.json --out hw >/dev/null 2>&1 && [ -s hw/report.md ] \
    && { [ -z "$pngs" ] || [ -s hw/gemm_square.png ]; } && ok "bench report redraws the report from the profile" \
    || bad "bench report"
else bad "bench all --quick failed:"; cat hw.log; fi

# ---- bad input ----
expect_fail "unknown profile" "unknown profile 'mi400'" "$FOUNDRY" plan --profile mi400 --total-params 1B
out="$("$FOUNDRY" plan --profile mi400 --total-params 1B 2>&1)"
grep -q "available:.*mi300x" <<<"$out" && ok "the hint lists the available profiles" || bad "no list: $out"
echo '{"format": "foundry-hardware-profile", "version": 1,' > broken.json
expect_fail "broken profile JSON" "broken.json: not valid JSON" "$FOUNDRY" plan --profile ./broken.json --total-params 1B
expect_fail "no budget" "plan needs a budget" "$FOUNDRY" plan --profile mi300x --devices 8 --global-batch 8
expect_fail "unparsable budget" "--total-params 'lots'" "$FOUNDRY" plan --profile mi300x --total-params lots
expect_fail "batch not divisible" "cannot be split evenly over --devices 3" \
  "$FOUNDRY" plan --profile mi300x --total-params 1B --devices 3 --global-batch 8
expect_fail "active above total" "exceeds --total-params" \
  "$FOUNDRY" plan --profile mi300x --total-params 1B --active-params 2B
expect_fail "nothing fits" "no shape meets the budget" \
  "$FOUNDRY" plan --profile cpu.json --arch moe --active-params 2M --seq 64 --global-batch 4 --vocab 1000 \
  --hidden 128 --experts 4 --top-k 1 --memory-per-device 1MiB --out nothing.json
[ ! -e nothing.json ] || bad "a failed plan left a file behind"

finish
