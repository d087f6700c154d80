#!/usr/bin/env bash
# `foundry generate --batch` end to end on a tiny trained model:
#  1. greedy results are what `foundry generate` prints for each prompt alone, in input order,
#     an invalid line reported by number and answered with an error line;
#  2. a sampled request with its own seed gives the same tokens in any batch;
#  3. the baseline schedules (lru, fixed batches) and prompt chunks of any size give the same
#     results; --trace writes a line per step;
#  4. a run killed part way (OUT cut back to some results and half a line) resumes without
#     redoing them and ends with the same file.
source "$(dirname "$0")/lib.sh"
cd "$WORK"

cat > tiny.json <<'JSON'
{
  "model": {"vocab_size": 300, "d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
            "head_dim": 8, "n_experts": 4, "top_k": 2, "ffn_dim": 48, "max_seq_len": 48},
  "train": {"steps": 6, "batch_size": 2, "seq_len": 32, "lr": 3e-3, "warmup_steps": 2,
            "precision": "fp32", "log_every": 3, "checkpoint_every": 6, "peak_gflops": 100,
            "run_dir": "run"},
  "data": {"dir": "ds"}
}
JSON
tiny_corpus 3 800 6 18
{ "$FOUNDRY" data prepare --input corpus --out ds --vocab-size 300 --quiet \
  && "$FOUNDRY" train -c tiny.json -q; } >setup.log 2>&1 || { cat setup.log; bad "setup"; finish; exit 1; }

cat > req.jsonl <<'JSON'
{"prompt": "the expert router", "max_new_tokens": 6, "temperature": 0}
{"prompt": "the expert router sends each", "max_new_tokens": 9, "temperature": 0}
{"prompt": "the model", "temperature": 0, "top_p": 3}

{"prompt": "the expert learns", "max_new_tokens": 7, "seed": 11, "temperature": 1.2}
{"prompt": "", "max_new_tokens": 5, "temperature": 0}
{"prompt_ids": [10, 20, 30], "max_new_tokens": 4}
JSON
"$FOUNDRY" generate -c tiny.json --batch req.jsonl --out out.jsonl -q >batch.log 2>&1 \
  && ok "generate --batch runs" || { cat batch.log; bad "generate --batch failed"; }
grep -q "line 3: \"top_p\" is 3" batch.log && ok "the invalid line is named by its number" \
  || bad "no warning naming line 3: $(cat batch.log)"

field() { python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).read().splitlines()[int(sys.argv[2])])[sys.argv[3]])" "$@"; }
[ "$(wc -l <out.jsonl)" = 6 ] && ok "one line per request (the blank line is none)" || bad "$(wc -l <out.jsonl) lines"
for i in 0 1; do
  prompt="$(python3 -c "import json,sys; print(json.loads(open('req.jsonl').read().splitlines()[$i])['prompt'])")"
  n="$(python3 -c "import json,sys; print(json.loads(open('req.jsonl').read().splitlines()[$i])['max_new_tokens'])")"
  alone="$("$FOUNDRY" generate -c tiny.json -p "$prompt" -n "$n" --temperature 0 2>/dev/null)"
  if [ "$alone" = "$prompt$(field out.jsonl $i text)" ]; then ok "request $i: the text generate gives it alone"
  else bad "request $i: batch '$prompt$(field out.jsonl $i text)' vs alone '$alone'"; fi
done
alone="$("$FOUNDRY" generate -c tiny.json -p "" -n 5 --temperature 0 2>/dev/null)"
[ "$alone" = "$(field out.jsonl 4 text)" ] && ok "an empty --prompt: the text of the batch's empty prompt" \
  || bad "empty prompt: alone '$alone', in the batch '$(field out.jsonl 4 text)'"
[ "$(field out.jsonl 2 line)" = 3 ] && ok "the invalid request's line: an error" || bad "line 3's result: $(sed -n 3p out.jsonl)"

# The baseline schedules, prompt chunks of 3 tokens and a trace: the same results.
for args in "--schedule lru" "--schedule fixed --max-requests 2" "--batch-tokens 3"; do
  # shellcheck disable=SC2086
  "$FOUNDRY" generate -c tiny.json --batch req.jsonl --out other.jsonl -q $args --trace trace.tsv \
    >other.log 2>&1 || { cat other.log; bad "generate --batch $args failed"; }
  cmp -s other.jsonl out.jsonl && ok "$args: the same results" || bad "$args: other results"
  rm -f other.jsonl
done
python3 - <<'PY' && ok "--trace: a header and a line per step, at most 3 rows a step, the KV memory back to 0 at the end" || bad "trace.tsv: $(head -3 trace.tsv)"
rows = [l.rstrip("\n").split("\t") for l in open("trace.tsv")]
assert rows[0] == ["seconds", "requests_done", "generated_tokens", "kv_bytes", "running",
                   "prefill_tokens", "decode_tokens"], rows[0]
