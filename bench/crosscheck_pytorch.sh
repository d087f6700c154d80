#!/usr/bin/env bash
# Cross-checks Foundry's fp32 forward pass and gradients against the independent PyTorch
# reference (bench/pytorch_reference.py). Exits non-zero when any compared quantity differs
# by more than TOL (relative, default 1e-4).
#
#   bash bench/crosscheck_pytorch.sh            # tiny config, a few seconds
#   FULL=1 bash bench/crosscheck_pytorch.sh     # also variants (dense, GQA/MHA, no top-k
#                                               # renormalization, long sequences) and the
#                                               # moe-bench shape (about a minute)
#
# What is compared (all in fp32):
#  A. forward on real text: a tiny dataset from `foundry data prepare` (vocab 300), a
#     3-step training run, then the CE of the first eval batch of the val split at the final
#     checkpoint: Foundry's `val_loss` (metrics.jsonl, full precision) and `foundry eval
#     --batches 1` (printed to 4 decimals) against PyTorch's CE on the same tokens.
#  B. gradients: `foundry train --synthetic-data` for one step with lr = 0 and grad_clip = 0,
#     so the checkpoint holds the unchanged weights and AdamW's exp_avg = (1 - beta1) * grad.
#     PyTorch recomputes the same synthetic batch (Foundry's RNG, reimplemented), and compares
#     loss, CE, aux loss, the global gradient norm (metrics.jsonl) and every gradient tensor
#     element-wise. Done at initialization and again after 3 training steps (resumed for one
#     lr = 0 step, exp_avg differenced against the previous checkpoint).
#  D. A and B for a ZAYA1 config (3 layers); FULL=1 adds ZAYA1 variants (E). A step routes
#     with the balancing biases it started from (check --router-biases).
# Needs: build/foundry (or FOUNDRY=path), /usr/bin/python3 with python3-torch (Debian).
# tests/pytorch_crosscheck_test.sh runs it in the suite.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
PY=/usr/bin/python3
REF="$root/bench/pytorch_reference.py"
FOUNDRY="${FOUNDRY:-$root/build/foundry}"
TOL="${TOL:-1e-4}"
[ -x "$FOUNDRY" ] || bash scripts/setup.sh build >/dev/null
"$PY" -c "import torch" 2>/dev/null || { echo "error: $PY has no torch (apt-get install python3-torch)" >&2; exit 2; }

work="$(mktemp -d /tmp/foundry-crosscheck.XXXXXX)"
trap 'rm -rf "$work"' EXIT
failures=0

# ---- tiny config and dataset ------------------------------------------------------------
cat >"$work/tiny.json" <<EOF
{
  "model": {"arch": "moe", "vocab_size": 300, "d_model": 64, "n_layers": 2, "n_heads": 4,
            "n_kv_heads": 2, "head_dim": 16, "n_experts": 4, "top_k": 2, "ffn_dim": 96,
            "norm_topk_prob": true, "aux_loss_coef": 0.01, "rope_theta": 10000.0,
            "rms_norm_eps": 1e-5, "max_seq_len": 256, "init_std": 0.02, "tie_embeddings": true},
  "train": {"steps": 3, "batch_size": 4, "seq_len": 32, "lr": 1e-2, "warmup_steps": 1,
            "precision": "fp32", "seed": 7, "eval_every": 0, "eval_batches": 1,
            "checkpoint_every": 0, "keep_checkpoints": 0, "peak_gflops": 1,
            "run_dir": "$work/run"},
  "data": {"dir": "$work/data"}
}
EOF
"$PY" - "$work/corpus.txt" <<'EOF'
import random, sys
r = random.Random(1)
words = ("the a of and to in is was for on with as by at it from that this be are or an not "
         "have had but his her they we you one two three time day year way man world life "
         "hand part place case week work").split()
with open(sys.argv[1], "w") as f:
    for _ in range(600):
        f.write(" ".join(r.choice(words) for _ in range(r.randint(5, 14))).capitalize() + ".\n")
EOF
"$FOUNDRY" data prepare --input "$work/corpus.txt" --out "$work/data" --vocab-size 300 \
  --val-fraction 0.1 --quiet >/dev/null || exit 2

