#!/usr/bin/env bash
# End-to-end checks of `foundry plan` against the published anchors (docs/anchors.json): each
# anchor's config, with its recorded arguments, predicts the step recorded beside it (within
# 0.5%: a change to the model must re-record them with bench/plan_anchors.py --record and
# update the table in docs/planning.md); the goodput report; errors for bad layouts.
source "$(dirname "$0")/lib.sh"
cd "$WORK"

python3 - "$FOUNDRY" "$SRC" <<'PY' && ok "every anchor predicts its recorded step time" \
  || bad "anchor predictions moved"
import json, os, shlex, subprocess, sys
foundry, src = sys.argv[1], sys.argv[2]
anchors = json.load(open(os.path.join(src, "docs", "anchors.json")))
checked = 0
for a in anchors:
    rec = a.get("prediction")
    if not rec:
        continue
    words = shlex.split(rec["args"])
    i = words.index("--profile")
    words[i + 1] = os.path.join(src, "profiles", words[i + 1] + ".json")
    r = subprocess.run([foundry, "plan", "--config", os.path.join(src, a["config"])] + words +
                       ["--json"], capture_output=True, text=True)
    assert r.returncode == 0, (a["name"], r.stderr)
    out = json.loads(r.stdout)
    got = out["step_s"]
    assert abs(got / rec["step_s"] - 1) < 0.005, (a["name"], got, rec["step_s"])
    assert out["goodput"]["goodput"] <= 1 and out["goodput"]["interval_s"] > 0, a["name"]
    checked += 1
assert checked >= 11, checked
print(f"{checked} anchors checked")
PY

# ---- the report: new terms in the breakdown and goodput ----
out="$("$FOUNDRY" plan --profile mi300x --config "$SRC/configs/anchors/qwen3-30b-a3b-16xH100.json" \
  --devices 16 --global-batch 512 --micro-batch 2 --pp 2 --vp 24 --ep 8 --recompute selective 2>&1)"
for needle in "pipeline bubble (1F1B fill and drain)" "expert-parallel dispatch and combine" \
              "activation recompute (selective)" "framework overhead (kernel launches)" \
              "weight all-gather (after the optimizer step)" \
              "model parallel: tp 1, pp 2 (vp 24), ep 8" \
              "job MTBF" "Daly" "predicted goodput"; do
  grep -qF -- "$needle" <<<"$out" || bad "plan output lacks '$needle'"
done
ok "the breakdown shows the layout's terms and the goodput"
# train.batch_size is the global batch, split over the devices as foundry train splits it;
# --micro-batch runs each device's share in pieces with accumulation.
"$FOUNDRY" plan --profile h100 --config "$SRC/configs/moe-bench.json" --devices 2 >split.txt 2>&1 \
  && grep -q "step: 4 sequences x 256 tokens per device (micro-batch 4 x 1), 2 data-parallel" split.txt \
  && "$FOUNDRY" plan --profile h100 --config "$SRC/configs/moe-bench.json" --devices 2 \
       --global-batch 32 --micro-batch 4 >accum.txt 2>&1 \
  && grep -q "step: 16 sequences x 256 tokens per device (micro-batch 4 x 4)" accum.txt \
  && "$FOUNDRY" plan --profile h100 --config "$SRC/configs/moe-bench.json" --devices 2 \
       --set train.batch_size=32 --micro-batch 4 >accum_set.txt 2>&1 \
  && [ "$(grep "predicted step time" accum.txt)" = "$(grep "predicted step time" accum_set.txt)" ] \
  && ok "plan --config splits train.batch_size over the devices; --micro-batch accumulates" \
  || { bad "plan's batch split:"; cat split.txt accum.txt; }
"$FOUNDRY" plan --profile h100 --config "$SRC/configs/moe-bench.json" --devices 2 --tokens 1M \
  --json >tokens.json 2>&1 && "$FOUNDRY" plan --profile h100 --config "$SRC/configs/moe-bench.json" \
  --devices 2 --tokens 1M >tokens.txt 2>&1
python3 - tokens.json tokens.txt <<'PY' && ok "plan --config --tokens reports the training time" \
  || bad "plan --config --tokens"
import json, math, sys
d = json.load(open(sys.argv[1]))
steps = math.ceil(1e6 / (8 * 256))  # moe-bench: global batch 8 x 256 tokens
assert d["training"]["steps"] == steps, d["training"]
assert abs(d["training"]["days"] - steps * d["step_s"] / 86400) < 1e-12, d["training"]
assert f"training 1.000 M tokens: {steps} steps of" in open(sys.argv[2]).read()
PY
# The memory of one config's layout against the profile's device: warned when it does not fit
# (AdamW's 8 bytes a parameter of state and two sequences on one device do not).
"$FOUNDRY" plan --profile mi300x --config "$SRC/configs/zaya1-base.json" \
  --set train.optimizer=adamw train.batch_size=2 >one.txt 2>&1 \
  && grep -q "per device, more than the 178.81 GiB of a device (AMD Instinct MI300X.*): it does not fit" one.txt \
  && "$FOUNDRY" plan --profile mi300x --config "$SRC/configs/zaya1-base.json" --devices 1024 \
       --global-batch 1024 >many.txt 2>&1 && grep -q "predicted step time" many.txt \
  && ! grep -q "does not fit" many.txt \
  && ok "a config that does not fit its device is warned about (on one device, not on 1,024)" \
  || bad "memory warning: $(head -3 one.txt)"
