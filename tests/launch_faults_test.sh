#!/usr/bin/env bash
# End-to-end fault tolerance: `foundry launch` keeps a run going through a rank killed with
# SIGKILL mid-step, mid-save and mid-load, a stopped rank (SIGSTOP), and a full disk, in one
# process and under mpirun. Every supervised run must end with the same losses as an
# uninterrupted run of the same layout, bit for bit, and its events log must name what
# happened. Heartbeats are fast here (0.5 s, silent after 2 s) to keep the test short.
source "$(dirname "$0")/lib.sh"
cd "$WORK"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# One thread per process, whatever the host's core count and whatever runs beside the test
# (launch would otherwise give each rank its share of all the host's cores; command_test
# checks that sharing).
export OMP_NUM_THREADS=1

cat > tiny.json <<'JSON'
{
  "model": {"vocab_size": 300, "d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
            "head_dim": 8, "n_experts": 4, "top_k": 2, "ffn_dim": 48, "max_seq_len": 32},
  "train": {"steps": 3000, "batch_size": 2, "seq_len": 16, "lr": 1e-2, "warmup_steps": 2,
            "precision": "fp32", "log_every": 1000, "checkpoint_every": 250, "keep_checkpoints": 3,
            "peak_gflops": 100, "run_dir": "run", "heartbeat_interval_s": 0.5,
            "heartbeat_timeout_s": 2},
  "data": {"dir": ""}
}
JSON

events() { python3 -c "import json,sys; print(' '.join(json.loads(l)['event'] for l in open(sys.argv[1]+'/events.jsonl')))" "$1"; }
log_of() { echo "${1//\//_}.log"; }  # a run's launch log, in $WORK (disk/run: disk_run.log)
launch() {  # launch DIR NP [launch options]: in the background, pid in $lpid
  local dir="$1" np="$2"; shift 2
  "$FOUNDRY" launch --config tiny.json --synthetic-data -q --np "$np" --backoff 0.2 \
    --set train.run_dir="$dir" "$@" >"$(log_of "$dir")" 2>&1 &
  lpid=$!
}
# check NAME DIR REFERENCE CAUSES: launch exited 0, losses equal the reference's, the events
# log holds a failure with one of CAUSES (a regex) and a restart.
check() {
  wait $lpid; local rc=$?
  local got; got="$(step_losses "$2/metrics.jsonl" 2>&1)"
  if [ $rc -ne 0 ]; then bad "$1: launch exited $rc"; cat "$(log_of "$2")"
  elif [ "$got" != "$3" ]; then bad "$1: losses differ from the uninterrupted run's"; cat "$(log_of "$2")"
  elif ! grep -Eq "\"cause\":\"($4)\"" "$2/events.jsonl" || ! grep -q '"event":"restart"' "$2/events.jsonl"; then
    bad "$1: events log lacks cause $4 and a restart: $(events "$2")"; cat "$(log_of "$2")"
  else ok "$1: restarted, $(grep -c '"event":"restart"' "$2/events.jsonl") restart(s), losses bitwise equal"; fi
}

# ---- references: uninterrupted runs, one process and two ranks ----
"$FOUNDRY" train --config tiny.json --synthetic-data -q --set train.run_dir=ref1 >ref1.log 2>&1 || bad "reference run failed"
ref1="$(step_losses ref1/metrics.jsonl)"
# Two ranks, one thread each, on the same schedule.
mpirun --oversubscribe --bind-to none -np 2 -x OMP_NUM_THREADS "$FOUNDRY" train --config tiny.json \
  --synthetic-data -q --steps 3000 --set train.run_dir=ref2 >ref2.log 2>&1 || bad "two-rank reference run failed"
ref2="$(step_losses ref2/metrics.jsonl)"

# ---- one process killed mid-step ----
launch kill1 1
wait_step kill1 120 && kill -9 "$(rank_pid kill1 0)"
check "SIGKILL mid-step (1 process)" kill1 "$ref1" signal

