#!/usr/bin/env python3
"""Fault -> step running again on healthy nodes, in place and by requeue, on the loopback Slurm
(tests/slurmcluster.py; root).

    .venv/bin/python bench/bench_autoresume.py [--runs 5] [--facts-interval 1.0] [--mode both]

Each run submits docs/examples/batch.sh (2 nodes, ``hma srun --auto-resume=1`` over
docs/examples/trainer.py) as an ordinary user (created if absent, removed afterwards if created
here), with one Remediator ("the agent") per node as in the tests. Once the trainer runs on both
nodes, the fault: the agent of one node (not the batch host) gets a draining fault (``update()``,
t0), drains the node, and the trainer rank there dies (its FAULT file, written as soon as the
drain shows). Two clusters of 4 nodes:

* ``in-place`` (``SchedulerParameters=permit_job_expansion``): hma srun shrinks the job, merges a
  replacement node and runs the step again; "mended" is when ``squeue`` shows the job on 2 nodes
  without the faulty one;
* ``requeue`` (no expansion: what a GRES job gets): "mended" is when ``squeue`` shows the
  job's restart count 1; the agent then sets ``StartTime=now`` (one facts refresh after the job
  left its node; ``--facts-interval``, the agent's default is 10 s) instead of Slurm's ~2 minute
  requeue delay.

Fault -> running again: until the trainer has started again on both healthy nodes (its own start
timestamps in history.log). Prints the median (and min/max) in seconds and describes the machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from common import machine, median_ms  # noqa: E402

from tests.integration.autoresume_helpers import (  # noqa: E402
    USER,
    Work,
    ensure_user,
    hosts,
    job,
    python_for,
    remove_user,
)
from tests.integration.remediation_helpers import fault, make, verdict  # noqa: E402
from tests.slurmcluster import SlurmCluster, available  # noqa: E402


def until(predicate, timeout: float, what: str, every: float = 0.05) -> float:  # type: ignore[no-untyped-def]
    """Poll ``predicate``; returns the time.time() it first held."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(every)
    return time.time()


def one_run(cluster: SlurmCluster, python: str, facts: float, tmp: Path) -> tuple[float, float]:
    """One fault; returns (fault -> mended, fault -> running again) in seconds."""
    cluster.reset()
    tmp.mkdir(parents=True)
    work = Work(cluster, USER, python)
    rems = {}
    try:
        rems = {
            n: make(tmp, cluster, n, {"max_drained_percent": 100.0}, {"facts_interval": facts})[0]
            for n in cluster.nodes
        }
        job_id = work.submit("--steps", "100000", "--step-time", "0.2")
        until(lambda: len(work.history()) == 2, 60, "first start")
        nodes = hosts(cluster, job(cluster, job_id)["nodes"])
        batch_host = cluster.scontrol("show", "job", job_id).split("BatchHost=")[1].split()[0]
        bad = next(n for n in nodes if n != batch_host)
        rem = rems[bad]
        until(lambda: job_id in rem.facts().job_ids, 30, "job in the agent's facts")
        time.sleep(2 * facts)  # the agent has seen the job's marker
        t0 = time.time()
        rem.update(verdict(fault()), "boot-1")
        until(lambda: "DRAIN" in cluster.state(bad), 30, "drain")
        (work.ckpt / f"FAULT-{bad}").write_text("Xid 79\n")

        def mended() -> bool:
            info = job(cluster, job_id)
            if not cluster.expansion:
                return info.get("restart_cnt") == 1
            now = hosts(cluster, info.get("nodes") or "")
            return len(now) == 2 and bad not in now

        t_mended = until(mended, 60, "mended", every=0.02)
        again = lambda: [h for h in work.history() if float(h["ts"]) > t0]  # noqa: E731
        until(lambda: len(again()) == 2, 180, "running again")
        assert bad not in {h["node"] for h in again()}
        return t_mended - t0, max(float(h["ts"]) for h in again()) - t0
    finally:
        cluster.run("scancel", "-u", USER)
        for rem in rems.values():
            rem.close()
        work.remove()


def bench(mode: str, runs: int, facts: float, python: str) -> tuple[list[float], list[float]]:
    """``runs`` faults on a fresh cluster for ``mode``; the two durations of each."""
    mended, running = [], []
    with SlurmCluster(4, expansion=mode == "in-place") as cluster:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(runs):
                a, b = one_run(cluster, python, facts, Path(tmp) / str(i))
                mended.append(a)
                running.append(b)
                print(f"{mode} run {i + 1}: mended after {a:.2f} s, running again after {b:.2f} s")
    return mended, running


def main() -> int:
    """Run the benchmark; see the module doc."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--facts-interval", type=float, default=1.0)
    parser.add_argument("--mode", choices=("both", "in-place", "requeue"), default="both")
    args = parser.parse_args()
    why = available()
    if why:
        print(f"skipped: {why}")
        return 0
    created = ensure_user(USER)
    results = {}
    try:
        python = python_for(USER)
        if python is None:
            print(f"skipped: no Python >= 3.9 that {USER} can run")
            return 0
        modes = ("in-place", "requeue") if args.mode == "both" else (args.mode,)
        for mode in modes:
            results[mode] = bench(mode, args.runs, args.facts_interval, python)
    finally:
        if created:
            remove_user(USER)
    print(f"machine: {machine()}")
    print(f"agent facts_interval {args.facts_interval:g} s, grace not reached (drain came first)")
    for mode, (mended, running) in results.items():
        for name, samples in (("fault -> mended", mended), ("fault -> running again", running)):
            print(
                f"{mode}: {name}: median {median_ms(samples) / 1000:.2f} s (min "
                f"{min(samples):.2f}, max {max(samples):.2f}, n={len(samples)}, stdev "
                f"{statistics.pstdev(samples):.2f})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
