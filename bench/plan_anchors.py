#!/usr/bin/env python3
"""Predicts every published anchor (docs/anchors.json) with `foundry plan --config` and
tabulates the published step time against the prediction, before (a second binary, e.g. the
main branch's, run with the anchors' plain data-parallel arguments, without --micro-batch
for a binary that predates it) and after (this build,
with each run's layout: foundry_plan_layout_args).

  bench/plan_anchors.py [--foundry build/foundry] [--before OTHER_FOUNDRY --before-root DIR]
                        [--record]

The step compared is the published global batch's: G·T / (devices · predicted tokens/s per
device), the rate the published batch runs at.
--record writes each "after" prediction into docs/anchors.json ("prediction"), which
tests/plan_anchors_test.sh checks.
"""
import argparse
import datetime
import json
import os
import re
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CATEGORIES = [("gemm", "GEMMs"), ("attention", "attention"), ("elementwise", "elementwise"),
              ("recompute", "recompute"), ("optimizer", "optimizer"),
              ("comm_exposed", "exposed comm"), ("pipeline_bubble", "pipeline bubble"),
              ("framework_overhead", "framework"), ("data_exposed", "data loading")]


def predict(foundry, root, anchor, args):
    """The JSON of `foundry plan` for one anchor, or None with the error."""
    words = shlex.split(args)
    # Reference profiles by path, so each binary reads its own tree's profiles.
    i = words.index("--profile")
    words[i + 1] = os.path.join(root, "profiles", words[i + 1] + ".json")
    cmd = [foundry, "plan", "--config", os.path.join(root, anchor["config"])] + words + ["--json"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return None, (r.stderr.strip().splitlines() or ["failed"])[0]
    return json.loads(r.stdout), None


def step_at_published_batch(anchor, out):
    return anchor["global_batch_tokens"] / (anchor["devices"] * out["tokens_per_s_per_device"])


def dominant(out, n=3):
    b = out["breakdown_s"]
    total = out["step_s"]
    parts = sorted(((b.get(k, 0), name) for k, name in CATEGORIES), reverse=True)[:n]
    return ", ".join(f"{name} {100 * s / total:.0f}%" for s, name in parts if s > 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--foundry", default=os.path.join(ROOT, "build", "foundry"))
    ap.add_argument("--before", help="another foundry binary (the 'before' column)")
    ap.add_argument("--before-root", help="its source tree (profiles, configs)")
    ap.add_argument("--record", action="store_true", help="write predictions to anchors.json")
    a = ap.parse_args()
    path = os.path.join(ROOT, "docs", "anchors.json")
    anchors = json.load(open(path))
    print(f"date: {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC | command: "
          f"bench/plan_anchors.py {' '.join(sys.argv[1:])}")
    print()
    print("| # | anchor | role | published step (s) | before (s) | after (s) | after / published "
          "| after MFU (spec) | dominant terms after |")
    print("|---|---|---|---:|---:|---:|---:|---:|---|")
    for n, anchor in enumerate(anchors, 1):
        if anchor.get("foundry_plan_layout_args") is None:
            print(f"| {n} | {anchor['name']} | {anchor['status']} | not computable | | | | | "
                  "device count not published |")
            continue
        base = anchor["foundry_plan_args"]
        before = "n/a"
        if a.before:
            out, err = predict(a.before, a.before_root or ROOT, anchor, base)
            if out is None and "--micro-batch" in base:
                # A binary from before --micro-batch: its tree's configs hold the micro-batch.
                out, err = predict(a.before, a.before_root or ROOT, anchor,
                                   re.sub(r"\s*--micro-batch \d+", "", base))
            before = f"{step_at_published_batch(anchor, out):.2f}" if out else "fails"
        args = (base + " " + anchor["foundry_plan_layout_args"]).strip()
        out, err = predict(a.foundry, ROOT, anchor, args)
        if out is None:
            print(f"| {n} | {anchor['name']} | {anchor['status']} | {anchor['step_s']:.2f} | "
                  f"{before} | error: {err} | | | |")
            continue
        after = step_at_published_batch(anchor, out)
        print(f"| {n} | {anchor['name']} | {anchor['status']} | {anchor['step_s']:.2f} | {before} "
              f"| {after:.2f} | {after / anchor['step_s']:.2f} | {100 * out['mfu_spec']:.1f}% | "
              f"{dominant(out)} |")
        if a.record:
            anchor["prediction"] = {"args": args, "step_s": out["step_s"],
                                    "step_at_published_batch_s": after,
                                    "ratio_to_published": after / anchor["step_s"]}
    if a.record:
        with open(path, "w") as f:
            f.write(json.dumps(anchors, indent=1) + "\n")


if __name__ == "__main__":
    main()
