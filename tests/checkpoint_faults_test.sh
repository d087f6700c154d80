#!/usr/bin/env bash
# Failures during sharded, asynchronous checkpoints (2 ranks under mpirun): a rank that fails
# or dies at each point of the commit protocol, a full disk, a flipped byte and a truncated
# file in one rank's shard. The job fails naming the rank and the file, the previous
# checkpoint always stays loadable, and a damaged checkpoint is never loaded.
source "$(dirname "$0")/lib.sh"
cd "$WORK"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
MPIRUN=(mpirun --oversubscribe --bind-to none -np 2)

cat > tiny.json <<'JSON'
{
  "model": {"vocab_size": 300, "d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
            "head_dim": 8, "n_experts": 4, "top_k": 2, "ffn_dim": 48, "max_seq_len": 32},
  "train": {"steps": 8, "batch_size": 4, "seq_len": 16, "lr": 1e-2, "warmup_steps": 2,
            "optimizer": "muon", "precision": "fp32", "log_every": 4, "checkpoint_every": 4,
            "keep_checkpoints": 0, "peak_gflops": 100, "comm_timeout_s": 60, "run_dir": "run"},
  "data": {"dir": ""}
}
JSON

train() {  # run_dir [extra args...]: 2 ranks
  local dir="$1"; shift
  "${MPIRUN[@]}" "$FOUNDRY" train --config tiny.json --synthetic-data --set train.run_dir="$dir" -q "$@"
}
latest() { cat "$1/checkpoints/latest" 2>/dev/null; }
# The run directory still resumes from step 4's checkpoint: the resumed run ends at step 8.
resumes_from_4() {
  train "$1" --resume >"$1.resume.log" 2>&1 && grep -q "resumed from .*step_00000004 (step 4" "$1.resume.log"
}

