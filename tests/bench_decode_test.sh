#!/usr/bin/env bash
# End-to-end checks of `foundry bench decode` on tiny models (a few steps, seconds):
#  1. it runs for both architectures and writes its table: JSON with one row per (width,
#     batch), every time and rate positive, predictions against a profile; Markdown likewise;
#  2. the KV cache table compares CCA with standard attention of the same width;
#  3. bad values fail with an error naming the flag and the value, and write nothing.
source "$(dirname "$0")/lib.sh"
cd "$WORK"
F="$FOUNDRY"

for arch in moe zaya1; do
  extra=""
  [ "$arch" = zaya1 ] && extra=', "router_latent_dim": 32, "rope_fraction": 0.5'
  cat >"$arch.json" <<EOF
{"model": {"arch": "$arch", "vocab_size": 512, "d_model": 64, "n_layers": 2, "n_heads": 4,
           "n_kv_heads": 2, "head_dim": 16, "n_experts": 4, "top_k": 1, "ffn_dim": 128,
           "max_seq_len": 64$extra},
 "train": {"precision": "bf16", "seq_len": 32}, "data": {"dir": ""}}
EOF
  if "$F" bench decode --config "$arch.json" --finer 2 --batches 1,3 --context 16 --warmup 1 \
       --warmup-seconds 0 --steps 3 --profile "$SRC/profiles/dev-machine.json" --out "$arch-decode.json" \
       >"$arch.txt" 2>"$arch.err"; then
    ok "$arch: bench decode exits 0"
  else
    bad "$arch: bench decode failed:"; cat "$arch.txt" "$arch.err"
  fi
  grep -q "bench decode" "$arch.err" && ok "$arch: progress on stderr" || bad "$arch: no progress"
  if python3 - "$arch-decode.json" "$arch" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["arch"] == sys.argv[2] and j["context"] == 16 and j["steps"] == 3, j
assert "bench decode" in j["provenance"]["command"] and j["provenance"]["cpu"]
rows = j["rows"]
widths = {(r["experts"], r["ffn_dim"], r["top_k"]) for r in rows}
assert widths == {(4, 128, 1), (8, 64, 2)}, widths  # the config's and one finer
assert sorted(r["batch"] for r in rows) == [1, 1, 3, 3], rows
for r in rows:
    for key in ("median_ms", "min_ms", "max_ms", "median_cpu_ms", "tokens_per_s", "predicted_ms",
                "total_params", "active_params"):
        assert r[key] > 0, (key, r)
    assert r["min_ms"] <= r["median_ms"] <= r["max_ms"], r
    assert abs(r["tokens_per_s"] - r["batch"] / (r["median_ms"] / 1e3)) <= 1e-6 * r["tokens_per_s"]
    assert abs(r["error"] - (r["median_ms"] - r["predicted_ms"]) / r["predicted_ms"]) < 1e-9
kv = j["kv_cache_values_per_token_per_layer"]
assert kv["this"] == 2 * 2 * 16 and kv["mha_full_width"] == 2 * 64 and kv["mha_same_heads"] == 2 * 64
assert (kv["cca_state_per_sequence"] > 0) == (sys.argv[2] == "zaya1"), kv
PY
  then ok "$arch: JSON table: one row per width and batch, positive times, predictions"
  else bad "$arch: JSON table content"; fi
done

grep -qE "^\| width \| batch \| params \(total / active\) \| ms/step \| CPU ms/step \| tokens/s \| predicted ms \| error \|$" moe.txt \
  && ok "the Markdown table has its columns" || bad "Markdown table header"
grep -qE "^\| CCA \(K and V of the KV heads\) \| 64 \| 128 \| 256 \| 1.0x \|$" zaya1.txt \
  && ok "zaya1: the KV cache table names CCA" || bad "zaya1: no CCA row in the KV cache table"

"$F" bench decode --config moe.json --widths 4x128x1 --batches 2 --context 8 --steps 2 --warmup-seconds 0.2 --quiet \
  --out table.md >/dev/null 2>&1 && ok "bench decode without --profile exits 0" || bad "without --profile"
if [ "$(grep -cE '^\| 4x128 top-1 \| 2 \| [0-9.]+M / [0-9.]+M \| [0-9.]+ \| [0-9.]+ \| [0-9]+ \|$' table.md)" = 1 ]; then
  ok "Markdown --out: one row, no prediction columns without a profile"
else
  bad "Markdown --out content:"; cat table.md
fi
grep -q "no --profile" table.md && ok "the table says why nothing is predicted" || bad "no note on the missing profile"
grep -q "^# device: cpu$" table.md && ok "the header names the device" || bad "no device line in the header"

expect_fail "--batches 0" "--batches 0" "$F" bench decode --config moe.json --batches 0 --out bad.json
expect_fail "--widths 4x128x8" "--widths '4x128x8'" "$F" bench decode --config moe.json --widths 4x128x8 --out bad.json
expect_fail "--widths 4x" "'4x' is not EXPERTSxFFNxTOPK" "$F" bench decode --config moe.json --widths 4x
expect_fail "--steps 0" "--steps 0" "$F" bench decode --config moe.json --steps 0 --out bad.json
expect_fail "--context -1" "--context -1" "$F" bench decode --config moe.json --context -1
expect_fail "--device tpu" "--device" "$F" bench decode --config moe.json --device tpu --out bad.json
expect_fail "--warmup-seconds -1" "--warmup-seconds -1" "$F" bench decode --config moe.json --warmup-seconds=-1
[ -e bad.json ] && bad "a failed run left bad.json behind" || ok "failed runs write no output file"

finish
