#!/usr/bin/env bash
# Fault tolerance on a GPU (label gpu; exits 77, a skip, where the build has no CUDA backend or
# no GPU is visible), as tests/launch_faults_test.sh and tests/anomaly_test.sh check it on the
# CPU:
#  1. `foundry launch` restarts a GPU run whose process was killed with SIGKILL mid-step, or
#     stopped (SIGSTOP: only the heartbeats show it), in one process and with two ranks
#     sharing the GPU (rank 1 killed), and from an in-memory checkpoint taken out of device
#     memory; each supervised run ends with the uninterrupted run's losses bit for bit, its
#     events log naming the failure and the restart;
#  2. an injected NaN gradient and loss spike under anomaly_policy = skip and rollback give the
#     losses of a run without those batches, bit for bit.
# FOUNDRY_TEST_DEVICE=cpu with FOUNDRY_POSE_AS_DEVICE=1 runs the same on a machine without a GPU,
# the CPU backend posing as the device (the paths of a GPU run on the CPU's kernels).
source "$(dirname "$0")/lib.sh"
cd "$WORK"
GPU="${FOUNDRY_TEST_DEVICE:-cuda:0}"
# One process runs STEPS steps: on a GPU (a few ms a step for this tiny model) 2,000, so that a
# kill at step 300 lands well before the end; posing on the CPU, 800 are enough. Two ranks
# sharing a GPU step slower (their gradients go through host memory): 800 there.
STEPS=2000
[ "$GPU" = cpu ] && STEPS=800
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

cat > tiny.json <<'JSON'
{
  "model": {"vocab_size": 300, "d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
            "head_dim": 32, "n_experts": 4, "top_k": 2, "ffn_dim": 96, "max_seq_len": 64},
  "train": {"steps": STEPS, "batch_size": 4, "seq_len": 64, "lr": 3e-3, "warmup_steps": 2,
            "precision": "fp32", "log_every": 1000, "checkpoint_every": 200,
            "keep_checkpoints": 3, "peak_gflops": 100, "run_dir": "probe", "device": "cuda:0",
            "heartbeat_interval_s": 0.5, "heartbeat_timeout_s": 5},
  "data": {"dir": ""}
}
JSON
sed -i "s/\"cuda:0\"/\"$GPU\"/; s/STEPS/$STEPS/" tiny.json

probe="$("$FOUNDRY" train -c tiny.json --synthetic-data --steps 1 -q 2>&1)"
[ $? -eq 0 ] || gpu_probe_failed "train" "$probe"

launch() {  # DIR NP [--set ...]: `foundry launch` in the background, its pid in $lpid
  local dir="$1" np="$2"
  shift 2
  timeout -k 5 300 "$FOUNDRY" launch --config tiny.json --synthetic-data -q --np "$np" \
    --backoff 0.2 --set train.run_dir="$dir" "$@" >"$dir.log" 2>&1 &
  lpid=$!
}
# check NAME DIR REFERENCE CAUSE: launch exited 0, the losses equal the reference's, the
# events log holds a failure with CAUSE (a regex) and a restart.
check() {
  wait $lpid; local rc=$?
  local got; got="$(step_losses "$2/metrics.jsonl" 2>&1)"
  if [ $rc -ne 0 ]; then bad "$1: launch exited $rc"; tail -n 20 "$2.log"
  elif [ "$got" != "$3" ]; then bad "$1: losses differ from the uninterrupted run's"; tail -n 20 "$2.log"
  elif ! grep -Eq "\"cause\":\"($4)\"" "$2/events.jsonl" || ! grep -q '"event":"restart"' "$2/events.jsonl"; then
    bad "$1: the events log lacks cause $4 and a restart"; cat "$2/events.jsonl"
  else ok "$1: restarted on $GPU, losses bitwise equal to the uninterrupted run's"; fi
}

