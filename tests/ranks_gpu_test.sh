#!/usr/bin/env bash
# Data parallel on a GPU (label gpu; exits 77, a skip, where the build has no CUDA backend or
# no GPU is visible): two ranks sharing one GPU (cuda:0), their gradients averaged through host
# memory, train as one rank does on the whole batch (fp32 losses within 1e-4 relative), replicated
# and with ZeRO-1, and save checkpoints in their two shares that one rank resumes (the ZeRO-1
# one also on the CPU at 2 ranks); expert parallelism (2 ranks, both layouts; the sharded ZeRO-1
# one's checkpoint resumed at its layout, bit for bit) and context
# parallelism (2 ranks, both architectures) do the same; where two GPUs are visible,
# two ranks each on its own exchange over NCCL (when the build has it) alike, replicated and
# ZeRO-1, expert and context parallel; one rank's checkpoints resume across devices (GPU on GPU bit for bit, GPU on CPU and
# CPU on GPU within 1e-4).
# FOUNDRY_TEST_DEVICE=cpu with FOUNDRY_POSE_AS_DEVICE=1 runs the same on a machine without a GPU,
# the CPU backend posing as the device (the paths of a GPU run on the CPU's kernels).
source "$(dirname "$0")/lib.sh"
cd "$WORK"
GPU="${FOUNDRY_TEST_DEVICE:-cuda:0}"
MPIRUN=(timeout -k 5 120 mpirun --oversubscribe --bind-to none)  # a hang costs 2 minutes, not the test
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)

cat > tiny.json <<'JSON'
{
  "model": {"vocab_size": 300, "d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
            "head_dim": 32, "n_experts": 4, "top_k": 2, "ffn_dim": 96, "max_seq_len": 64},
  "train": {"steps": 8, "batch_size": 4, "seq_len": 64, "lr": 3e-3, "warmup_steps": 2,
            "precision": "fp32", "log_every": 1, "checkpoint_every": 4, "zero1": false,
            "peak_gflops": 100, "run_dir": "one", "device": "cuda:0"}
}
JSON
sed -i "s/\"cuda:0\"/\"$GPU\"/" tiny.json

probe="$("$FOUNDRY" train -c tiny.json --synthetic-data --steps 1 --set train.run_dir=probe -q 2>&1)"
[ $? -eq 0 ] || gpu_probe_failed "train" "$probe"

"$FOUNDRY" train -c tiny.json --synthetic-data -q >one.log 2>&1 || { cat one.log; bad "one rank failed"; }
OMP_NUM_THREADS=1 "${MPIRUN[@]}" -np 2 "$FOUNDRY" train -c tiny.json --synthetic-data \
  --set train.run_dir=two >two.log 2>&1 || { cat two.log; bad "two ranks failed"; }
python3 - one/metrics.jsonl two/metrics.jsonl <<'PY' && ok "2 ranks on one GPU follow 1 rank's 8 fp32 losses within 1e-4" || bad "2 ranks and 1 rank differ"
import json, sys
def losses(p): return [json.loads(l)['loss'] for l in open(p) if 'loss' in json.loads(l)]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
print('1 rank ', a); print('2 ranks', b)
sys.exit(0 if len(a) == len(b) == 8 and all(abs(x - y) <= 1e-4 * abs(x) for x, y in zip(a, b)) else 1)
PY
grep -q "gradients averaged through host memory" two.log \
  && ok "the 2-rank run says how its gradients are reduced" || bad "no word of the host-staged reduction"
# The reduction overlapped with backward (each range copied out as the GPU finishes it; buckets
# of one report each, so that even this tiny model's start before the step) against after
# backward: the same sums in the same order, so the same losses bit for bit.
for mode in during after; do
  OMP_NUM_THREADS=1 "${MPIRUN[@]}" -np 2 "$FOUNDRY" train -c tiny.json --synthetic-data \
    --set train.run_dir=two-$mode --set train.grad_bucket_mib=0 \
    --set train.overlap_grad_reduce=$([ $mode = during ] && echo true || echo false) \
    >two-$mode.log 2>&1 || { cat two-$mode.log; bad "two ranks reducing $mode backward failed"; }
