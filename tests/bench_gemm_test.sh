#!/usr/bin/env bash
# End-to-end checks of `foundry bench gemm` and `foundry bench membw` on tiny sweeps:
#  1. both run, print the provenance header and their tables, and write JSON, CSV and their
#     sections of a hardware profile (other sections kept) with the keys other code reads;
#  2. every measurement passes its own check (GEMM against a reference, STREAM validation);
#  3. bad input fails with an error naming the flag, and leaves no output file behind.
source "$(dirname "$0")/lib.sh"
cd "$WORK"
F="$FOUNDRY"

# A profile written by someone else first: its sections must survive.
cat >profile.json <<'EOF'
{"format": "foundry-hardware-profile", "version": 1, "name": "test box",
 "collectives": [{"op": "all_reduce", "ranks": 2, "alpha_s": 1e-5, "beta_bytes_per_s": 1e9}]}
EOF

# ---- bench gemm ----
if "$F" bench gemm --quick --json gemm.json --csv gemm.csv --profile profile.json >gemm.txt 2>gemm.err; then
  ok "bench gemm --quick exits 0"
else
  bad "bench gemm --quick failed:"; cat gemm.txt gemm.err
fi
for line in "^# date: " "^# command: .*bench gemm --quick" "^# host: .* cpu: " "^# libraries: foundry [0-9a-fu].*, oneDNN" \
            "^# load average before: " "^peak compute" "fp32: measured best .*estimate .* cores × .* GHz × .* lanes × 2" \
            "^square GEMMs" "^transformer GEMMs" "^expert GEMMs" "^offsize GEMMs" "^decode GEMMs" \
            "^dtype +M +N +K +lay +ms +GFLOP/s +eff +%peak +shape" "n = 128 \(multiple of 64\)" \
            "top-2 of 4 experts"; do
  grep -qE -- "$line" gemm.txt && ok "gemm output has /$line/" || bad "gemm output lacks /$line/"
done
grep -q "WRONG RESULT" gemm.txt && bad "a GEMM result is wrong" || ok "every GEMM result matches the reference"
grep -q "bench gemm" gemm.err && ok "gemm shows progress on stderr" || bad "no progress on stderr"

if python3 - gemm.json gemm.csv <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert "provenance" in j and j["provenance"]["command"].find("bench gemm") >= 0
for dt in ("bf16", "fp32"):
    c = j["compute"][dt]
    assert c["spec_flops_per_s"] > 0 and "lanes" in c["spec_basis"], c
    assert c["measured_flops_per_s"] > 0 and c["source"] == "measured", c
g = j["gemm"]
assert g["source"] == "measured"
kinds = {p["kind"] for p in g["points"]}
assert kinds == {"square", "transformer", "expert", "offsize", "decode"}, kinds
for p in g["points"]:
    for key in ("dtype", "m", "n", "k", "kind", "label", "seconds", "flops_per_s", "efficiency"):
        assert key in p, (key, p)
    assert p["valid"] and p["seconds"] > 0
    assert abs(p["flops_per_s"] - 2 * p["m"] * p["n"] * p["k"] / p["seconds"]) <= 1e-6 * p["flops_per_s"]
    best = g["best_flops_per_s"][p["dtype"]]
    assert abs(p["efficiency"] - p["flops_per_s"] / best) < 1e-9
for dt in ("bf16", "fp32"):
    assert max(p["efficiency"] for p in g["points"] if p["dtype"] == dt) == 1.0
    assert j["compute"][dt]["measured_flops_per_s"] == g["best_flops_per_s"][dt]
# expert rows = tokens * top_k / experts = 256 * 2 / 4
assert any(p["m"] == 128 and p["kind"] == "expert" for p in g["points"])
lines = open(sys.argv[2]).read().splitlines()
header = [l for l in lines if not l.startswith("#")][0]
assert lines[0].startswith("# date:"), lines[0]
assert header == "dtype,kind,m,n,k,layout,seconds,gflops_per_s,efficiency,valid,label", header
assert len([l for l in lines if not l.startswith("#")]) == 1 + len(g["points"])
PY
then ok "gemm JSON and CSV: keys, GFLOP/s = 2MNK/t, efficiency against the best rate"; else bad "gemm JSON/CSV content"; fi

# ---- bench membw ----
if "$F" bench membw --quick --json membw.json --csv membw.csv --profile profile.json >membw.txt 2>membw.err; then
  ok "bench membw --quick exits 0"
else
  bad "bench membw --quick failed:"; cat membw.txt membw.err
fi
for line in "^# date: " "^# command: .*bench membw --quick" "^caches: +L1 " \
            "^STREAM: arrays of " "^kernel +threads +bytes/run +best GB/s +avg s +min s +max s +valid" \
            "^copy .* yes$" "^scale .* yes$" "^add .* yes$" "^triad .* yes$" \
            "^working set: triad" "^ +bytes +GB/s +fits in" " L1 +#" "-- L1 = .* KiB"; do
  grep -qE -- "$line" membw.txt && ok "membw output has /$line/" || bad "membw output lacks /$line/"
done
if python3 - membw.json membw.csv profile.json <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))["memory"]
assert m["source"] == "measured" and m["spec_bytes_per_s"] is None
assert [s["kernel"] for s in m["stream"]] == ["copy", "scale", "add", "triad"]
for s in m["stream"]:
    assert s["valid"] and s["bytes_per_s"] > 0 and s["array_bytes"] == 8 << 20 and s["threads"] >= 1
    assert s["bytes_per_run"] == (2 if s["kernel"] in ("copy", "scale") else 3) * s["array_bytes"]
