#!/usr/bin/env bash
# End-to-end checks of `foundry bench comm` under mpirun: 2- and 3-rank smoke runs of all five
# collectives (exit 0, #wrong 0, table columns, JSON, CSV, profile merge), a corrupted result
# caught by the checker, the algorithm sweep, and clear errors for one rank and bad flags.
source "$(dirname "$0")/lib.sh"
cd "$WORK"
export OMP_NUM_THREADS=1  # one thread per rank: the ranks share the cores
MPIRUN=(mpirun --allow-run-as-root --oversubscribe)
SMALL=(-b 8 -e 64K -f 4 -w 2 -n 5)  # 7 sizes per op: a few seconds in all

# check_run "description" N out.txt: the run's table has every op, the columns, 7 rows per op
# (sizes 8 B .. 32 KiB, rounded to whole blocks at N ranks) and #wrong 0 everywhere.
check_table() {
  local what="$1" ranks="$2" out="$3"
  for op in all_reduce reduce_scatter all_gather broadcast all_to_all; do
    grep -qE "^# $op \(MPI_[A-Za-z_]+\) \| ranks $ranks \| float32 \| algorithm: default \(tuned decision rules\)$" "$out" \
      || { bad "$what: no $op table"; return; }
  done
  grep -qE '^# +size +count +type +op +avg +min +p50 +p99 +max +algbw +busbw +#wrong$' "$out" \
    || { bad "$what: column header missing"; return; }
  local rows wrong
  rows=$(grep -cE '^ +[0-9]+ +[0-9]+ +float ' "$out")
  wrong=$(awk '/^ +[0-9]+ +[0-9]+ +float / && $NF != 0' "$out" | wc -l)
  [ "$rows" -eq 35 ] || { bad "$what: $rows result rows, expected 35"; return; }
  [ "$wrong" -eq 0 ] || { bad "$what: $wrong rows with #wrong > 0"; return; }
  # A fit per op: t(S) = α + S/β, or "none" with the reason when time does not grow with size
  # over the range (ranks sharing cores wait on the scheduler, which can hide the size term of
  # 8 B .. 32 KiB messages; the fit itself is checked against known data in latbw_fit_test).
  [ "$(grep -cE '^# fit: (t\(S\) = .* us \+ S / .* GB/s|none \(time does not grow with size over .*; latency .* us\))' "$out")" -eq 5 ] \
    || { bad "$what: not one fit per op"; return; }
  ok "$what: 5 ops x 7 sizes, columns, #wrong 0, a fit per op"
}

# ---- 2 ranks: everything, with JSON, CSV and a profile that has a section of its own ----
echo '{"format": "foundry-hardware-profile", "version": 1, "name": "test", "gemm": {"kept": true}}' \
  >profile.json
if "${MPIRUN[@]}" -np 2 "$FOUNDRY" bench comm "${SMALL[@]}" --json np2.json --csv np2.csv \
     --profile profile.json >np2.txt 2>np2.err; then
  ok "mpirun -np 2 bench comm exits 0"
else
  bad "mpirun -np 2 bench comm failed:"; cat np2.txt np2.err
fi
check_table "np 2" 2 np2.txt
grep -q '^# command: .*bench comm' np2.txt && grep -q '^# host: .*ranks: 2' np2.txt \
  && ok "provenance header first" || bad "provenance header missing"
[ "$(grep -c '^# date:' np2.txt)" -eq 1 ] && ok "only rank 0 prints" || bad "several ranks printed"