done
python3 - two-during.log <<'PY' && ok "the overlapped run starts buckets during backward" || bad "no bucket started during backward on the GPU"
import re, sys
m = re.search(r"([0-9.]+) started during backward carrying ([0-9]+)% of the slab", open(sys.argv[1]).read())
print(m.group(0) if m else "no gradient reduction line")
sys.exit(0 if m and float(m.group(1)) > 0 and int(m.group(2)) > 0 else 1)
PY
python3 - two-during/metrics.jsonl two-after/metrics.jsonl <<'PY' && ok "overlapped and after-backward reductions give the same 8 losses bit for bit" || bad "overlap changed the losses"
import json, sys
def losses(p): return [json.loads(l)['loss'] for l in open(p) if 'loss' in json.loads(l)]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
sys.exit(0 if len(a) == 8 and a == b else 1)
PY

# ZeRO-1 with the two ranks on one GPU: the state sharded, the gradients reduce-scattered and the
# weights all-gathered through host memory.
OMP_NUM_THREADS=1 "${MPIRUN[@]}" -np 2 "$FOUNDRY" train -c tiny.json --synthetic-data \
  --set train.run_dir=zero1 --set train.zero1=true >zero1.log 2>&1 \
  || { cat zero1.log; bad "two ranks with ZeRO-1 failed"; }
follows() {  # REFERENCE RUN WHAT: 8 losses each within 1e-4 relative
  python3 - "$1/metrics.jsonl" "$2/metrics.jsonl" <<'PY'
import json, sys
def losses(p): return [json.loads(l)['loss'] for l in open(p) if 'loss' in json.loads(l)]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
print('reference', a); print('run      ', b)
sys.exit(0 if len(a) == len(b) == 8 and all(abs(x - y) <= 1e-4 * abs(x) for x, y in zip(a, b)) else 1)
PY
}
follows one zero1 && ok "2 ranks with ZeRO-1 on one GPU follow 1 rank's 8 fp32 losses within 1e-4" \
  || bad "2 ranks with ZeRO-1 and 1 rank differ"
grep -q "ZeRO-1 over 2 ranks, gradients reduce-scattered through host memory" zero1.log \
  && ok "the ZeRO-1 run says how it exchanges" || bad "no word of ZeRO-1's host-staged exchange"

# Two ranks each on a GPU of its own (plain cuda: rank r takes GPU r), where two are visible.
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ "$GPU" != cpu ] && [ "${gpus:-0}" -ge 2 ]; then
  for zero1 in false true; do
    OMP_NUM_THREADS=1 "${MPIRUN[@]}" -np 2 "$FOUNDRY" train -c tiny.json --synthetic-data \
      --device cuda --set train.run_dir=two-gpus-$zero1 --set train.zero1=$zero1 \
      >two-gpus-$zero1.log 2>&1 || { cat two-gpus-$zero1.log; bad "two ranks on two GPUs (zero1 $zero1) failed"; }
    follows one two-gpus-$zero1 \
      && ok "2 ranks on 2 GPUs (zero1 $zero1) follow 1 rank's 8 fp32 losses within 1e-4" \
      || bad "2 ranks on 2 GPUs (zero1 $zero1) and 1 rank differ"
    grep -qE "(averaged|reduce-scattered) (over NCCL|through host memory)" two-gpus-$zero1.log \
      && ok "2 GPUs: $(grep -oE '(averaged|reduce-scattered) (over NCCL|through host memory)' two-gpus-$zero1.log | head -1)" \
      || bad "no word of how 2 GPUs reduce"
  done
  # NCCL's collectives between the two GPUs: every result exact, and a fit per operation.
  OMP_NUM_THREADS=1 "${MPIRUN[@]}" -np 2 "$FOUNDRY" bench comm --device cuda -b 1K -e 4M -f 4 \
    -w 2 -n 5 --json nccl.json >nccl.txt 2>&1 || { cat nccl.txt; bad "bench comm --device cuda failed"; }
  python3 - nccl.json <<'PY' && ok "bench comm --device cuda: five NCCL collectives, every element right" || bad "bench comm --device cuda's results"
import json, sys
r = json.load(open(sys.argv[1]))["collectives"]
print([(c["op"], c["algorithm"], len(c["points"])) for c in r])
sys.exit(0 if len(r) == 5 and all(c["algorithm"] == "nccl" and c["points"] and
         all(p["wrong"] == 0 for p in c["points"]) for c in r) else 1)