steps = [list(map(float, r)) for r in rows[1:]]
import re
log = open("other.log").read()
assert len(steps) == int(re.search(r"\| (\d+) steps", log).group(1)), log
assert all(a[0] <= b[0] and a[1] <= b[1] for a, b in zip(steps, steps[1:]))
assert steps[-1][1] == 5 and steps[-1][3] == 0 and max(s[3] for s in steps) > 0
tokens = [[0, 0]] + [s[5:7] for s in steps]  # prompt and decode tokens so far
assert all(1 <= (b[0] - a[0]) + (b[1] - a[1]) <= 3 for a, b in zip(tokens, tokens[1:])), tokens
assert tokens[-1][1] > 0 and tokens[-1][0] == int(re.search(r"computed (\d+) \(schedule", log).group(1)), log
PY

# A sampled request alone, in a batch file of its own: the same tokens.
sed -n 5p req.jsonl >one.jsonl
"$FOUNDRY" generate -c tiny.json --batch one.jsonl --out one_out.jsonl -q >/dev/null 2>&1
[ "$(field one_out.jsonl 0 token_ids)" = "$(field out.jsonl 3 token_ids)" ] \
  && ok "a seeded sampled request draws the same tokens alone and in a batch" \
  || bad "seeded request: alone $(field one_out.jsonl 0 token_ids), in batch $(field out.jsonl 3 token_ids)"

# Killed after two results: they stay, the rest run, the file ends the same.
{ sed -n 5p out.jsonl; sed -n 1p out.jsonl; sed -n 2p out.jsonl | head -c 40; } >resumed.jsonl
"$FOUNDRY" generate -c tiny.json --batch req.jsonl --out resumed.jsonl -q >resume.log 2>&1
if cmp -s resumed.jsonl out.jsonl && grep -q "2 already done" resume.log; then
  ok "a killed run resumes: 2 results kept, the rest generated, the same file"
else bad "resume: $(cat resume.log)"; diff resumed.jsonl out.jsonl; fi

# A pipe for OUT: every line once, in request order, at the end (the same file).
"$FOUNDRY" generate -c tiny.json --batch req.jsonl --out /dev/stdout -q 2>/dev/null | cat >piped.jsonl
cmp -s piped.jsonl out.jsonl && ok "--out /dev/stdout writes the results to the pipe, in order" \
  || { bad "generate --batch --out /dev/stdout"; diff piped.jsonl out.jsonl; }

# SIGINT part way: the run stops after its step with exit 75, OUT holds the results finished so
# far in request order, and the same command resumes to the file of an uninterrupted run.
python3 -c "
for i in range(3000): print('{\"prompt\": \"the expert router %d\", \"max_new_tokens\": 12, \"seed\": %d}' % (i, i))
" >many.jsonl
"$FOUNDRY" generate -c tiny.json --batch many.jsonl --out many_whole.jsonl -q >/dev/null 2>&1
"$FOUNDRY" generate -c tiny.json --batch many.jsonl --out many.out -q >int.log 2>&1 &
pid=$!
for _ in $(seq 1 600); do [ -s many.out ] && break; sleep 0.05; done
kill -INT "$pid"
wait "$pid"; rc=$?
python3 - <<'PY' && ok "SIGINT: exit $rc, the results so far in request order" || bad "SIGINT: exit $rc, $(cat int.log)"
import json, re
idx = [json.loads(l)["index"] for l in open("many.out")]
n = int(re.search(r"interrupted by SIGINT: (\d+) of the 3000 requests have their results in many.out", open("int.log").read()).group(1))
assert 0 < len(idx) == n < 3000 and idx == sorted(idx), (len(idx), n)
PY
[ "$rc" = 75 ] || bad "SIGINT: exit $rc, not 75"
"$FOUNDRY" generate -c tiny.json --batch many.jsonl --out many.out -q >resumed_int.log 2>&1 \
  && cmp -s many.out many_whole.jsonl && ok "the interrupted run resumes to the same file" \
  || bad "resume after SIGINT: $(cat resumed_int.log)"

# Results of another model (here: the same checkpoint in bf16) are not kept as this one's.
cp out.jsonl kept.jsonl
if "$FOUNDRY" generate -c tiny.json --batch req.jsonl --out kept.jsonl -q --set train.precision=bf16 \
     >other_model.log 2>&1; then bad "OUT of another model was resumed: $(cat other_model.log)"
elif grep -q "by another model" other_model.log && cmp -s kept.jsonl out.jsonl; then
  ok "OUT made by another model is refused and left as it was"
else bad "another model's OUT: $(cat other_model.log)"; fi

# A checkpoint of random tokens evaluated on the dataset: warned, a checkpoint of its text not.
"$FOUNDRY" train -c tiny.json -q --synthetic-data --steps 2 --set train.run_dir=run_syn \
  --set train.checkpoint_every=2 >syn.log 2>&1 || { cat syn.log; bad "synthetic setup"; }
"$FOUNDRY" eval -c tiny.json --set train.run_dir=run_syn >syn_eval.log 2>&1
"$FOUNDRY" eval -c tiny.json >text_eval.log 2>&1
if grep -q "trained on random tokens (--synthetic-data)" syn_eval.log \
   && ! grep -q "random tokens" text_eval.log; then
  ok "eval of a --synthetic-data checkpoint on a dataset warns"
