#!/usr/bin/env bash
# A file system that fills up (or an output that cannot be written), end to end:
#  1. a command's printed output that cannot be written fails it (no empty file, exit 0);
#  2. data prepare --overwrite leaves the older dataset or the new one whole, at every amount
#     of free space;
#  3. generate --batch stops at the first result it cannot append, naming the full disk;
#  4. a checkpoint that fails on a full disk removes its unfinished files, says which checkpoint
#     stands, and the run resumes once space is freed; a leftover of a killed save is removed
#     by the next start;
#  5. metrics.jsonl that cannot be appended to is named as the cause, before the checkpoint
#     that fails after it;
#  6. a new run that cannot create its files (no inodes left) leaves no directory behind.
# The full-disk cases need a small tmpfs (mounting one needs root) and are skipped without one.
source "$(dirname "$0")/lib.sh"
cd "$WORK"

# ---- 1. stdout ----
out="$("$FOUNDRY" model info --config "$SRC/configs/demo.json" 2>&1 >/dev/full)"; rc=$?
[ $rc -ne 0 ] && grep -q "^error: cannot write the standard output: " <<<"$out" \
  && ok "stdout to a full device: exit $rc, named" || bad "stdout to /dev/full: rc=$rc: $out"
"$FOUNDRY" train --help >/dev/full 2>/dev/null && bad "train --help to /dev/full: exit 0" \
  || ok "help to a full device: not exit 0"

cat > tiny.json <<'JSON'
{
  "model": {"vocab_size": 300, "d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
            "head_dim": 8, "n_experts": 4, "top_k": 2, "ffn_dim": 48, "max_seq_len": 48},
  "train": {"steps": 6, "batch_size": 2, "seq_len": 32, "lr": 3e-3, "warmup_steps": 2,
            "precision": "fp32", "log_every": 1, "checkpoint_every": 2, "peak_gflops": 100,
            "checkpoint_async": false, "run_dir": "run"},
  "data": {"dir": "ds"}
}
JSON
tiny_corpus 3 800 6 18
{ "$FOUNDRY" data prepare --input corpus --out ds --vocab-size 300 --quiet \
  && "$FOUNDRY" train -c tiny.json -q; } >setup.log 2>&1 || { cat setup.log; bad "setup"; finish; exit 1; }

mkdir -p disk
if ! mount -t tmpfs -o size=4M,nr_inodes=400 tmpfs disk 2>/dev/null; then
  echo "skip: full disk (mounting a tmpfs needs root)"
  finish
  exit
fi
# fill PAGES: leave PAGES pages of 4 KiB free on the tmpfs.
fill() {
  rm -f disk/filler
  local avail; avail=$(df -B1 --output=avail disk | tail -1)
  fallocate -l $((avail - $1 * 4096)) disk/filler
}
# A dataset directory is whole: meta.json names every shard there, each of the size its token
# count gives (a 64-byte header, then the tokens), and a tokenizer.
dataset_whole() {
  python3 - "$1" <<'PY'
import json, os, sys
d = sys.argv[1]
m = json.load(open(os.path.join(d, "meta.json")))
listed = set()
for split in m["splits"].values():
    for shard in split["shards"]:
        listed.add(shard["file"])
        size = os.path.getsize(os.path.join(d, shard["file"]))
        assert size == 64 + shard["tokens"] * m["token_bytes"], (shard, size)
assert listed == {n for n in os.listdir(d) if n.endswith(".bin")}, listed
assert os.path.getsize(os.path.join(d, m["tokenizer"]["file"])) > 0
PY
}

# ---- 2. data prepare --overwrite on a disk with little room ----
# Many small inputs: meta.json (which lists them) is the last and a large write.
mkdir -p many
python3 - <<'PY'
import random
rng = random.Random(5)
words = "the expert router sends each token to a small set of experts".split()
for i in range(1500):
    with open(f"many/part_{i:04d}.txt", "w") as f:
        f.write(" ".join(rng.choice(words) for _ in range(12)) + "\n")
