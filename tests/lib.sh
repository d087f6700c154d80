# Helpers for the end-to-end test scripts: source it, then call check/expect_fail.
set -uo pipefail
FOUNDRY="$(realpath "$1")"
SRC="$(realpath "$2")"
WORK="$(mktemp -d)"
# A directory in memory for in-memory checkpoints (/dev/shm, as a run would use; under $WORK
# where there is none): a save there does not wait for a disk.
RAM="$(mktemp -d /dev/shm/foundry-test.XXXXXX 2>/dev/null)" || { RAM="$WORK/ram"; mkdir -p "$RAM"; }
# (a test that mounted a file system in $WORK/disk may have failed before unmounting it)
trap 'umount "$WORK/disk" 2>/dev/null; rm -rf "$WORK" "$RAM"' EXIT
failures=0
passes=0

ok() { echo "ok: $*"; passes=$((passes + 1)); }
bad() { echo "FAIL: $*"; failures=$((failures + 1)); }

# expect_fail "description" "substring the error must contain" cmd...
expect_fail() {
  local what="$1" needle="$2"
  shift 2
  local out
  if out="$("$@" 2>&1)"; then
    bad "$what: exited 0"
  elif ! grep -qF -- "$needle" <<<"$out"; then
    bad "$what: error does not mention '$needle':"
    echo "$out" | sed 's/^/    /'
  elif ! grep -q '^error: ' <<<"$out"; then
    bad "$what: no 'error:' line"
  else
    ok "$what"
  fi
}

finish() {
  echo "$passes passed, $failures failed"
  [ "$failures" -eq 0 ]
}

# Under FOUNDRY_POSE_AS_DEVICE the runs must pose, or a posing test would compare the CPU with
# itself: a one-step run says so.
if [ -n "${FOUNDRY_POSE_AS_DEVICE:-}" ]; then
  posing_dir="$WORK/.posing-check"
  mkdir -p "$posing_dir"
  cat >"$posing_dir/c.json" <<'JSON'
{"model": {"vocab_size": 64, "d_model": 16, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1,
           "head_dim": 8, "n_experts": 2, "top_k": 1, "ffn_dim": 16, "max_seq_len": 16},
 "train": {"steps": 1, "batch_size": 1, "seq_len": 16, "peak_gflops": 100, "checkpoint_every": 0,
           "checkpoint_at_end": false}}
JSON
  posing_out="$("$FOUNDRY" train -c "$posing_dir/c.json" --synthetic-data -q \
                 --set train.run_dir="$posing_dir/run" 2>&1)"
  rm -rf "$posing_dir"
  grep -q "the CPU backend poses as a device" <<<"$posing_out" || {
    echo "FAIL: FOUNDRY_POSE_AS_DEVICE=$FOUNDRY_POSE_AS_DEVICE, but the run did not pose as a device"
    exit 1
  }
fi

# The CPU itself, for a GPU test's reference runs: also where FOUNDRY_POSE_AS_DEVICE=1 has the
# CPU device pose as a GPU for the runs under test (FOUNDRY_TEST_DEVICE=cpu).
ON_CPU=(env -u FOUNDRY_POSE_AS_DEVICE)

# After a GPU test's probe run failed with OUTPUT: a skip (exit 77) where the failure is for
# want of a GPU or of the CUDA backend; any other failure fails the test.
gpu_probe_failed() {  # WHAT OUTPUT
  if grep -qE "no CUDA GPU is visible|built without the CUDA backend" <<<"$2"; then
    echo "skipped: no GPU to $1 ($(grep -m1 '^error' <<<"$2"))"
    exit 77
  fi
  bad "the probe ($1 on the GPU) failed:"
  echo "$2" | tail -n 20 | sed 's/^/    /'
  finish
  exit 1
}

# ---- supervised runs (foundry launch): a run directory's steps and its ranks ----

# The losses of a run's metrics.jsonl, which must hold steps 1, 2, ... in order.
step_losses() { python3 -c "
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1])]
assert [s['step'] for s in steps] == list(range(1, len(steps) + 1)), 'steps out of order'
print(' '.join(repr(s['loss']) for s in steps))" "$1"; }
last_step() {  # DIR: the last step its metrics.jsonl holds, 0 before the first
  [ -s "$1/metrics.jsonl" ] && tail -n1 "$1/metrics.jsonl" |
    python3 -c "import json,sys; print(json.load(sys.stdin)['step'])" 2>/dev/null || echo 0
}
wait_step() {  # DIR N: until metrics.jsonl reaches step N (a minute at most)
  for _ in $(seq 600); do [ "$(last_step "$1")" -ge "$2" ] 2>/dev/null && return 0; sleep 0.1; done
  return 1
}
# The pids of this test's processes whose command line matches PATTERN (pgrep -f): those working
# in $WORK, not another test's of the same command running beside it (ctest -j).
test_pids() {  # PATTERN
  local p
  for p in $(pgrep -f "$1"); do [ "/proc/$p/cwd" -ef "$WORK" ] && echo "$p"; done
  return 0
}
rank_pid() {  # DIR RANK: the rank's pid from its heartbeat record (rewritten in place: a read
  # can catch it torn, so read again)
  for _ in $(seq 50); do
    python3 -c "import json,sys; print(json.load(open(sys.argv[1]+'/heartbeat/rank_%05d.json' % int(sys.argv[2])))['pid'])" \
      "$1" "$2" 2>/dev/null && return 0
    sleep 0.05
  done
  return 1
}

# corpus/a.txt, the tiny dataset of the tests that prepare one: LINES sentences of MIN to MAX
# words drawn (seed SEED) from a small vocabulary about experts ("wide": three more words).
tiny_corpus() {  # SEED LINES MIN MAX [wide]
  python3 - "$@" <<'PY'
import os, random, sys
seed, lines, lo, hi = map(int, sys.argv[1:5])
text = ("the expert router sends each token to a small set of experts and the model learns "
        "which one fits best when data flows through layers while training runs")
if sys.argv[5:] == ["wide"]:
    text += " on many cores"
words = text.split()
rng = random.Random(seed)
os.makedirs("corpus", exist_ok=True)
with open("corpus/a.txt", "w") as f:
    for _ in range(lines):
        f.write(" ".join(rng.choice(words) for _ in range(rng.randint(lo, hi))) + ".\n")
PY
}
