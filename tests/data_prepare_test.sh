#!/usr/bin/env bash
# End-to-end checks of `foundry data prepare` on small generated inputs:
#  1. text, JSONL and JSON-array inputs (files and a folder) give a complete dataset whose
#     meta.json and shard headers agree with each other and with docs/formats.md;
#  2. the same input gives byte-identical output, and --tokenizer reuses a tokenizer;
#  3. every bad input fails with a message naming the file or flag, and leaves no meta.json;
#  4. SIGINT/SIGTERM stop it and leave --out as it was.
source "$(dirname "$0")/lib.sh"
case "$FOUNDRY" in /*) ;; *) FOUNDRY="$PWD/$FOUNDRY" ;; esac  # the checks run inside $WORK
cd "$WORK"

# ---- inputs ----
python3 - <<'PY'
import json, random, os
rng = random.Random(5)
words = ("the expert router sends each token to a small set of experts and the model learns "
         "which one fits best when data flows through layers while training runs on many cores").split()
def sentence():
    return " ".join(rng.choice(words) for _ in range(rng.randint(4, 14))) + "."
os.makedirs("corpus/nested", exist_ok=True)
with open("corpus/a.txt", "w") as f:
    for _ in range(150):
        f.write(sentence() + "\n")
    f.write("\n\n")  # blank lines are not documents
with open("corpus/b.jsonl", "w") as f:
    for i in range(100):
        f.write(json.dumps({"id": i, "text": sentence() + "\n" + sentence()}) + "\n")
with open("corpus/nested/c.json", "w") as f:
    json.dump([sentence() for _ in range(50)], f, indent=1)
PY

F="$FOUNDRY"
common=(--vocab-size 300 --val-fraction 0.1 --shard-tokens 2000 --quiet)

# ---- success ----
if "$F" data prepare --input corpus --out ds "${common[@]}" >prep.log 2>&1; then
  ok "prepare a folder of text, JSONL and JSON-array files"
else
  cat prep.log; bad "prepare failed"; finish; exit 1
fi
python3 - ds <<'PY' && ok "meta.json lists every shard; shard headers match it (magic, version, width, count, vocab, checksum)" || bad "dataset layout (see above)"
import json, os, struct, sys
d = sys.argv[1]
meta = json.load(open(os.path.join(d, "meta.json")))
errors = []
def check(cond, what):
    if not cond: errors.append(what)
check(meta["format"] == "foundry-token-dataset" and meta["format_version"] == 1, "format")
check(meta["vocab_size"] == 300 and meta["token_bytes"] == 2, "vocab/width")
check([s["format"] for s in meta["sources"]] == ["text", "jsonl", "json-array"], "source formats")
check([s["documents"] for s in meta["sources"]] == [150, 100, 50], "documents per source")
check(meta["splits"]["train"]["documents"] + meta["splits"]["val"]["documents"] == 300, "doc split")
check(meta["splits"]["val"]["documents"] == 30, "val documents = 0.1 * 300")
check(len(meta["splits"]["train"]["shards"]) > 1, "several train shards")
check(meta["tokenizer"]["eos_id"] == 2, "eos id")
files = {"meta.json", "tokenizer.model"}
for split in ("train", "val"):
    total = 0
    for i, s in enumerate(meta["splits"][split]["shards"]):
        check(s["file"] == f"{split}_{i:05d}.bin", "shard name " + s["file"])
        files.add(s["file"])
        raw = open(os.path.join(d, s["file"]), "rb").read()
        magic, version, width, count, vocab = struct.unpack_from("<8sIIQI", raw, 0)
        tok_sum, = struct.unpack_from("<Q", raw, 32)
        check(magic == b"FDRYTOK\0" and version == 1 and width == 2, "header of " + s["file"])
        check(count == s["tokens"] and vocab == 300, "count/vocab of " + s["file"])
        check(len(raw) == 64 + 2 * count, "size of " + s["file"])
        check(f"{tok_sum:016x}" == meta["tokenizer"]["checksum"], "tokenizer checksum of " + s["file"])
        check(count == 0 or max(struct.unpack_from(f"<{count}H", raw, 64)) < 300, "ids of " + s["file"])
        total += count
    check(total == meta["splits"][split]["tokens"], split + " token total")
check(set(os.listdir(d)) == files, "no stray files: " + str(sorted(os.listdir(d))))
for e in errors: print("   ", e)
sys.exit(1 if errors else 0)
PY

"$F" data prepare --input corpus --out ds2 "${common[@]}" >/dev/null 2>&1
if cmp -s ds/tokenizer.model ds2/tokenizer.model && cmp -s ds/train_00000.bin ds2/train_00000.bin \
   && cmp -s ds/val_00000.bin ds2/val_00000.bin; then
  ok "same input, same tokenizer and shards"
else bad "a second run differs"; fi

"$F" data prepare --input corpus/a.txt --input corpus/b.jsonl --out ds3 --tokenizer ds/tokenizer.model \
  --val-fraction 0.05 --quiet >ds3.log 2>&1 || { cat ds3.log; bad "prepare with --tokenizer failed"; }
docs3="$(python3 -c 'import json; s = json.load(open("ds3/meta.json"))["splits"]; print(s["train"]["documents"] + s["val"]["documents"])' 2>&1)"
if cmp -s ds/tokenizer.model ds3/tokenizer.model && [ "$docs3" = 250 ]; then
  ok "--tokenizer is copied and reused; repeated --input files are all read"
else bad "--tokenizer reuse"; fi

out="$("$F" data prepare --input corpus/a.txt --out ds4 --vocab-size 300 2>&1)"
grep -q "train .* tokens" <<<"$out" && grep -q "reading" <<<"$out" \
  && ok "reports progress and a summary" || { echo "$out"; bad "no progress/summary output"; }

# ---- errors: non-zero exit, the message names the culprit, no meta.json ----
no_dataset() {  # no_dataset DIR DESCRIPTION
  if [ -e "$1/meta.json" ] || ls "$1"/*.bin >/dev/null 2>&1; then bad "$2 left files in $1"
  else ok "$2 leaves no dataset behind"; fi
}
echo '{"text": "fine"}' > bad.jsonl; echo '{"text": "broken' >> bad.jsonl
printf '[\n"a",\n"b"\n"c"]\n' > bad.json
echo '{"body": "no text field"}' > nofield.jsonl
: > empty.txt; printf '\n  \n' > blank.txt
echo "not a model" > junk.model

expect_fail "missing input" "nope.txt" "$F" data prepare --input nope.txt --out e1 "${common[@]}"
no_dataset e1 "missing input"
expect_fail "empty input" "empty.txt" "$F" data prepare --input empty.txt --input blank.txt --out e2 "${common[@]}"
no_dataset e2 "empty input"
expect_fail "malformed JSONL names file and line" "bad.jsonl:2:" "$F" data prepare --input corpus --input bad.jsonl --out e3 "${common[@]}"
no_dataset e3 "malformed JSONL"
expect_fail "malformed JSON array names file and line" "bad.json:4:" "$F" data prepare --input bad.json --out e4 "${common[@]}"
expect_fail "missing JSONL field" "nofield.jsonl:1: the object has no field \"text\"" "$F" data prepare --input nofield.jsonl --out e5 "${common[@]}"
expect_fail "vocabulary too small" "vocabulary size 100 is too small" "$F" data prepare --input corpus --out e6 --vocab-size 100 --quiet
no_dataset e6 "vocabulary too small"
expect_fail "vocabulary too large" "vocabulary size 50000 is too large" "$F" data prepare --input corpus --out e7 --vocab-size 50000 --quiet
no_dataset e7 "vocabulary too large"
expect_fail "--val-fraction out of range" "--val-fraction 0.9" "$F" data prepare --input corpus --out e8 --val-fraction 0.9
expect_fail "invalid --tokenizer" "junk.model" "$F" data prepare --input corpus --out e9 --tokenizer junk.model --quiet
no_dataset e9 "invalid --tokenizer"
expect_fail "existing dataset is not clobbered" "already holds a prepared dataset" "$F" data prepare --input corpus --out ds "${common[@]}"
cmp -s ds/train_00000.bin ds2/train_00000.bin && ok "the existing dataset is intact" || bad "the existing dataset changed"
"$F" data prepare --input corpus/a.txt --out ds --overwrite "${common[@]}" >/dev/null 2>&1 \
  && grep -q '"documents": 150' ds/meta.json && ok "--overwrite replaces a dataset" || bad "--overwrite"
# ---- text that is not UTF-8: named and counted, not replaced silently; binary is refused ----
{ printf 'br\xfbl\xe9e and cr\xe8me are desserts.\n'; cat corpus/a.txt; } > latin1.txt
"$F" data prepare --input latin1.txt --out latin "${common[@]}" >latin.log 2>&1 \
  && grep -q "'latin1.txt': 3 byte(s) on 1 line(s) are not valid UTF-8 (the first on line 1) and become U+FFFD" latin.log \
  && ok "Latin-1 bytes are counted and named" || { bad "Latin-1 input:"; cat latin.log; }
head -c 100000 /dev/urandom > noise.bin
expect_fail "binary input is refused" "'noise.bin' is not text" "$F" data prepare --input noise.bin --out e10 "${common[@]}"
no_dataset e10 "binary input"
{ cat corpus/a.txt; printf 'a line with a NUL \0 in it\n'; } > nul.txt
expect_fail "a NUL byte is refused" "'nul.txt' is not text: 1 control byte(s), NUL among them" \
  "$F" data prepare --input nul.txt --out e11 "${common[@]}"
"$F" data prepare --input nul.txt --out binary --allow-binary "${common[@]}" >/dev/null 2>&1 \
  && [ -s binary/meta.json ] && ok "--allow-binary reads it anyway" || bad "--allow-binary"

# ---- a stop signal: the work stops, what it wrote goes, --out is as it was ----
python3 - <<'PY'
import random
rng = random.Random(9)
words = "the expert router sends each token to a small set of experts and the model learns".split()
with open("big.txt", "w") as f:
    for _ in range(250000):
        f.write(" ".join(rng.choice(words) for _ in range(rng.randint(5, 30))) + ".\n")
PY
interrupt_prepare() {  # interrupt_prepare SIGNAL OUT LOG [args...]: signalled once encoding starts
  local sig="$1" out="$2" log="$3"
  shift 3
  "$F" data prepare --input big.txt --out "$out" --tokenizer ds3/tokenizer.model "$@" >"$log" 2>&1 &
  local pid=$! i
  for i in $(seq 1200); do
    compgen -G "$out/.prepare-*/tokenizer.model" >/dev/null && break
    sleep 0.05
  done
  kill "-$sig" $pid
  wait $pid
}
interrupt_prepare INT stopped/ds stop1.log
rc=$?
if [ $rc = 130 ] && [ ! -e stopped ] && grep -q "stopping: data prepare removes what it wrote" stop1.log \
   && grep -q "data prepare stopped by SIGINT" stop1.log; then
  ok "SIGINT stops prepare, which removes the directories it made and exits as killed by it"
else bad "SIGINT during prepare: exit $rc, $(ls -a stopped 2>&1 | tr '\n' ' ')"; cat stop1.log; fi
before="$(cd ds2 && md5sum * | sort)"
interrupt_prepare TERM ds2 stop2.log --overwrite
rc=$?
after="$(cd ds2 && md5sum * | sort)"
if [ $rc = 143 ] && [ "$before" = "$after" ] && ! compgen -G "ds2/.prepare-*" >/dev/null; then
  ok "SIGTERM during an --overwrite leaves the dataset there whole, and no staging files"
else bad "SIGTERM during prepare --overwrite: exit $rc, $(ls -a ds2 | tr '\n' ' ')"; cat stop2.log; fi
finish
