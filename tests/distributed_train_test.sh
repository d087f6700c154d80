#!/usr/bin/env bash
# Distributed training under mpirun: 1, 2 and 4 ranks (data parallel + ZeRO-1, and expert
# parallel) give the same losses within the reduction-order tolerance; the same layout twice
# is bitwise identical; a checkpoint written at one layout resumes at others; and failures
# (ranks with different configs, a killed rank, layouts that do not divide) end the job with a
# clear error instead of hanging.
source "$(dirname "$0")/lib.sh"
cd "$WORK"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
MPIRUN=(mpirun --oversubscribe --bind-to none)
# Reduction order differs between layouts (gradients summed over ranks in another order, then
# clipped and fed to AdamW/Muon; AdamW's first steps are sign-like on nearly cancelling
# gradients, and top-k routing could flip on a last-bit difference): the losses of 30 fp32
# steps must agree to 1e-6 relative (measured: about 1e-8).
TOL=1e-6

cat > moe.json <<'JSON'
{
  "model": {"vocab_size": 300, "d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
            "head_dim": 8, "n_experts": 4, "top_k": 2, "ffn_dim": 48, "max_seq_len": 32,
            "aux_loss_coef": 0},
  "train": {"steps": 30, "batch_size": 4, "seq_len": 16, "lr": 3e-3, "warmup_steps": 5,
            "optimizer": "muon", "muon_ns_precision": "fp32", "precision": "fp32",
            "log_every": 10, "checkpoint_every": 0, "peak_gflops": 100, "run_dir": "run"},
  "data": {"dir": ""}
}
JSON
cat > zaya.json <<'JSON'
{
  "model": {"arch": "zaya1", "vocab_size": 300, "d_model": 32, "n_layers": 2, "n_heads": 4,
            "n_kv_heads": 2, "head_dim": 8, "n_experts": 4, "top_k": 1, "ffn_dim": 48,
            "router_latent_dim": 16, "rope_fraction": 0.5, "max_seq_len": 32},
  "train": {"steps": 30, "batch_size": 4, "seq_len": 16, "lr": 3e-3, "warmup_steps": 5,
            "optimizer": "adamw", "precision": "fp32", "log_every": 10, "checkpoint_every": 0,
            "peak_gflops": 100, "run_dir": "run"},
  "data": {"dir": ""}
}
JSON

losses() { python3 -c "import json,sys; print(' '.join(repr(json.loads(l)['loss']) for l in open(sys.argv[1])))" "$1"; }
close() {  # close A B: every loss of run B within TOL of run A's (relative), same count
  python3 - "$1/metrics.jsonl" "$2/metrics.jsonl" "$TOL" <<'PY'
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
tol = float(sys.argv[3])
assert len(a) == len(b) and a, (len(a), len(b))
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print(f"    worst relative difference {worst:.2e} over {len(a)} steps")
assert worst <= tol, worst
PY
}
train() {  # train NP CONFIG RUN_DIR [extra args]
  local np="$1" config="$2" dir="$3"
  shift 3
  if [ "$np" = 1 ]; then
    "$FOUNDRY" train --config "$config" --synthetic-data --set train.run_dir="$dir" -q "$@"
  else
    timeout 300 "${MPIRUN[@]}" -np "$np" "$FOUNDRY" train --config "$config" --synthetic-data \
      --set train.run_dir="$dir" -q "$@"
  fi
}

# ---- equivalence across layouts ----
for arch in moe zaya; do
  train 1 $arch.json $arch-1 >$arch-1.log 2>&1 || { bad "$arch: single process failed"; cat $arch-1.log; }
  for layout in "2 1" "4 1" "4 2" "2 2"; do
    set -- $layout
    np=$1 ep=$2
    run=$arch-$np-ep$ep
    if train "$np" $arch.json $run --set train.expert_parallel=$ep >$run.log 2>&1; then
      if close $arch-1 $run; then ok "$arch: $np ranks (expert parallel $ep) match one process"
      else bad "$arch: $np ranks (expert parallel $ep) differ from one process"; fi
    else bad "$arch: $np ranks (expert parallel $ep) failed"; cat $run.log; fi
  done
done