python3 - np2.json "$(grep -c '^# fit: t(S)' np2.txt)" <<'PY' && ok "JSON: every op, S conventions, busbw factors, fit keys (as many as the table's)" || bad "JSON contents"
import json, sys
d = json.load(open(sys.argv[1]))
table_fits = int(sys.argv[2])
assert sum(1 for e in d["collectives"] if e.get("fit") is not None) == table_fits, table_fits
assert d["format"] == "foundry-bench-comm" and d["provenance"]["ranks"] == 2
ops = {e["op"]: e for e in d["collectives"]}
assert sorted(ops) == sorted(["all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all"])
factor = {"all_reduce": 1.0, "reduce_scatter": 0.5, "all_gather": 0.5, "broadcast": 1.0, "all_to_all": 0.5}
for name, e in ops.items():
    assert e["ranks"] == 2 and e["dtype"] == "float32" and e["algorithm"] == "default"
    assert e["source"] == "measured"
    # No fit where time does not grow with size (the table's "fit: none", allowed above).
    f = e.get("fit")
    if f is not None:
        assert f["alpha_s"] >= 0 and f["beta_bytes_per_s"] > 0 and f["max_rel_residual"] >= 0
        assert f["min_bytes"] == 8 and f["max_bytes"] == 32768, f
    assert [p["bytes"] for p in e["points"]] == [8 * 4**i for i in range(7)]
    for p in e["points"]:
        assert p["wrong"] == 0
        assert p["bytes"] == 4 * p["count"]
        assert p["min_s"] <= p["p50_s"] <= p["p99_s"] <= p["max_s"]
        assert p["min_s"] <= p["avg_s"] <= p["max_s"]
        assert abs(p["algbw_bytes_per_s"] - p["bytes"] / p["avg_s"]) <= 1e-9 * p["algbw_bytes_per_s"]
        assert abs(p["busbw_bytes_per_s"] - factor[name] * p["algbw_bytes_per_s"]) <= 1e-9 * p["busbw_bytes_per_s"]
PY
head -1 np2.csv | grep -q '^# date: ' && grep -q '^op,ranks,algorithm,dtype,bytes,count,avg_us,min_us,p50_us,p99_us,max_us,algbw_GBps,busbw_GBps,wrong$' np2.csv \
  && [ "$(grep -c ',float32,' np2.csv)" -eq 35 ] && ok "CSV: provenance, header, 35 rows" || bad "CSV contents"

# ---- 3 ranks: blocks rounded to whole elements, merged into the same profile ----
if "${MPIRUN[@]}" -np 3 "$FOUNDRY" bench comm "${SMALL[@]}" --profile profile.json >np3.txt 2>np3.err; then
  ok "mpirun -np 3 bench comm exits 0"
else
  bad "mpirun -np 3 bench comm failed:"; cat np3.txt np3.err
fi
check_table "np 3" 3 np3.txt
awk '/^ +[0-9]+ +[0-9]+ +float +(reduce_scatter|all_gather|all_to_all) / && ($2 % 3 != 0) {bad=1} END {exit bad}' np3.txt \
  && grep -qE '^ +12 +3 +float +all_gather ' np3.txt \
  && ok "np 3: whole blocks per rank (8 B becomes 12 B)" || bad "np 3: block rounding"
python3 - profile.json <<'PY' && ok "profile: 10 entries (5 ops x 2 rank counts), other sections kept" || bad "profile merge"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["format"] == "foundry-hardware-profile" and d["gemm"] == {"kept": True}
keys = sorted((e["op"], e["ranks"], e["algorithm"]) for e in d["collectives"])
assert len(keys) == 10 and len(set(keys)) == 10, keys
assert {r for _, r, _ in keys} == {2, 3}
PY
# Measuring again replaces entries rather than adding duplicates.
"${MPIRUN[@]}" -np 2 "$FOUNDRY" bench comm -b 8 -e 32K -f 64 -w 1 -n 2 --op all_reduce \
  --profile profile.json >/dev/null 2>&1
python3 -c "import json; d = json.load(open('profile.json')); assert len(d['collectives']) == 10; \
e = [c for c in d['collectives'] if c['op'] == 'all_reduce' and c['ranks'] == 2]; \
assert len(e) == 1 and len(e[0]['points']) == 3" && ok "profile: same op+ranks+algorithm replaced" \
  || bad "profile replace"

# ---- the checker catches a corrupted result ----
"${MPIRUN[@]}" -np 2 "$FOUNDRY" bench comm -b 8 -e 512 -f 8 -w 1 -n 2 --inject-error 1 \
  >corrupt.txt 2>corrupt.err
rc=$?
if [ "$rc" -ne 0 ] && grep -q '^error: 15 wrong result elements' corrupt.err \
   && [ "$(awk '/^ +[0-9]+ +[0-9]+ +float / && $NF == 1' corrupt.txt | wc -l)" -eq 15 ]; then
  ok "a corrupted element on rank 1 gives #wrong 1 per size and op, and a non-zero exit"