PY
head -200 corpus/a.txt > small.txt
torn=0
for free in $(seq 10 8 90); do
  rm -rf disk/*
  "$FOUNDRY" data prepare --input small.txt --out disk/d --vocab-size 290 --quiet >/dev/null 2>&1
  fill $free
  "$FOUNDRY" data prepare --input many --out disk/d --vocab-size 300 --quiet --overwrite \
    >prep.log 2>&1; rc=$?
  rm -f disk/filler
  echo "prepare --overwrite with $free pages free: exit $rc"
  if ! dataset_whole disk/d 2>/dev/null; then
    torn=1; bad "prepare --overwrite with $free pages free (rc $rc) left no whole dataset:"
    ls -la disk/d; cat prep.log
  elif [ $rc -ne 0 ] && ! grep -q "is full: free space there" prep.log; then
    torn=1; bad "prepare --overwrite with $free pages free: the error does not say the disk is full"
    cat prep.log
  fi
done
[ $torn = 0 ] && ok "prepare --overwrite on a filling disk: a whole dataset every time"

# ---- 3. generate --batch with no room for its results ----
rm -rf disk/*
python3 -c "
import json
for i in range(40): print(json.dumps({'prompt': 'the expert', 'max_new_tokens': 4, 'seed': i}))" > req.jsonl
fill 0
"$FOUNDRY" generate -c tiny.json --batch req.jsonl --out disk/o.jsonl -q >gen.log 2>&1; rc=$?
rm -f disk/filler
[ $rc -ne 0 ] && grep -q "cannot append a result to --out 'disk/o.jsonl': No space left" gen.log \
  && grep -q "is full" gen.log && ok "generate --batch stops at the first result it cannot write" \
  || { bad "generate --batch on a full disk: rc=$rc"; cat gen.log; }

# ---- 4. a checkpoint on a full disk ----
rm -rf disk/*  # room for a few checkpoints (0.7 MB each), all kept, not for all 20
"$FOUNDRY" train -c tiny.json -q --steps 40 --set train.run_dir=disk/r train.keep_checkpoints=0 \
  >ck.log 2>&1; rc=$?
if [ $rc -ne 0 ] && grep -q "the checkpoint of step [0-9]* failed: .*No space left on device" ck.log \
   && grep -q "its unfinished files were removed" ck.log \
   && grep -q "hint: the file system holding .* is full" ck.log \
   && grep -q "the checkpoint of step [0-9]* is intact: resume from it" ck.log \
   && [ -z "$(ls disk/r/checkpoints | grep '\.tmp')" ]; then
  ok "a checkpoint that fills the disk: named, its unfinished files removed"
else
  bad "checkpoint on a full disk: rc=$rc"; cat ck.log; ls -la disk/r/checkpoints
fi
# Space freed (all but the latest checkpoint removed), and a killed save's leftover.
latest="$(cat disk/r/checkpoints/latest)"
for d in disk/r/checkpoints/step_*; do [ "$(basename "$d")" = "$latest" ] || rm -rf "$d"; done
mkdir -p disk/r/checkpoints/step_00000038.abcd.tmp
echo x > disk/r/checkpoints/step_00000038.abcd.tmp/rank_00000.bin
"$FOUNDRY" train -c disk/r/config.json --resume --steps 40 --set train.keep_checkpoints=2 \
  >resume.log 2>&1; rc=$?
[ $rc -eq 0 ] && grep -q "removed what 1 unfinished checkpoint save left in disk/r/checkpoints: step_00000038.abcd.tmp" resume.log \
  && [ ! -e disk/r/checkpoints/step_00000038.abcd.tmp ] \
  && ok "the next start removes a killed save's leftover, and the run resumes" \
  || { bad "resume after freeing space: rc=$rc"; cat resume.log; ls -la disk/r/checkpoints; }

# ---- 5. metrics.jsonl on a full disk ----
rm -rf disk/*
fill 12  # room for the run's start and some steps' metrics, not for a checkpoint
"$FOUNDRY" train -c tiny.json -q --steps 100000 --set train.run_dir=disk/m train.checkpoint_every=0 \
  >met.log 2>&1; rc=$?
rm -f disk/filler
first="$(grep '^error: ' met.log | head -1)"
[ $rc -ne 0 ] && grep -q "^error: cannot append step [0-9]* to 'disk/m/metrics.jsonl': No space" <<<"$first" \
  && ok "metrics.jsonl on a full disk is named first" || { bad "metrics on a full disk: rc=$rc"; cat met.log; }

# The same with the checkpoints on a disk with room (checkpoints/ a link to it): the stop's
# checkpoint carries the step's line, and the resume writes it, so no step is missing.
rm -rf disk/* ck && mkdir -p disk/m2 ck && ln -s "$WORK/ck" disk/m2/checkpoints
fill 12
"$FOUNDRY" train -c tiny.json -q --steps 100000 --set train.run_dir=disk/m2 train.checkpoint_every=0 \
  >met2.log 2>&1; rc=$?
rm -f disk/filler
stopped="$(sed -n 's/.*cannot append step \([0-9]*\) to .*checkpoint of step \1 saved.*/\1/p' met2.log)"
# A resume with nothing left to train writes the line too; the next trains on.
"$FOUNDRY" train -c disk/m2/config.json --resume --steps "$stopped" -q >met2r.log 2>&1 \
  && [ "$(tail -1 disk/m2/metrics.jsonl | python3 -c 'import json,sys; print(json.load(sys.stdin)["step"])')" = "$stopped" ] \
  && ok "a resume with nothing to train writes the stopped step's line" \
  || { bad "resume --steps $stopped: no line for step $stopped"; cat met2r.log; tail -2 disk/m2/metrics.jsonl; }
"$FOUNDRY" train -c disk/m2/config.json --resume --steps $((stopped + 2)) -q >met2r.log 2>&1; rc2=$?
python3 - disk/m2/metrics.jsonl "$stopped" <<'PY' && [ $rc -ne 0 ] && [ $rc2 -eq 0 ] \
  && ok "the line of the step whose append failed is written by the resume (steps 1..$((stopped + 2)))" \
  || { bad "metrics after a failed append: rc=$rc rc2=$rc2 stopped='$stopped'"; cat met2.log met2r.log; }
import json, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1])]
stop = int(sys.argv[2])
assert steps == list(range(1, stop + 3)), (steps[-5:], stop)
PY

# ---- 6. no inodes left for a new run's files: a start that fails leaves nothing behind ----
rm -rf disk/*
mkdir -p disk/inodes
left=0
for free in 1 2 3 4 5 6; do
  rm -rf disk/r6 disk/inodes/*
  avail=$(df --output=iavail disk | tail -1)
  [ "$avail" -gt 5000 ] && { echo "skip: the tmpfs has no inode limit ($avail free)"; break; }
  for i in $(seq $((avail - free))); do : > disk/inodes/f$i; done 2>/dev/null
  "$FOUNDRY" train -c tiny.json -q --steps 2 --set train.run_dir=disk/r6 >ino.log 2>&1 && continue
  # (a run that trained a step before its checkpoint failed keeps what it wrote)
  [ -e disk/r6 ] && [ ! -s disk/r6/metrics.jsonl ] \
    && { left=1; bad "a start that failed with $free inodes free left disk/r6:"; ls -la disk/r6; cat ino.log; }
done
rm -rf disk/inodes
[ $left = 0 ] && ok "a new run that cannot create its files leaves nothing behind"

umount disk
finish
