#!/usr/bin/env bash
# Builds Foundry with the CUDA backend on a GPU machine, runs the GPU tests and the GPU
# benchmarks (GEMMs, bandwidth, attention, training and decoding both GPU benchmark configs,
# and the PyTorch peer),
# and prints a table last. For a machine like the one docs/gpu.md describes:
# Ubuntu 24.04 with CUDA, cuBLASLt and Foundry's other dependencies, where oneDNN and the
# xxHash headers come from Debian 12's .deb files in DEB_DIR (apt-get download libdnnl-dev
# libdnnl2 libxxhash-dev on a Debian 12 machine).
#   scripts/gpu_check.sh DEB_DIR [OUT_DIR=gpu-check] [--quick | --tests | --bench]
# --quick: shorter benchmarks and training; GPU_CHECK_DP=1 adds the 2-rank runs,
#   GPU_CHECK_BATCH=1 the batch-generation schedules, GPU_CHECK_CHECKPOINTS=0 leaves out the
#   checkpoint-stall runs and GPU_CHECK_PEER=0 the PyTorch peer.
# --tests: build what the GPU tests need, run them and compute-sanitizer's memcheck over the
#   kernel tests (GPU_CHECK_MEMCHECK_S, 300 s), and stop: about 5 minutes with the multi-rank
#   runs.
# --bench: --quick without the tests, for a second call on a machine that kept build-gpu from
#   a --tests call; the runs that have no figure yet on a GPU (the 2-rank runs with
#   GPU_CHECK_DP=1, decoding) before the ones that have.
# GPU_CHECK_BUDGET_S: the seconds the whole call may take (default: no limit); each later step's
#   time limit is cut to what is left (30 s kept for the table), and a step with nothing left
#   is reported as not run.
# OUT_DIR receives build.log, the test log, the benchmarks' output and gpu-profile.json.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
debs="${1:?usage: scripts/gpu_check.sh DEB_DIR [OUT_DIR] [--quick | --tests | --bench]}"
out="$(realpath -m "${2:-gpu-check}")"
quick="" tests_only="" bench_only=""
case "${3:-}" in
  "") ;;
  --quick) quick="--quick" ;;
  --tests) tests_only=1 quick="--quick" ;;
  --bench) bench_only=1 quick="--quick" ;;
  *) echo "gpu_check: unknown option '${3}' (use --quick, --tests or --bench)" >&2; exit 2 ;;
esac
# Only what the GPU tests and benchmarks run (the GPU tests are the cuda, model and optim
# layers' and shell scripts over foundry).
if [ -n "$bench_only" ]; then
  export FOUNDRY_BUILD_TARGETS="${FOUNDRY_BUILD_TARGETS:-foundry}"
elif [ -n "$quick" ]; then
  export FOUNDRY_BUILD_TARGETS="${FOUNDRY_BUILD_TARGETS:-foundry test_cuda test_model test_optim}"
fi
# Time limits (seconds): one GPU test, one training run, the PyTorch peer.
test_limit=300 train_limit=420 peer_limit=420
[ -n "$quick" ] && test_limit=150 train_limit=150 peer_limit=200
[ -n "$bench_only" ] && train_limit=120
started=$(date +%s)
budget="${GPU_CHECK_BUDGET_S:-0}"
# within SECONDS: SECONDS, or what is left of the budget if less; 0 when nothing is left.
within() {
  local want=$1 left
  if [ "$budget" -gt 0 ]; then
    left=$(( budget - ($(date +%s) - started) - 30 ))
    [ "$left" -lt "$want" ] && want=$left
  fi
  [ "$want" -gt 0 ] && echo "$want" || echo 0
}
# bounded SECONDS LOG COMMAND...: runs COMMAND under `timeout` (within the budget), its output
# to LOG; a run with no time left writes "not run: out of time" there and fails.
bounded() {
  local limit log=$2
  limit=$(within "$1")
  shift 2
  if [ "$limit" -eq 0 ]; then
    echo "not run: out of time (GPU_CHECK_BUDGET_S=$budget)" >"$log"
    return 124
  fi
  timeout -k 10 "$limit" "$@" >"$log" 2>&1
}
mkdir -p "$out"
# A run that leaves some parts out must not report an earlier call's files as its own.
rm -f "$out"/checkpoint-*.txt "$out"/dp-*.txt "$out"/attention.txt "$out"/attention.csv \
  "$out"/sanitizer*.log "$out"/decode-*.json "$out"/decode-*.txt "$out"/train-*.txt