# ---- one process stopped: only the supervisor's heartbeat watch can see it ----
launch stop1 1
wait_step stop1 120 && pid=$(rank_pid stop1 0) && kill -STOP "$pid"
check "SIGSTOP (1 process)" stop1 "$ref1" rank_lost
kill -9 "$pid" 2>/dev/null
grep -q "is stopped (SIGSTOP?)" stop1.log && ok "the stopped process is named as stopped" \
  || { bad "no 'is stopped' in the launch log"; cat stop1.log; }

# ---- killed mid-save: the third save's shard half written ----
FOUNDRY_CHECKPOINT_FAULT='write@0#3:exit' launch save1 1
check "death mid-save (1 process)" save1 "$ref1" exit
ls save1/checkpoints | grep -q '\.tmp$' && bad "a staging directory was left behind" \
  || ok "the interrupted save's staging directory was removed"

# ---- killed mid-load: a resume paused while reading its checkpoint ----
"$FOUNDRY" train --config tiny.json --synthetic-data -q --set train.run_dir=load1 --stop-at-step 500 >load1.pre.log 2>&1
FOUNDRY_CHECKPOINT_FAULT='load@0:pause' launch load1 1
for _ in $(seq 100); do pid=$(test_pids "foundry train .*run_dir=load1") && [ -n "$pid" ] && break; sleep 0.1; done
sleep 2; kill -9 $pid  # paused in the load for two minutes
check "SIGKILL mid-load (1 process)" load1 "$ref1" signal

# ---- a load slower than --startup-timeout is no failure: the job beats while it loads ----
"$FOUNDRY" train --config tiny.json --synthetic-data -q --set train.run_dir=slow1 --stop-at-step 500 >slow1.pre.log 2>&1
FOUNDRY_CHECKPOINT_FAULT='load@0:sleep=6' launch slow1 1 --startup-timeout 2
wait $lpid; rc=$?
if [ $rc -ne 0 ] || grep -q '"event":"failure"' slow1/events.jsonl; then
  bad "a 6 s load under --startup-timeout 2: launch exited $rc, events: $(events slow1)"; cat slow1.log
elif [ "$(step_losses slow1/metrics.jsonl)" != "$ref1" ]; then bad "slow load: losses differ"
else ok "a 6 s load under --startup-timeout 2 finished without a restart"; fi
# SIGTERM to launch while its job loads (it beats, its stop handler not yet installed): the job
# ends by the signal, which is a stop, not a failure
# (two ranks: rank 1 has loaded its part and waits for rank 0)
mpirun --oversubscribe --bind-to none -np 2 -x OMP_NUM_THREADS "$FOUNDRY" train --config tiny.json \
  --synthetic-data -q --set train.run_dir=slow2 --stop-at-step 500 >slow2.pre.log 2>&1
FOUNDRY_CHECKPOINT_FAULT='load@0:sleep=6' launch slow2 2
for _ in $(seq 100); do grep -qs 'loading a checkpoint' slow2/heartbeat/rank_00000.json && break; sleep 0.1; done
kill -TERM $lpid
wait $lpid; rc=$?
if [ $rc -eq 75 ] && ! grep -q '"event":"failure"' slow2/events.jsonl \
  && [ "$(events slow2 | awk '{print $NF}')" = interrupted ] \
  && grep -q "received SIGTERM while starting: no step trained" "$(log_of slow2)"; then
  ok "SIGTERM to launch while its 2 ranks load a checkpoint: no step trained, interrupted, exit 75"
else bad "SIGTERM while loading: rc $rc, events: $(events slow2)"; cat "$(log_of slow2)"; fi

# Ctrl-C twice to launch while its job loads: the second is passed on as SIGINT, which ends a
# job still starting at once (a 30 s load here), the checkpoint as it was.
"$FOUNDRY" train --config tiny.json --synthetic-data -q --set train.run_dir=ctrlc --stop-at-step 500 >ctrlc.pre.log 2>&1
FOUNDRY_CHECKPOINT_FAULT='load@0:sleep=30' launch ctrlc 1
for _ in $(seq 100); do grep -qs 'loading a checkpoint' ctrlc/heartbeat/rank_00000.json && break; sleep 0.1; done
t0=$(date +%s)
kill -INT $lpid; sleep 0.5; kill -INT $lpid
wait $lpid; rc=$?
if [ $rc -eq 75 ] && [ $(( $(date +%s) - t0 )) -lt 15 ] && grep -q "second stop signal: passing SIGINT on" "$(log_of ctrlc)" \
   && [ "$(cat ctrlc/checkpoints/latest)" = step_00000500 ]; then
  ok "Ctrl-C twice to launch while its job loads: the job exits at once, exit 75"