else
  bad "corruption not caught (exit $rc):"; tail -n 5 corrupt.txt corrupt.err
fi

# ---- Open MPI algorithm sweep, forced in-process ----
"${MPIRUN[@]}" -np 2 "$FOUNDRY" bench comm -b 1K -e 64K -f 8 -w 1 -n 3 --op all_reduce,broadcast \
  --algorithms >sweep.txt 2>sweep.err
rc=$?
if [ "$rc" -eq 0 ] && grep -q 'algorithm: ring (coll_tuned_allreduce_algorithm=4)$' sweep.txt \
   && grep -q 'algorithm: binomial (coll_tuned_bcast_algorithm=6)$' sweep.txt \
   && [ "$(grep -c '^# all_reduce (' sweep.txt)" -ge 5 ] \
   && awk '/^ +[0-9]+ +[0-9]+ +float / && $NF != 0 {bad = 1} END {exit bad}' sweep.txt; then
  ok "--algorithms runs every coll/tuned algorithm, all correct"
else
  bad "--algorithms sweep (exit $rc):"; grep -E '^# [a-z_]+ \(|error' sweep.txt sweep.err | head -20
fi

# ---- errors ----
expect_fail "one rank (no mpirun)" "needs at least 2 ranks (got 1); run it under mpirun, e.g. mpirun -np 2 foundry bench comm" \
  "$FOUNDRY" bench comm -b 8 -e 64
expect_fail "-b larger than -e" "-b/--minbytes (1 MiB) is larger than -e/--maxbytes (8 B)" \
  "$FOUNDRY" bench comm -b 1M -e 8
expect_fail "unparsable -b" "-b/--minbytes: '12Q'" "$FOUNDRY" bench comm -b 12Q
expect_fail "-f 1" "-f/--stepfactor must be an integer of at least 2 (got 1)" "$FOUNDRY" bench comm -f 1
expect_fail "-f 1.5" "-f/--stepfactor: '1.5' is not an integer" "$FOUNDRY" bench comm -f 1.5
expect_fail "unknown --op" "--op: unknown operation 'allreduce'" "$FOUNDRY" bench comm --op allreduce
expect_fail "-n 0" "-n/--iters must be at least 1" "$FOUNDRY" bench comm -n 0
expect_fail "--device cuda with --algorithms" "--algorithms forces Open MPI's algorithms, but --device cuda measures NCCL's" \
  "$FOUNDRY" bench comm --device cuda --algorithms
expect_fail "--device gpu" "--device 'gpu': not a device" "$FOUNDRY" bench comm --device gpu
# --device cuda where this build or machine has no GPU: the error says which, on every rank.
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  expect_fail "--device cuda without a GPU" "--device cuda:0: " \
    timeout 60 "${MPIRUN[@]}" -np 2 "$FOUNDRY" bench comm -e 64 --device cuda
fi
# A failure on rank 0 alone (an unreadable profile) ends every rank, with rank 0's error.
echo '{broken' >broken.json
expect_fail "bad --profile under mpirun" "--profile broken.json: not valid JSON" \
  timeout 60 "${MPIRUN[@]}" -np 2 "$FOUNDRY" bench comm -b 8 -e 64 -w 1 -n 2 --op broadcast --profile broken.json
[ "$(cat broken.json)" = "{broken" ] && ok "the bad profile is left as it was" || bad "bad profile overwritten"
# A --profile that is JSON but no hardware profile is refused before anything is measured or
# written.
echo '{"my": "settings"}' >notprof.json
expect_fail "--profile that is not a hardware profile" "notprof.json" \
  timeout 60 "${MPIRUN[@]}" -np 2 "$FOUNDRY" bench comm -b 8 -e 64 -w 1 -n 2 --op broadcast \
  --json np.json --profile notprof.json
[ ! -e np.json ] && [ "$(cat notprof.json)" = '{"my": "settings"}' ] \
  && ok "nothing measured or written for a foreign --profile" || bad "np.json written or notprof.json changed"

finish