cd "$root"
build="$root/build-gpu"
t0=$(date +%s)

status_build=ok
if ! bash scripts/build_from_debs.sh "$debs" "$build" -DFOUNDRY_CUDA=ON -DFOUNDRY_BUILD_PERF=OFF \
     2>"$out/build.err"; then
  status_build=FAILED
fi
cp "$build/build.log" "$out/build.log" 2>/dev/null || true
cp "$build/configure.log" "$out/configure.log" 2>/dev/null || true
configured=$(grep -h "^-- Foundry" "$out/configure.log" 2>/dev/null | sed 's/^-- //' | paste -sd ';' -)
if [ "$status_build" != ok ]; then
  cat "$out/build.err" >&2
  echo "gpu_check: the build failed (log: $out/build.log)" >&2
  exit 1
fi
# shellcheck disable=SC1091
source "$build/deps/env.sh"
t_build=$(( $(date +%s) - t0 ))
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader \
  > "$out/nvidia-smi.txt" 2>&1 || true

echo "gpu_check: built in ${t_build} s; $(cat "$out/nvidia-smi.txt" 2>/dev/null)"

# GPU tests: every CUDA kernel against the CPU. Side by side on the one GPU (they check
# numbers, not time), each bounded so that one hang cannot eat the machine's lease.
t1=$(date +%s)
status_tests="not run (--bench)" skipped=0 nccl_note=""
if [ -z "$bench_only" ]; then
  # -V: every test's output, so that skipped GPU cases (no GPU visible) show and are counted.
  # Bounded only by the budget (each test has its own limit).
  bounded 3600 "$out/gpu-tests.log" ctest --test-dir "$build" -L gpu -V -j4 --timeout "$test_limit"
  case $? in
    0) status_tests=passed ;;
    124 | 137) status_tests="FAILED (cut off: out of time)" ;;
    *) status_tests=FAILED ;;
  esac
  # Skips for want of a GPU: gtest's "no CUDA GPU visible" and the shell tests' "skipped: no
  # GPU" (GpuBackend.IsAClearErrorWithoutAGpu skips the other way round, where a GPU is visible).
  skipped=$(grep -c -E "no CUDA GPU visible|skipped: no GPU" "$out/gpu-tests.log")
  [ "$status_tests" = passed ] && [ "$skipped" -gt 0 ] && status_tests="SKIPPED (is a GPU visible?)"
  grep -q "this build has no NCCL" "$out/gpu-tests.log" && nccl_note="; NCCL tests skipped: the build has no NCCL"
  # How the slabs' zeros holes are mapped (GpuMemory.SlabHoles* prints it): read-write means a
  # stray write into a hole would change every hole's zeros without a fault.
  zeros=$(grep -m1 -o "maps the zeros holes read-[a-z]*" "$out/gpu-tests.log" | sed 's/.*holes //')
  [ -n "$zeros" ] && nccl_note="$nccl_note; slab zeros holes $zeros"
fi
t_tests=$(( $(date +%s) - t1 ))
echo "gpu_check: GPU tests $status_tests in ${t_tests} s"
if [ -z "$bench_only" ]; then
  grep -E "^ *[0-9]+/[0-9]+ Test .*(Failed|Timeout|Exception)" "$out/gpu-tests.log" || true
  # ctest -V puts each test's number before its lines.
  grep -E "^([0-9]+: )?(\[  FAILED  \]|not ok|FAIL)" "$out/gpu-tests.log" | sort -u | head -40 || true
fi

# compute-sanitizer (memcheck) over the kernel tests, where the toolkit has it (not --quick;
# --quick runs memcheck and racecheck over the tensor-core attention and decode tests alone, 90 s
# each).
status_sanitizer="not run"
sanitizer="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
if [ -n "$quick" ] && [ -z "$tests_only" ] && [ -z "$bench_only" ] && [ -x "$sanitizer" ]; then
  status_sanitizer="attention and decode:"
  for tool in memcheck racecheck; do
    OMP_NUM_THREADS=2 bounded 90 "$out/sanitizer-attention-$tool.log" "$sanitizer" --tool "$tool" \
      --error-exitcode 9 "$build/test_cuda" '--gtest_filter=GpuOps.AttentionOnTensorCores*:GpuDecode.*'
    case $? in
      0) status_sanitizer="$status_sanitizer $tool clean" ;;
      124 | 137) status_sanitizer="$status_sanitizer $tool cut off or not run" ;;
      *) status_sanitizer="$status_sanitizer $tool FAILED ($out/sanitizer-attention-$tool.log)" ;;
    esac
  done