else bad "Ctrl-C twice while loading: rc $rc after $(( $(date +%s) - t0 )) s"; cat "$(log_of ctrlc)"; fi

# ---- two ranks: rank 1 killed mid-step; rank 1 stopped (rank 0's heartbeat watch) ----
launch kill2 2 --steps 3000
wait_step kill2 300 && kill -9 "$(rank_pid kill2 1)"
check "SIGKILL of rank 1 mid-step (2 ranks)" kill2 "$ref2" "rank_lost"
# launch sees the rank's process vanish before mpirun's clean-up reports it.
grep -q "rank 1 (pid .*) has died (its process is gone; its last heartbeat was at step [0-9]* (" kill2.log \
  && grep -q '"event":"failure".*"rank":1' kill2/events.jsonl \
  && ok "launch names the killed rank 1 as dead" || { bad "the killed rank is not named"; cat kill2.log; }
# Heartbeats every 0.1 s here: rank 0's watch (2 s of silence) then fires about 0.8 s before
# launch's own (after 3 s), which leaves that long for MPI_Abort and mpirun to end the job.
launch stop2 2 --steps 3000 --set train.heartbeat_interval_s=0.1
wait_step stop2 300 && pid=$(rank_pid stop2 1) && kill -STOP "$pid"
check "SIGSTOP of rank 1 (2 ranks)" stop2 "$ref2" rank_lost
kill -9 "$pid" 2>/dev/null
grep -q "rank 1 (pid $pid on .*) at step .* is stopped (SIGSTOP?): no heartbeat" stop2.log \
  && grep -q "the job exited with code 3 (a rank died, stopped or hung" stop2.log \
  && ok "rank 0 names the stopped rank 1 and the job exits 3" || { bad "the stopped rank is not named"; cat stop2.log; }

# ---- in-memory checkpoints every 10 steps: a kill loses at most about 10 steps ----
# The first durable checkpoint is at step 2000, so a kill anywhere in the seconds between step
# 300 and it must resume from an in-memory checkpoint. (With durable ones every 250 steps, a
# kill landing within 10 steps after one resumes from it, as new as the in-memory one.)
launch mem2 2 --steps 3000 --set train.memory_checkpoint_every=10 train.memory_checkpoint_dir="$RAM" \
  train.checkpoint_every=2000
wait_step mem2 300 && kill -9 "$(rank_pid mem2 1)"
check "SIGKILL of rank 1 with in-memory checkpoints (2 ranks)" mem2 "$ref2" "exit|rank_lost"
lost=$(python3 -c "import json,sys; print([json.loads(l) for l in open(sys.argv[1])if '\"restart\"' in l][0]['steps_lost'])" mem2/events.jsonl)
# (a save skipped while the one before is still in flight can leave 20 steps between two)
grep -q "an in-memory checkpoint" mem2.log && [ "$lost" -le 21 ] \
  && ok "resumed from the in-memory checkpoint, $lost step(s) lost" \
  || { bad "in-memory resume: $lost step(s) lost"; cat mem2.log; }
[ -z "$(ls "$RAM")" ] && ok "the finished run removed its in-memory checkpoints" || bad "left in $RAM: $(ls "$RAM")"

# ---- one launch per run directory: a second is refused and changes nothing ----
launch dup 1
wait_step dup 50
events_before="$(cat dup/events.jsonl)"
"$FOUNDRY" launch --config tiny.json --synthetic-data -q --set train.run_dir=dup >dup2.log 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q "'dup' is in use by another foundry launch (pid $lpid on host" dup2.log \
  && [ "$(cat dup/events.jsonl)" = "$events_before" ] \
  && ok "a second launch on a supervised run directory is refused, its events untouched" \
  || { bad "second launch: rc=$rc"; cat dup2.log; }
wait $lpid; rc=$?
[ $rc -eq 0 ] && [ "$(step_losses dup/metrics.jsonl)" = "$ref1" ] \
  && ok "the first launch finished undisturbed" || { bad "first launch: rc=$rc"; cat dup.log; }