assert m["measured_bytes_per_s"] == max(s["bytes_per_s"] for s in m["stream"] if s["kernel"] == "triad")
ws = m["working_set"]
assert len(ws) >= 8 and all(p["bytes_per_s"] > 0 and p["kernel"] == "triad" for p in ws)
assert ws[0]["bytes"] < 20 << 10 and ws[-1]["bytes"] > 3 << 20
assert m["caches"] and all(c["bytes"] > 0 and c["level"] >= 1 for c in m["caches"])
lines = open(sys.argv[2]).read().splitlines()
assert lines[0].startswith("# date:")
assert "section,kernel,threads,array_bytes,working_set_bytes,bytes_per_run,best_seconds,gb_per_s,fits_in,valid" in lines
p = json.load(open(sys.argv[3]))
assert p["format"] == "foundry-hardware-profile" and p["version"] == 1 and p["name"] == "test box"
assert p["collectives"][0]["op"] == "all_reduce", "someone else's section was lost"
assert {"compute", "gemm", "memory"} <= set(p), set(p)
PY
then ok "membw JSON, CSV and the merged profile (other sections kept)"; else bad "membw JSON/CSV/profile content"; fi

# ---- bad input: clear errors naming the flag, no output files ----
expect_fail "gemm --sizes 0" "--sizes 0" "$F" bench gemm --sizes 0 --kinds square --json bad.json
expect_fail "gemm --sizes 12,abc" "--sizes '12,abc'" "$F" bench gemm --sizes 12,abc
expect_fail "gemm --dtype fp16" "--dtype 'fp16'" "$F" bench gemm --quick --dtype fp16
expect_fail "gemm --top-k above --experts" "--top-k 5 exceeds --experts 4" "$F" bench gemm --quick --experts 4 --top-k 5
expect_fail "gemm --offsize backwards" "--offsize 1040:1000" "$F" bench gemm --offsize 1040:1000
expect_fail "gemm --offsize-dim q" "--offsize-dim 'q'" "$F" bench gemm --quick --offsize-dim q
expect_fail "gemm --kinds cubes" "--kinds: unknown kind 'cubes'" "$F" bench gemm --quick --kinds cubes
expect_fail "gemm --peak-clock-ghz 0" "--peak-clock-ghz" "$F" bench gemm --quick --peak-clock-ghz 0
expect_fail "gemm --tokens -5" "--tokens" "$F" bench gemm --quick --tokens=-5
expect_fail "membw --max-bytes below --min-bytes" "--max-bytes 64 KiB is below --min-bytes 1 MiB" \
  "$F" bench membw --min-bytes 1M --max-bytes 64K --json bad.json
expect_fail "membw --threads 0" "--threads 0" "$F" bench membw --quick --threads 0
expect_fail "membw --repeats 1" "--repeats 1" "$F" bench membw --quick --repeats 1
expect_fail "membw --array-bytes lots" "--array-bytes 'lots'" "$F" bench membw --array-bytes lots
expect_fail "membw --min-bytes 12X" "unknown unit 'X'" "$F" bench membw --min-bytes 12X
[ -e bad.json ] && bad "a failed run left bad.json behind" || ok "failed runs write no output file"

echo '{"model": {"d_model": 8}}' >config.json
cp config.json config.orig
expect_fail "gemm --profile on a non-profile" "not a foundry hardware profile" \
  "$F" bench gemm --quick --kinds square --sizes 32 --profile config.json --json early.json
cmp -s config.json config.orig && ok "a non-profile file is left untouched" || bad "config.json was modified"
[ -e early.json ] && bad "a wrong --profile was noticed only after the run" || ok "a wrong --profile fails before the run"
ls ./*.tmp.* >/dev/null 2>&1 && bad "temporary files left behind" || ok "no temporary files left"

# ---- bench attention (a GPU's kernels): bad input fails before any GPU is needed ----
expect_fail "attention on the CPU" "give --device cuda" "$F" bench attention --json bad.json
expect_fail "attention without --profile" "needs --profile" "$F" bench attention --device cuda
echo '{"format": "foundry-hardware-profile", "version": 1, "name": "empty"}' >empty.json
cp empty.json empty.orig
expect_fail "attention --head-dim 80" "--head-dim 80" \
  "$F" bench attention --device cuda --profile empty.json --head-dim 80
expect_fail "attention --kv-heads 3 of 16" "--kv-heads 3 does not divide --heads 16" \
  "$F" bench attention --device cuda --profile empty.json --kv-heads 3
expect_fail "attention --seq 4 (too many sequences)" "more than a launch's 65,535" \
  "$F" bench attention --device cuda --profile empty.json --seq 4
expect_fail "attention against a profile without GEMM rates" "no GEMM rates" \
  "$F" bench attention --device cuda --profile empty.json --csv bad.csv
expect_fail "attention against a CPU's profile" "is a CPU's profile" \
  "$F" bench attention --device cuda --profile "$SRC/profiles/dev-machine.json"
cmp -s empty.json empty.orig && ok "attention: a refused profile is left untouched" || bad "empty.json was modified"
[ -e bad.json ] || [ -e bad.csv ] && bad "a refused bench attention wrote output" || ok "a refused bench attention writes nothing"

finish