fi
if { [ -z "$quick" ] || [ -n "$tests_only" ]; } && [ -x "$sanitizer" ]; then
  # NCCL's proxy thread under the sanitizer is slow and not Foundry's code: left out, and so
  # are the cases that measure free memory (the sanitizer's own allocations move it). With
  # --tests, the kernels that changed most recently first (attention, decoding, CCA, ZAYA1, the
  # runtime's copies), then the rest in what time is left.
  memcheck_s="${GPU_CHECK_MEMCHECK_S:-300}"
  first='GpuOps.Attention*:GpuDecode.*:GpuCca.*:GpuZaya.*:GpuRuntime.*'
  filters=("-*Slow*:GpuNccl.*:GpuMemory.*")
  [ -n "$tests_only" ] && filters=("$first" "-*Slow*:GpuNccl.*:GpuMemory.*:$first")
  status_sanitizer=""
  memcheck_end=$(( $(date +%s) + memcheck_s ))  # the filters share GPU_CHECK_MEMCHECK_S
  for filter in "${filters[@]}"; do
    log="$out/sanitizer.log"
    [ "$filter" = "$first" ] && log="$out/sanitizer-recent.log"
    OMP_NUM_THREADS=2 bounded "$(( memcheck_end - $(date +%s) ))" "$log" "$sanitizer" --tool memcheck \
      --error-exitcode 9 "$build/test_cuda" "--gtest_filter=$filter"
    case $? in
      0) part=clean ;;
      124 | 137) part="cut off or not run ($log)" ;;
      *) part="FAILED ($log)" ;;
    esac
    status_sanitizer="${status_sanitizer:+$status_sanitizer; }${filter%%:*}...: $part"
  done
fi

if [ -n "$tests_only" ]; then
  echo "| what | figure |"
  echo "| --- | --- |"
  echo "| GPU | $(cat "$out/nvidia-smi.txt" 2>/dev/null) |"
  echo "| build | $status_build (${t_build} s; ${configured:-no configure log}) |"
  echo "| GPU tests (ctest -L gpu) | $status_tests$nccl_note, $skipped skipped (${t_tests} s; $out/gpu-tests.log) |"
  echo "| compute-sanitizer, test_cuda | $status_sanitizer |"
  [ "$status_tests" = passed ] && [[ "$status_sanitizer" != *FAILED* ]]
  exit
fi

# Benchmarks, merged into one profile.
foundry="$build/foundry"
profile="$out/gpu-profile.json"
rm -f "$profile"
t2=$(date +%s)
status_gemm=FAILED status_membw=FAILED status_attention=FAILED
bounded "$train_limit" "$out/bench-gemm.txt" "$foundry" bench gemm --device cuda $quick \
  --profile "$profile" --csv "$out/gemm.csv" --quiet && status_gemm=ok
bounded "$train_limit" "$out/bench-membw.txt" "$foundry" bench membw --device cuda $quick \
  --profile "$profile" --csv "$out/membw.csv" --quiet && status_membw=ok
# Foundry's own attention kernels against the GEMM rates just measured: the profile's
# efficiency.attention curve, which plan reads.
bounded "$train_limit" "$out/attention.txt" "$foundry" bench attention --device cuda $quick \
  --profile "$profile" --csv "$out/attention.csv" --quiet && status_attention=ok
t_bench=$(( $(date +%s) - t2 ))
echo "gpu_check: bench gemm $status_gemm, membw $status_membw, attention $status_attention in ${t_bench} s"

t3=$(date +%s)
run_status=""  # "NAME:ok" or "NAME:FAILED" for every run below
note() { run_status="$run_status $1:$([ "$2" = 0 ] && echo ok || echo FAILED)"; }