# ---- a run directory a launch supervises takes only the jobs that launch starts ----
# (between two attempts no job holds the directory: a job started by hand then would train
# beside the launch's next attempt). The launch's lock is held here by flock(1).
mkdir -p held && echo '{"pid": 4242, "host": "h", "since": "t"}' > held/launch.lock
flock held/launch.lock sleep 60 </dev/null >/dev/null 2>&1 & fpid=$!
for _ in $(seq 200); do flock -n held/launch.lock true || break; sleep 0.05; done  # until held
"$FOUNDRY" train --config tiny.json --synthetic-data -q --steps 2 --set train.run_dir=held \
  >held.log 2>&1; rc=$?
[ $rc -eq 1 ] && grep -q "'held' is supervised by foundry launch (pid 4242 on host h" held.log \
  && [ ! -e held/metrics.jsonl ] \
  && ok "a training job started beside a launch is refused and writes nothing" \
  || { bad "a job beside a launch: rc=$rc"; cat held.log; }
FOUNDRY_LAUNCH_PID=4242 "$FOUNDRY" train --config tiny.json --synthetic-data -q --steps 2 \
  --set train.run_dir=held >held2.log 2>&1; rc=$?
[ $rc -eq 0 ] && [ -e held/metrics.jsonl ] \
  && ok "the launch's own job trains in it" || { bad "the launch's own job: rc=$rc"; cat held2.log; }
pkill -P $fpid 2>/dev/null; kill $fpid 2>/dev/null; wait $fpid 2>/dev/null

# ---- with no durable checkpoint yet (checkpoint_every=0: only the final one), only the
# in-memory tier holds the run: the restart resumes from it, not from step 0 ----
launch mem1 1 --set train.memory_checkpoint_every=10 train.memory_checkpoint_dir="$RAM" \
  train.checkpoint_every=0
wait_step mem1 120 && kill -9 "$(rank_pid mem1 0)"
check "SIGKILL before the first durable checkpoint, in-memory checkpoints (1 process)" mem1 "$ref1" signal
lost=$(python3 -c "import json,sys; print([json.loads(l) for l in open(sys.argv[1])if '\"restart\"' in l][0]['steps_lost'])" mem1/events.jsonl)
# (a save skipped while the one before is still in flight can leave 20 steps between two)
grep -q "resumed from .*, an in-memory checkpoint (step" mem1.log && [ "$lost" -le 21 ] \
  && ok "resumed from the in-memory checkpoint alone, $lost step(s) lost" \
  || { bad "in-memory-only resume: $lost step(s) lost"; cat mem1.log; }

# ---- SIGTERM to launch under mpirun, with steps of about a second: the ranks (not mpirun,
# which would kill them) get it, save a checkpoint and exit; launch exits 75 ----
"$FOUNDRY" launch --config "$SRC/configs/moe-bench.json" --synthetic-data --np 2 --steps 100000 \
  --set train.run_dir=term2 train.peak_gflops=1000 train.checkpoint_every=0 >term2.log 2>&1 &
lpid=$!
( sleep 600; kill -9 $lpid ) >/dev/null 2>&1 & watchdog=$!  # a lost SIGTERM fails, not hangs
wait_step term2 2; kill -TERM $lpid; wait $lpid; rc=$?
pkill -P $watchdog 2>/dev/null; kill $watchdog 2>/dev/null
[ $rc -eq 75 ] && [ "$(grep -c 'received SIGTERM: checkpoint saved at step' term2.log)" -ge 1 ] \
  && [ -s term2/checkpoints/latest ] && ok "SIGTERM under mpirun: checkpoint saved, exit 75" \
  || { bad "SIGTERM under mpirun: rc=$rc"; cat term2.log; }

