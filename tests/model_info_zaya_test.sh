#!/usr/bin/env bash
# End-to-end checks of `foundry model info` on configs/zaya1-base.json: it answers at once
# (nothing is allocated), prints the spec's ZAYA1-base counts, and reports which optimizer
# each parameter group gets, following train.optimizer or --optimizer.
source "$(dirname "$0")/lib.sh"
cd "$WORK"
CONFIG="$SRC/configs/zaya1-base.json"

start=$(date +%s%N)
if "$FOUNDRY" model info --config "$CONFIG" >info.txt 2>err.txt; then
  ok "model info on zaya1-base exits 0"
else
  bad "model info on zaya1-base failed:"; cat err.txt
fi
ms=$(( ($(date +%s%N) - start) / 1000000 ))
[ "$ms" -lt 5000 ] && ok "model info on an 8.8 B model takes ${ms} ms" \
  || bad "model info took ${ms} ms (should not allocate the model)"

# expect_line "description" "regex a line of info.txt must match"
expect_line() {
  if grep -qE -- "$2" info.txt; then ok "$1"; else bad "$1: no line matching '$2'"; fi
}
expect_line "CCA sublayer 5,575,682" "per CCA sublayer .* 5,575,682 "
expect_line "q 2,097,152" "q_proj +2,097,152 "
expect_line "k 524,288" "k_proj +524,288 "
expect_line "v 2 x 262,144" "v_proj current \+ delayed \(2 x 262,144\) +524,288 "
expect_line "convolutions 332,800" "convolutions .* 332,800 "
expect_line "o 2,097,152" "o_proj +2,097,152 "
expect_line "temperature 2" "QK-norm temperature +2 "
expect_line "router 660,992" "router \(x40\) +660,992 "
expect_line "first router 660,736" "first MoE sublayer's router .* 660,736 "
expect_line "per expert 12,582,912" "per expert .* 12,582,912 "
expect_line "experts per MoE sublayer 201,326,592" "all 16 experts +201,326,592 "
expect_line "embedding 537,133,056" "embedding \(tied with the LM head\) +537,133,056 "
expect_line "total 8.303 B / active 0.754 B without embeddings" \
  "8\.303 B total / 0\.754 B active per token without embeddings; embedding 0\.537 B"
expect_line "non-embedding 8,303,355,728" "non-embedding +8,303,355,728 "
expect_line "active non-embedding 753,608,528" "active per token, non-embedding +753,608,528 "
expect_line "config's optimizer is muon" "optimizer groups \(train.optimizer = muon\)"
expect_line "experts updated by Muon" "^  experts \(gate, up, down\) .* muon$"
expect_line "attention projections updated by Muon" "^  attention projections .* muon$"
expect_line "embedding stays with AdamW" "^  embedding \(tied LM head\) .* adamw$"
expect_line "router stays with AdamW" "^  router matrices .* adamw$"
expect_line "convolution weights stay with AdamW" "^  CCA convolution weights .* adamw$"
expect_line "Muon momentum in memory" "Muon momentum"

# --optimizer overrides train.optimizer: every group is AdamW, no Muon momentum.
"$FOUNDRY" model info --config "$CONFIG" --optimizer adamw >info.txt 2>&1 || bad "--optimizer adamw failed"
if grep -qE " muon$" info.txt || grep -q "Muon momentum" info.txt; then
  bad "--optimizer adamw still reports Muon"
else ok "--optimizer adamw puts every group on AdamW"; fi
# (a command-line parse error: CLI11 prints it without the "error:" prefix)
if out="$("$FOUNDRY" model info --config "$CONFIG" --optimizer sgd 2>&1)"; then
  bad "--optimizer sgd exited 0"
elif grep -q -- "--optimizer" <<<"$out" && grep -q "adamw,muon" <<<"$out"; then
  ok "--optimizer sgd is refused, naming the choices"
else bad "--optimizer sgd: unexpected message: $out"; fi

# --json carries the same numbers and the groups.
"$FOUNDRY" model info --config "$CONFIG" --json >info.json 2>&1 || bad "--json failed"
if python3 - info.json <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
p = j["parameters"]
assert j["optimizer"] == "muon", j["optimizer"]
assert p["cca_per_layer"]["total"] == 5575682, p["cca_per_layer"]
assert p["per_expert"] == 12582912 and p["router_per_layer"] == 660992
assert p["router_first_layer"] == 660736 and p["experts_per_layer"] == 201326592
assert p["non_embedding"] == 8303355728 and p["active_non_embedding"] == 753608528
assert p["embedding"] == 537133056
groups = {g["name"]: g for g in j["param_groups"]}
assert sum(g["params"] for g in j["param_groups"]) == p["total"]
assert groups["experts (gate, up, down)"]["optimizer"] == "muon"
assert groups["embedding (tied LM head)"]["optimizer"] == "adamw"
muon = sum(g["params"] for g in j["param_groups"] if g["optimizer"] == "muon")
assert j["memory_bytes"]["muon_momentum"] == 4 * muon
assert j["memory_bytes"]["adamw_state"] == 8 * (p["total"] - muon)
PY
then ok "--json: counts, groups and Muon state"; else bad "--json content"; fi

