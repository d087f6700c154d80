#!/usr/bin/env bash
# Numerical anomalies end to end on a tiny model with synthetic data: injected faults
# (FOUNDRY_TRAIN_FAULT: a NaN in one rank's gradient at batch 5, a loss spike at batch 9)
# under train.anomaly_policy = skip and rollback, in one process and under mpirun -np 2,
# give the losses of a run without those batches (train.skip_batches = [5, 9]) bit for bit;
# events.jsonl names the step, batch and action; a run stopped after a rollback and resumed
# from a checkpoint older than the decision still drops the batch; repeated anomalies and
# anomaly_policy = stop end the run with exit status 1 and a report.
source "$(dirname "$0")/lib.sh"
cd "$WORK"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN=(mpirun --oversubscribe --bind-to none -np 2 -x OMP_NUM_THREADS=1 -x FOUNDRY_TRAIN_FAULT)

cat > tiny.json <<'JSON'
{
  "model": {"vocab_size": 300, "d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
            "head_dim": 8, "n_experts": 4, "top_k": 2, "ffn_dim": 48, "max_seq_len": 32},
  "train": {"steps": 12, "batch_size": 2, "seq_len": 16, "lr": 1e-2, "warmup_steps": 2,
            "precision": "fp32", "log_every": 4, "checkpoint_every": 4, "keep_checkpoints": 0,
            "spike_warmup": 4, "peak_gflops": 100, "run_dir": "run"},
  "data": {"dir": ""}
}
JSON
FAULTS="nan_grad@5,loss_spike@9"

losses() { python3 -c "import json,sys; print(' '.join(repr(json.loads(l)['loss']) for l in open(sys.argv[1])))" "$1"; }
steps() { python3 -c "import json,sys; print(' '.join(str(json.loads(l)['step']) for l in open(sys.argv[1])))" "$1"; }
train() { "$FOUNDRY" train --config tiny.json --synthetic-data -q "$@"; }

# same_losses WHAT REF RUN [BATCHES]: the runs' metrics.jsonl hold the same 12 losses, bit
# for bit (REF trained without BATCHES, default "5 and 9").
same_losses() {
  local a b
  a="$(losses "$2/metrics.jsonl")"; b="$(losses "$3/metrics.jsonl")"
  if [ -n "$a" ] && [ "$a" = "$b" ] && [ "$(steps "$3/metrics.jsonl")" = "$(seq -s ' ' 1 12)" ]; then
    ok "$1: the losses of the run without batches ${4:-5 and 9}, bitwise"
  else bad "$1: losses differ or steps are not 1..12: ref [$a] run [$b] steps [$(steps "$3/metrics.jsonl")]"; fi
}

# expect_events WHAT RUN_DIR PYTHON-CONDITION (over `ev`, the list of events)
expect_events() {
  if python3 - "$2" "$3" <<'PY'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1] + "/events.jsonl")]
sys.exit(0 if eval("(" + sys.argv[2] + ")") else 1)
PY
  then ok "$1"; else bad "$1:"; sed 's/^/    /' "$2/events.jsonl"; fi
}
ANOMALIES='[(e["step"], e["batch"], e["kind"], e["action"]) for e in ev if e["event"] == "anomaly"]'

# ---- one process ----
train --set train.run_dir=ref --set 'train.skip_batches=[5,9]' >/dev/null 2>&1 || bad "reference run failed"

FOUNDRY_TRAIN_FAULT=$FAULTS train --set train.run_dir=skip >skip.log 2>&1 || { bad "skip run failed"; cat skip.log; }
same_losses "skip" ref skip
expect_events "skip: events name step, batch, kind and action" skip \
  "$ANOMALIES == [(5, 5, 'nan_grad', 'skip'), (8, 9, 'spike', 'skip')] and
   [(e['step'], e['batch']) for e in ev if e['event'] == 'skip'] == [(5, 5), (8, 9)]"
grep -q "anomaly at step 5 (batch 5): gradient norm nan" skip.log && ok "skip: the console names the anomaly" \
  || { bad "skip: no console line"; cat skip.log; }
python3 -c "import json; b = json.load(open('skip/skipped_batches.json'))['batches']; assert [x['batch'] for x in b] == [5, 9]" \
  && ok "skip: skipped_batches.json lists batches 5 and 9" || bad "skip: skipped_batches.json"

