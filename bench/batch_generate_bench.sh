#!/usr/bin/env bash
# `foundry generate --batch` throughput with and without global prefix sharing and token
# batching, side by side: a small model of the demo's shape (ZAYA1 or the standard MoE,
# trained a few steps on a generated corpus, fp32 so any build gives the same tokens) runs one
# request file four ways, interleaved over `rounds`:
#   shared+batched  (the default: prefixes computed once, --batch-tokens 32)
#   batched         (--no-prefix-sharing)
#   shared          (--batch-tokens 1: one token a step)
#   neither         (--batch-tokens 1 --no-prefix-sharing: each request alone, in turn)
# The requests: S system prompts × F few-shot blocks × Q questions (prompts of ~64 tokens,
# most of them shared), N new tokens each, greedy. Every mode must write the same results
# (checked); the table gives the median wall time, generated tokens/s and the ratio to
# `neither`.
#   bench/batch_generate_bench.sh FOUNDRY [arch=zaya1] [rounds=3] [S=4] [F=4] [Q=8] [N=32]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
foundry="$(realpath "${1:?usage: $0 FOUNDRY [arch] [rounds] [S] [F] [Q] [N]}")"
arch="${2:-zaya1}" rounds="${3:-3}" S="${4:-4}" F="${5:-4}" Q="${6:-8}" N="${7:-32}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"

source "$root/bench/batch_model.sh"
batch_model "$foundry" "$arch" 128

python3 - "$S" "$F" "$Q" "$N" <<'PY'
import json, random, sys
S, F, Q, N = map(int, sys.argv[1:])
rng = random.Random(2)
words = "the expert router token model data layer step weight answer question example".split()
def text(n): return " ".join(rng.choice(words) for _ in range(n))
with open("requests.jsonl", "w") as f:
    for s in range(S):
        system = "System %d: %s." % (s, text(14))
        for b in range(F):
            shots = " Example %d: %s. Answer: %s." % (b, text(8), text(4))
            for q in range(Q):
                f.write(json.dumps({"prompt": system + shots + " Question: " + text(4) + "?",
                                    "max_new_tokens": N, "temperature": 0}) + "\n")
PY

declare -A args=([shared+batched]="" [batched]="--no-prefix-sharing" [shared]="--batch-tokens 1"
                 [neither]="--batch-tokens 1 --no-prefix-sharing")
modes=(shared+batched batched shared neither)
for r in $(seq 1 "$rounds"); do
  for m in "${modes[@]}"; do
    rm -f "out-$m.jsonl"
    # shellcheck disable=SC2086
    "$foundry" generate -c model.json --batch requests.jsonl --out "out-$m.jsonl" -q ${args[$m]} \
      >"log-$m-$r.txt" 2>&1
  done
done
for m in "${modes[@]}"; do
  cmp -s "out-$m.jsonl" "out-neither.jsonl" || { echo "error: $m wrote other results than neither" >&2; exit 1; }
done

echo "# generate --batch: prefix sharing and token batching"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC') | cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) | cores: $(nproc) | OMP_NUM_THREADS=$OMP_NUM_THREADS"
echo "command: bench/batch_generate_bench.sh FOUNDRY $arch $rounds $S $F $Q $N | model: $arch, d_model 384, 4 layers, fp32"
python3 - "$rounds" "${modes[@]}" <<'PY'
import re, statistics, sys
rounds, modes = int(sys.argv[1]), sys.argv[2:]
rows = {}
for m in modes:
    secs, toks, prompt, computed, steps, kv = [], 0, 0, 0, 0, ""
    for r in range(1, rounds + 1):
        log = open(f"log-{m}-{r}.txt").read()
        g = re.search(r"generated now \((\d+) tokens in ([\d.]+) s", log)
        toks, secs = int(g.group(1)), secs + [float(g.group(2))]
        p = re.search(r"context tokens (\d+) .*?, computed (\d+) .*\| (\d+) steps \| KV memory at most (.*) of", log)
        prompt, computed, steps, kv = int(p.group(1)), int(p.group(2)), int(p.group(3)), p.group(4)
    rows[m] = (statistics.median(secs), toks, prompt, computed, steps, kv)
base = rows["neither"][0]
print()
print("| mode | prompt tokens computed | decode steps | peak KV | wall s (median) | generated tokens/s | speed-up |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for m in modes:
    s, toks, prompt, computed, steps, kv = rows[m]
    print(f"| {m} | {computed} of {prompt} | {steps} | {kv} | {s:.2f} | {toks / s:.0f} | {base / s:.2f}x |")
PY