# compare NAME FOUNDRY_VALUE PYTORCH_VALUE [ABS_TOL]: relative difference against TOL (plus an
# absolute tolerance for values Foundry prints rounded).
compare() {
  local verdict
  verdict=$("$PY" -c "
import sys
name, a, b, tol, abs_tol = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
rel = abs(a - b) / max(abs(a), 1e-30)
ok = abs(a - b) <= tol * abs(a) + abs_tol
print(f'{\"ok  \" if ok else \"FAIL\"} {name:<52} foundry {a:.10g}  pytorch {b:.10g}  rel diff {rel:.1e}')
sys.exit(0 if ok else 1)" "$1" "$2" "$3" "$TOL" "${4:-0}") || failures=$((failures + 1))
  echo "$verdict"
}
# foundry ARGS...: runs build/foundry quietly; on failure shows its output and stops.
foundry() {
  if ! "$FOUNDRY" "$@" >"$work/foundry.log" 2>&1; then
    echo "error: foundry $* failed:" >&2
    cat "$work/foundry.log" >&2
    exit 2
  fi
}
jget() { "$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$1" "$2"; }
last_metric() { "$PY" -c "import json,sys; print(json.loads(open(sys.argv[1]).read().splitlines()[-1])[sys.argv[2]])" "$1" "$2"; }

# grad_check LABEL CONFIG RUN_DIR STEP [PREV_CKPT] -- after the lr=0 step STEP in RUN_DIR.
grad_check() {
  local label="$1" cfg="$2" run="$3" step="$4" prev="${5:-}" ckpt out
  shift 5 2>/dev/null || shift 4
  ckpt="$run/checkpoints/$(printf 'step_%08d' "$step")"
  out="$work/check-$label.json"
  "$PY" "$REF" tokens --config "$cfg" "$@" --synthetic-step "$step" --out "$work/tokens-$label.json"
  # ZAYA1 routes a step with the balancing biases it started from: the initial ones, or the
  # previous checkpoint's (the checkpoint holds those after the step's update).
  "$PY" "$REF" check --config "$cfg" "$@" --checkpoint "$ckpt" --tokens "$work/tokens-$label.json" \
    --compare-adam-grads ${prev:+--adam-prev "$prev"} --router-biases "${prev:-initial}" \
    --compact >"$out"
  compare "[$label] CE loss" "$(last_metric "$run/metrics.jsonl" loss)" "$(jget "$out" ce_loss)"
  compare "[$label] aux loss" "$(last_metric "$run/metrics.jsonl" aux_loss)" "$(jget "$out" aux_loss)"
  compare "[$label] global grad norm" "$(last_metric "$run/metrics.jsonl" grad_norm)" "$(jget "$out" grad_norm)"
  local worst err
  worst=$(jget "$out" grad_rel_err_worst_tensor)
  err=$(jget "$out" grad_rel_err_max)
  if "$PY" -c "import sys; sys.exit(0 if float(sys.argv[1]) <= float(sys.argv[2]) else 1)" "$err" "$TOL"; then
    printf 'ok   %-52s max rel err %.1e (%s)\n' "[$label] every gradient tensor, element-wise" "$err" "$worst"
  else
    printf 'FAIL %-52s max rel err %.1e (%s)\n' "[$label] every gradient tensor, element-wise" "$err" "$worst"
    "$PY" -c "
import json, sys
d = json.load(open(sys.argv[1]))
for k, v in sorted(d['grad_rel_err'].items(), key=lambda kv: -kv[1])[:8]:
    print(f'       {v:.2e}  {k}')" "$out"
    failures=$((failures + 1))
  fi
}

# fresh_grad_check LABEL CONFIG [section.key=value ...]: one lr=0 step from initialization.
fresh_grad_check() {
  local label="$1" cfg="$2"
  shift 2
  local sets=("$@" train.lr=0 train.grad_clip=0)
  foundry train --config "$cfg" --synthetic-data --steps 1 -q \
    --set "${sets[@]}" train.run_dir="$work/$label"
  grad_check "$label" "$cfg" "$work/$label" 1 "" --set "${sets[@]}"
}

# val_check LABEL CONFIG: A. a 3-step run on the dataset, then the val batch's CE at its final
# checkpoint against metrics.jsonl's val_loss and foundry eval's.
val_check() {
  local label="$1" cfg="$2" run="$work/val-$1" eval_line pt_ce
  foundry train --config "$cfg" -q --set train.run_dir="$run"
  eval_line=$("$FOUNDRY" eval --config "$cfg" --set train.run_dir="$run" --batches 1 | grep '^val loss')
  "$PY" "$REF" tokens --config "$cfg" --val-data "$work/data" --out "$work/val-$label.json"
  "$PY" "$REF" check --config "$cfg" --checkpoint "$run/checkpoints/step_00000003" \
    --tokens "$work/val-$label.json" --compact >"$work/check-val-$label.json"
  pt_ce=$(jget "$work/check-val-$label.json" ce_loss)
  compare "[$label] val CE, metrics.jsonl val_loss" "$(last_metric "$run/metrics.jsonl" val_loss)" "$pt_ce"
  compare "[$label] val CE, foundry eval (4 decimals)" "$(echo "$eval_line" | awk '{print $3}')" "$pt_ce" 5e-5
}

# trained_grad_check LABEL CONFIG: B. 3 steps on random tokens (a run on the dataset resumes
# only on it), then one lr = 0 step, exp_avg differenced against step 3's.
trained_grad_check() {
  local label="$1" cfg="$2" run="$work/trained-$1"
  foundry train --config "$cfg" --synthetic-data -q --set train.run_dir="$run"
  foundry train --config "$cfg" --synthetic-data --resume --steps 4 -q --allow-config-change \
    --set train.lr=0 train.grad_clip=0 train.run_dir="$run"
  grad_check "$label" "$cfg" "$run" 4 "$run/checkpoints/step_00000003"
}

echo "== A. forward on a prepared dataset (val batch, trained checkpoint) =="
val_check moe "$work/tiny.json"

echo "== B. loss and gradients on a synthetic batch (lr = 0 step) =="
fresh_grad_check init "$work/tiny.json"
trained_grad_check trained "$work/tiny.json"

echo "== D. ZAYA1: the same checks (3 layers: EDA chains over two routers) =="
"$PY" - "$work/tiny.json" "$work/zaya.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["model"] = {"arch": "zaya1", "vocab_size": 300, "d_model": 64, "n_layers": 3, "n_heads": 4,
              "n_kv_heads": 2, "head_dim": 16, "n_experts": 4, "ffn_dim": 96,
              "router_latent_dim": 32, "max_seq_len": 256}
