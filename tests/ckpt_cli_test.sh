#!/usr/bin/env bash
# End-to-end checks of `foundry ckpt` on the checkpoints of a tiny Muon run:
#  1. info (text and --json) describes the format, step, layout, model, saved slabs, what the
#     optimizer keeps no state for, and the files;
#  2. verify passes on the intact checkpoint, and fails naming the file and byte range of a
#     flipped byte, and naming a truncated file;
#  3. export writes a Hugging Face directory whose model.safetensors holds every parameter
#     exactly as tests/ckpt_v2.py reads it from the checkpoint, refuses a non-empty output and
#     leaves nothing behind when it fails;
#  4. bad arguments fail with a message naming the path.
source "$(dirname "$0")/lib.sh"
cd "$WORK"

cat > tiny.json <<'JSON'
{
  "model": {"vocab_size": 300, "d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
            "head_dim": 8, "n_experts": 4, "top_k": 2, "ffn_dim": 48, "max_seq_len": 32},
  "train": {"steps": 4, "batch_size": 2, "seq_len": 16, "lr": 1e-2, "warmup_steps": 2,
            "optimizer": "muon", "precision": "fp32", "log_every": 4, "checkpoint_every": 2,
            "keep_checkpoints": 2, "peak_gflops": 100, "run_dir": "run"},
  "data": {"dir": ""}
}
JSON
"$FOUNDRY" train --config tiny.json --synthetic-data -q >train.log 2>&1 \
  || { bad "training the tiny model failed"; cat train.log; finish; exit 1; }
CK=run/checkpoints/step_00000004

# ---- info ----
if "$FOUNDRY" ckpt info "$CK" >info.txt 2>&1; then ok "ckpt info exits 0"; else bad "ckpt info failed"; cat info.txt; fi
missing=""
for line in "format      version 2 (sharded), committed" "step        4" \
            "written by  1 rank, expert_parallel 1, ZeRO-1 off" "model       arch moe, " \
            "optimizer   muon" "  params  " "  muon_momentum  " \
            "note: no exp_avg, exp_avg_sq for " "note: no muon_momentum for " \
            "  rank_00000.bin  " "  metadata.json  " "  COMMITTED  " "  total  "; do
  grep -qF -- "$line" info.txt || missing="$missing [$line]"
done
if [ -z "$missing" ]; then ok "ckpt info shows format, step, layout, model, optimizer, slabs, notes, files"
else bad "ckpt info lacks:$missing"; cat info.txt; fi

"$FOUNDRY" ckpt info "$CK" --json >info.json 2>&1 || { bad "ckpt info --json failed"; cat info.json; }
python3 - "$CK" <<'PY' && ok "ckpt info --json: slabs, what each lacks, file sizes, no problems" || bad "ckpt info --json (see above)"
import json, os, sys
d = sys.argv[1]
info = json.load(open("info.json"))
meta = json.load(open(d + "/metadata.json"))
assert info["format_version"] == 2 and info["committed"] and info["step"] == 4, info
assert info["layout"] == {"world": 1, "expert_parallel": 1, "zero1": False, "context_parallel": 1}, info["layout"]
assert info["model"]["arch"] == "moe" and info["optimizer"] == "muon", info["model"]
assert info["problems"] == [], info["problems"]
slabs = {s["name"]: s for s in info["slabs"]}
assert [s["name"] for s in info["slabs"]] == ["params", "exp_avg", "exp_avg_sq", "muon_momentum"]
params = [n for n in meta["tensors"] if not n.endswith((".exp_avg", ".exp_avg_sq", ".muon_momentum"))]
assert slabs["params"]["tensors"] == len(params) == info["model"]["tensors"]
assert slabs["params"]["without"] == []
# Every parameter has exactly one optimizer's state: AdamW's moments or Muon's momentum.
assert set(slabs["exp_avg"]["without"]) == {n for n in params if n + ".exp_avg" not in meta["tensors"]}
assert sorted(slabs["exp_avg"]["without"]) == sorted(set(params) - set(slabs["muon_momentum"]["without"]))
assert "model.layers.0.self_attn.q_proj.weight" in slabs["exp_avg"]["without"]
def numel(shape):
    n = 1
    for dim in shape:
        n *= dim
    return n
for s in info["slabs"]:
    suffix = "" if s["name"] == "params" else "." + s["name"]
    want = sum(4 * numel(meta["tensors"][p + suffix]["shape"])
               for p in params if p + suffix in meta["tensors"])
    assert s["bytes"] == want, (s["name"], s["bytes"], want)