# Micro-batches (train.micro_batch_size 1: four in one process, two a rank at 2 ranks, with
# the reduction overlapping the last backward and, at expert parallel 2, the experts' gradients
# accumulated across the exchange): the same losses as the whole batch at once.
for arch in moe zaya; do
  for layout in "1 1" "2 1" "2 2"; do
    set -- $layout
    np=$1 ep=$2
    run=$arch-micro-$np-ep$ep
    if train "$np" $arch.json $run --set train.expert_parallel=$ep train.micro_batch_size=1 >$run.log 2>&1; then
      if close $arch-1 $run; then ok "$arch: micro-batches of 1 at $np rank(s) (expert parallel $ep) match the whole batch"
      else bad "$arch: micro-batches at $np rank(s) (expert parallel $ep) differ from the whole batch"; fi
    else bad "$arch: micro-batches at $np rank(s) failed"; cat $run.log; fi
  done
done

# The load-balancing loss counts expert shares over the global batch, so with it on the
# losses still match across layouts.
train 1 moe.json aux-1 --set model.aux_loss_coef=0.05 >aux-1.log 2>&1 || { bad "aux loss: single process failed"; cat aux-1.log; }
for layout in "2 1" "4 2"; do
  set -- $layout
  if train "$1" moe.json aux-$1-$2 --set model.aux_loss_coef=0.05 --set train.expert_parallel=$2 >aux.log 2>&1; then
    close aux-1 aux-$1-$2 && ok "moe with aux_loss_coef 0.05: $1 ranks (expert parallel $2) match one process" \
      || bad "moe with the aux loss: $1 ranks (expert parallel $2) differ from one process"
  else bad "moe with the aux loss at $1 ranks failed"; cat aux.log; fi
done

# ---- the same layout twice: bitwise ----
train 2 moe.json again >again.log 2>&1 || bad "second 2-rank run failed"
if [ "$(losses moe-2-ep1/metrics.jsonl)" = "$(losses again/metrics.jsonl)" ]; then
  ok "the same 2-rank layout twice gives bitwise-identical losses"
else bad "2-rank runs differ: $(losses moe-2-ep1/metrics.jsonl) / $(losses again/metrics.jsonl)"; fi

# ---- gradient reduction: overlapped with backward or not, ZeRO-1 or replicated ----
# Every gradient element is summed in rank order whatever the buckets (optim/grad_reduce.h),
# so overlap on or off and any bucket size give bitwise the default run's losses at any rank
# count. grad_bucket_mib=0 starts a bucket at every report of the backward pass (these models
# are far smaller than the default 16 MiB bucket). Replicated optimizer state (zero1=false)
# sums the gradient norm in another order: within TOL at 4 ranks; at 2 ranks the orders
# coincide.
same_as() {  # same_as REFERENCE_RUN RUN DESCRIPTION
  [ "$(losses $1/metrics.jsonl)" = "$(losses $2/metrics.jsonl)" ] \
    && ok "$3: bitwise equal to the default run" || bad "$3: losses differ from the default run"
}
for variant in "overlap_grad_reduce=false" "grad_bucket_mib=0" "zero1=false" \
               "zero1=false --set train.overlap_grad_reduce=false"; do
  run="moe-2-$(echo "$variant" | tr -c 'a-z0-9' _)"
  if train 2 moe.json "$run" --set train.$variant >"$run.log" 2>&1; then
    same_as moe-2-ep1 "$run" "2 ranks with train.$variant"
  else bad "2 ranks with train.$variant failed"; cat "$run.log"; fi
done
for arch in moe zaya; do
  for variant in "grad_bucket_mib=0" "overlap_grad_reduce=false" "zero1=false --set train.grad_bucket_mib=0"; do
    run="$arch-4-ep2-$(echo "$variant" | tr -c 'a-z0-9' _)"
    what="$arch: 4 ranks (expert parallel 2) with train.$variant"
    if ! train 4 $arch.json "$run" --set train.expert_parallel=2 --set train.$variant >"$run.log" 2>&1; then
      bad "$what failed"; cat "$run.log"
    elif [[ "$variant" == zero1=false* ]]; then
      close $arch-1 "$run" && ok "$what matches one process" || bad "$what differs from one process"
    else
      same_as $arch-4-ep2 "$run" "$what"
    fi
  done
done