json.dump(c, open(sys.argv[2], "w"))
PY
val_check zaya "$work/zaya.json"
fresh_grad_check zaya-init "$work/zaya.json"
trained_grad_check zaya-trained "$work/zaya.json"

if [ "${FULL:-0}" = 1 ]; then
  echo "== C. variants (from initialization) =="
  fresh_grad_check dense "$work/tiny.json" model.n_experts=1 model.top_k=1
  fresh_grad_check no-renorm "$work/tiny.json" model.norm_topk_prob=false model.top_k=3
  fresh_grad_check mha-top1 "$work/tiny.json" model.n_kv_heads=4 model.top_k=1
  fresh_grad_check gqa4-long "$work/tiny.json" model.n_heads=8 model.n_kv_heads=2 \
    train.seq_len=200 train.batch_size=3
  fresh_grad_check wide "$work/tiny.json" model.d_model=256 model.n_heads=8 \
    model.n_kv_heads=4 model.head_dim=32 model.ffn_dim=384 model.n_experts=8 \
    train.seq_len=256 train.batch_size=4
  fresh_grad_check moe-bench "$root/configs/moe-bench.json" train.precision=fp32
  echo "== E. ZAYA1 variants (from initialization) =="
  fresh_grad_check zaya-kernels-3-3 "$work/zaya.json" model.cca_kernel_depthwise=3 \
    model.cca_kernel_grouped=3
  fresh_grad_check zaya-top2-no-eda "$work/zaya.json" model.top_k=2 model.router_eda=false
  # A skip-class bias that sends some tokens there: its input passes, and the bias ranks
  # probabilities differently from logits.
  fresh_grad_check zaya-skip-passes-input "$work/zaya.json" model.skip_passes_input=true \
    model.skip_bias_init=0.3 model.top_k=2
  fresh_grad_check zaya-bias-on-probs "$work/zaya.json" model.balance_bias_on=probs \
    model.skip_bias_init=0.05
  fresh_grad_check zaya-mha-full-rope "$work/zaya.json" model.n_kv_heads=4 \
    model.rope_fraction=1.0 model.router_skip_class=false
  fresh_grad_check zaya-kv1-long "$work/zaya.json" model.n_kv_heads=1 train.seq_len=200 \
    train.batch_size=3
fi

if [ "$failures" -gt 0 ]; then
  echo "crosscheck: $failures comparison(s) beyond $TOL relative" >&2
  exit 1
fi
echo "crosscheck: all comparisons within $TOL relative"
