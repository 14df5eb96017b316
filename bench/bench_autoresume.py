#!/usr/bin/env python3
"""Fault -> job running again on healthy nodes, on the loopback Slurm (tests/slurmcluster.py; root).

    .venv/bin/python bench/bench_autoresume.py [--runs 5] [--facts-interval 1.0]

Each run submits docs/examples/batch.sh (2 nodes, ``hma srun --auto-resume=1`` over
docs/examples/trainer.py) as an ordinary user (created if absent, removed afterwards if created
here), with one Remediator ("the agent") per node as in the tests. Once the trainer runs on both
nodes, the fault: the agent of one node gets a draining fault (``update()``, t0), drains the node,
and the trainer rank there dies (its FAULT file, written as soon as the drain shows). Measured:

* fault -> requeued: until ``squeue`` shows the job's restart count 1 (hma srun decided and ran
  ``scontrol requeue``);
* fault -> running again: until the trainer has started on both healthy nodes (its own start
  timestamps in history.log), which includes the agent's ``StartTime=now`` (one facts refresh
  after the job left its node; ``--facts-interval``, the agent's default is 10 s) instead of
  Slurm's ~2 minute requeue delay.

Prints the median (and min/max) in seconds and describes the machine.
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
    """One fault; returns (fault -> requeued, fault -> running again) in seconds."""
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

        def started(restarts: int) -> list[dict[str, str]]:
            return [h for h in work.history() if h["restart"] == str(restarts)]

        until(lambda: len(started(0)) == 2, 60, "first start")
        nodes = hosts(cluster, job(cluster, job_id)["nodes"])
        bad = nodes[-1]
        rem = rems[bad]
        until(lambda: job_id in rem.facts().job_ids, 30, "job in the agent's facts")
        time.sleep(2 * facts)  # the agent has seen the job's marker
        t0 = time.time()
        rem.update(verdict(fault()), "boot-1")
        until(lambda: "DRAIN" in cluster.state(bad), 30, "drain")
        (work.ckpt / f"FAULT-{bad}").write_text("Xid 79\n")
        t_requeued = until(
            lambda: job(cluster, job_id).get("restart_cnt") == 1, 60, "requeue", every=0.02
        )
        until(lambda: len(started(1)) == 2, 180, "running again")
        t_running = max(float(h["ts"]) for h in started(1))
        assert bad not in {h["node"] for h in started(1)}
        return t_requeued - t0, t_running - t0
    finally:
        cluster.run("scancel", "-u", USER)
        for rem in rems.values():
            rem.close()
        work.remove()


def main() -> int:
    """Run the benchmark; see the module doc."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--facts-interval", type=float, default=1.0)
    args = parser.parse_args()
    why = available()
    if why:
        print(f"skipped: {why}")
        return 0
    created = ensure_user(USER)
    requeued, running = [], []
    try:
        python = python_for(USER)
        if python is None:
            print(f"skipped: no Python >= 3.9 that {USER} can run")
            return 0
        with SlurmCluster(4) as cluster, tempfile.TemporaryDirectory() as tmp:
            for i in range(args.runs):
                a, b = one_run(cluster, python, args.facts_interval, Path(tmp) / str(i))
                requeued.append(a)
                running.append(b)
                print(f"run {i + 1}: requeued after {a:.2f} s, running again after {b:.2f} s")
    finally:
        if created:
            remove_user(USER)
    print(f"machine: {machine()}")
    print(f"agent facts_interval {args.facts_interval:g} s, grace not reached (drain came first)")
    for name, samples in (("fault -> requeued", requeued), ("fault -> running again", running)):
        print(
            f"{name}: median {median_ms(samples) / 1000:.2f} s (min {min(samples):.2f}, "
            f"max {max(samples):.2f}, n={len(samples)}, stdev {statistics.pstdev(samples):.2f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
