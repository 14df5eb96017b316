"""``hma srun --auto-resume`` and ``hma job-env`` on a real Slurm (4 loopback nodes, munge).

Jobs run as an ordinary user (created for the session if absent, removed afterwards only if
created here), from docs/examples/batch.sh over docs/examples/trainer.py. "The agent" of each node
is a Remediator (as in test_remediation_slurm.py): a fault verdict makes it drain its node with
hma's reason; the trainer on that node then dies (its FAULT-<node> file), as a training process
does when its GPU falls off the bus. The agent sets the requeued job's StartTime=now, so the
test does not wait Slurm's 2 minute requeue delay.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest

from hma.contracts import label as label_mod
from hma.remediation.engine import Remediator
from hma.remediation.requeue import find_marker
from tests.integration.autoresume_helpers import (  # noqa: F401 (the user fixture)
    ROOT,
    USER,
    Work,
    config_check,
    finished,
    hosts,
    inject,
    job,
    job_work,
    node_agents,
    python_for,
    show_job,
    user,
)
from tests.integration.remediation_helpers import (
    SLURM_VERSIONS,
    slurm_cluster,
    wait,
)
from tests.slurmcluster import SlurmCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture(scope="module", params=SLURM_VERSIONS, ids=lambda v: f"slurm{v}")
def cluster(request: pytest.FixtureRequest, user: str) -> Iterator[SlurmCluster]:
    yield from slurm_cluster(request.param)


@pytest.fixture
def work(cluster: SlurmCluster, user: str) -> Iterator[Work]:
    with job_work(cluster, user) as w:
        yield w


@pytest.fixture
def agents(cluster: SlurmCluster, tmp_path: Path, work: Work) -> Iterator[dict[str, Remediator]]:
    """One Remediator ("the agent") per node."""
    with node_agents(cluster, tmp_path) as rems:
        yield rems


def running(cluster: SlurmCluster, work: Work, job_id: str, restarts: int) -> list[str]:
    """Wait until the trainer runs on both nodes after ``restarts`` requeues; those nodes."""

    def started() -> list[str]:
        return [h["node"] for h in work.history() if h["restart"] == str(restarts)]

    wait(lambda: len(started()) == 2, 60, f"job {job_id} running (restarts={restarts})")
    info = job(cluster, job_id)
    brief = {k: info.get(k) for k in ("job_state", "restart_cnt", "nodes", "comment")}
    assert info["restart_cnt"] == restarts, (brief, work.history(), work.output())
    nodes = sorted(started())
    assert hosts(cluster, info["nodes"]) == nodes
    return nodes


def test_hardware_fault_requeues_without_the_node_and_resumes(
    cluster: SlurmCluster, work: Work, agents: dict[str, Remediator]
) -> None:
    job_id = work.submit("--steps", "40", "--step-time", "0.25", comment="my run")
    first = running(cluster, work, job_id, 0)
    wait(lambda: work.step() >= 4, 30, "a few checkpoints")
    bad = first[1]
    inject(cluster, work, agents[bad], bad, job_id)
    second = running(cluster, work, job_id, 1)  # StartTime=now by the agents: no 2 minute wait
    assert bad not in second and len(second) == 2
    info = job(cluster, job_id)
    assert info["comment"].startswith("my run ")  # the user's comment is kept
    marker = find_marker(info["comment"])
    assert marker is not None and (marker.attempts, marker.attempt, marker.nodes) == (1, 1, (bad,))
    assert any(job_id in rem._autoresume.hurried for rem in agents.values())
    fields = finished(cluster, job_id)
    assert fields.get("JobState") in (None, "COMPLETED"), fields
    out = work.output()
    assert f"hardware fault on {bad}" in out and "resuming (attempt 1 of 1)" in out
    assert "requeueing the job so that it restarts from its checkpoint" in out
    assert json.loads((work.ckpt / "final.json").read_text()) == {"step": 40}
    resumed = [h for h in work.history() if h["restart"] == "1"]
    assert len(resumed) == 2 and {h["node"] for h in resumed} == set(second)
    assert all(int(h["start"]) >= 4 for h in resumed)  # from the checkpoint, not from 0
    # Item 2: the fault hit an auto-resume job, so the node gets replace, not reboot.
    found = label_mod.find(cluster.node(bad)["extra"])
    assert found is not None and found.action == "replace"
    assert cluster.reboots() == []


def test_script_failure_is_not_requeued(cluster: SlurmCluster, work: Work) -> None:
    job_id = work.sbatch(
        "-N2",
        "--requeue",
        f"--output={work.out}",
        "--wrap=hma srun --auto-resume=1 -l sh -c 'echo started; sleep 1; exit 3'",
    )
    fields = finished(cluster, job_id)
    out = work.output()
    assert out.count("started") == 2
    assert "srun exited 3; no node of the job is marked faulty" in out
    assert "not a hardware failure, not resumed; exit 3" in out
    assert fields["ExitCode"] == "3:0" and fields["Restarts"] == "0"


def test_attempts_exhausted_gives_up(
    cluster: SlurmCluster, work: Work, agents: dict[str, Remediator]
) -> None:
    job_id = work.submit("--steps", "200", "--step-time", "0.25")
    first = running(cluster, work, job_id, 0)
    inject(cluster, work, agents[first[0]], first[0], job_id)
    second = running(cluster, work, job_id, 1)
    inject(cluster, work, agents[second[0]], second[0], job_id, step_dies_first=True)
    fields = finished(cluster, job_id)
    out = work.output()
    assert "giving up: 1 of 1 auto-resume attempt(s) used" in out
    assert fields.get("JobState", "FAILED") == "FAILED" and fields.get("Restarts", "1") == "1"
    assert not (work.ckpt / "final.json").exists()


def test_job_env_matches_scontrol_show_job(cluster: SlurmCluster, work: Work) -> None:
    script = work.base / "env.sh"
    script.write_text(
        "#!/bin/sh\n"
        f'hma job-env --format json > {work.base}/env-"$SLURMD_NODENAME".json\n'
        'eval "$(hma job-env)"\n'
        f'echo "$NODE_RANK $NNODES $MASTER_NODE $MASTER_ADDR" > {work.base}/sh-"$SLURMD_NODENAME"\n'
    )
    script.chmod(0o755)
    job_id = work.sbatch(
        "-N3",
        f"--output={work.out}",
        f"--wrap=srun {script}; sleep 30",
    )
    wait(lambda: len(list(work.base.glob("sh-*"))) == 3, 60, "job-env on 3 nodes")
    fields = show_job(cluster, job_id)
    expected = hosts(cluster, fields["NodeList"])
    addr = cluster.show(expected[0])["NodeAddr"]
    for rank, node in enumerate(expected):
        doc = json.loads((work.base / f"env-{node}.json").read_text())
        assert doc == {
            "JOB_ID": job_id,
            "NODE_LIST": expected,
            "MASTER_NODE": expected[0],
            "MASTER_ADDR": addr,
            "NNODES": 3,
            "NODE_RANK": rank,
        }
        assert (work.base / f"sh-{node}").read_text().split() == [str(rank), "3", expected[0], addr]
    cluster.run("scancel", job_id)


def test_config_check_warns_without_permit_job_expansion(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    proc = config_check(cluster, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "warning: slurm: SchedulerParameters lacks permit_job_expansion" in proc.stderr
