#!/usr/bin/env python3
"""A tiny checkpointing "trainer" (plain Python, no torch) for the auto-resume examples and tests.

Rank 0 owns the checkpoint ``<dir>/checkpoint.json`` (``{"step": k}``, written atomically every
``--every`` steps); every rank resumes from it, so a requeued job continues where it stopped. Each
start appends a line to ``<dir>/history.log``; rank 0 writes ``<dir>/final.json`` at the end.

Failure stand-ins for the tests:

* ``<dir>/FAULT-<node>`` exists: the rank on that node dies as a process does when its GPU falls
  off the bus (exit 1, after printing a CUDA-like error);
* ``--exit-at STEP:CODE``: rank 0 exits with CODE at STEP (a bug in the training script).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main() -> int:
    """Train: resume, step, checkpoint; see the module doc."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", required=True, help="shared checkpoint folder")
    parser.add_argument("--steps", type=int, default=20, help="total steps to reach")
    parser.add_argument("--step-time", type=float, default=0.2, help="seconds per step")
    parser.add_argument("--every", type=int, default=1, help="checkpoint every N steps")
    parser.add_argument("--rank", type=int, default=int(os.environ.get("SLURM_PROCID", "0")))
    parser.add_argument("--world", type=int, default=int(os.environ.get("SLURM_NTASKS", "1")))
    parser.add_argument("--exit-at", default="", metavar="STEP:CODE", help="simulate a bug")
    args = parser.parse_args()
    node = os.environ.get("SLURMD_NODENAME", os.uname().nodename)
    ckpt = os.path.join(args.dir, "checkpoint.json")
    step = 0
    if os.path.exists(ckpt):
        with open(ckpt) as fh:
            step = int(json.load(fh)["step"])
    restart = os.environ.get("SLURM_RESTART_COUNT", "0") or "0"
    with open(os.path.join(args.dir, "history.log"), "a") as fh:
        fh.write(f"{time.time():.3f} restart={restart} node={node} rank={args.rank} start={step}\n")
    print(f"trainer rank {args.rank}/{args.world} on {node}: starting at step {step}", flush=True)
    bug_step, _, bug_code = args.exit_at.partition(":")
    fault = os.path.join(args.dir, f"FAULT-{node}")
    while step < args.steps:
        if os.path.exists(fault):
            print(f"{node}: CUDA error: unspecified launch failure (simulated Xid 79)", flush=True)
            return 1
        time.sleep(args.step_time)
        step += 1
        if args.rank == 0 and bug_step and step == int(bug_step):
            print(f"trainer: simulated bug at step {step}", flush=True)
            return int(bug_code or 1)
        if args.rank == 0 and (step % args.every == 0 or step == args.steps):
            tmp = f"{ckpt}.tmp"
            with open(tmp, "w") as fh:
                json.dump({"step": step}, fh)
            os.replace(tmp, ckpt)
    if args.rank == 0:
        with open(os.path.join(args.dir, "final.json"), "w") as fh:
            json.dump({"step": step}, fh)
    print(f"trainer rank {args.rank} on {node}: finished at step {step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