# Data parallel through host memory (not --quick, unless GPU_CHECK_DP=1): 2 ranks sharing the
# GPU, replicated and ZeRO-1 (the reduction overlapped with backward), and context parallel
# (each rank half of every sequence), against 1 rank, at a quarter of gpu-moe-bench (2 layers),
# the same global batch.
data_parallel() {
  local run np zero1 cp mpi
  for run in 1 2 2-zero1 2-cp; do
    np=${run%%-*} zero1=false cp=1
    [ "$run" = 2-zero1 ] && zero1=true
    [ "$run" = 2-cp ] && cp=2
    mpi=()
    [ "$np" -gt 1 ] && mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$np")
    OMP_NUM_THREADS=8 bounded "$train_limit" "$out/dp-$run.txt" "${mpi[@]}" "$foundry" train \
      -c configs/gpu-moe-bench.json --device cuda:0 --synthetic-data --steps 8 --overwrite \
      --set "train.run_dir=$out/run-dp-$run" model.n_layers=2 "train.zero1=$zero1" \
      "train.context_parallel=$cp" train.checkpoint_at_end=false
    note "dp-$run" $?
    rm -rf "$out/run-dp-$run"
  done
}
# Decoding on the GPU: latency per step at batch 1 to 64 over 256 cached positions, both
# benchmark models (their own MoE width only), against plan's decode model with this call's
# profile.
decoding() {
  local cfg
  for cfg in gpu-moe-bench gpu-zaya-bench; do
    bounded 120 "$out/decode-$cfg.txt" "$foundry" bench decode --config "configs/$cfg.json" \
      --device cuda --profile "$profile" --finer 1 --batches 1,4,16,64 --context 256 --quiet \
      --out "$out/decode-$cfg.json"
    note "decode-$cfg" $?
  done
}
# Training on the GPU: both benchmark configs (synthetic tokens, op breakdown on CUDA events).
training() {
  local cfg steps=30
  [ -n "$quick" ] && steps=12
  for cfg in gpu-moe-bench gpu-zaya-bench; do
    bounded "$train_limit" "$out/train-$cfg.txt" "$foundry" train -c "configs/$cfg.json" \
      --device cuda --synthetic-data --steps "$steps" --overwrite --op-breakdown \
      --set "train.run_dir=$out/run-$cfg" train.checkpoint_at_end=false
    note "train-$cfg" $?
    echo "gpu_check: trained $cfg: $(grep -m1 '^trained steps' "$out/train-$cfg.txt" || tail -n 2 "$out/train-$cfg.txt")"
    rm -rf "$out/run-$cfg"
  done
}
want_dp=""
{ [ -z "$quick" ] || [ "${GPU_CHECK_DP:-0}" = 1 ]; } && want_dp=1
if [ -n "$bench_only" ]; then
  # The runs with no figure on a GPU yet first.
  [ -n "$want_dp" ] && data_parallel
  decoding
  training
else
  training
  [ -n "$want_dp" ] && data_parallel
  decoding
fi
# Checkpoints from the GPU: how long the step loop stalls for a save, asynchronous (the copy
# out of device memory beside the next step) against synchronous, at a quarter of
# gpu-moe-bench (2 layers: 6.0 GB a checkpoint), saving at steps 3 and 6.
for mode in async sync; do
  [ "${GPU_CHECK_CHECKPOINTS:-1}" = 0 ] && break
  async=true
  [ "$mode" = sync ] && async=false
  bounded "$train_limit" "$out/checkpoint-$mode.txt" "$foundry" train -c configs/gpu-moe-bench.json \
    --device cuda --synthetic-data --steps 6 --overwrite --set "train.run_dir=$out/run-ckpt-$mode" \
    model.n_layers=2 train.checkpoint_every=3 "train.checkpoint_async=$async"
  note "checkpoint-$mode" $?
  rm -rf "$out/run-ckpt-$mode"
done
# Batch generation's schedules on the GPU (not --quick, unless GPU_CHECK_BATCH=1): 64 requests
# under 4 shared prompts of 1,024 tokens, prefix tree against the LRU cache and fixed batches.
if [ -z "$quick" ] || [ "${GPU_CHECK_BATCH:-0}" = 1 ]; then
  DEVICE=cuda ROUNDS=1 SCHEDULES="prefix-tree lru fixed" WORKLOADS=shared PLOT="$out/batch.png" \
    bounded 300 "$out/batch-schedules.txt" bash bench/batch_schedules_bench.sh "$foundry" zaya1 \
    64 4 1024 64 64
  note batch-schedules $?
