#!/usr/bin/env bash
# Batch generation under four schedules, side by side on one model, one request file and one
# KV budget (BatchLLM's comparison; docs/formats.md, "Batch generation"):
#   one-at-a-time  --schedule fixed --max-requests 1: each request alone, in turn
#   fixed          --schedule fixed --max-requests $BATCH: batches in arrival order, each run
#                  to its end, nothing shared
#   lru            --schedule lru: arrival order over a prefix cache that keeps finished
#                  prefixes and evicts the least recently used when the budget needs room
#                  (the serving-system baseline)
#   prefix-tree    the default: global prefix tree, each prefix's group together, freed after
#                  its last request
# Two workloads of R requests, each Q question tokens after its prompt and N new tokens
# (ignore_eos: every request generates all N), in a shuffled arrival order:
#   shared    S system prompts of P tokens, each request under one of them
#   unshared  every prompt P + Q tokens of its own
# The model has the demo's shape (d_model 384, 4 layers, 8 experts, fp32), trained 10 steps.
# Every schedule must write the same results (checked). Prints a table per workload and
# plots the KV memory in use over time to $PLOT (gnuplot).
#   bench/batch_schedules_bench.sh FOUNDRY [arch=zaya1] [R=256] [S=4] [P=1024] [Q=64] [N=64]
# Environment: TOKENS (--batch-tokens, 64), BATCH (fixed's batch and every schedule's
# --max-requests, 32), KV (--kv-memory of every schedule, e.g. 24M; default: no limit),
# PLOT (default: docs/figures/batch_schedules_<arch>.png), WORKLOADS ("shared unshared").
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
foundry="$(realpath "${1:?usage: $0 FOUNDRY [arch] [R] [S] [P] [Q] [N]}")"
arch="${2:-zaya1}" R="${3:-256}" S="${4:-4}" P="${5:-1024}" Q="${6:-64}" N="${7:-64}"
TOKENS="${TOKENS:-64}" BATCH="${BATCH:-32}" KV="${KV:-}" WORKLOADS="${WORKLOADS:-shared unshared}"
PLOT="$(realpath -m "${PLOT:-$root/docs/figures/batch_schedules_$arch.png}")"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"

max_len=$(( (P + Q + N + 1 + 63) / 64 * 64 ))
python3 - "$arch" "$max_len" <<'PY'
import json, random, sys, os
arch, max_len = sys.argv[1], int(sys.argv[2])
rng = random.Random(1)
words = ("the expert router sends each token to a small set of experts and the model learns "
         "which one fits best when data flows through layers while training runs on many "
         "cores question answer example because every step reads the weights once").split()
os.makedirs("corpus", exist_ok=True)
with open("corpus/a.txt", "w") as f:
    for _ in range(4000):
        f.write(" ".join(rng.choice(words) for _ in range(rng.randint(6, 20))) + ".\n")
model = {"arch": arch, "vocab_size": 512, "d_model": 384, "n_layers": 4, "n_heads": 6,
         "n_kv_heads": 2, "head_dim": 64, "n_experts": 8, "top_k": 1 if arch == "zaya1" else 2,
         "ffn_dim": 1408 if arch == "zaya1" else 704, "max_seq_len": max_len}
if arch == "zaya1":
    model.update({"router_latent_dim": 128, "rope_fraction": 0.5})
json.dump({"model": model,
           "train": {"steps": 10, "batch_size": 8, "seq_len": 128, "lr": 2e-3, "warmup_steps": 2,
                     "precision": "fp32", "log_every": 10, "checkpoint_every": 10,
                     "peak_gflops": 100, "run_dir": "run"},
           "data": {"dir": "ds"}}, open("model.json", "w"), indent=1)
PY
"$foundry" data prepare --input corpus --out ds --vocab-size 512 --quiet >/dev/null
"$foundry" train -c model.json -q >/dev/null 2>&1

python3 - "$R" "$S" "$P" "$Q" "$N" <<'PY'
import json, random, sys
R, S, P, Q, N = map(int, sys.argv[1:])
rng = random.Random(2)
def ids(n): return [rng.randrange(1, 512) for _ in range(n)]
systems = [ids(P) for _ in range(S)]
with open("shared.jsonl", "w") as f:
    for _ in range(R):
        prompt = rng.choice(systems) + ids(Q)
        f.write(json.dumps({"prompt_ids": prompt, "max_new_tokens": N, "temperature": 0,
                            "ignore_eos": True}) + "\n")
