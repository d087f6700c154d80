#!/usr/bin/env bash
# End-to-end checks of `foundry train/eval/model info` on a tiny model with synthetic data:
# config errors, bit-exact resume, SIGTERM checkpointing, corrupted and mismatched checkpoints.
source "$(dirname "$0")/lib.sh"
cd "$WORK"

cat > tiny.json <<'JSON'
{
  "model": {"vocab_size": 300, "d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
            "head_dim": 8, "n_experts": 4, "top_k": 2, "ffn_dim": 48, "max_seq_len": 32},
  "train": {"steps": 12, "batch_size": 2, "seq_len": 16, "lr": 1e-2, "warmup_steps": 2,
            "precision": "fp32", "log_every": 4, "checkpoint_every": 4, "keep_checkpoints": 2,
            "peak_gflops": 100, "run_dir": "run"},
  "data": {"dir": ""}
}
JSON

# ---- config errors ----
expect_fail "missing config" "nope.json" "$FOUNDRY" train --config nope.json --synthetic-data
echo '{"model": {"d_model": 32,}' > garbled.json
expect_fail "garbled config" "garbled.json:1" "$FOUNDRY" train --config garbled.json --synthetic-data
expect_fail "unknown key" "model.d_modle" "$FOUNDRY" train --config tiny.json --set model.d_modle=3 --synthetic-data
expect_fail "bad value" "train.precision" "$FOUNDRY" train --config tiny.json --set train.precision=fp8 --synthetic-data
expect_fail "wrong type" "train.lr" "$FOUNDRY" train --config tiny.json --set 'train.lr="fast"' --synthetic-data
expect_fail "heads/kv heads" "n_kv_heads" "$FOUNDRY" train --config tiny.json --set model.n_kv_heads=3 --synthetic-data
expect_fail "no dataset" "data.dir" "$FOUNDRY" train --config tiny.json
expect_fail "unknown GEMM rows mode" "FOUNDRY_GEMM_ROWS = 'fast'" \
  env FOUNDRY_GEMM_ROWS=fast "$FOUNDRY" train --config tiny.json --synthetic-data
[ ! -d run ] && ok "failed runs leave no run directory" || bad "a failed run left a run directory"

# ---- straight run vs stop-and-resume: identical losses, bit for bit ----
losses() { python3 -c "import json,sys; print(' '.join(repr(json.loads(l)['loss']) for l in open(sys.argv[1])))" "$1"; }
"$FOUNDRY" train --config tiny.json --synthetic-data --set train.run_dir=straight -q >/dev/null 2>&1 \
  || bad "straight run failed"
"$FOUNDRY" train --config tiny.json --synthetic-data --set train.run_dir=resumed -q --stop-at-step 6 >/dev/null 2>&1 \
  || bad "first half failed"
"$FOUNDRY" train --config tiny.json --synthetic-data --set train.run_dir=resumed -q --resume >resumed.log 2>&1 \
  || bad "resumed half failed"
a="$(losses straight/metrics.jsonl)"; b="$(losses resumed/metrics.jsonl)"
if [ -n "$a" ] && [ "$a" = "$b" ]; then ok "resume reproduces the straight run's 12 losses bitwise"
else bad "resume differs: straight [$a] resumed [$b]"; fi
# A resume that stretches the cosine schedule says what the next step's lr becomes.
cp -r straight stretched
"$FOUNDRY" train --config tiny.json --synthetic-data --set train.run_dir=stretched -q --resume \
  --steps 24 >stretched.log 2>&1
grep -q "schedule now spans 24 steps instead of the checkpoint's 12: step 13 trains at lr" stretched.log \
  && ! grep -q "schedule now spans" resumed.log \
  && ok "a resume under another train.steps warns that the schedule changes shape" \
  || { bad "no schedule warning"; cat stretched.log; }
# The run's config.json holds the steps it trains to (--steps overrides train.steps): resuming
# from that file goes on to them, with the same schedule.
"$FOUNDRY" train --config tiny.json --synthetic-data --set train.run_dir=longer -q --steps 16 \
  --stop-at-step 6 >/dev/null 2>&1 \
  && "$FOUNDRY" train --config longer/config.json --synthetic-data -q --resume >longer.log 2>&1
[ "$(python3 -c "import json; print(json.load(open('longer/config.json'))['train']['steps'])")" = 16 ] \
  && [ "$(tail -1 longer/metrics.jsonl | python3 -c "import json,sys; print(json.load(sys.stdin)['step'])")" = 16 ] \
  && ! grep -q "schedule now spans" longer.log \
  && ok "--steps is the run's: config.json holds it and a resume from that file trains to it" \
  || { bad "--steps not kept in config.json"; cat longer.log; }