# ---- a full disk: the job stops, the supervisor retries until space is freed ----
mkdir -p disk
if mount -t tmpfs -o size=6M tmpfs disk 2>/dev/null; then
  launch disk/run 1 --max-restarts 50
  wait_step disk/run 120 && dd if=/dev/zero of=disk/filler bs=64k >/dev/null 2>&1
  for _ in $(seq 300); do grep -q '"event":"failure"' disk/run/events.jsonl 2>/dev/null && break
    grep -q 'launch: attempt 1 failed' disk_run.log && break; sleep 0.1; done
  sleep 1; rm -f disk/filler
  check "full disk (1 process)" disk/run "$ref1" exit
  grep -q "No space left on device" disk_run.log && ok "the job's error names the full disk" \
    || { bad "no ENOSPC in the log"; cat disk_run.log; }
  umount disk
else
  echo "skip: full disk (mounting a tmpfs needs root)"
fi

# ---- the restart budget spent: launch gives up, naming the attempt ----
launch gaveup 1 --max-restarts 0
wait_step gaveup 120 && kill -9 "$(rank_pid gaveup 0)"
wait $lpid; rc=$?
python3 - gaveup/events.jsonl <<'PY' && [ $rc -eq 1 ] \
  && ok "--max-restarts 0: a killed job ends launch with a gave_up event naming attempt 1" \
  || { bad "gave up: rc=$rc, events $(events gaveup)"; cat "$(log_of gaveup)"; }
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
assert ev[-1]["event"] == "gave_up" and ev[-1]["attempt"] == 1 and ev[-1]["restarts"] == 0, ev[-1]
PY

# ---- SIGTERM while launch waits to restart: it stops there, saying so ----
"$FOUNDRY" launch --config tiny.json --synthetic-data -q --np 1 --backoff 30 \
  --set train.run_dir=termwait train.checkpoint_every=100000 >termwait.log 2>&1 &
lpid=$!
wait_step termwait 50 && kill -9 "$(rank_pid termwait 0)"
for _ in $(seq 100); do grep -q '"event":"restart"' termwait/events.jsonl 2>/dev/null && break; sleep 0.1; done
kill -TERM $lpid; wait $lpid; rc=$?
python3 - termwait/events.jsonl <<'PY' && [ $rc -eq 75 ] && grep -q "launch: stopped before the run's first checkpoint: the same command starts it again" termwait.log \
  && ok "SIGTERM during the backoff: exit 75 with stop and interrupted events" \
  || { bad "SIGTERM during the backoff: rc=$rc, events $(events termwait)"; cat termwait.log; }
import json, sys
ev = [json.loads(l)["event"] for l in open(sys.argv[1])]
assert ev[-3:] == ["restart", "stop", "interrupted"], ev
PY

# ---- SIGTERM to the job's rank itself (a scheduler's preemption): the job saves a
# checkpoint and exits 75, and launch stops too instead of restarting it ----
launch preempt 1 --set train.checkpoint_every=100000
wait_step preempt 50 && kill -TERM "$(rank_pid preempt 0)"
wait $lpid; rc=$?
python3 - preempt/events.jsonl <<'PY' && [ $rc -eq 75 ] && [ -s preempt/checkpoints/latest ] \
  && ok "SIGTERM to the rank: launch stops with exit 75, no restart" \
  || { bad "SIGTERM to the rank: rc=$rc, events $(events preempt)"; cat "$(log_of preempt)"; }
import json, sys
ev = [json.loads(l)["event"] for l in open(sys.argv[1])]
assert "restart" not in ev and ev[-1] == "interrupted", ev
PY

# ---- SIGTERM to launch while its rank is stopped: the stop cannot be saved; launch still ends
# (the silent rank is lost), reports the failure and exits 75 instead of waiting forever ----
launch stopterm 1 --set train.checkpoint_every=100000
wait_step stopterm 50 && pid=$(rank_pid stopterm 0) && kill -STOP "$pid" && kill -TERM $lpid
for _ in $(seq 200); do kill -0 $lpid 2>/dev/null || break; sleep 0.1; done
if kill -0 $lpid 2>/dev/null; then
  bad "SIGTERM to launch with a stopped rank: still running after 20 s"; kill -9 $lpid "$pid"
  cat "$(log_of stopterm)"
else
  wait $lpid; rc=$?
  python3 - stopterm/events.jsonl <<'PY' && [ $rc -eq 75 ] \
    && ok "SIGTERM to launch with a stopped rank: the job ends, failure reported, exit 75" \
    || { bad "SIGTERM to launch with a stopped rank: rc=$rc, events $(events stopterm)"; cat "$(log_of stopterm)"; }
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
names = [e["event"] for e in ev]
assert names[-3:] == ["stop", "failure", "interrupted"], names
assert ev[-2]["cause"] == "rank_lost", ev[-2]
PY
fi

