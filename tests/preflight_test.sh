#!/usr/bin/env bash
# End-to-end checks of the memory preflight and of non-finite checkpoints: with a small
# FOUNDRY_MEMORY_LIMIT, train, eval, generate and bench gemm/membw/comm refuse before
# allocating (both figures on the error line, a hint, no run directory or output files left),
# under mpirun every rank refuses; with a generous limit they run; eval and generate refuse a
# checkpoint holding a NaN weight.
source "$(dirname "$0")/lib.sh"
cd "$WORK"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN=(timeout 120 mpirun --oversubscribe --bind-to none -np 2 -x OMP_NUM_THREADS=1)

tiny_corpus 7 400 4 14 wide
"$FOUNDRY" data prepare --input corpus --out ds --vocab-size 300 --val-fraction 0.1 --quiet >prep.log 2>&1 \
  || { bad "data prepare failed"; cat prep.log; finish; exit 1; }

cat > tiny.json <<'JSON'
{
  "model": {"vocab_size": 300, "d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
            "head_dim": 8, "n_experts": 4, "top_k": 2, "ffn_dim": 48, "max_seq_len": 32},
  "train": {"steps": 4, "batch_size": 2, "seq_len": 16, "lr": 1e-2, "warmup_steps": 2,
            "precision": "fp32", "log_every": 4, "checkpoint_every": 4, "eval_batches": 2,
            "peak_gflops": 100, "run_dir": "run"},
  "data": {"dir": "ds"}
}
JSON

# refuses "description" cmd...: exits non-zero with "error: ... needs about X ... may use Y"
# and a hint line.
refuses() {
  local what="$1"
  shift
  local out
  if out="$("$@" 2>&1)"; then
    bad "$what: exited 0"
  elif ! grep -qE '^error: .* needs about [0-9.]+ [KMGT]?i?B per process .*, but this process may use [0-9.]+ [KMGT]?i?B \(FOUNDRY_MEMORY_LIMIT\)$' <<<"$out"; then
    bad "$what: no error line with both figures:"; echo "$out" | sed 's/^/    /'
  elif ! grep -q '^hint: .*FOUNDRY_MEMORY_LIMIT' <<<"$out"; then
    bad "$what: no hint line:"; echo "$out" | sed 's/^/    /'
  else
    ok "$what"
  fi
}

# ---- a generous limit: everything runs ----
export FOUNDRY_MEMORY_LIMIT=64G
"$FOUNDRY" train --config tiny.json -q >train.log 2>&1 && [ -f run/checkpoints/latest ] \
  && ok "train runs under FOUNDRY_MEMORY_LIMIT=64G" || { bad "train failed"; cat train.log; }
out="$("$FOUNDRY" eval --config tiny.json 2>&1)"
grep -q "^val loss [0-9]" <<<"$out" && ok "eval runs" || { bad "eval failed:"; echo "$out"; }
# A run stopped at --stop-at-step ends validated at that step: eval of its checkpoint agrees.
"$FOUNDRY" train --config tiny.json --set train.run_dir=stopped train.steps=8 --stop-at-step 3 \
  >stopped.log 2>&1
after="$(grep -o "val loss after [0-9.]*" stopped.log | cut -d' ' -f4)"
evaluated="$("$FOUNDRY" eval --config tiny.json --set train.run_dir=stopped 2>&1 | grep -o "^val loss [0-9.]*" | cut -d' ' -f3)"
[ -n "$after" ] && [ "$after" = "$evaluated" ] \
  && ok "--stop-at-step reports the validation of its last step ($after)" \
  || { bad "--stop-at-step: val loss after '$after', eval '$evaluated'"; cat stopped.log; }
out="$("$FOUNDRY" generate --config tiny.json --prompt "the expert" -n 4 --temperature 0 2>&1)"
grep -q "^the expert" <<<"$out" && ok "generate runs" || { bad "generate failed:"; echo "$out"; }
"$FOUNDRY" bench gemm --quick --quiet --kinds square --dtype fp32 >gemm.log 2>&1 \
  && ok "bench gemm runs" || { bad "bench gemm failed"; cat gemm.log; }
"$FOUNDRY" bench membw --quick --quiet --no-working-set >membw.log 2>&1 \
  && ok "bench membw runs" || { bad "bench membw failed"; cat membw.log; }
"${MPIRUN[@]}" "$FOUNDRY" bench comm -b 8 -e 1K -f 4 -w 1 -n 2 --op all_reduce >comm.log 2>&1 \
  && ok "bench comm runs" || { bad "bench comm failed"; cat comm.log; }