with open("unshared.jsonl", "w") as f:
    for _ in range(R):
        f.write(json.dumps({"prompt_ids": ids(P + Q), "max_new_tokens": N, "temperature": 0,
                            "ignore_eos": True}) + "\n")
PY

declare -A args=([one-at-a-time]="--schedule fixed --max-requests 1"
                 [fixed]="--schedule fixed --max-requests $BATCH"
                 [lru]="--schedule lru --max-requests $BATCH"
                 [prefix-tree]="--max-requests $BATCH")
schedules=(prefix-tree lru fixed one-at-a-time)
kv_arg=()
[ -n "$KV" ] && kv_arg=(--kv-memory "$KV")
for w in $WORKLOADS; do
  for s in "${schedules[@]}"; do
    echo "running $w / $s" >&2
    # shellcheck disable=SC2086
    "$foundry" generate -c model.json --batch "$w.jsonl" --out "out-$w-$s.jsonl" -q \
      --batch-tokens "$TOKENS" "${kv_arg[@]}" --trace "trace-$w-$s.tsv" ${args[$s]} \
      >"log-$w-$s.txt" 2>&1 || { cat "log-$w-$s.txt" >&2; exit 1; }
  done
  for s in "${schedules[@]}"; do
    cmp -s "out-$w-$s.jsonl" "out-$w-prefix-tree.jsonl" ||
      { echo "error: $s wrote other results than prefix-tree on $w" >&2; exit 1; }
  done
done

echo "# generate --batch: four schedules"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC') | cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) | cores: $(nproc) | OMP_NUM_THREADS=$OMP_NUM_THREADS"
echo "command: TOKENS=$TOKENS BATCH=$BATCH KV=${KV:-none} bench/batch_schedules_bench.sh FOUNDRY $arch $R $S $P $Q $N | model: $arch, d_model 384, 4 layers, fp32"
python3 - "$WORKLOADS" "${schedules[@]}" <<'PY'
import re, sys
workloads, schedules = sys.argv[1].split(), sys.argv[2:]
for w in workloads:
    rows = {}
    for s in schedules:
        log = open(f"log-{w}-{s}.txt").read()
        g = re.search(r"generated now \((\d+) tokens in ([\d.]+) s", log)
        p = re.search(r"prompt tokens (\d+), computed (\d+) .*\| (\d+) steps \| KV memory at most (.*?) of", log)
        e = re.search(r"(\d+) cached prefixes evicted", log)
        rows[s] = dict(tokens=int(g.group(1)), secs=float(g.group(2)), prompt=int(p.group(1)),
                       computed=int(p.group(2)), steps=int(p.group(3)), kv=p.group(4),
                       evicted=e.group(1) if e else "")
    print(f"\n{w} workload\n")
    print("| schedule | prompt tokens computed | steps | peak KV | evictions | time to last result s | generated tokens/s | prefix-tree's speed-up |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    base = rows["prefix-tree"]["secs"]
    for s in schedules:
        r = rows[s]
        print(f"| {s} | {r['computed']:,} of {r['prompt']:,} | {r['steps']:,} | {r['kv']} | {r['evicted']} "
              f"| {r['secs']:.2f} | {r['tokens'] / r['secs']:,.0f} | {r['secs'] / base:.2f}x |")
PY

if command -v gnuplot >/dev/null; then
  mkdir -p "$(dirname "$PLOT")"
  plots=""
  for w in $WORKLOADS; do
    plots+="set title '$w workload'; plot "
    for s in "${schedules[@]}"; do
      plots+="'trace-$w-$s.tsv' using 1:(\$4/1048576) every ::1 with lines lw 2 title '$s', "
    done
    plots="${plots%, }; "
  done
  n=$(wc -w <<<"$WORKLOADS")
  gnuplot <<GP
set terminal pngcairo size 1000,$((380 * n))
set output '$PLOT'
set multiplot layout $n,1 title 'KV memory in use, $arch, $R requests (KV budget: ${KV:-none})'
set grid
set key top right
set xlabel 'seconds'
set ylabel 'KV MiB'
set logscale x
$plots
unset multiplot
GP
  echo "wrote $PLOT" >&2
fi
