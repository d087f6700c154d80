#!/usr/bin/env python3
"""zaya-bench's training throughput against moe-bench's, side by side.

    bench/zaya_moe_ratio.py FOUNDRY [FOUNDRY ...] [--rounds 6] [--steps 24]

Each round trains configs/moe-bench.json and configs/zaya-bench.json once with every binary
given (random tokens, bf16, no checkpoint, `--op-breakdown`); the order is reversed every
other round, so a machine whose speed drifts slows both models alike. Prints each run's
tokens/s as it ends; then, per binary, a table of the rounds' tokens/s and zaya/moe ratios,
the median ratio, and the median of every operation's time per step for both models with
the difference (the figures docs/PERFORMANCE.md records).
"""
import argparse
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ("moe", "zaya")
TOKENS = re.compile(r"\| ([0-9.]+) tokens/s")
OP_LINE = re.compile(r"^  (\S.*?)\s+([0-9.]+) ms", re.M)


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def train_once(foundry, model, steps, run_dir):
    config = os.path.join(ROOT, "configs", f"{model}-bench.json")
    cmd = [foundry, "train", "--config", config, "--synthetic-data", "--steps", str(steps), "-q",
           "--op-breakdown", "--set", f"train.run_dir={run_dir}", "train.checkpoint_every=0",
           "train.checkpoint_at_end=false"]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    shutil.rmtree(run_dir, ignore_errors=True)
    found = TOKENS.search(done.stdout)
    if done.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} exited {done.returncode}:\n{done.stdout[-2000:]}")
    if not found:
        sys.exit(f"error: {' '.join(cmd)} printed no tokens/s:\n{done.stdout[-2000:]}")
    ops = {m.group(1).strip(): float(m.group(2)) for m in OP_LINE.finditer(done.stdout)}
    return float(found.group(1)), ops


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("foundry", nargs="+", help="foundry binaries to compare")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=24)
    args = ap.parse_args()
    if args.rounds < 1 or args.steps < 5:
        # Runs of 4 steps or fewer time their first (cold) steps too.
        sys.exit("error: --rounds must be >= 1 and --steps >= 5 (the first two steps warm up)")
    for b in args.foundry:
        if not (os.path.isfile(b) and os.access(b, os.X_OK)):
            sys.exit(f"error: '{b}' is not an executable (build it first: cmake --build build)")

    print("# zaya-bench against moe-bench, interleaved")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} | host: "
          f"{socket.gethostname()} | cpu: {cpu_model()} | cores: {os.cpu_count()} | "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(unset)')} | "
          f"load before: {' '.join(open('/proc/loadavg').read().split()[:3])}")
    print(f"command: bench/zaya_moe_ratio.py {' '.join(args.foundry)} --rounds {args.rounds} "
          f"--steps {args.steps}\n")

    runs = {}  # (binary, model) -> [(tokens/s, ops)]
    work = tempfile.mkdtemp(prefix="zaya_moe_ratio.")
    try:
        for r in range(args.rounds):
            order = [(b, m) for b in args.foundry for m in MODELS]
            if r % 2:
                order.reverse()
            for b, m in order:
                tps, ops = train_once(b, m, args.steps, os.path.join(work, m))
                runs.setdefault((b, m), []).append((tps, ops))
                print(f"round {r + 1}: {b} {m}-bench {tps:.0f} tokens/s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    for b in args.foundry:
        moe = [t for t, _ in runs[(b, "moe")]]
        zaya = [t for t, _ in runs[(b, "zaya")]]
        ratios = [z / m for z, m in zip(zaya, moe)]
        print(f"\n## {b}\n")
        print("| round | moe-bench tokens/s | zaya-bench tokens/s | ratio |")
        print("| ---: | ---: | ---: | ---: |")
        for i, (m, z, q) in enumerate(zip(moe, zaya, ratios)):
            print(f"| {i + 1} | {m:.0f} | {z:.0f} | {q:.3f} |")
        print(f"\nmedian ratio {statistics.median(ratios):.3f}\n")
        names = list(dict.fromkeys(k for m in MODELS for _, ops in runs[(b, m)] for k in ops))
        print("| operation (median ms a step) | moe-bench | zaya-bench | zaya - moe |")
        print("| --- | ---: | ---: | ---: |")
        for name in sorted(names, key=lambda n: (n == "total", n)):
            med = {m: statistics.median(ops.get(name, 0.0) for _, ops in runs[(b, m)])
                   for m in MODELS}
            print(f"| {name} | {med['moe']:.1f} | {med['zaya']:.1f} | "
                  f"{med['zaya'] - med['moe']:+.1f} |")


if __name__ == "__main__":
    main()