PY
elif [ "$GPU" != cpu ]; then
  echo "skipped: two ranks on two GPUs (${gpus:-0} visible)"
  expect_fail "bench comm --device cuda with two ranks on one GPU" "share one GPU, and NCCL needs a GPU per rank" \
    "${MPIRUN[@]}" -np 2 "$FOUNDRY" bench comm --device cuda:0 -e 1K
fi

# FROM NEW: a copy of run directory FROM whose latest checkpoint is step 4's (8 steps, one
# checkpoint every 4), for a resume to finish.
copy_at_step_4() { rm -rf "$2" && cp -r "$1" "$2" && rm -rf "$2/checkpoints/step_00000008"; }

# The 2-rank checkpoint of step 4 (two shares) resumes in one process to the same end.
copy_at_step_4 two two-resumed
"$FOUNDRY" train -c tiny.json --synthetic-data --set train.run_dir=two-resumed --resume \
  >resumed.log 2>&1 || { cat resumed.log; bad "one rank could not resume the 2-rank checkpoint"; }
final() { sed -n 's/.*final train loss \([0-9.]*\).*/\1/p' "$1" | tail -n 1; }
a="$(final two.log)" b="$(final resumed.log)"
close() { python3 -c "import sys; a, b = map(float, sys.argv[1:]); sys.exit(0 if abs(a - b) <= 1e-4 * abs(a) else 1)" "$@"; }
if grep -q "resumed from" resumed.log && [ -n "$a" ] && [ -n "$b" ] && close "$a" "$b"; then
  ok "1 rank resumes the 2-rank checkpoint of step 4 and ends alike ($a)"
else bad "the resumed run: '$b' after $(grep -m1 -o 'trained steps [0-9.]*' resumed.log), 2 ranks '$a'"; fi

# ---- one rank's checkpoints across devices (fp32): the GPU's step-4 checkpoint resumes on the
# GPU to the same 4 losses bit for bit and on the CPU within 1e-4; the CPU's on the GPU too ----
last4() {  # the last 4 losses a run dir's metrics.jsonl holds
  python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; print(' '.join([repr(x['loss']) for x in r if 'loss' in x][-4:]))" "$1/metrics.jsonl"
}
resume_at_4() {  # FROM_DIR NEW_DIR gpu|cpu
  local run=("$FOUNDRY") device="$GPU"
  [ "$3" = cpu ] && run=("${ON_CPU[@]}" "$FOUNDRY") device=cpu
  copy_at_step_4 "$1" "$2"
  "${run[@]}" train -c tiny.json --synthetic-data --set train.run_dir="$2" --resume --device "$device" \
    >"$2.log" 2>&1 || { cat "$2.log"; bad "resuming $1 on $3 failed"; }
  grep -q "resumed from" "$2.log" || bad "$2 did not say it resumed"
}
within() {  # A B: the same number of losses, each within 1e-4 relative
  python3 -c "import sys; a, b = sys.argv[1].split(), sys.argv[2].split(); sys.exit(0 if len(a) == len(b) == 4 and all(abs(float(x) - float(y)) <= 1e-4 * abs(float(x)) for x, y in zip(a, b)) else 1)" "$1" "$2"
}
resume_at_4 one gpu-on-gpu gpu
[ -n "$(last4 one)" ] && [ "$(last4 gpu-on-gpu)" = "$(last4 one)" ] \
  && ok "a GPU checkpoint resumes on the GPU to the same losses, bit for bit" \
  || bad "GPU resume: '$(last4 gpu-on-gpu)' against '$(last4 one)'"
resume_at_4 one gpu-on-cpu cpu
within "$(last4 one)" "$(last4 gpu-on-cpu)" && ok "a GPU checkpoint resumes on the CPU within 1e-4" \
  || bad "GPU checkpoint on the CPU: '$(last4 gpu-on-cpu)' against '$(last4 one)'"
"${ON_CPU[@]}" "$FOUNDRY" train -c tiny.json --synthetic-data --device cpu --set train.run_dir=cpu -q >cpu.log 2>&1 \
  || { cat cpu.log; bad "the CPU run failed"; }
resume_at_4 cpu cpu-on-gpu gpu
within "$(last4 cpu)" "$(last4 cpu-on-gpu)" && ok "a CPU checkpoint resumes on the GPU within 1e-4" \
  || bad "CPU checkpoint on the GPU: '$(last4 cpu-on-gpu)' against '$(last4 cpu)'"