"$FOUNDRY" plan --profile mi300x --config "$SRC/configs/zaya1-base.json" --devices 1024 \
  --global-batch 4096 --failure-rate 0 --json >g0.json 2>&1
python3 - g0.json <<'PY' && ok "no failures: goodput 1" || bad "goodput without failures"
import json, sys
g = json.load(open(sys.argv[1]))["goodput"]
assert g["goodput"] == 1 and g["mtbf_s"] is None, g
PY
"$FOUNDRY" plan --profile mi300x --config "$SRC/configs/zaya1-base.json" --devices 1024 \
  --global-batch 4096 --checkpoint-stall 10 --checkpoint-write 0 --restart 60 --json >g1.json 2>&1
python3 - g1.json <<'PY' && ok "the interval is Daly's for the given stall" \
  || bad "goodput interval"
import json, math, sys
g = json.load(open(sys.argv[1]))["goodput"]
M = 3600 / (1024 * 1.97e-5)
r = 10 / (2 * M)
daly = math.sqrt(2 * 10 * M) * (1 + math.sqrt(r) / 3 + r / 9) - 10
assert abs(g["interval_s"] - daly) < 1e-6 * daly and abs(g["mtbf_s"] - M) < 1e-6 * M, g
PY

# A given interval is whole steps (a run saves between steps): 1 ms is one step, and below the
# write time it is warned about.
"$FOUNDRY" plan --profile mi300x --config "$SRC/configs/zaya1-base.json" --devices 8 \
  --global-batch 8 --checkpoint-interval 0.001 --json >g2.json 2>g2.err
python3 - g2.json <<'PY' && grep -q "shorter than a checkpoint's write" g2.err \
  && ok "an interval below a step is one step, and warned about below the write" \
  || { bad "short checkpoint interval"; cat g2.err; }
import json, sys
d = json.load(open(sys.argv[1]))
assert abs(d["goodput"]["interval_s"] - d["step_s"]) < 1e-12, (d["goodput"], d["step_s"])
PY

# The breakdown's shares are of the step: overlapping exchanges count by their exposed parts,
# so the shares add up to 100% (they reached 174% when hidden time was counted).
for args in "--config $SRC/configs/zaya1-base.json --devices 1024 --global-batch 4096" \
            "--config $SRC/configs/moe-bench.json --devices 16 --ep 4 --global-batch 16" \
            "--config $SRC/configs/moe-bench.json --devices 16 --ep 4 --global-batch 16 --overlap-expert-comm"; do
  "$FOUNDRY" plan --profile mi300x $args >shares.txt 2>&1
  total=$(awk '/^operation/ {on=1; next} on && /^$/ {exit} on {for (i = 1; i <= NF; i++) if ($i ~ /^[0-9.]+%$/) {sub("%", "", $i); t += $i}} END {print t}' shares.txt)
  python3 -c "import sys; t = float(sys.argv[1]); sys.exit(0 if 99.5 <= t <= 100.5 else 1)" "$total" \
    && ok "the shares add up to 100% ($total; $(echo $args | sed 's|.*configs/||'))" \
    || { bad "shares add up to $total: $args"; cat shares.txt; }
done

# ---- bad layouts fail with the flag named ----
expect_fail "tp x pp not dividing the devices" "--tp 3 x --pp 1 = 3 does not divide --devices 8" \
  "$FOUNDRY" plan --profile h100 --config "$SRC/configs/moe-bench.json" --devices 8 --tp 3
expect_fail "more expert ranks than experts" "--ep 16" \
  "$FOUNDRY" plan --profile h100 --config "$SRC/configs/moe-bench.json" --devices 16 --ep 16
expect_fail "imbalance below 1" "--expert-imbalance 0.5 must be >= 1" \
  "$FOUNDRY" plan --profile h100 --config "$SRC/configs/moe-bench.json" --devices 8 --ep 8 \
  --expert-imbalance 0.5
expect_fail "negative failure rate" "--failure-rate -1" \
  "$FOUNDRY" plan --profile h100 --config "$SRC/configs/moe-bench.json" --failure-rate -1
expect_fail "an attention kernel the profile lacks" "no attention kernel 'fa9'" \
  "$FOUNDRY" plan --profile h100 --config "$SRC/configs/moe-bench.json" --attention-kernel fa9

# ---- the stack's kernels: shown, and slower than the fused default ----
out="$("$FOUNDRY" plan --profile h100 --config "$SRC/configs/anchors/olmo-1b-dense-128xH100.json" \
  --devices 128 --global-batch 1024 --eager --attention-kernel fa2 2>&1)"
grep -qF "kernels: unfused (eager) elementwise, attention fa2" <<<"$out" \
  && grep -qF "elementwise, unfused: RMSNorms and RoPE op by op (eager)" <<<"$out" \
  && ok "eager kernels and the FA2 curve are named in the report" \
  || bad "the kernels line or the eager item is missing"

finish