# ---- a rank fails (an I/O error) or dies at each point of the second save (step 8) ----
for fault in write@1 before_fsync@1 before_commit@0 write@0:exit before_fsync@1:exit \
             before_commit@0:exit; do
  point="${fault%%@*}"; rest="${fault#*@}"; rank="${rest%%:*}"
  dir="run_${point}_${rank}${fault##*[0-9]}"; dir="${dir//:/}"
  FOUNDRY_CHECKPOINT_FAULT="${point}@${rank}#2${fault#*@$rank}" train "$dir" >"$dir.log" 2>&1
  rc=$?
  if [ "$rc" -eq 0 ]; then bad "$fault: the job exited 0"; continue; fi
  case "$fault" in
    *:exit) ;;  # a dead process: mpirun ends the job
    before_commit*) grep -q "the checkpoint of step 8 failed: rank 0: " "$dir.log" \
                      || { bad "$fault: no error naming rank 0:"; cat "$dir.log"; continue; } ;;
    *) grep -q "the checkpoint of step 8 failed: rank $rank: .*rank_0000$rank.bin" "$dir.log" \
         || { bad "$fault: the error does not name rank $rank and its file:"; cat "$dir.log"; continue; } ;;
  esac
  # A failure the job survives to report removes the save's staging directory; a dead
  # process's is removed by the next start.
  staging=$(ls -d "$dir"/checkpoints/step_00000008.*.tmp 2>/dev/null | wc -l)
  case "$fault" in *:exit) want_staging=1 ;; *) want_staging=0 ;; esac
  if [ "$(latest "$dir")" = step_00000004 ] && [ ! -d "$dir/checkpoints/step_00000008" ] \
     && [ "$staging" = "$want_staging" ] && resumes_from_4 "$dir" \
     && ! ls -d "$dir"/checkpoints/*.tmp >/dev/null 2>&1; then
    ok "$fault: the job fails, step 4's checkpoint stays the latest and resumes; the failed save's staging directory is removed"
  else bad "$fault: latest '$(latest "$dir")', $staging staging directories"; ls "$dir/checkpoints"; cat "$dir.log" "$dir.resume.log"; fi
done

# ---- SIGKILL to a rank in the middle of an asynchronous save ----
# Rank 1's writer stops halfway through its shard of step 8 (parameters written, state not);
# the rank is killed with -9 there, and mpirun ends the job.
FOUNDRY_CHECKPOINT_FAULT="write@1#2:pause" train killed >killed.log 2>&1 &
job=$!
victim=""
for _ in $(seq 1 300); do
  if ls killed/checkpoints/step_00000008.*.tmp/rank_00001.bin >/dev/null 2>&1; then
    for pid in $(test_pids "foundry train --config tiny.json --synthetic-data --set train.run_dir=killed"); do
      grep -qxzF OMPI_COMM_WORLD_RANK=1 "/proc/$pid/environ" 2>/dev/null && victim=$pid
    done
    [ -n "$victim" ] && break
  fi
  sleep 0.1
done
[ -n "$victim" ] && kill -9 "$victim"
wait "$job"; rc=$?
if [ -n "$victim" ] && [ "$rc" -ne 0 ] && [ "$(latest killed)" = step_00000004 ] \
   && [ ! -d killed/checkpoints/step_00000008 ] && resumes_from_4 killed; then
  ok "rank 1 killed with -9 during an asynchronous save: step 4 stays the latest and resumes"
else bad "kill -9 mid-save: victim '$victim', rc $rc, latest '$(latest killed)'"; cat killed.log; fi

# Dying after the rename, before `latest` moves: step 8 is complete, step 4 stays current
# (`latest` decides which checkpoint a run resumes from).
FOUNDRY_CHECKPOINT_FAULT="before_latest@0#2:exit" train late >late.log 2>&1
if [ "$(latest late)" = step_00000004 ] && [ -f late/checkpoints/step_00000008/COMMITTED ] \
   && resumes_from_4 late; then
  ok "killed before 'latest' moved: step 8 is complete and step 4 stays current"
else bad "before_latest: latest '$(latest late)'"; ls late/checkpoints; cat late.log late.resume.log; fi

# Failing (not dying) there: step 8's checkpoint is committed, so the run ends well, saying
# `latest` was not moved; the old `latest` (step 4) is removed, so a resume finds step 8.
FOUNDRY_CHECKPOINT_FAULT="before_latest@0#2" train latefail >latefail.log 2>&1; rc=$?
if [ $rc -eq 0 ] && [ ! -e latefail/checkpoints/latest ] \
   && grep -q "warning: checkpoint .*step_00000008 is saved, but .*No space left.*was removed" latefail.log \
   && train latefail --resume --steps 10 >latefail.resume.log 2>&1 \
   && grep -q "resumed from .*step_00000008 (step 8" latefail.resume.log; then
  ok "'latest' not moved after a commit: a warning, the run goes on, and a resume finds the checkpoint"
else bad "before_latest (thrown): rc $rc, latest '$(latest latefail)'"; cat latefail.log latefail.resume.log; fi

# ---- a disk that fills up: the error says so and names the file ----
FOUNDRY_CHECKPOINT_FAULT="write@1" train full >full.log 2>&1
if grep -q "rank 1: cannot write .*rank_00001.bin.*No space left on device" full.log \
   && [ ! -e full/checkpoints/latest ]; then
  ok "a full disk at the first save: the error names rank 1, its file and the cause; nothing committed"
else bad "disk full:"; cat full.log; fi

# ---- damaged shards of a committed checkpoint are never loaded ----
train good >good.log 2>&1 || { bad "the reference run failed"; cat good.log; }
cp -r good flipped
python3 - flipped/checkpoints/step_00000008 <<'PY'
import json, sys
d = sys.argv[1]
piece = [p for p in json.load(open(d + "/metadata.json"))["pieces"] if p["file"] == 1][0]
path = d + "/rank_00001.bin"
b = bytearray(open(path, "rb").read())
b[piece["byte_offset"] + piece["byte_length"] // 2] ^= 0x01
open(path, "wb").write(b)
PY
train flipped --resume --set train.steps=10 >flipped.log 2>&1
if grep -q "skipping checkpoint .*step_00000008: rank [01]: .*rank_00001.bin: bytes \[" flipped.log \
   && grep -q "resumed from .*step_00000004 (step 4" flipped.log; then
  ok "a flipped byte in rank 1's shard: the checkpoint is skipped naming the file and bytes"
else bad "flipped byte:"; cat flipped.log; fi

cp -r good truncated
truncate -s -100 truncated/checkpoints/step_00000008/rank_00000.bin
train truncated --resume --set train.steps=10 >truncated.log 2>&1
if grep -q "rank_00000.bin has .* bytes" truncated.log && grep -q "resumed from .*step_00000004" truncated.log; then
  ok "a truncated shard: the checkpoint is skipped naming the file"
else bad "truncated shard:"; cat truncated.log; fi

finish