# A run directory whose config.json links to the user's config: the link is replaced, the
# user's file left as it was.
mkdir -p linked && cp tiny.json mine.json && ln -s ../mine.json linked/config.json
"$FOUNDRY" train --config mine.json --synthetic-data --set train.run_dir=linked -q --steps 2 \
  >linked.log 2>&1
cmp -s mine.json tiny.json && [ ! -L linked/config.json ] \
  && ok "a linked config.json in the run directory is replaced, not written through" \
  || { bad "config.json link"; cat linked.log; }
# Sequences of any length train without context parallelism (an odd one here).
"$FOUNDRY" train --config tiny.json --synthetic-data --set train.run_dir=odd train.seq_len=15 -q \
  --steps 2 >odd.log 2>&1 && ok "an odd train.seq_len trains" || { bad "odd seq_len"; cat odd.log; }
# A GPU's profile for a run on the CPU: the MFU is against that GPU's peak, and the run says so.
"$FOUNDRY" train --config tiny.json --synthetic-data --set train.run_dir=gpuprof train.peak_gflops=0 \
  train.hardware_profile=mi300x -q --steps 2 >gpuprof.log 2>&1
grep -q "warning: train.hardware_profile .* is a gpu profile .* this run trains on the cpu" gpuprof.log \
  && ok "a GPU profile for a CPU run is warned about" || { bad "no warning for a GPU profile"; cat gpuprof.log; }
# metrics' tokens count what was trained on, across a resume under another batch size.
"$FOUNDRY" train --config tiny.json --synthetic-data --set train.run_dir=rebatch -q --stop-at-step 6 \
  >/dev/null 2>&1 && "$FOUNDRY" train --config tiny.json --synthetic-data -q --resume \
  --set train.run_dir=rebatch train.batch_size=4 --allow-config-change >rebatch.log 2>&1
python3 - rebatch/metrics.jsonl <<'PY' && ok "metrics' tokens go on counting under a new batch size" \
  || { bad "tokens after a batch change"; cat rebatch.log; }
import json, sys
tokens = {m["step"]: m["tokens"] for m in map(json.loads, open(sys.argv[1]))}
assert tokens[6] == 6 * 2 * 16 and tokens[7] == 6 * 2 * 16 + 4 * 16, tokens
assert tokens[12] == 6 * 2 * 16 + 6 * 4 * 16, tokens
PY
[ "$(cat straight/checkpoints/latest)" = "step_00000012" ] && ok "latest points at the final step" \
  || bad "latest is '$(cat straight/checkpoints/latest 2>/dev/null)'"
n=$(ls -d straight/checkpoints/step_* | wc -l)
[ "$n" = 2 ] && ok "keep_checkpoints=2 keeps 2" || bad "kept $n checkpoints"
# The checkpoint `latest` names is gone: the resume says so once and takes the one before.
cp -r straight gone && rm -r gone/checkpoints/step_00000012
"$FOUNDRY" train --config tiny.json --synthetic-data --set train.run_dir=gone -q --resume \
  >gone.log 2>&1
[ "$(grep -c 'skipping checkpoint .*step_00000012 named by' gone.log)" = 1 ] \
  && grep -q "resumed from .*step_00000008" gone.log \
  && ok "a missing latest checkpoint: one warning, the one before resumed" \
  || { bad "missing latest checkpoint"; cat gone.log; }

# ---- train.checkpoint_at_end=false: a completed run ends without the final checkpoint ----
"$FOUNDRY" train --config tiny.json --synthetic-data --set train.run_dir=noend -q \
  --set train.checkpoint_at_end=false --set train.steps=10 >noend.log 2>&1 || bad "checkpoint_at_end=false run failed"
[ "$(cat noend/checkpoints/latest 2>/dev/null)" = "step_00000008" ] && [ ! -d noend/checkpoints/step_00000010 ] \
  && ok "checkpoint_at_end=false keeps the periodic checkpoints and writes none at the end" \
  || { bad "checkpoint_at_end=false: latest is '$(cat noend/checkpoints/latest 2>/dev/null)'"; cat noend.log; }
"$FOUNDRY" train --config tiny.json --synthetic-data --set train.run_dir=noend_stop -q \
  --set train.checkpoint_at_end=false --set train.steps=10 --stop-at-step 7 >noend_stop.log 2>&1 \
  && [ "$(cat noend_stop/checkpoints/latest 2>/dev/null)" = "step_00000007" ] \
  && ok "--stop-at-step checkpoints its step under checkpoint_at_end=false (a stop, not the end)" \
  || { bad "--stop-at-step without checkpoint_at_end: latest '$(cat noend_stop/checkpoints/latest 2>/dev/null)'"; cat noend_stop.log; }