# ---- --overwrite over a run with checkpoints: the first attempt starts anew, and says so ----
"$FOUNDRY" launch --config tiny.json --synthetic-data -q --np 1 --steps 20 --overwrite \
  --set train.run_dir=preempt >over.log 2>&1
python3 - preempt/events.jsonl <<'PY' && grep -q "attempt 1: 1 rank(s), from the start (--overwrite)" over.log \
  && ok "launch --overwrite: attempt 1 starts from step 0, and its event says so" \
  || { bad "launch --overwrite's start"; cat over.log; }
import json, sys
starts = [e for e in map(json.loads, open(sys.argv[1])) if e["event"] == "start"]
assert starts[-1]["resume_step"] == 0, starts[-1]
PY

# ---- a stop while a 2-rank --overwrite job starts, before launch could signal any rank (it
# signals mpirun, which passes it on late): the ranks read launch's request where they agree
# on a stop before the first step, so the old run is never replaced after the stop ----
before="$(ls preempt/checkpoints) $(wc -l <preempt/metrics.jsonl)"
launch preempt 2 --overwrite --steps 100000
# (after launch has started the job: before, launch itself is still starting and dies by it)
for _ in $(seq 200); do grep -q "launch: attempt 1: " "$(log_of preempt)" && break; sleep 0.05; done
sleep 0.2; kill -TERM $lpid
wait $lpid; rc=$?
python3 - preempt/events.jsonl <<'PY' >overstop.order
import json, sys
ev = [e for e in map(json.loads, open(sys.argv[1]))]
ev = ev[max(i for i, e in enumerate(ev) if e["event"] == "start" and e.get("attempt") == 1):]
stop = min(e["unix"] for e in ev if e["event"] == "stop")
over = [e["unix"] for e in ev if e["event"] == "overwrite"]
print("after" if over and over[0] > stop else "before" if over else "none")
PY
order="$(cat overstop.order)"
if [ $rc -eq 75 ] && [ "$order" != after ] \
   && { [ "$order" = before ] || [ "$(ls preempt/checkpoints) $(wc -l <preempt/metrics.jsonl)" = "$before" ]; } \
   && [ ! -e preempt/heartbeat/stop ]; then
  ok "a stop while a 2-rank --overwrite job starts: no replacement after it (overwrite $order the stop), exit 75"
else bad "stop while a 2-rank --overwrite job starts: rc $rc, overwrite $order the stop"; cat "$(log_of preempt)"; fi
grep -q "it is as it was (run the same command to replace it" "$(log_of preempt)" || [ "$order" = before ] \
  || bad "the stopped --overwrite launch does not say the old run is as it was"
# Stopped once it has replaced the old run, launch says to resume without --overwrite (the
# same command would replace the new run in turn).
launch preempt 1 --overwrite --steps 100000
wait_step preempt 50 && kill -TERM $lpid
wait $lpid; rc=$?
[ $rc -eq 75 ] && grep -q "resume with the same command without --overwrite" "$(log_of preempt)" \
  && ok "a stopped launch --overwrite says to resume without --overwrite" \
  || { bad "stopped launch --overwrite: rc $rc"; cat "$(log_of preempt)"; }
# A first --overwrite attempt that fails after training steps (its first save meets a full
# disk) made headway, though the old run it replaced had logged more: it is retried.
FOUNDRY_CHECKPOINT_FAULT='write@0' "$FOUNDRY" launch --config tiny.json --synthetic-data -q --np 1 \
  --backoff 0.2 --steps 60 --overwrite --set train.run_dir=preempt train.checkpoint_every=20 >overfull.log 2>&1
rc=$?
[ $rc -eq 0 ] && grep -q "launch: attempt 2: " overfull.log && ! grep -q "before completing a step" overfull.log \
  && [ "$(tail -1 preempt/metrics.jsonl | python3 -c 'import json,sys; print(json.load(sys.stdin)["step"])')" = 60 ] \
  && ok "a first --overwrite attempt failing after its first steps is retried" \
  || { bad "a first --overwrite attempt failing after its first steps: rc $rc"; cat overfull.log; }