fi
# Then the PyTorch peer of gpu-moe-bench in the same call (bf16 autocast, torch.compile);
# GPU_CHECK_PEER=0 leaves it out (torch.compile takes minutes).
peer_steps=20
[ -n "$quick" ] && peer_steps=10
rm -f "$out/pytorch-gpu.json" "$out/pytorch-gpu.txt"
if [ "${GPU_CHECK_PEER:-1}" = 0 ]; then
  status_peer="not run (GPU_CHECK_PEER=0)"
elif peer_s=$(within "$peer_limit") && [ "$peer_s" -eq 0 ]; then
  status_peer="not run: out of time (GPU_CHECK_BUDGET_S=$budget)"
elif timeout -k 10 "$peer_s" python3 bench/pytorch_reference.py bench --config configs/gpu-moe-bench.json \
       --device cuda --compile --steps "$peer_steps" >"$out/pytorch-gpu.json" 2>"$out/pytorch-gpu.txt"; then
  status_peer=ok
else
  status_peer=FAILED
fi
t_train=$(( $(date +%s) - t3 ))

# The table.
# failure LOG: "FAILED: " and the run's first error, its "not run" line, or its last line.
failure() {
  echo "FAILED: $(grep -m1 -E '^error:|^not run' "$1" 2>/dev/null || tail -n 1 "$1" 2>/dev/null)"
}
python3 - "$profile" "$out" <<'PY'
import json, sys
path, out = sys.argv[1], sys.argv[2]
try:
    p = json.load(open(path))
except Exception:
    p = {}
d, c, m = p.get('device', {}), p.get('compute', {}), p.get('memory', {})
def tf(x): return '%.1f' % (x / 1e12) if x else '-'
def gb(x): return '%.0f' % (x / 1e9) if x else '-'
print('| what | figure |')
print('| --- | --- |')
print('| GPU | %s (%s, %s SMs, %.1f GiB) |' % (d.get('name', '?'), d.get('arch', '?'), d.get('sm_count', '?'),
                                          d.get('memory_bytes', 0) / 2**30))
for t in ('bf16', 'fp32'):
    e = c.get(t, {})
    print('| %s GEMM best, TFLOP/s (estimate) | %s (%s) |' % (t, tf(e.get('measured_flops_per_s')),
                                                          tf(e.get('spec_flops_per_s'))))
for s in m.get('stream', []):
    print('| STREAM %s, GB/s | %s%s |' % (s['kernel'], gb(s['bytes_per_s']), '' if s['valid'] else ' INVALID'))
print('| memory spec, GB/s | %s |' % gb(m.get('spec_bytes_per_s')))
PY
echo "| build | $status_build (${t_build} s; ${configured:-no configure log}) |"
echo "| GPU tests (ctest -L gpu) | $status_tests$nccl_note, $skipped skipped (${t_tests} s; $out/gpu-tests.log) |"
echo "| compute-sanitizer, test_cuda | $status_sanitizer |"
echo "| bench gemm / membw / attention | $status_gemm / $status_membw / $status_attention (${t_bench} s; $out/bench-*.txt, $out/attention.txt) |"
att=$(awk '$1 == 2048 && $2 ~ /^[0-9]+$/ {print "seq 2048: forward " $3 " ms, " $5 " TFLOP/s, " $7 "; backward " $4 " ms, " $6 " TFLOP/s, " $8}' "$out/attention.txt" 2>/dev/null)
[ -n "$att" ] && echo "| attention kernels (efficiency of the GEMM rate) | $att |"
for cfg in gpu-moe-bench gpu-zaya-bench; do
  line=$(grep -m1 "^trained steps" "$out/train-$cfg.txt" 2>/dev/null || true)
  [ -z "$line" ] && line="$(failure "$out/train-$cfg.txt")"
  echo "| train $cfg (--device cuda) | $line |"
  mem=$(grep -m1 "^GPU memory" "$out/train-$cfg.txt" 2>/dev/null || true)
  [ -n "$mem" ] && echo "| $cfg memory | $mem |"