# ---- a run stopped by SIGTERM saves a checkpoint and exits 75 (interrupted, resumable) ----
"$FOUNDRY" train --config tiny.json --synthetic-data --set train.run_dir=sig --set train.steps=100000 \
  --set train.checkpoint_every=0 -q >sig.log 2>&1 &
pid=$!
for _ in $(seq 100); do [ -s sig/metrics.jsonl ] && break; sleep 0.1; done
kill -TERM $pid
wait $pid; rc=$?
if [ $rc -eq 75 ] && grep -q "SIGTERM" sig.log && [ -f "sig/checkpoints/$(cat sig/checkpoints/latest)/COMMITTED" ]; then
  ok "SIGTERM saves a committed checkpoint and exits 75"
else bad "SIGTERM: rc=$rc"; cat sig.log; fi

# A stop inside a given step (FOUNDRY_TRAIN_FAULT=sigterm@B): inside step 3 of 6 it saves step 3
# and exits 75; inside the last step the run is complete, and ends as finished (exit 0).
FOUNDRY_TRAIN_FAULT=sigterm@3 "$FOUNDRY" train --config tiny.json --synthetic-data \
  --set train.run_dir=sig_mid train.steps=6 train.checkpoint_every=0 -q >sig_mid.log 2>&1
rc=$?
[ $rc -eq 75 ] && [ "$(cat sig_mid/checkpoints/latest 2>/dev/null)" = "step_00000003" ] \
  && grep -q "received SIGTERM: checkpoint saved at step 3" sig_mid.log \
  && ok "SIGTERM inside step 3 saves step 3 and exits 75" \
  || { bad "SIGTERM inside step 3: rc=$rc"; cat sig_mid.log; }
FOUNDRY_TRAIN_FAULT=sigterm@6 "$FOUNDRY" train --config tiny.json --synthetic-data \
  --set train.run_dir=sig_last train.steps=6 train.checkpoint_every=0 train.checkpoint_at_end=false \
  -q >sig_last.log 2>&1
rc=$?
[ $rc -eq 0 ] && [ ! -e sig_last/checkpoints/latest ] \
  && grep -q "received SIGTERM during the last step: the run is complete" sig_last.log \
  && ! grep -q "checkpoint saved" sig_last.log \
  && ok "SIGTERM inside the last step: the run is complete (exit 0, no false checkpoint message)" \
  || { bad "SIGTERM inside the last step: rc=$rc"; cat sig_last.log; }
# While a run starts (here a checkpoint load of a minute) a stop waits for its first step and
# says so; a second Ctrl-C ends the process at once (exit 130), the run as it was.
FOUNDRY_CHECKPOINT_FAULT='load@0:sleep=60' "$FOUNDRY" train --config tiny.json --synthetic-data \
  --set train.run_dir=sig_mid train.steps=6 train.checkpoint_every=0 --resume >sig_start.log 2>&1 &
pid=$!
for _ in $(seq 300); do grep -q "^loading .*step_00000003" sig_start.log && break; sleep 0.1; done
kill -INT $pid
for _ in $(seq 100); do grep -q "received a stop signal while starting" sig_start.log && break; sleep 0.1; done
kill -INT $pid
wait $pid; rc=$?
if [ $rc -eq 130 ] && grep -q "press Ctrl-C again to exit now" sig_start.log \
   && [ "$(cat sig_mid/checkpoints/latest)" = step_00000003 ] \
   && "$FOUNDRY" train --config tiny.json --synthetic-data -q --set train.run_dir=sig_mid train.steps=6 \
        train.checkpoint_every=0 --resume >sig_after.log 2>&1; then
  ok "a stop while loading says it waits; a second Ctrl-C exits 130 at once, the run resumable"
else bad "Ctrl-C twice while loading: rc=$rc"; cat sig_start.log sig_after.log; fi

# ---- corrupted and mismatched checkpoints are never loaded ----
cp -r straight corrupt
ckpt=corrupt/checkpoints/step_00000012
python3 - "$ckpt" <<'PY'
import json, sys
d = sys.argv[1]
# A byte in the middle of the embedding's saved piece: read by every loader of the weights.
piece = next(p for p in json.load(open(d + "/metadata.json"))["pieces"]
             if p["tensor"] == "model.embed_tokens.weight")
