"""The agent on a cluster that looks big to Slurm's clients: 2 slurmd + 2,000 nodes without one,
3,000 held jobs (tests/slurmcluster.py). What it asks slurmctld is read from ``sdiag``."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from hma.contracts.model import Action, Clears
from tests.integration.remediation_helpers import fault, make, verdict, wait
from tests.slurmcluster import SlurmCluster, available

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

PLACEHOLDERS = 2000
HELD_JOBS = 3000
# what a single-node state read (sinfo -n NODE) and a single-job read (squeue -j ID) cost
SINGLE = {"REQUEST_NODE_INFO_SINGLE", "REQUEST_PARTITION_INFO"}


@pytest.fixture(scope="module")
def big() -> Iterator[SlurmCluster]:
    why = available()
    if why:
        pytest.skip(why)
    with SlurmCluster(2, placeholders=PLACEHOLDERS, held_jobs=HELD_JOBS) as cluster:
        yield cluster


def test_the_harness_looks_big(big: SlurmCluster) -> None:
    assert len(big.run("sinfo", "-h", "-N", "-o", "%N").stdout.split()) == PLACEHOLDERS + 2
    assert len(big.run("squeue", "-h", "-r", "-o", "%i").stdout.split()) == HELD_JOBS
    assert big.run("scontrol", "-o", "show", "node").stdout.count("\n") == PLACEHOLDERS + 2


def test_steady_state_is_single_node_queries_and_a_fault_drains(
    big: SlurmCluster, tmp_path: Path
) -> None:
    job = big.submit("node1")
    rem, _store = make(
        tmp_path,
        big,
        "node1",
        {"max_drained_percent": 10.0, "recheck_interval": 600.0},  # no recheck in this test
        {"heartbeat": 1.0, "facts_interval": 0.25},
    )
    try:
        wait(lambda: rem.facts().job_ids == (job,), 30, "the agent sees the job")
        assert rem.facts().job_users == ("root",)
        assert rem.facts().slurm_state == "allocated"
        big.rpc_counts(reset=True)  # nothing but the agent talks to slurmctld from here
        wait(
            lambda: big.rpc_counts().get("REQUEST_NODE_INFO_SINGLE", (0, 0))[0] >= 5,
            30,
            "heartbeats",
        )
        counts = big.rpc_counts()
        assert set(counts) <= SINGLE, counts  # no node table, no job table
        single = counts["REQUEST_NODE_INFO_SINGLE"][0]
        assert counts["REQUEST_PARTITION_INFO"][0] == single  # sinfo's second RPC, no more
        # a fault: the drain goes through whatever the cluster's size
        big.rpc_counts(reset=True)
        rem.update(verdict(fault(action=Action.NONE, clears=Clears.OBSERVATION)), "boot-1")
        done = lambda: [r["state"] for r in rem.status()["actions"]] == ["done"]  # noqa: E731
        wait(done, 30, "the drain applied")
        counts = big.rpc_counts()  # before this test's own scontrol calls
        assert rem.status()["breaker"]["held_nodes"] == ["node1"]  # the recount after the drain
        assert rem.status()["breaker"]["total"] == PLACEHOLDERS + 2
        # the drain went first; the breaker's count after it read the node table once
        assert counts["REQUEST_NODE_INFO"][0] == 1 and "REQUEST_JOB_INFO" not in counts
        assert counts["REQUEST_UPDATE_NODE"][0] == 1
        assert "DRAIN" in big.state("node1")
        assert big.show("node1")["Reason"].startswith("HMA: GPU_XID_79")
    finally:
        rem.close()
        big.run("scancel", job)
        big.run("scontrol", "update", "NodeName=node1", "State=RESUME", "Extra=")