# The run reports memory per rank, and ZeRO-1 keeps half of AdamW's 8 bytes a parameter; on
# the CPU its report counts the reduced gradient shard too (4 bytes, halved): 6 of the 8.
mem() {  # mem NP ZERO1: prints this rank-0 optimizer state in MiB
  train "$1" moe.json mem-$1-$2 --set train.zero1=$2 train.optimizer=adamw model.d_model=128 \
    model.head_dim=32 model.ffn_dim=512 --steps 2 --op-breakdown 2>&1 \
    | sed -n 's/^memory per rank: optimizer state \([0-9.]*\) MiB.*peak RSS before the final checkpoint rank 0 [0-9]* MiB, rank 1 [0-9]* MiB.*/\1/p'
}
sharded="$(mem 2 true)"; replicated="$(mem 2 false)"
if [ "${FOUNDRY_POSE_AS_DEVICE:-0}" = 1 ]; then share=0.5; else share=0.75; fi
if [ -n "$sharded" ] && [ -n "$replicated" ] \
   && python3 -c "import sys; s, r, f = map(float, sys.argv[1:]); assert abs(s / r - f) <= 0.05" "$sharded" "$replicated" "$share"; then
  ok "memory per rank reported: optimizer state $sharded MiB with ZeRO-1 against $replicated MiB replicated"
else bad "memory per rank: ZeRO-1 '$sharded' MiB, replicated '$replicated' MiB"; fi

# ---- checkpoints: written at 2 ranks, resumed at 2 (bitwise), 1 and 4 (within tolerance) ----
train 2 moe.json ck --set train.checkpoint_every=15 --stop-at-step 15 >ck.log 2>&1 \
  || { bad "2-rank run to step 15 failed"; cat ck.log; }
for np in 2 1 4; do
  rm -rf ck$np && cp -r ck ck$np
  if train "$np" moe.json ck$np --resume >ck$np.log 2>&1; then
    if [ "$np" = 2 ]; then
      [ "$(losses moe-2-ep1/metrics.jsonl)" = "$(losses ck2/metrics.jsonl)" ] \
        && ok "resumed at 2 ranks: bitwise equal to the straight 2-rank run" \
        || bad "2-rank resume differs from the straight run"
    else
      close moe-2-ep1 ck$np && ok "written at 2 ranks, resumed at $np: matches the straight run" \
        || bad "resume at $np ranks differs"
    fi
  else bad "resume at $np ranks failed"; cat ck$np.log; fi
done

# Expert-parallel checkpoints: ranks store only their experts (Model::shard_expert_storage),
# so rank 0 gathers the others' before writing and every rank drops them again after
# loading. Written at 4 ranks with expert parallel 2, resumed there (bitwise) and in one
# process (within TOL).
train 4 moe.json ckep --set train.expert_parallel=2 --set train.checkpoint_every=15 --stop-at-step 15 \
  >ckep.log 2>&1 || { bad "4-rank expert-parallel run to step 15 failed"; cat ckep.log; }
rm -rf ckep4 ckep1 && cp -r ckep ckep4 && cp -r ckep ckep1
if train 4 moe.json ckep4 --set train.expert_parallel=2 --resume >ckep4.log 2>&1; then
  same_as moe-4-ep2 ckep4 "written and resumed at 4 ranks (expert parallel 2)"
else bad "expert-parallel resume at 4 ranks failed"; cat ckep4.log; fi
if train 1 moe.json ckep1 --resume >ckep1.log 2>&1; then
  close moe-4-ep2 ckep1 && ok "written at 4 ranks (expert parallel 2), resumed in one process: matches" \
    || bad "expert-parallel checkpoint resumed in one process differs"
else bad "expert-parallel checkpoint resume in one process failed"; cat ckep1.log; fi