path = d + "/rank_00000.bin"
b = bytearray(open(path, 'rb').read())
b[piece["byte_offset"] + piece["byte_length"] // 2] ^= 0x40
open(path, 'wb').write(b)
PY
# (eval reads the dataset first; bad_input.py's "rank file flipped (eval)" covers eval)
expect_fail "verify of a corrupted checkpoint" "rank_00000.bin" "$FOUNDRY" ckpt verify "$ckpt"
out="$("$FOUNDRY" train --config tiny.json --synthetic-data --set train.run_dir=corrupt -q --resume 2>&1)"
if grep -q "step_00000008" <<<"$out" && grep -q "step_00000012" <<<"$out"; then
  ok "a corrupted checkpoint is skipped; resume falls back to the previous one"
else bad "corrupted checkpoint handling:"; echo "$out"; fi
expect_fail "checkpoint from another config" "d_model" \
  "$FOUNDRY" train --config tiny.json --synthetic-data --set train.run_dir=straight --set model.d_model=64 --resume -q

# ---- model info reads the same config ----
"$FOUNDRY" model info --config tiny.json >info.txt 2>&1 && grep -qi "param" info.txt \
  && ok "model info runs" || bad "model info failed"
"$FOUNDRY" --version >version.txt 2>&1 \
  && grep -qE '^foundry ([0-9a-f]{12}(\+changes)?|unknown)$' <(head -1 version.txt) \
  && grep -q "oneDNN: [0-9]" version.txt && grep -q "CUDA backend: " version.txt \
  && ok "--version names the commit and the libraries" || { bad "--version:"; cat version.txt; }
"$FOUNDRY" train --help >/dev/null && "$FOUNDRY" eval --help >/dev/null && "$FOUNDRY" generate --help >/dev/null \
  && ok "--help on train/eval/generate" || bad "--help failed"

# ---- the MFU denominator: named in the log and in metrics.jsonl ----
cat > profile.json <<'JSON'
{"format": "foundry-hardware-profile", "version": 1, "name": "test machine",
 "device": {"kind": "cpu", "name": "test"},
 "compute": {"fp32": {"measured_flops_per_s": 5e9, "spec_flops_per_s": 6e9},
             "bf16": {"measured_flops_per_s": 7e9}}}
JSON
"$FOUNDRY" train --config tiny.json --synthetic-data --set train.run_dir=prof --set train.peak_gflops=0 \
  --set train.hardware_profile=profile.json --set train.steps=2 >prof.log 2>&1 || { bad "run with a profile failed"; cat prof.log; }
src="profile profile.json, measured fp32 GEMM peak × 1 host"
if grep -qF "MFU peak: 5 GFLOP/s ($src)" prof.log &&
   python3 - "$src" <<'PY'
import json, sys
lines = [json.loads(l) for l in open("prof/metrics.jsonl")]
assert all(l["peak_source"] == sys.argv[1] and l["peak_gflops"] == 5 for l in lines), lines[0]
PY
then ok "train.hardware_profile: the profile's measured fp32 peak is the MFU denominator, named in the log and metrics"
else bad "profile peak not reported as expected"; cat prof.log; head -c 600 prof/metrics.jsonl; fi
expect_fail "unknown profile" "no-such-profile" "$FOUNDRY" train --config tiny.json --synthetic-data \
  --set train.run_dir=prof2 --set train.peak_gflops=0 --set train.hardware_profile=no-such-profile
[ ! -d prof2 ] && ok "a bad profile leaves no run directory" || bad "a bad profile left prof2"
# A peak far below what a step achieves is a bug the run reports, once.
"$FOUNDRY" train --config tiny.json --synthetic-data --set train.run_dir=low --set train.peak_gflops=1e-6 \
  --set train.steps=3 >low.log 2>&1 || bad "run with a tiny peak failed"
[ "$(grep -c 'is above 100%' low.log)" = 1 ] && ok "an MFU above 100% is reported once, naming the peak's source" \
  || { bad "MFU above 100% not reported once"; cat low.log; }

# ---- a run directory belongs to one job: a second is refused, naming the holder ----
"$FOUNDRY" train --config tiny.json --synthetic-data --set train.run_dir=locked --set train.steps=100000 \
  --set train.checkpoint_every=0 -q >locked.log 2>&1 &
pid=$!
for _ in $(seq 100); do [ -s locked/metrics.jsonl ] && break; sleep 0.1; done
out="$("$FOUNDRY" train --config tiny.json --synthetic-data --set train.run_dir=locked --auto-resume 2>&1)"; rc=$?
kill -TERM $pid; wait $pid; first=$?
if [ $rc -eq 1 ] && grep -q "run directory 'locked' is in use by another training job (pid $pid on" <<<"$out"; then
  ok "a second job on a locked run directory is refused, naming the holder's pid"
else bad "second job: rc=$rc"; echo "$out"; fi
[ $first -eq 75 ] && [ ! -e locked/lock ] && ok "the holder exits 75 on SIGTERM and its lock file goes with it" \
  || bad "holder: rc=$first, lock file $(ls locked/lock 2>&1)"
finish