# The ZeRO-1 checkpoint of step 4 (each rank's range and its state) resumes in one process on
# the GPU, and at 2 ranks with ZeRO-1 on the CPU, to the same end.
for where in "1 $GPU" "2 cpu"; do
  read -r np dev <<<"$where"
  dir=zero1-on-$np-${dev%%:*}
  copy_at_step_4 zero1 "$dir"
  mpi=()
  [ "$np" = 2 ] && mpi=("${ON_CPU[@]}" OMP_NUM_THREADS=1 "${MPIRUN[@]}" -np 2)  # the CPU's ZeRO-1
  "${mpi[@]}" "$FOUNDRY" train -c tiny.json --synthetic-data --set train.run_dir="$dir" \
    --set train.zero1=true --device "$dev" --resume >"$dir.log" 2>&1 \
    || { cat "$dir.log"; bad "resuming the ZeRO-1 checkpoint on $np rank(s), $dev, failed"; }
  a="$(final zero1.log)" b="$(final "$dir.log")"
  if grep -q "resumed from" "$dir.log" && [ -n "$a" ] && [ -n "$b" ] && close "$a" "$b"; then
    ok "the ZeRO-1 checkpoint of step 4 resumes on $np rank(s), $dev, and ends alike ($b)"
  else bad "the ZeRO-1 resume on $np rank(s), $dev: '$b' against '$a'"; fi
done

# Expert parallel with the two ranks on one GPU: each computes its own experts for both ranks'
# tokens, the rows exchanged through host memory; the same losses as one rank within 1e-4,
# replicated and with ZeRO-1.
for zero1 in false true; do
  OMP_NUM_THREADS=1 "${MPIRUN[@]}" -np 2 "$FOUNDRY" train -c tiny.json --synthetic-data \
    --set train.run_dir=ep-$zero1 --set train.expert_parallel=2 --set train.zero1=$zero1 \
    >ep-$zero1.log 2>&1 || { cat ep-$zero1.log; bad "expert parallel on the GPU (zero1 $zero1) failed"; }
  follows one ep-$zero1 \
    && ok "2 expert-parallel ranks on one GPU (zero1 $zero1) follow 1 rank's 8 fp32 losses within 1e-4" \
    || bad "expert parallel on the GPU (zero1 $zero1) and 1 rank differ"
done
# The sharded model resumes on the device: the expert-parallel ZeRO-1 checkpoint of step 4,
# loaded at the same layout (each rank copies to its slabs only the ranges it stores, around
# the chunks it handed back), ends as the run that went through, bit for bit.
copy_at_step_4 ep-true ep-resumed
OMP_NUM_THREADS=1 "${MPIRUN[@]}" -np 2 "$FOUNDRY" train -c tiny.json --synthetic-data --resume \
  --set train.run_dir=ep-resumed train.expert_parallel=2 train.zero1=true >ep-resumed.log 2>&1 \
  || { cat ep-resumed.log; bad "resuming the expert-parallel ZeRO-1 checkpoint failed"; }
grep -q "resumed from" ep-resumed.log && [ -n "$(last4 ep-true)" ] \
  && [ "$(last4 ep-resumed)" = "$(last4 ep-true)" ] \
  && ok "the expert-parallel ZeRO-1 checkpoint resumes on $GPU at its layout, bit for bit" \
  || bad "the sharded resume: '$(last4 ep-resumed)' against '$(last4 ep-true)'"
# The expert storage sharded on the GPU (ZeRO-1, expert parallel 2): each rank hands back the
# slabs' chunks inside the other rank's experts outside its state range. wide.json's experts
# are 96 MiB of fp32 weights and as many gradients; a rank keeps about three quarters of them.
sed -e 's/"d_model": 64/"d_model": 128/' -e 's/"ffn_dim": 96/"ffn_dim": 4096/' \
    -e 's/"n_experts": 4/"n_experts": 8/' -e 's/"steps": 8/"steps": 2/' tiny.json > wide.json
slabs() {  # slabs EP: rank 0's weight and gradient slabs in MiB, 2 ranks with ZeRO-1
  OMP_NUM_THREADS=1 "${MPIRUN[@]}" -np 2 "$FOUNDRY" train -c wide.json --synthetic-data \
    --set train.run_dir=wide-$1 train.expert_parallel=$1 train.zero1=true --op-breakdown \
    >wide-$1.log 2>&1 || { cat wide-$1.log; bad "wide.json at expert parallel $1 failed"; }
  sed -n 's/^memory per rank:.*weight and gradient slabs rank 0 \([0-9]*\) MiB.*/\1/p' wide-$1.log
}
full="$(slabs 1)"; half="$(slabs 2)"
if [ -n "$full" ] && [ -n "$half" ] && [ $((full - half)) -ge 30 ]; then
  ok "expert parallel 2 on $GPU stores less: weight and gradient slabs $half MiB against $full MiB"