# Expert storage: with expert parallel 2 a rank holds half the experts' weights and
# gradients (the slabs' resident pages, as `foundry train` reports them).
cat > wide.json <<'JSON'
{
  "model": {"vocab_size": 300, "d_model": 128, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
            "head_dim": 32, "n_experts": 8, "top_k": 2, "ffn_dim": 1024, "max_seq_len": 32,
            "aux_loss_coef": 0},
  "train": {"steps": 2, "batch_size": 4, "seq_len": 16, "lr": 3e-3, "precision": "fp32",
            "log_every": 10, "checkpoint_every": 0, "peak_gflops": 100, "run_dir": "run"},
  "data": {"dir": ""}
}
JSON
slabs() {  # slabs EP: rank 0's resident weight and gradient slabs in MiB at 2 ranks
  train 2 wide.json wide-$1 --set train.expert_parallel=$1 --op-breakdown 2>&1 \
    | sed -n 's/^memory per rank:.*weight and gradient slabs rank 0 \([0-9]*\) MiB.*/\1/p'
}
full="$(slabs 1)"; half="$(slabs 2)"
# Experts: 2 layers x 8 x 3 x 128 x 1024 floats = 24 MiB of weights and 24 of gradients. At
# expert parallel 2 a rank drops the gradients of the other half (12 MiB) and the weights of
# those outside its ZeRO-1 shard (about half of them). On a device (the CPU posing as one) it
# keeps the gradients of its state range too, which its reduction writes in place: about 6
# MiB of each.
least=15
[ -n "${FOUNDRY_POSE_AS_DEVICE:-}" ] && least=9
if [ -n "$full" ] && [ -n "$half" ] && [ $((full - half)) -ge $least ]; then
  ok "expert parallel 2 stores less: weight and gradient slabs $half MiB against $full MiB"
else bad "expert storage: slabs '$half' MiB at expert parallel 2 against '$full' MiB"; fi

# ---- context parallelism: each sequence in 2C chunks, two per rank ----
# C = 2 and 4 alone, DP 2 × CP 2, and with expert parallelism across the CP groups; the
# losses match one process's (seq_len 16: chunks of 4 and 2 tokens, so the CCA convolutions
# and the value shift read across every chunk boundary).
for arch in moe zaya; do
  for layout in "2 2 1" "4 4 1" "4 2 1" "4 2 2" "4 2 4"; do
    set -- $layout
    np=$1 cp=$2 ep=$3
    run=$arch-$np-cp$cp-ep$ep
    what="$arch: $np ranks, context parallel $cp, expert parallel $ep"
    if train "$np" $arch.json $run --set train.context_parallel=$cp --set train.expert_parallel=$ep \
        >$run.log 2>&1; then
      close $arch-1 $run && ok "$what match one process" || bad "$what differ from one process"
    else bad "$what failed"; cat $run.log; fi
  done
done
train 4 zaya.json zaya-cp-again --set train.context_parallel=2 --set train.expert_parallel=2 \
  >cp-again.log 2>&1 || { bad "second context-parallel run failed"; cat cp-again.log; }
[ "$(losses zaya-4-cp2-ep2/metrics.jsonl)" = "$(losses zaya-cp-again/metrics.jsonl)" ] \
  && ok "zaya: the same context-parallel layout twice gives bitwise-identical losses" \
  || bad "zaya: context-parallel runs of one layout differ"
# A checkpoint written at context parallel 2 resumes at 4 and in one process.
train 4 zaya.json ckcp --set train.context_parallel=2 --set train.checkpoint_every=15 --stop-at-step 15 \
  >ckcp.log 2>&1 || { bad "context-parallel run to step 15 failed"; cat ckcp.log; }
for target in "4 4" "1 1"; do
  set -- $target
  rm -rf ckcp-$2 && cp -r ckcp ckcp-$2
  if train "$1" zaya.json ckcp-$2 --set train.context_parallel=$2 --resume >ckcp-$2.log 2>&1; then
    close zaya-4-cp2-ep1 ckcp-$2 && ok "zaya: written at context parallel 2, resumed at $2: matches" \
      || bad "zaya: written at context parallel 2, resumed at $2: differs"
  else bad "zaya: resume at context parallel $2 failed"; cat ckcp-$2.log; fi
done
expect_fail "context parallel on one process" "train.context_parallel = 2 needs" \
  "$FOUNDRY" train --config zaya.json --synthetic-data --set train.run_dir=bad --set train.context_parallel=2 -q
expect_fail "sequence not divisible into 2C chunks" "cannot be cut into 6 equal chunks" \
  "$FOUNDRY" train --config zaya.json --synthetic-data --set train.run_dir=bad --set train.context_parallel=3 -q
