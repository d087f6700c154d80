#!/usr/bin/env bash
# `foundry train` and `foundry eval` with --device cuda against the CPU, end to end (label gpu;
# exits 77, a skip, where the build has no CUDA backend or no GPU is visible):
#  1. a checkpoint trained on the CPU evaluates to the same loss on the GPU (fp32: 1e-4
#     relative; bf16, where attention runs on tensor cores: 2%);
#  2. training on the GPU follows the CPU's losses (fp32, 1e-4 relative) and its checkpoint
#     evaluates to the same loss on the CPU and on the GPU;
#  3. a run too large for the GPU's free memory is refused before anything is written.
# FOUNDRY_TEST_DEVICE=cpu with FOUNDRY_POSE_AS_DEVICE=1 runs the same on a machine without a GPU,
# the CPU backend posing as the device (the paths of a GPU run on the CPU's kernels).
source "$(dirname "$0")/lib.sh"
cd "$WORK"
GPU="${FOUNDRY_TEST_DEVICE:-cuda}"

cat > tiny.json <<'JSON'
{
  "model": {"vocab_size": 300, "d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
            "head_dim": 32, "n_experts": 4, "top_k": 2, "ffn_dim": 96, "max_seq_len": 64},
  "train": {"steps": 8, "batch_size": 4, "seq_len": 64, "lr": 3e-3, "warmup_steps": 2,
            "precision": "fp32", "log_every": 1, "checkpoint_every": 8, "eval_batches": 2,
            "peak_gflops": 100, "run_dir": "cpu"},
  "data": {"dir": "ds"}
}
JSON

probe="$("$FOUNDRY" train -c tiny.json --synthetic-data --device "$GPU" --steps 1 \
          --set train.run_dir=probe -q 2>&1)"
[ $? -eq 0 ] || gpu_probe_failed "train" "$probe"

tiny_corpus 11 1500 6 18
"$FOUNDRY" data prepare --input corpus --out ds --vocab-size 300 --val-fraction 0.2 --quiet \
  >prep.log 2>&1 || { cat prep.log; bad "data prepare failed"; finish; exit 1; }

val() { sed -n 's/^val loss \([0-9.]*\).*/\1/p' <<<"$1"; }
close() { python3 -c "import sys; a, b, r = map(float, sys.argv[1:]); sys.exit(0 if abs(a - b) <= r * abs(a) else 1)" "$@"; }
losses() { python3 -c "import json,sys; print(' '.join(repr(json.loads(l)['loss']) for l in open(sys.argv[1]) if 'loss' in json.loads(l)))" "$1"; }

# ---- a CPU checkpoint on the GPU ----
"${ON_CPU[@]}" "$FOUNDRY" train -c tiny.json -q >cpu.log 2>&1 || { cat cpu.log; bad "CPU training failed"; }
for precision in fp32 bf16; do
  tol=1e-4; [ $precision = bf16 ] && tol=2e-2
  a="$(val "$("${ON_CPU[@]}" "$FOUNDRY" eval -c tiny.json --set train.precision=$precision 2>&1)")"
  b="$(val "$("$FOUNDRY" eval -c tiny.json --set train.precision=$precision --device "$GPU" 2>&1)")"
  if [ -n "$a" ] && [ -n "$b" ] && close "$a" "$b" "$tol"; then
    ok "eval $precision of a CPU checkpoint: CPU $a, GPU $b"
  else bad "eval $precision of a CPU checkpoint: CPU '$a', GPU '$b' (within $tol?)"; fi
done

# ---- training on the GPU ----
"$FOUNDRY" train -c tiny.json --device "$GPU" --set train.run_dir=gpu -q >gpu.log 2>&1 \
  || { cat gpu.log; bad "GPU training failed"; }
python3 - cpu/metrics.jsonl gpu/metrics.jsonl <<'PY' && ok "GPU training follows the CPU's 8 fp32 losses within 1e-4" || bad "GPU and CPU losses differ"
import json, sys
def losses(p): return [json.loads(l)['loss'] for l in open(p) if 'loss' in json.loads(l)]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
print('CPU', a); print('GPU', b)
sys.exit(0 if len(a) == len(b) == 8 and all(abs(x - y) <= 1e-4 * abs(x) for x, y in zip(a, b)) else 1)
PY
a="$(val "$("${ON_CPU[@]}" "$FOUNDRY" eval -c tiny.json --set train.run_dir=gpu 2>&1)")"
b="$(val "$("$FOUNDRY" eval -c tiny.json --set train.run_dir=gpu --device "$GPU" 2>&1)")"
if [ -n "$a" ] && [ -n "$b" ] && close "$a" "$b" 1e-4; then
  ok "a GPU checkpoint evaluates alike on the CPU ($a) and the GPU ($b)"
else bad "eval of a GPU checkpoint: CPU '$a', GPU '$b'"; fi

# ---- the GPU's memory preflight: a run that cannot fit is refused before anything is written ----
# (gpu-moe-bench at 2 layers: its weights and optimizer state fit any GPU of 16 GB or more.)
[ "$GPU" = cpu ] && { finish; exit; }  # what follows needs a real GPU, not the CPU posing as one
big=(train -c "$SRC/configs/gpu-moe-bench.json" --device "$GPU" --synthetic-data --steps 1
     --set model.n_layers=2 train.batch_size=8192 train.run_dir=toolarge)
expect_fail "a batch the GPU cannot hold" "of GPU memory per rank" "$FOUNDRY" "${big[@]}"
[ -e toolarge ] && bad "the refused run created its run directory" || ok "the refused run wrote nothing"
out="$("$FOUNDRY" "${big[@]}" 2>&1)"
grep -qE "^hint: (the largest train.batch_size that fits is [0-9]|even train.batch_size)" <<<"$out" \
  && ok "the refusal says what batch fits" || bad "no batch in the hint: $out"

finish