else bad "expert storage on $GPU: slabs '$half' MiB at expert parallel 2 against '$full' MiB"; fi
# Context parallelism on one GPU: each rank holds two chunks of every sequence, the keys and
# values (and ZAYA1's convolution boundaries) exchanged through host memory; the same losses as
# one rank within 1e-4, both architectures.
OMP_NUM_THREADS=1 "${MPIRUN[@]}" -np 2 "$FOUNDRY" train -c tiny.json --synthetic-data \
  --set train.run_dir=cp --set train.context_parallel=2 >cp.log 2>&1 \
  || { cat cp.log; bad "context parallel on the GPU failed"; }
follows one cp && ok "2 context-parallel ranks on one GPU follow 1 rank's 8 fp32 losses within 1e-4" \
  || bad "context parallel on the GPU and 1 rank differ"
[ "$(grep -l "their exchanges through host memory" cp.log ep-false.log | wc -l)" = 2 ] \
  && ok "ranks sharing a GPU say their exchanges go through host memory" \
  || bad "no word of the exchanges through host memory (cp.log, ep-false.log)"
cat > zaya.json <<'JSON'
{
  "model": {"arch": "zaya1", "vocab_size": 300, "d_model": 64, "n_layers": 2, "n_heads": 4,
            "n_kv_heads": 2, "head_dim": 32, "n_experts": 4, "top_k": 1, "ffn_dim": 96,
            "router_latent_dim": 16, "rope_fraction": 0.5, "max_seq_len": 64},
  "train": {"steps": 8, "batch_size": 4, "seq_len": 64, "lr": 3e-3, "warmup_steps": 2,
            "optimizer": "adamw", "precision": "fp32", "log_every": 1, "checkpoint_every": 0,
            "zero1": false, "peak_gflops": 100, "run_dir": "zaya-one", "device": "cuda:0"}
}
JSON
sed -i "s/\"cuda:0\"/\"$GPU\"/" zaya.json
"$FOUNDRY" train -c zaya.json --synthetic-data -q >zaya-one.log 2>&1 \
  || { cat zaya-one.log; bad "zaya on one rank failed"; }
OMP_NUM_THREADS=1 "${MPIRUN[@]}" -np 2 "$FOUNDRY" train -c zaya.json --synthetic-data \
  --set train.run_dir=zaya-cp --set train.context_parallel=2 >zaya-cp.log 2>&1 \
  || { cat zaya-cp.log; bad "zaya context parallel on the GPU failed"; }
follows zaya-one zaya-cp \
  && ok "zaya: 2 context-parallel ranks on one GPU follow 1 rank's 8 fp32 losses within 1e-4" \
  || bad "zaya: context parallel on the GPU and 1 rank differ"

# Expert and context parallel with each rank on a GPU of its own: the rows over NCCL.
if [ "$GPU" != cpu ] && [ "${gpus:-0}" -ge 2 ]; then
  while read -r config dir reference setting; do
    OMP_NUM_THREADS=1 "${MPIRUN[@]}" -np 2 "$FOUNDRY" train -c "$config" --synthetic-data \
      --device cuda --set train.run_dir="$dir" --set "$setting" >"$dir.log" 2>&1 \
      || { cat "$dir.log"; bad "$dir: $setting on two GPUs failed"; }
    follows "$reference" "$dir" \
      && ok "$dir: $setting on 2 GPUs follows 1 rank's 8 fp32 losses within 1e-4" \
      || bad "$dir: $setting on 2 GPUs and 1 rank differ"
    grep -q "their exchanges over NCCL" "$dir.log" && ok "$dir: the exchanges went over NCCL" \
      || bad "$dir: no word of the exchanges over NCCL"
  done <<'RUNS'
tiny.json ep-gpus one train.expert_parallel=2
tiny.json cp-gpus one train.context_parallel=2
zaya.json zaya-cp-gpus zaya-one train.context_parallel=2
RUNS
fi

finish