# ---- the uninterrupted runs: one process, two ranks sharing the GPU ----
"$FOUNDRY" train -c tiny.json --synthetic-data -q --set train.run_dir=ref1 >ref1.log 2>&1 \
  || { tail -n 20 ref1.log; bad "the reference run failed"; }
ref1="$(step_losses ref1/metrics.jsonl)"
timeout -k 5 300 mpirun --oversubscribe --bind-to none -np 2 -x OMP_NUM_THREADS "$FOUNDRY" train \
  -c tiny.json --synthetic-data -q --steps 800 --set train.run_dir=ref2 >ref2.log 2>&1 \
  || { tail -n 20 ref2.log; bad "the two-rank reference run failed"; }
ref2="$(step_losses ref2/metrics.jsonl)"

# ---- one process killed mid-step, one stopped ----
launch kill1 1
wait_step kill1 300 && kill -9 "$(rank_pid kill1 0)"
check "SIGKILL mid-step (1 process)" kill1 "$ref1" signal
launch stop1 1
pid=""
wait_step stop1 300 && pid=$(rank_pid stop1 0) && kill -STOP "$pid"
check "SIGSTOP (1 process)" stop1 "$ref1" rank_lost
[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null

# ---- two ranks on one GPU: rank 1 killed mid-step ----
launch kill2 2 --steps 800
wait_step kill2 300 && kill -9 "$(rank_pid kill2 1)"
check "SIGKILL of rank 1 mid-step (2 ranks on one GPU)" kill2 "$ref2" "rank_lost|exit"

# ---- in-memory checkpoints from device memory every 10 steps (the first durable one at the
# end): a kill resumes from the newest in memory ----
launch mem1 1 --set train.memory_checkpoint_every=10 train.memory_checkpoint_dir="$RAM" \
  train.checkpoint_every="$STEPS"
wait_step mem1 300 && kill -9 "$(rank_pid mem1 0)"
check "SIGKILL with in-memory checkpoints (1 process)" mem1 "$ref1" signal
grep -q "an in-memory checkpoint" mem1.log && ok "the restart resumed from an in-memory checkpoint" \
  || { bad "no resume from an in-memory checkpoint"; tail -n 20 mem1.log; }
[ -z "$(ls "$RAM")" ] && ok "the finished run removed its in-memory checkpoints" || bad "left in $RAM: $(ls "$RAM")"

# ---- anomalies: a NaN gradient at batch 5 and a loss spike at batch 9, skipped or rolled
# back, against a run that never trained those batches ----
anomaly() { "$FOUNDRY" train -c tiny.json --synthetic-data -q --steps 12 --set train.lr=1e-2 \
  --set train.log_every=4 --set train.checkpoint_every=4 --set train.keep_checkpoints=0 \
  --set train.spike_warmup=4 "$@"; }
anomaly --set train.run_dir=without --set 'train.skip_batches=[5,9]' >without.log 2>&1 \
  || { tail -n 20 without.log; bad "the run without batches 5 and 9 failed"; }
for policy in skip rollback; do
  FOUNDRY_TRAIN_FAULT="nan_grad@5,loss_spike@9" anomaly --set train.run_dir=$policy \
    --set train.anomaly_policy=$policy >$policy.log 2>&1 || { tail -n 20 $policy.log; bad "$policy run failed"; }
  a="$(step_losses without/metrics.jsonl 2>&1)" b="$(step_losses $policy/metrics.jsonl 2>&1)"
  if [ -n "$a" ] && [ "$a" = "$b" ] && [ "$(wc -l <$policy/metrics.jsonl)" = 12 ]; then
    ok "anomaly_policy=$policy on $GPU: the losses of the run without batches 5 and 9, bitwise"
  else bad "anomaly_policy=$policy on $GPU: [$b] against [$a]"; fi
  grep -q "anomaly at step 5 (batch 5): gradient norm nan" $policy.log \
    && ok "$policy: the console names the NaN gradient" || { bad "$policy: no anomaly line"; tail -n 20 $policy.log; }
done

finish