# ---- an --overwrite attempt that fails before it takes the run directory: the run there is as
# it was, and none of its steps count as this launch's ----
before="$(ls preempt/checkpoints)"
FOUNDRY_TRAIN_FAULT=bogus "$FOUNDRY" launch --config tiny.json --synthetic-data -q --np 1 --steps 20 \
  --overwrite --set train.run_dir=preempt >overfail.log 2>&1
rc=$?
python3 - preempt/events.jsonl <<'PY' && [ $rc -eq 1 ] && [ "$(ls preempt/checkpoints)" = "$before" ] \
  && grep -q "failed before its job replaced the old run" overfail.log \
  && ok "an --overwrite attempt failing at start-up counts none of the old run's steps" \
  || { bad "an --overwrite attempt failing at start-up (rc $rc)"; cat overfail.log; }
import json, sys
f = [e for e in map(json.loads, open(sys.argv[1])) if e["event"] == "failure"][-1]
assert (f["last_step"], f["steps_lost"], f["checkpoint_step"]) == (0, 0, 0), f
PY

# ---- a run directory held by a `foundry train` started by hand: launch refuses it and leaves
# that job running ----
"$FOUNDRY" train --config tiny.json --synthetic-data -q --steps 100000 \
  --set train.run_dir=byhand train.heartbeat_interval_s=0.5 >byhand.log 2>&1 &
tpid=$!
wait_step byhand 5
"$FOUNDRY" launch --config tiny.json --synthetic-data -q --np 1 --steps 100000 \
  --set train.run_dir=byhand >byhand-launch.log 2>&1
rc=$?
sleep 3  # the job would see its own heartbeats vanish within 2 s
if [ $rc -eq 1 ] && grep -q "is in use by another training job (pid $tpid" byhand-launch.log \
   && kill -0 $tpid 2>/dev/null && [ -s byhand/heartbeat/rank_00000.json ]; then
  ok "launch on a directory a hand-started train holds: refused, that job goes on"
else bad "launch over a hand-started train: rc=$rc"; cat byhand-launch.log byhand.log; fi
kill -TERM $tpid; wait $tpid

# ---- what is not retried: bad input fails once, before anything starts ----
"$FOUNDRY" launch --config tiny.json --synthetic-data -q --set train.run_dir=bad train.lr=-1 >bad.log 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q "train.lr" bad.log && ! grep -q "attempt" bad.log && [ ! -e bad ] \
  && ok "bad config: refused before the first attempt, exit 1" || { bad "bad config: rc=$rc"; cat bad.log; }
"$FOUNDRY" launch --config tiny.json -q --set train.run_dir=nodata >nodata.log 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q "data.dir" nodata.log && [ "$(grep -c 'launch: attempt .: ' nodata.log)" = 1 ] \
  && grep -q "before completing a step" nodata.log \
  && ok "a first attempt failing before its first step is not retried" || { bad "no dataset: rc=$rc"; cat nodata.log; }
# A job exiting 2 (its command line refused, here by a stand-in mpirun on the restart) is not
# retried: every restart would be refused the same way.
mkdir -p fakebin
cat > fakebin/mpirun <<'SH'
#!/bin/sh
# The first attempt loses a rank (exit 3: retried); the restart's command line is refused.
if [ -e fakebin/ran ]; then echo "mpirun: unrecognized option" >&2; exit 2; fi
: >fakebin/ran; exit 3
SH
chmod +x fakebin/mpirun
PATH="$PWD/fakebin:$PATH" "$FOUNDRY" launch --config tiny.json --synthetic-data -q --np 2 --backoff 0.2 \
  --max-restarts 3 --set train.run_dir=usage >usage.log 2>&1
rc=$?
[ $rc -eq 1 ] && [ "$(grep -c 'launch: attempt .: ' usage.log)" = 2 ] \
  && grep -q "exited with code 2 (its command line is wrong: it would fail the same way again)" usage.log \
  && ok "a job exiting 2 (command line refused) is not retried" || { bad "exit 2: rc=$rc"; cat usage.log; }
finish