done
# plan with this call's profile against the measured steps (the op breakdown's total).
for cfg in gpu-moe-bench gpu-zaya-bench; do
  predicted=$("$foundry" plan --profile "$profile" --config "configs/$cfg.json" 2>/dev/null |
                sed -n 's/^predicted step time: \([0-9.]*\) ms.*/\1/p')
  measured=$(awk '$1 == "total" {print $2}' "$out/train-$cfg.txt" 2>/dev/null)
  if [ -n "$predicted" ] && [ -n "$measured" ] && [ "$measured" != 0.00 ]; then
    echo "| plan $cfg: predicted / measured step | $predicted / $measured ms ($(python3 -c "print('%+.0f%%' % (100 * ($predicted / $measured - 1)))")) |"
  else
    echo "| plan $cfg: predicted / measured step | ${predicted:-plan failed} / ${measured:-no breakdown} |"
  fi
done
for mode in async sync; do
  [ -f "$out/checkpoint-$mode.txt" ] || continue
  stalls=$(sed -n 's/^saved checkpoint .*step_0*\([0-9]*\):.*the step loop was blocked \([0-9.]*\) s.*/step \1: \2 s/p' \
             "$out/checkpoint-$mode.txt" 2>/dev/null | paste -sd ',' -)
  echo "| checkpoint stall, $mode (2-layer gpu-moe-bench) | ${stalls:-FAILED: $(tail -n 1 "$out/checkpoint-$mode.txt" 2>/dev/null)} |"
done
for run in 1 2 2-zero1 2-cp; do
  [ -f "$out/dp-$run.txt" ] || continue
  name=${run/-zero1/ ZeRO-1}
  line=$(grep -m1 '^trained steps' "$out/dp-$run.txt" || tail -n 1 "$out/dp-$run.txt")
  [[ "$run_status" == *" dp-$run:FAILED"* ]] &&
    line="$(failure "$out/dp-$run.txt")"
  echo "| data parallel, ${name/-cp/ context-parallel} rank(s) on one GPU (2-layer gpu-moe-bench) | $line |"
  reduce=$(grep -m1 '^gradient reduction per step' "$out/dp-$run.txt" || true)
  [ -n "$reduce" ] && echo "| ... $run: ${reduce} |"
done
for cfg in gpu-moe-bench gpu-zaya-bench; do
  dec=$(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(', '.join('B=%d %.2f ms%s' % (x['batch'], x['median_ms'], ' (plan %.2f, %+.0f%%)' % (x['predicted_ms'], 100 * x['error']) if 'predicted_ms' in x else '') for x in r['rows']))" "$out/decode-$cfg.json" 2>/dev/null ||
        failure "$out/decode-$cfg.txt")
  echo "| bench decode $cfg, ms a step (context 256) | $dec |"
done
[ -f "$out/batch-schedules.txt" ] &&
  echo "| generate --batch on the GPU, zaya1, 64 shared requests: s to the last result | $(awk -F'|' '/^\| (prefix-tree|lru|fixed) /{gsub(/ /, "", $2); gsub(/ /, "", $7); printf "%s %s  ", $2, $7}' "$out/batch-schedules.txt") |"
peer=$(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print('%.0f tokens/s (median of %d steps, %s)' % (r['tokens_per_s_median'], r['timed_steps'], r['device']))" "$out/pytorch-gpu.json" 2>/dev/null || echo "$status_peer$([ -s "$out/pytorch-gpu.txt" ] && echo ": $(tail -n 1 "$out/pytorch-gpu.txt")")")
echo "| PyTorch peer, gpu-moe-bench compiled bf16 | $peer |"
echo "| runs after the benchmarks | ${t_train} s ($run_status) |"
for f in bench-gemm bench-membw attention; do
  first_error=$(grep -m1 "^error:" "$out/$f.txt" 2>/dev/null || true)
  [ -n "$first_error" ] && echo "| $f: | ${first_error#error: } |"
done
{ [ "$status_tests" = passed ] || [ -n "$bench_only" ]; } && [ "$status_gemm" = ok ] && [ "$status_membw" = ok ] &&
  [ "$status_attention" = ok ] && [[ "$status_sanitizer" != *FAILED* ]] &&
  [[ "$run_status" != *FAILED* ]]