FOUNDRY_TRAIN_FAULT=$FAULTS train --set train.run_dir=rollback --set train.anomaly_policy=rollback \
  >rollback.log 2>&1 || { bad "rollback run failed"; cat rollback.log; }
same_losses "rollback" ref rollback
expect_events "rollback: events name the anomalies and the checkpoints rolled back to" rollback \
  "$ANOMALIES == [(5, 5, 'nan_grad', 'rollback'), (8, 9, 'spike', 'rollback')] and
   [(e['step'], e['batch'], e['to_step']) for e in ev if e['event'] == 'rollback'] == [(5, 5, 4), (8, 9, 4)]"

# A rollback before the first checkpoint skips the batch (nothing was updated since the start).
train --set train.run_dir=ref_b2 --set 'train.skip_batches=[2]' >/dev/null 2>&1 || bad "reference run without batch 2 failed"
FOUNDRY_TRAIN_FAULT=nan_loss@2 train --set train.run_dir=early --set train.anomaly_policy=rollback \
  >early.log 2>&1 || { bad "early rollback run failed"; cat early.log; }
same_losses "rollback before the first checkpoint" ref_b2 early 2
grep -q "no checkpoint to roll back to yet" early.log && ok "early rollback: says it skipped instead" \
  || { bad "early rollback: no message"; cat early.log; }

# Stopped after the rollback (at step 6), resumed from the checkpoint of step 4, written
# before batch 5 was dropped: the run directory's record drops it again.
FOUNDRY_TRAIN_FAULT=$FAULTS train --set train.run_dir=resumed --set train.anomaly_policy=rollback \
  --stop-at-step 6 >/dev/null 2>&1 || bad "first half failed"
rm -rf resumed/checkpoints/step_00000006
echo step_00000004 > resumed/checkpoints/latest
FOUNDRY_TRAIN_FAULT=loss_spike@9 train --set train.run_dir=resumed --set train.anomaly_policy=rollback \
  --resume >resumed.log 2>&1 || { bad "resumed half failed"; cat resumed.log; }
grep -q "step 4" resumed.log && ok "resume: from the checkpoint of step 4" || { bad "resume: not from step 4"; cat resumed.log; }
same_losses "stop and resume after a rollback" ref resumed
expect_events "resume: batch 5 was not trained again (no new anomaly on it)" resumed \
  "[a[1] for a in $ANOMALIES] == [5, 9]"

# ---- mpirun -np 2: one rank's NaN gradient and loss spike stop every rank's update ----
"${MPIRUN[@]}" "$FOUNDRY" train --config tiny.json --synthetic-data -q --set train.run_dir=ref2 \
  --set 'train.skip_batches=[5,9]' >/dev/null 2>&1 || bad "np 2 reference run failed"
for policy in skip rollback; do
  FOUNDRY_TRAIN_FAULT=$FAULTS "${MPIRUN[@]}" "$FOUNDRY" train --config tiny.json --synthetic-data -q \
    --set train.run_dir=${policy}2 --set train.anomaly_policy=$policy >${policy}2.log 2>&1 \
    || { bad "np 2 $policy run failed"; cat ${policy}2.log; }
  same_losses "np 2 $policy" ref2 ${policy}2
  expect_events "np 2 $policy: events from rank 0 only, once each" ${policy}2 \
    "$ANOMALIES == [(5, 5, 'nan_grad', '$policy'), (8, 9, 'spike', '$policy')]"
done

# ---- repeated anomalies and anomaly_policy = stop: exit status 1 with a report ----
FOUNDRY_TRAIN_FAULT=nan_grad@5,nan_loss@6,nan_grad@7 train --set train.run_dir=repeated >repeated.log 2>&1
rc=$?
if [ $rc -eq 1 ] && grep -q "^error: .*3 anomalies in a row" repeated.log \
   && grep -q "step 5 (batch 7): gradient norm nan" repeated.log && grep -q "^hint: .*train.skip_batches=\[5,6,7\]" repeated.log; then
  ok "three anomalies in a row stop the run (exit 1) with a report"
