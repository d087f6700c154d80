#!/usr/bin/env bash
# Generation and scoring with --device cuda against the CPU, end to end on tiny trained models
# of both architectures (label gpu; exits 77, a skip, where the build has no CUDA backend or
# no GPU is visible). fp32:
#  1. `generate` greedy continues a prompt with the CPU's tokens;
#  2. `generate --batch` (shared prefixes, the prefix-tree schedule) gives the CPU's greedy
#     token ids for every request, and a sampled request the CPU's tokens for its seed;
#  3. `eval --choices` scores every candidate within 1e-4 (relative) of the CPU;
#  4. `bench decode --device cuda` measures steps on the GPU and says so.
# FOUNDRY_TEST_DEVICE=cpu with FOUNDRY_POSE_AS_DEVICE=1 runs the same on a machine without a GPU,
# the CPU backend posing as the device (the paths of a GPU run on the CPU's kernels).
source "$(dirname "$0")/lib.sh"
cd "$WORK"
GPU="${FOUNDRY_TEST_DEVICE:-cuda}"

# Skips only for want of a GPU (or of the CUDA backend); any other failure of the probe fails.
probe="$("$FOUNDRY" bench decode --config "$SRC/configs/demo-moe.json" --device "$GPU" \
          --batches 1 --steps 1 --warmup 0 --warmup-seconds 0 --context 1 --finer 1 --quiet 2>&1)"
[ $? -eq 0 ] || gpu_probe_failed "decode" "$probe"

tiny_corpus 5 800 6 18
"$FOUNDRY" data prepare --input corpus --out ds --vocab-size 300 --quiet >prep.log 2>&1 \
  || { cat prep.log; bad "data prepare failed"; finish; exit 1; }

cat > moe.json <<'JSON'
{
  "model": {"vocab_size": 300, "d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
            "head_dim": 16, "n_experts": 4, "top_k": 2, "ffn_dim": 96, "max_seq_len": 64},
  "train": {"steps": 8, "batch_size": 4, "seq_len": 32, "lr": 3e-3, "warmup_steps": 2,
            "precision": "fp32", "log_every": 4, "checkpoint_every": 8, "peak_gflops": 100,
            "run_dir": "moe"},
  "data": {"dir": "ds"}
}
JSON
cat > zaya.json <<'JSON'
{
  "model": {"arch": "zaya1", "vocab_size": 300, "d_model": 64, "n_layers": 2, "n_heads": 4,
            "n_kv_heads": 2, "head_dim": 16, "n_experts": 4, "top_k": 1, "ffn_dim": 96,
            "max_seq_len": 64, "router_latent_dim": 16, "rope_fraction": 0.5,
            "norm_topk_prob": false, "aux_loss_coef": 0},
  "train": {"steps": 8, "batch_size": 4, "seq_len": 32, "lr": 3e-3, "warmup_steps": 2,
            "optimizer": "muon", "precision": "fp32", "log_every": 4, "checkpoint_every": 8,
            "peak_gflops": 100, "run_dir": "zaya"},
  "data": {"dir": "ds"}
}
JSON
cat > req.jsonl <<'JSON'
{"prompt": "the expert router sends", "max_new_tokens": 12, "temperature": 0}
{"prompt": "the expert router learns", "max_new_tokens": 9, "temperature": 0}
{"prompt": "the model", "max_new_tokens": 16, "temperature": 0}
{"prompt": "the expert router sends each token", "max_new_tokens": 7, "seed": 11, "temperature": 0.8}
{"prompt": "", "max_new_tokens": 5, "temperature": 0}
JSON
cat > choices.jsonl <<'JSON'
{"context": "the expert router", "choices": [" sends each token", " flows", " the the the"], "answer": 0}
{"context": "the model", "choices": [" learns", " x", " which one fits"]}
JSON

for arch in moe zaya; do
  "${ON_CPU[@]}" "$FOUNDRY" train -c $arch.json -q >train-$arch.log 2>&1 \
    || { cat train-$arch.log; bad "$arch: training failed"; continue; }

  prompt="the expert router sends each token to"
  a="$("${ON_CPU[@]}" "$FOUNDRY" generate -c $arch.json -p "$prompt" -n 24 --temperature 0 2>gen-cpu.err)"
  b="$("$FOUNDRY" generate -c $arch.json -p "$prompt" -n 24 --temperature 0 --device "$GPU" 2>gen-gpu.err)"
  if [ -n "$a" ] && [ "$a" = "$b" ]; then ok "$arch: generate greedy on the GPU is the CPU's text"
  else bad "$arch: generate: CPU '$a', GPU '$b' ($(cat gen-gpu.err))"; fi

  "${ON_CPU[@]}" "$FOUNDRY" generate -c $arch.json --batch req.jsonl --out cpu-$arch.jsonl -q >b-cpu.log 2>&1 \
    || { cat b-cpu.log; bad "$arch: generate --batch on the CPU failed"; }
  "$FOUNDRY" generate -c $arch.json --batch req.jsonl --out gpu-$arch.jsonl -q --device "$GPU" \
    >b-gpu.log 2>&1 || { cat b-gpu.log; bad "$arch: generate --batch on the GPU failed"; }
  python3 - cpu-$arch.jsonl gpu-$arch.jsonl <<'PY' \
    && ok "$arch: generate --batch on the GPU gives every request the CPU's tokens" \
    || bad "$arch: generate --batch differs between the CPU and the GPU"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 5, (len(a), len(b))
for x, y in zip(a, b):
    assert x["index"] == y["index"] and x["token_ids"] == y["token_ids"], (x, y)
    assert x["finish_reason"] == y["finish_reason"], (x, y)
PY

  "${ON_CPU[@]}" "$FOUNDRY" eval -c $arch.json --choices choices.jsonl --out s-cpu-$arch.jsonl -q >c-cpu.log 2>&1 \
    || { cat c-cpu.log; bad "$arch: eval --choices on the CPU failed"; }
  "$FOUNDRY" eval -c $arch.json --choices choices.jsonl --out s-gpu-$arch.jsonl -q --device "$GPU" \
    >c-gpu.log 2>&1 || { cat c-gpu.log; bad "$arch: eval --choices on the GPU failed"; }
  python3 - s-cpu-$arch.jsonl s-gpu-$arch.jsonl <<'PY' \
    && ok "$arch: eval --choices on the GPU scores within 1e-4 of the CPU" \
    || bad "$arch: eval --choices scores differ between the CPU and the GPU"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 2
for x, y in zip(a, b):
    for s, t in zip(x["scores"], y["scores"]):
        assert abs(s - t) <= 1e-4 * abs(s), (s, t)
    assert x["prediction"] == y["prediction"]
PY
done

[ "$GPU" = cpu ] && { finish; exit; }  # what follows needs a real GPU, not the CPU posing as one
out="$("$FOUNDRY" bench decode --config zaya.json --device cuda --batches 1,4 --steps 3 \
        --warmup 1 --warmup-seconds 0 --context 8 --finer 1 --quiet 2>&1)"
grep -q "^# device: cuda:0" <<<"$out" && ok "bench decode --device cuda measures on the GPU" \
  || bad "bench decode --device cuda: $out"

finish