else bad "synthetic eval: $(cat syn_eval.log) / $(cat text_eval.log)"; fi

# A batch larger than the splits: windows repeat in every training batch (warned), and
# validation, which would count windows twice, is off (warned).
"$FOUNDRY" train -c tiny.json -q --steps 1 --set train.run_dir=run_big train.batch_size=4000 \
  train.checkpoint_at_end=false >big.log 2>&1 || { cat big.log; bad "a batch larger than the data"; }
grep -q "train.batch_size 4000 is more than the [0-9]* window(s) of 33 tokens the train split holds" big.log \
  && grep -q "validation is off for this run: the validation split holds [0-9]* token(s), [0-9]* window(s)" big.log \
  && ok "a batch larger than the splits trains with both warnings" || bad "big batch: $(cat big.log)"
# A dataset prepared with --val-fraction 0 (no validation split) trains, validation off.
"$FOUNDRY" data prepare --input corpus --out ds_noval --vocab-size 300 --val-fraction 0 --quiet \
  >noval_prep.log 2>&1 && "$FOUNDRY" train -c tiny.json -q --steps 2 \
  --set data.dir=ds_noval train.run_dir=run_noval >noval.log 2>&1 \
  && grep -q "validation is off for this run: the validation split holds 0 token(s)" noval.log \
  && [ -f run_noval/checkpoints/latest ] \
  && ok "a dataset without a validation split trains, validation off (warned)" \
  || bad "--val-fraction 0: $(cat noval_prep.log noval.log)"

# ---- eval --choices ----
cat > choices.jsonl <<'JSON'
{"context": "the expert router", "choices": [" sends each token", " flows", " the the the"], "answer": 0}
{"context": "the model", "choices": [" learns", " x"]}
{"context": "bad", "choices": ["only one"]}
JSON
"$FOUNDRY" eval -c tiny.json --choices choices.jsonl --out scores.jsonl -q >choices.log 2>&1 \
  && ok "eval --choices runs" || { cat choices.log; bad "eval --choices failed"; }
grep -q "2 items scored (1 invalid lines skipped) | accuracy" choices.log \
  && ok "eval --choices reports the accuracy over the items with an answer" || bad "summary: $(cat choices.log)"
python3 - <<'PY' && ok "one line per item: scores, token log-probabilities, prediction; the invalid line named" || bad "scores.jsonl"
import json, math
lines = [json.loads(l) for l in open("scores.jsonl")]
assert [l["index"] for l in lines] == [0, 1, 2], lines
a, b, c = lines
assert len(a["scores"]) == 3 and len(a["token_logprobs"]) == 3
for s, t in zip(a["scores"], a["token_logprobs"]):
    assert abs(s - sum(t)) < 1e-9 and all(x <= 0 for x in t)
assert a["prediction"] == max(range(3), key=lambda i: a["scores"][i])
assert a["correct"] == (a["prediction"] == 0) and "answer" not in b
assert c["line"] == 3 and "at least two" in c["error"]
PY

# ---- outputs through a link, to a pipe, and over another command's results ----
: >linked.jsonl  # empty: only this run's write can make it the scores
ln -s linked.jsonl scores-link.jsonl
"$FOUNDRY" eval -c tiny.json --choices choices.jsonl --out scores-link.jsonl -q >/dev/null 2>&1
[ -L scores-link.jsonl ] && cmp -s scores.jsonl linked.jsonl \
  && ok "--out through a symbolic link writes the file it names, and the link stays" \
  || bad "--out replaced the symbolic link"
"$FOUNDRY" eval -c tiny.json --choices choices.jsonl --out /dev/stdout -q 2>/dev/null | cat >piped.jsonl
cmp -s piped.jsonl scores.jsonl && [ -L /dev/stdout ] \
  && ok "eval --choices --out /dev/stdout writes the scores to the pipe" || bad "eval --choices --out /dev/stdout"
"$FOUNDRY" eval -c tiny.json --choices choices.jsonl --out /dev/stdout -q >redirected.jsonl 2>/dev/null
cmp -s redirected.jsonl scores.jsonl \
  && ok "eval --choices --out /dev/stdout redirected to a file writes the scores there" \
  || bad "eval --choices --out /dev/stdout > file"
timeout 120 "$FOUNDRY" generate -c tiny.json --batch req.jsonl --out /dev/stdout -q 2>/dev/null \
  | cat >piped-gen.jsonl
cmp -s piped-gen.jsonl out.jsonl && ok "generate --batch --out /dev/stdout: the results once, in request order" \
  || { bad "generate --batch to a pipe"; diff piped-gen.jsonl out.jsonl | head -5; }
cp out.jsonl precious.jsonl
expect_fail "eval --choices --out over generate's results" "already holds something this command did not write" \
  "$FOUNDRY" eval -c tiny.json --choices choices.jsonl --out precious.jsonl -q
cmp -s out.jsonl precious.jsonl && ok "generate's results are left as they were" || bad "precious.jsonl changed"

finish