# --dp N --ep P: what each rank stores when experts are sharded over groups of P ranks.
"$FOUNDRY" model info --config "$CONFIG" --dp 16 --ep 8 --json >ep.json 2>&1 || bad "--ep failed"
if python3 - ep.json <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
s, p, L = j["expert_storage"], j["parameters"], j["model"]["n_layers"]
assert s["ep"] == 8 and j["zero1"]["dp"] == 16
# Gradients: everything but the other 7/8 of the experts (expert tensors need no padding).
others = 7 * p["experts_per_layer"] * L // 8
assert s["gradient_elements"] == s["slab_elements"] - others, (s, others)
# Weights: the same plus at most this rank's ZeRO-1 shard (1/16 of the slab, plus the split
# Muon matrix it owns).
assert s["gradient_elements"] < s["weight_elements"] <= s["gradient_elements"] + s["slab_elements"] // 16 + p["per_expert"], s
PY
then ok "--dp 16 --ep 8: a rank stores 1/8 of the experts' gradients, its weights plus its shard"
else bad "--ep report"; cat ep.json | tail -12; fi
expect_fail "--ep that does not divide --dp" "--ep 3 must divide --dp 16" \
  "$FOUNDRY" model info --config "$CONFIG" --dp 16 --ep 3

# ZeRO-1's per-rank total: the replicated slabs, the bf16 copies, the largest rank's optimizer
# state, the activations of its batch / dp sequences (those of one process at --batch 8/4) and
# its checkpoint snapshot.
MB="$SRC/configs/moe-bench.json"
for muon in adamw muon; do
  "$FOUNDRY" model info --config "$MB" --optimizer $muon --dp 4 --json >z1.json 2>&1 &&
  "$FOUNDRY" model info --config "$MB" --optimizer $muon --batch 2 --json >b2.json 2>&1 ||
    bad "model info --dp 4 ($muon)"
  if python3 - z1.json b2.json <<'PY'
import json, sys
z, one = (json.load(open(f)) for f in sys.argv[1:3])
assert z["batch_size"] == 8, z["batch_size"]
zero1, m = z["zero1"], one["memory_bytes"]
expected = (zero1["replicated_bytes"] + m["weights_bf16"] + zero1["optimizer_bytes_per_rank_peak"]
            + m["activations"] + m["backward_buffers"] + zero1["checkpoint_snapshot_bytes"]
            + zero1["memory_checkpoints_bytes"])
assert zero1["bytes_per_rank_peak"] == expected, (zero1["bytes_per_rank_peak"], expected)
# The asynchronous checkpoint's snapshot: a rank copies its shard and its state, a quarter
# or so of one process's.
assert 0 < 3 * zero1["checkpoint_snapshot_bytes"] < m["checkpoint_snapshot"], (zero1, m)
assert zero1["bytes_per_rank_peak"] < m["total"]
PY
  then ok "model info --dp 4 totals a rank's memory ($muon)"
  else bad "model info --dp 4 per-rank total ($muon)"; fi
done

# The GPU benchmark configs: the peer's shape (docs/gpu.md) and its ZAYA1 counterpart, whose
# experts (half as many, twice as wide, top-1) give the same total and active expert weights.
"$FOUNDRY" model info --config "$SRC/configs/gpu-moe-bench.json" --json >gm.json 2>&1 || bad "gpu-moe-bench"
"$FOUNDRY" model info --config "$SRC/configs/gpu-zaya-bench.json" --json >gz.json 2>&1 || bad "gpu-zaya-bench"
if python3 - gm.json gz.json <<'PY'
import json, sys
m, z = (json.load(open(f)) for f in sys.argv[1:3])
mm, zm = m["model"], z["model"]
assert (mm["vocab_size"], mm["d_model"], mm["n_layers"], mm["n_heads"], mm["head_dim"]) == (32768, 2048, 8, 16, 128)
assert (mm["n_experts"], mm["top_k"], mm["ffn_dim"]) == (16, 2, 2048)
assert (zm["d_model"], zm["n_layers"], zm["top_k"], zm["ffn_dim"]) == (2048, 8, 1, 4096)
assert m["parameters"]["experts_per_layer"] == z["parameters"]["experts_per_layer"]
assert m["memory_bytes"]["total"] < 78 * 2**30 and z["memory_bytes"]["total"] < 78 * 2**30
PY
then ok "gpu-moe-bench and gpu-zaya-bench: the peer's shape, equal expert weights, both fit an 80 GB GPU"
else bad "gpu bench configs"; head -c 600 gm.json; fi

finish