else bad "repeated anomalies: rc=$rc"; cat repeated.log; fi
expect_events "repeated: the stop is an event" repeated "ev[-1]['event'] == 'stop' and ev[-1]['batch'] == 7"
# What the report says to do: resume without the batches.
train --set train.run_dir=repeated --resume --set 'train.skip_batches=[5,6,7]' >/dev/null 2>&1 \
  || bad "resume with the report's train.skip_batches failed"
train --set train.run_dir=ref_567 --set 'train.skip_batches=[5,6,7]' >/dev/null 2>&1 || bad "reference run without 5, 6, 7 failed"
same_losses "resumed as the report says" ref_567 repeated "5, 6 and 7"

FOUNDRY_TRAIN_FAULT=nan_loss@3 "${MPIRUN[@]}" "$FOUNDRY" train --config tiny.json --synthetic-data -q \
  --set train.run_dir=stop2 --set train.anomaly_policy=stop >stop2.log 2>&1
rc=$?
if [ $rc -ne 0 ] && grep -q "train.anomaly_policy = stop" stop2.log && grep -q "step 3 (batch 3): loss nan" stop2.log; then
  ok "np 2: anomaly_policy = stop ends the job with the report"
else bad "np 2 stop: rc=$rc"; cat stop2.log; fi

FOUNDRY_TRAIN_FAULT=nan_grad@x expect_fail "malformed FOUNDRY_TRAIN_FAULT" "nan_grad@x" \
  "$FOUNDRY" train --config tiny.json --synthetic-data -q --set train.run_dir=bad
# Checked before --overwrite removes anything: the previous run stays.
FOUNDRY_TRAIN_FAULT=bogus@3 expect_fail "malformed FOUNDRY_TRAIN_FAULT with --overwrite" "bogus@3" \
  "$FOUNDRY" train --config tiny.json --synthetic-data -q --set train.run_dir=repeated --overwrite
[ -f repeated/metrics.jsonl ] && ! grep -q '"overwrite"' repeated/events.jsonl \
  && ok "a malformed FOUNDRY_TRAIN_FAULT leaves the run --overwrite named as it was" \
  || bad "a malformed FOUNDRY_TRAIN_FAULT: --overwrite removed the run first"
# A stop while the run starts (FOUNDRY_TRAIN_FAULT=sigterm@0: the last rank's own SIGTERM once
# its model is built): --overwrite has removed nothing yet, so the previous run stays whole and
# resumable (exit 75). Two ranks: only rank 1 has the signal, and rank 0 agrees. The same
# --overwrite without the stop replaces the run.
listing() { echo "$(ls "$1/checkpoints") $(cat "$1/checkpoints/latest") $(wc -l <"$1/metrics.jsonl")"; }
for np in 1 2; do
  dir=rollback; [ $np = 2 ] && dir=rollback2
  before="$(listing $dir)"
  run_np() { if [ $np = 2 ]; then "${MPIRUN[@]}" "$FOUNDRY" train --config tiny.json --synthetic-data -q "$@"; else train "$@"; fi; }
  FOUNDRY_TRAIN_FAULT=sigterm@0 run_np --set train.run_dir=$dir --overwrite >over_stop$np.log 2>&1
  rc=$?
  if [ $rc -eq 75 ] && [ "$(listing $dir)" = "$before" ] && ! grep -q '"overwrite"' $dir/events.jsonl \
     && grep -q "received SIGTERM while starting: no step trained" over_stop$np.log \
     && ! grep -q "overwrite: removed" over_stop$np.log; then
    ok "np $np: a stop while an --overwrite run starts removes nothing (exit 75)"
  else bad "np $np: a stop while an --overwrite run starts: rc $rc, before '$before', after '$(listing $dir)'"; cat over_stop$np.log; fi
  run_np --set train.run_dir=$dir --overwrite >over$np.log 2>&1
  rc=$?
  [ $rc -eq 0 ] && grep -q "overwrite: removed the previous run's files" over$np.log \
    && [ "$(steps $dir/metrics.jsonl)" = "$(seq -s ' ' 1 12)" ] \
    && ok "np $np: --overwrite without the stop replaces the run" \
    || { bad "np $np: --overwrite: rc $rc"; cat over$np.log; }
done
expect_fail "bad skip_batches" "train.skip_batches" \
  "$FOUNDRY" train --config tiny.json --synthetic-data -q --set train.run_dir=bad --set 'train.skip_batches=[0]'
finish