for f in info["files"]:
    assert f["bytes"] == os.path.getsize(d + "/" + f["name"]), f
assert info["total_bytes"] == sum(f["bytes"] for f in info["files"])
PY

# ---- verify: intact ----
if out="$("$FOUNDRY" ckpt verify "$CK" 2>&1)" && grep -qE "^ok: $CK: [0-9]+ pieces in 1 file, .* bytes .*\([0-9.]+ s\)$" <<<"$out"; then
  ok "ckpt verify passes and says what it checked: $out"
else bad "ckpt verify of an intact checkpoint:"; echo "$out"; fi

# ---- export ----
if "$FOUNDRY" ckpt export "$CK" --hf hf >export.log 2>&1; then ok "ckpt export exits 0"
else bad "ckpt export failed"; cat export.log; fi
python3 - "$CK" "$SRC" <<'PY' && ok "the export holds every parameter bit for bit as the checkpoint, in F32, and the HF config" || bad "exported model (see above)"
import json, os, struct, sys
d, src = sys.argv[1], sys.argv[2]
sys.path.insert(0, src + "/tests")
from ckpt_v2 import read_checkpoint
meta, tensors = read_checkpoint(d)
assert sorted(os.listdir("hf")) == ["config.json", "model.safetensors"], os.listdir("hf")
assert not [e for e in os.listdir(".") if e.startswith("hf.tmp-")], "a staging directory is left"
raw = open("hf/model.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
assert header.pop("__metadata__") == {"format": "pt"}
params = [k for k in meta["tensors"] if not k.endswith((".exp_avg", ".exp_avg_sq", ".muon_momentum"))]
assert sorted(header) == sorted(params), set(header) ^ set(params)
end = 0
for name, t in header.items():
    shape, values = tensors[name]
    assert t["dtype"] == "F32" and t["shape"] == shape, (name, t, shape)
    b, e = t["data_offsets"]
    assert raw[8 + n + b:8 + n + e] == struct.pack("<%df" % len(values), *values), name
    end = max(end, e)
assert 8 + n + end == len(raw), "bytes after the last tensor"
hf = json.load(open("hf/config.json"))
assert hf == json.load(open(d + "/config.json")), "config.json differs from the checkpoint's"
assert hf["foundry"] == meta["model"] and hf["model_type"] == "mixtral"
PY

# ---- errors ----
expect_fail "export into a directory that is not empty" "export directory 'hf' is not empty" \
  "$FOUNDRY" ckpt export "$CK" --hf hf
expect_fail "export without --hf" "--hf" "$FOUNDRY" ckpt export "$CK"
expect_fail "a run directory is not a checkpoint" "'run' is not a Foundry checkpoint" \
  "$FOUNDRY" ckpt info run
expect_fail "the hint names a checkpoint of the run directory" "run/checkpoints/step_00000004" \
  "$FOUNDRY" ckpt verify run
expect_fail "a missing directory" "checkpoint 'nothing/here' does not exist" \
  "$FOUNDRY" ckpt export nothing/here --hf out

# ---- verify: a flipped byte inside a piece of rank_00000.bin ----
cp -r "$CK" flipped
read -r offset length < <(python3 -c "
import json; p = json.load(open('flipped/metadata.json'))['pieces'][3]
print(p['byte_offset'], p['byte_length'])")
python3 - flipped/rank_00000.bin "$((offset + 5))" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(int(sys.argv[2])); c = f.read(1); f.seek(int(sys.argv[2])); f.write(bytes([c[0] ^ 0x40]))
PY
end=$((offset + (length < 1048576 ? length : 1048576)))
expect_fail "verify names the file and byte range of a flipped byte" \
  "flipped/rank_00000.bin: bytes [$offset, $end)" "$FOUNDRY" ckpt verify flipped
expect_fail "export of the corrupt checkpoint fails" "rank_00000.bin: bytes [$offset, $end)" \
  "$FOUNDRY" ckpt export flipped --hf hf2
if [ ! -e hf2 ] && ! ls -d hf2.tmp-* >/dev/null 2>&1; then ok "a failed export leaves nothing behind"
else bad "a failed export left $(ls -d hf2*)"; fi

# ---- verify: a truncated file ----
cp -r "$CK" truncated
truncate -s -100 truncated/rank_00000.bin
expect_fail "verify names a truncated file" "truncated/rank_00000.bin has" \
  "$FOUNDRY" ckpt verify truncated
expect_fail "info reports the truncated file as a problem" "truncated/rank_00000.bin has" \
  "$FOUNDRY" ckpt info truncated

finish