FOUNDRY_MEMORY_LIMIT=off "$FOUNDRY" train --config tiny.json -q --set train.run_dir=off --steps 1 \
  >off.log 2>&1 && ok "FOUNDRY_MEMORY_LIMIT=off skips the check" || { bad "off failed"; cat off.log; }

# ---- a small limit: every command refuses before allocating, and writes nothing ----
export FOUNDRY_MEMORY_LIMIT=1M
refuses "train" "$FOUNDRY" train --config tiny.json -q --set train.run_dir=small
refuses "eval" "$FOUNDRY" eval --config tiny.json
refuses "generate" "$FOUNDRY" generate --config tiny.json --prompt "the expert" -n 4
refuses "bench gemm" "$FOUNDRY" bench gemm --quick --quiet --json gemm.json --csv gemm.csv
refuses "bench membw" "$FOUNDRY" bench membw --quick --quiet --json membw.json
refuses "bench comm" "${MPIRUN[@]}" "$FOUNDRY" bench comm -e 4M --json comm.json
for what in "training" "bench comm"; do
  if [ "$what" = training ]; then
    "${MPIRUN[@]}" "$FOUNDRY" train --config tiny.json -q --set train.run_dir=small_mpi >np2.log 2>&1
  else
    "${MPIRUN[@]}" "$FOUNDRY" bench comm -e 4M >np2.log 2>&1
  fi
  rc=$?
  n=$(grep -c "^error: $what needs about" np2.log)
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$n" = 2 ] && ok "mpirun -np 2 $what: both ranks refuse, no hang" \
    || { bad "mpirun -np 2 $what: rc=$rc, $n ranks refused"; cat np2.log; }
done
left="$(ls -d small small_mpi gemm.json gemm.csv membw.json comm.json 2>/dev/null)"
[ -z "$left" ] && ok "refusals leave no run directory or files" || bad "left behind: $left"

FOUNDRY_MEMORY_LIMIT=lots expect_fail "malformed FOUNDRY_MEMORY_LIMIT" \
  "FOUNDRY_MEMORY_LIMIT='lots' is not a memory size" "$FOUNDRY" train --config tiny.json -q
unset FOUNDRY_MEMORY_LIMIT

# ---- a checkpoint holding a NaN weight ----
# Poisons the first element of the final norm's piece and writes the checksums that the
# change invalidates (the piece's first chunk, then COMMITTED's of metadata.json) with
# XXH3-64 from the libxxhash foundry links, so the checkpoint verifies and loads.
cp -r run nan
ckpt="nan/checkpoints/$(cat nan/checkpoints/latest)"
python3 - "$ckpt" <<'PY'
import ctypes, json, struct, sys
d = sys.argv[1]
xxh = ctypes.CDLL("libxxhash.so.0")
xxh.XXH3_64bits.restype = ctypes.c_uint64
xxh.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
h = lambda b: "%016x" % xxh.XXH3_64bits(bytes(b), len(b))
text = open(d + "/metadata.json").read()
meta = json.loads(text)
p = next(p for p in meta["pieces"] if p["tensor"] == "model.norm.weight")
path = d + "/" + meta["files"][p["file"]]["name"]
data = bytearray(open(path, "rb").read())
start = p["byte_offset"]
assert h(data[start:start + min(p["byte_length"], meta["chunk_bytes"])]) == p["xxh3_64"][0]
data[start:start + 4] = struct.pack("<f", float("nan"))
open(path, "wb").write(data)
text = text.replace(p["xxh3_64"][0], h(data[start:start + min(p["byte_length"], meta["chunk_bytes"])]))
open(d + "/metadata.json", "w").write(text)
committed = json.load(open(d + "/COMMITTED"))
committed["metadata_xxh3_64"] = h(text.encode())
open(d + "/COMMITTED", "w").write(json.dumps(committed))
PY
"$FOUNDRY" ckpt verify "$ckpt" >verify.log 2>&1 && ok "the poisoned checkpoint verifies" \
  || { bad "the poisoned checkpoint does not verify"; cat verify.log; }
want="checkpoint '$ckpt' has 1 non-finite weight in 1 tensor; the first is model.norm.weight (1 of its 32 values)"
expect_fail "eval of a checkpoint with a NaN weight" "$want" \
  "$FOUNDRY" eval --config tiny.json --checkpoint "$ckpt"
expect_fail "generate from a checkpoint with a NaN weight" "$want" \
  "$FOUNDRY" generate --config tiny.json --checkpoint "$ckpt" --prompt "the expert" -n 4

finish