expect_fail "chunks shorter than the CCA's halo" "fewer than the 2 rows" \
  "$FOUNDRY" train --config zaya.json --synthetic-data --set train.run_dir=bad --set train.context_parallel=8 -q

# ---- failures: clear errors, never a hang ----
expect_fail "batch not divisible by the ranks" "cannot be split evenly over 3 ranks" \
  timeout 120 "${MPIRUN[@]}" -np 3 "$FOUNDRY" train --config moe.json --synthetic-data --set train.run_dir=bad -q
expect_fail "expert parallel on one process" "train.expert_parallel = 2 needs" \
  "$FOUNDRY" train --config moe.json --synthetic-data --set train.run_dir=bad --set train.expert_parallel=2 -q
timeout 120 mpirun --oversubscribe --bind-to none \
    -np 1 "$FOUNDRY" train --config moe.json --synthetic-data --set train.run_dir=bad -q : \
    -np 1 "$FOUNDRY" train --config moe.json --synthetic-data --set train.run_dir=bad --set train.lr=1e-3 -q \
    >differ.log 2>&1 && bad "ranks with different configs: exited 0"
# Every rank fails, each naming rank 0's hash and the differing rank's (two different hashes).
python3 - differ.log <<'PY' && ok "ranks with different configs fail, naming both hashes" \
  || { bad "ranks with different configs:"; cat differ.log; }
import re, sys
found = re.findall(r"error: rank (\d): the run config or options of rank\(s\) 1 differ from rank 0's "
                   r"\(config hash (\w+) on rank 0, (\w+) on rank 1\)", open(sys.argv[1]).read())
assert {r for r, _, _ in found} == {"0", "1"}, found
assert all(a != b for _, a, b in found), found
PY
# Options that shape the run count too (one rank stopping early would leave the other waiting).
expect_fail "ranks with different --stop-at-step" "the run config or options of rank(s) 1 differ" \
  timeout 120 mpirun --oversubscribe --bind-to none \
    -np 1 "$FOUNDRY" train --config moe.json --synthetic-data --set train.run_dir=bad -q : \
    -np 1 "$FOUNDRY" train --config moe.json --synthetic-data --set train.run_dir=bad --stop-at-step 2 -q

# A rank killed mid-run: the job ends with an error that names the rank, in bounded time.
"${MPIRUN[@]}" -np 2 "$FOUNDRY" train --config moe.json --synthetic-data --set train.run_dir=killed \
  --set train.steps=100000 --set train.comm_timeout_s=20 -q >killed.log 2>&1 &
job=$!
for _ in $(seq 100); do
  victim="$(test_pids 'train.run_dir=killed' | while read -r p; do
    [ "$(tr '\0' ' ' </proc/$p/cmdline 2>/dev/null | cut -d' ' -f1)" = "$FOUNDRY" ] && echo "$p"; done | tail -n1)"
  [ -n "$victim" ] && [ -s killed/metrics.jsonl ] && break
  sleep 0.2
done
kill -9 "$victim" 2>/dev/null
killed_at=$(date +%s)
for _ in $(seq 450); do kill -0 $job 2>/dev/null || break; sleep 0.2; done
if kill -0 $job 2>/dev/null; then
  bad "killed rank: the job still runs 90 s later"; cat killed.log
  pkill -9 -f 'train.run_dir=killed'
  wait $job 2>/dev/null
else
  wait $job; rc=$?
  elapsed=$(( $(date +%s) - killed_at ))
  if [ "$rc" -ne 0 ] && grep -qiE "rank [0-9]" killed.log; then
    ok "a killed rank ends the job (exit $rc) within ${elapsed} s, naming the rank"
  else bad "killed rank: exit $rc, or no rank named:"; cat killed.log; fi
fi

# ---- a command that runs as one process, started as several ranks, is refused ----
timeout 60 "${MPIRUN[@]}" -np 2 "$FOUNDRY" model info --config moe.json >ranks.log 2>&1
rc=$?
[ $rc -ne 0 ] && [ "$(grep -c 'foundry model runs as one process, but the MPI launcher started 2 ranks' ranks.log)" = 2 ] \
  && ! grep -q "parameters" ranks.log \
  && ok "mpirun -np 2 foundry model info: refused on both ranks before any work" \
  || { bad "model info under mpirun -np 2 (exit $rc)"; cat ranks.log; }

finish
