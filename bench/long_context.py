#!/usr/bin/env python3
"""Training throughput and memory against sequence length, for one or two foundry builds.

For each sequence length T the config trains a few steps on random tokens at batch
max(1, tokens // T) (so every length sees about the same tokens per step), and the table
gives tokens/s (median of the steps after the first), the step time, the peak resident
memory (the run's own report) and the attention core's share of the step
(from --op-breakdown). With --old, the old build runs each length right before the new one
(up to --old-max, beyond which it does not fit in memory), so both see the same machine.
With --cp 1,2,4 each length runs at every context-parallel size, under mpirun with C ranks
sharing the cores (OMP_NUM_THREADS = cores / C, at least 1), peak memory per rank; with
--bytes the bytes rank 0 sends per step are measured too (Open MPI's pml monitoring, runs
of 1 and 2 steps: the difference is one step's traffic).

    bench/long_context.py [--foundry build/foundry] [--old OLD_FOUNDRY] [--config C]
                          [--lengths 2048,4096,...] [--tokens 8192] [--steps 3]
                          [--cp 1,2,4] [--bytes]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--foundry", default="build/foundry")
    p.add_argument("--old", help="a second (older) foundry binary to run side by side")
    p.add_argument("--old-max", type=int, default=8192, help="longest sequence for --old")
    p.add_argument("--config", default="configs/zaya-bench.json")
    p.add_argument("--lengths", default="2048,4096,8192,16384,32768")
    p.add_argument("--tokens", type=int, default=8192, help="tokens per step (batch = tokens // T)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--precision", default="bf16")
    p.add_argument("--cp", default="1", help="context-parallel sizes, e.g. 1,2,4")
    p.add_argument("--bytes", action="store_true", help="also measure bytes sent per step")
    p.add_argument("--set", action="append", default=[], help="extra --set overrides")
    return p.parse_args()


def mpi_prefix(cp, monitor=None):
    if cp == 1 and not monitor:
        return [], {}
    threads = max(1, (os.cpu_count() or 1) // cp)
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(cp),
           "-x", "OMP_NUM_THREADS"]
    if monitor:
        cmd += ["--mca", "pml_monitoring_enable", "2", "--mca", "pml_monitoring_enable_output", "3",
                "--mca", "pml_monitoring_filename", monitor]
    return cmd, {"OMP_NUM_THREADS": str(threads)}


def train_command(binary, args, seq, run_dir, steps, cp):
    batch = max(1, args.tokens // seq)
    cmd = [binary, "train", "--config", args.config, "--synthetic-data", "--steps", str(steps),
           "-q", "--op-breakdown",
           "--set", f"model.max_seq_len={seq}", "--set", f"train.seq_len={seq}",
           "--set", f"train.batch_size={batch}", "--set", f"train.precision={args.precision}",
           "--set", f"train.run_dir={run_dir}", "--set", "train.checkpoint_every=0",
           "--set", "train.peak_gflops=1000", "--set", "train.log_every=1",
           "--set", f"train.context_parallel={cp}", "--set", "train.hang_timeout_s=1800"]
    for extra in args.set:
        cmd += ["--set", extra]
    return cmd, batch


def run(binary, args, seq, tmp, tag, cp=1):
    run_dir = os.path.join(tmp, f"{tag}-{seq}-cp{cp}")
    cmd, batch = train_command(binary, args, seq, run_dir, args.steps, cp)
    prefix, env = mpi_prefix(cp)
    start = time.time()
    proc = subprocess.run(prefix + cmd, capture_output=True, text=True, env={**os.environ, **env})
    if proc.returncode != 0:
        sys.exit(f"error: {binary} failed at T={seq} (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    steps = rows[1:] or rows
    ops = dict(re.findall(r"^\s+(\S+)\s+([0-9.]+) ms", proc.stderr, re.M))
    memory = re.search(r"peak RSS before the final checkpoint(.*)", proc.stdout + proc.stderr)
    if not memory:
        sys.exit(f"error: no memory line in the output of {' '.join(cmd)}")
    rss_mib = max(float(x.replace(",", "")) for x in re.findall(r"([0-9][0-9,.]*) MiB", memory.group(1)))
    total = float(ops.get("total", "nan"))
    return {
        "batch": batch,
        "tps": statistics.median(r["tokens_per_s"] for r in steps),
        "step_s": statistics.median(r["step_time_s"] for r in steps),
        "rss": rss_mib * 2**20,
        "attention_share": float(ops.get("attention", "nan")) / total,
        "wall_s": time.time() - start,
        "cp_ms": sum(float(v) for k, v in ops.items() if k.startswith("cp_")),
        "step_ms": total,
    }


def sent_bytes(binary, args, seq, tmp, cp, steps):
    """Bytes rank 0 sent in a run of `steps` steps (all communicators)."""
    run_dir = os.path.join(tmp, f"bytes-{seq}-cp{cp}-{steps}")
    monitor = os.path.join(tmp, f"mon-{seq}-cp{cp}-{steps}")
    cmd, _ = train_command(binary, args, seq, run_dir, steps, cp)
    prefix, env = mpi_prefix(cp, monitor)
    proc = subprocess.run(prefix + cmd, capture_output=True, text=True, env={**os.environ, **env})
    if proc.returncode != 0:
        sys.exit(f"error: monitored run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    total = 0
    for line in open(monitor + ".0.prof"):
        f = line.split()
        if f and f[0] in ("E", "I"):
            total += int(f[3])
    return total


def main():
    args = parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    env = os.environ.get("OMP_NUM_THREADS", str(os.cpu_count()))
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print("# foundry: training against sequence length")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} | cpu: {cpu} | cores: {os.cpu_count()}"
          f" | OMP_NUM_THREADS={env} | load before: {open('/proc/loadavg').read().split()[0]}")
    print(f"command: {' '.join(sys.argv)}")
    print()
    builds = [("new", args.foundry)] + ([("old", args.old)] if args.old else [])
    cps = [int(x) for x in args.cp.split(",")]
    print("| T | batch | build | context parallel | tokens/s | step (s) | peak RSS per rank (GiB) "
          "| attention share | CP exchanges (ms/step) |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for seq in lengths:
            for cp in cps:
                for tag, binary in reversed(builds):
                    if tag == "old" and (seq > args.old_max or cp > 1):
                        if cp == 1:
                            print(f"| {seq} | | old | 1 | does not fit | | | | |", flush=True)
                        continue
                    r = run(binary, args, seq, tmp, tag, cp)
                    print(f"| {seq} | {r['batch']} | {tag} | {cp} | {r['tps']:,.0f} | {r['step_s']:.2f} "
                          f"| {r['rss'] / 2**30:.2f} | {100 * r['attention_share']:.1f}% "
                          f"| {r['cp_ms']:.0f} |", flush=True)
        if args.bytes:
            print()
            print("| T | context parallel | bytes rank 0 sends per step (MB) |")
            print("|---:|---:|---:|")
            for seq in lengths:
                for cp in cps:
                    if cp == 1:
                        continue
                    one = sent_bytes(args.foundry, args, seq, tmp, cp, 1)
                    two = sent_bytes(args.foundry, args, seq, tmp, cp, 2)
                    print(f"| {seq} | {cp} | {(two - one) / 1e6:.1f} |", flush=True)


if __name__ == "__main__":
    main()
