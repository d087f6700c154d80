# Sourced by the batch generation benchmarks: `batch_model FOUNDRY ARCH MAX_SEQ_LEN` builds, in
# the current directory, a small model of the demo's shape (ZAYA1 or the standard MoE,
# d_model 384, 4 layers, 8 experts, vocabulary 512, fp32 so any build gives the same tokens)
# trained 10 steps on a generated corpus: model.json, ds/ and the checkpoint in run/.
batch_model() {
  local foundry="$1" arch="$2" max_len="$3"
  python3 - "$arch" "$max_len" <<'PY'
import json, random, sys, os
arch, max_len = sys.argv[1], int(sys.argv[2])
rng = random.Random(1)
words = ("the expert router sends each token to a small set of experts and the model learns "
         "which one fits best when data flows through layers while training runs on many "
         "cores question answer example because every step reads the weights once").split()
os.makedirs("corpus", exist_ok=True)
with open("corpus/a.txt", "w") as f:
    for _ in range(4000):
        f.write(" ".join(rng.choice(words) for _ in range(rng.randint(6, 20))) + ".\n")
model = {"arch": arch, "vocab_size": 512, "d_model": 384, "n_layers": 4, "n_heads": 6,
         "n_kv_heads": 2, "head_dim": 64, "n_experts": 8, "top_k": 1 if arch == "zaya1" else 2,
         "ffn_dim": 1408 if arch == "zaya1" else 704, "max_seq_len": max_len}
if arch == "zaya1":
    model.update({"router_latent_dim": 128, "rope_fraction": 0.5})
json.dump({"model": model,
           "train": {"steps": 10, "batch_size": 8, "seq_len": 128, "lr": 2e-3, "warmup_steps": 2,
                     "precision": "fp32", "log_every": 10, "checkpoint_every": 10,
                     "peak_gflops": 100, "run_dir": "run"},
           "data": {"dir": "ds"}}, open("model.json", "w"), indent=1)
PY
  "$foundry" data prepare --input corpus --out ds --vocab-size 512 --quiet >/dev/null
  "$foundry" train -c model.json -q >/dev/null 2>&1
}
