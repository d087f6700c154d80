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
# PLOT (default: docs/figures/batch_schedules_<arch>.png), WORKLOADS ("shared unshared"),
# SCHEDULES (default: "prefix-tree lru fixed one-at-a-time"; prefix-tree must be among them),
# KV_SWEEP (budgets, e.g. "32M 16M": the shared workload again under each, prefix-tree and lru
# only), ROUNDS (2: every run that many times, interleaved; the table gives the median),
# DEVICE (where generate decodes: cpu, the default, or cuda[:N]; the model trains on the CPU).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
foundry="$(realpath "${1:?usage: $0 FOUNDRY [arch] [R] [S] [P] [Q] [N]}")"
arch="${2:-zaya1}" R="${3:-256}" S="${4:-4}" P="${5:-1024}" Q="${6:-64}" N="${7:-64}"
TOKENS="${TOKENS:-64}" BATCH="${BATCH:-32}" KV="${KV:-}" WORKLOADS="${WORKLOADS:-shared unshared}"
KV_SWEEP="${KV_SWEEP:-}" ROUNDS="${ROUNDS:-2}" DEVICE="${DEVICE:-cpu}"
PLOT="$(realpath -m "${PLOT:-$root/docs/figures/batch_schedules_$arch.png}")"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"

max_len=$(( (P + Q + N + 1 + 63) / 64 * 64 ))
source "$root/bench/batch_model.sh"
batch_model "$foundry" "$arch" "$max_len"

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
read -r -a schedules <<<"${SCHEDULES:-prefix-tree lru fixed one-at-a-time}"
# Cases: name, workload, KV budget ("" = none), schedules.
cases=()
for w in $WORKLOADS; do cases+=("$w|$w|$KV|${schedules[*]}"); done
for kv in $KV_SWEEP; do cases+=("shared-$kv|shared|$kv|prefix-tree lru"); done
run_case() {  # case, round
  local name w kv list s kv_arg=()
  IFS='|' read -r name w kv list <<<"$1"
  [ -n "$kv" ] && kv_arg=(--kv-memory "$kv")
  for s in $list; do
    echo "round $2: $name / $s" >&2
    rm -f "out-$name-$s.jsonl"
    # shellcheck disable=SC2086
    "$foundry" generate -c model.json --batch "$w.jsonl" --out "out-$name-$s.jsonl" -q \
      --batch-tokens "$TOKENS" "${kv_arg[@]}" --trace "trace-$name-$s-$2.tsv" ${args[$s]} \
      --device "$DEVICE" \
      >"log-$name-$s-$2.txt" 2>&1 || { cat "log-$name-$s-$2.txt" >&2; exit 1; }
    cmp -s "out-$name-$s.jsonl" "out-$name-prefix-tree.jsonl" ||
      { echo "error: $s wrote other results than prefix-tree on $name" >&2; exit 1; }
  done
}
for r in $(seq 1 "$ROUNDS"); do
  for c in "${cases[@]}"; do run_case "$c" "$r"; done
done

echo "# generate --batch: four schedules"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC') | cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) | cores: $(nproc) | OMP_NUM_THREADS=$OMP_NUM_THREADS"
echo "command: TOKENS=$TOKENS BATCH=$BATCH KV=${KV:-none} KV_SWEEP='$KV_SWEEP' ROUNDS=$ROUNDS DEVICE=$DEVICE bench/batch_schedules_bench.sh FOUNDRY $arch $R $S $P $Q $N | model: $arch, d_model 384, 4 layers, fp32 | wall time: the median of $ROUNDS interleaved rounds"
python3 - "$ROUNDS" "${cases[@]}" <<'PY'
import re, statistics, sys
rounds, cases = int(sys.argv[1]), sys.argv[2:]
for case in cases:
    name, w, kv, schedules = case.split("|")
    rows = {}
    for s in schedules.split():
        secs = []
        for r in range(1, rounds + 1):
            log = open(f"log-{name}-{s}-{r}.txt").read()
            g = re.search(r"generated now \((\d+) tokens in ([\d.]+) s", log)
            secs.append(float(g.group(2)))
        p = re.search(r"context tokens (\d+) .*?, computed (\d+) .*\| (\d+) steps \| KV memory at most (.*?) of", log)
        e = re.search(r"(\d+) cached prefixes evicted", log)
        rows[s] = dict(tokens=int(g.group(1)), secs=statistics.median(secs), prompt=int(p.group(1)),
                       computed=int(p.group(2)), steps=int(p.group(3)), kv=p.group(4),
                       evicted=e.group(1) if e else "")
    print(f"\n{w} workload, KV budget {kv or 'none'}\n")
    print("| schedule | prompt tokens computed | steps | peak KV | evictions | time to last result s | generated tokens/s | prefix-tree's speed-up |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    base = rows["prefix-tree"]["secs"]
    for s, r in rows.items():
        print(f"| {s} | {r['computed']:,} of {r['prompt']:,} | {r['steps']:,} | {r['kv']} | {r['evicted']} "
              f"| {r['secs']:.2f} | {r['tokens'] / r['secs']:,.0f} | {r['secs'] / base:.2f}x |")
PY

if command -v gnuplot >/dev/null; then
  mkdir -p "$(dirname "$PLOT")"
  plots=""
  for c in "${cases[@]}"; do
    IFS='|' read -r name w kv list <<<"$c"
    plots+="set title '$w workload, KV budget ${kv:-none}'; plot "
    for s in $list; do
      plots+="'trace-$name-$s-1.tsv' using 1:(\$4/1048576) every ::1 with lines lw 2 title '$s', "
    done
    plots="${plots%, }; "
  done
  n=${#cases[@]}
  gnuplot <<GP
set terminal pngcairo size 1000,$((380 * n))
set output '$PLOT'
set multiplot layout $n,1 title 'KV memory in use, $arch, $R requests'
set grid
set key outside right
set xlabel 'seconds'
set ylabel 'KV MiB'
set logscale x
$plots
unset multiplot
GP
  echo "wrote $PLOT" >&2
fi
