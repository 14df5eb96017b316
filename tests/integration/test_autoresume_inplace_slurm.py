"""``hma srun --auto-resume`` mending a job in place on a real Slurm (22.05 and 24.11, 4 loopback
nodes, ``SchedulerParameters=permit_job_expansion``, every node with one generic resource
``fpga`` that only the GRES test asks for).

As in test_autoresume_slurm.py: jobs run as an ordinary user, "the agent" of each node is a
Remediator that drains its node with hma's reason on a fault verdict, and the trainer on that node
then dies (its FAULT-<node> file). A job without GRES, from ``salloc -N2 --exclusive`` or from
``sbatch``, keeps its id: the faulty node leaves it, a free node joins it, the same srun runs again
and the trainer resumes from its checkpoint. A GRES batch job is requeued instead.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from hma.contracts import label as label_mod
from hma.remediation.engine import Remediator
from hma.remediation.requeue import find_marker
from tests.integration.autoresume_helpers import (  # noqa: F401 (the user fixture)
    EXAMPLES,
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
    user,
)
from tests.integration.remediation_helpers import SLURM_VERSIONS, wait
from tests.slurmcluster import SlurmCluster, available

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


CLUSTERS = [(v, g) for g in ("", "fpga:1") for v in SLURM_VERSIONS]


@pytest.fixture(
    scope="module", params=CLUSTERS, ids=lambda p: f"slurm{p[0]}{'-gres' if p[1] else ''}"
)
def cluster(request: pytest.FixtureRequest, user: str) -> Iterator[SlurmCluster]:
    """Per version: a cluster without GRES, and one whose every node has an ``fpga``."""
    version, gres = request.param
    why = available(version)
    if why:
        pytest.skip(f"Slurm {version}: {why}")
    c = SlurmCluster(4, version=version, expansion=True, gres=gres)
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def plain(cluster: SlurmCluster) -> SlurmCluster:
    """The cluster without GRES (the GRES one skips the test)."""
    if cluster.gres:
        pytest.skip("in-place replacement: nodes without GRES")
    return cluster


@pytest.fixture
def work(cluster: SlurmCluster, user: str) -> Iterator[Work]:
    with job_work(cluster, user) as w:
        yield w


@pytest.fixture
def agents(cluster: SlurmCluster, tmp_path: Path, work: Work) -> Iterator[dict[str, Remediator]]:
    """One Remediator ("the agent") per node."""
    with node_agents(cluster, tmp_path) as rems:
        yield rems


def starts(work: Work) -> list[dict[str, str]]:
    """The trainer's start lines."""
    return work.history()


def first_job(cluster: SlurmCluster, work: Work) -> tuple[str, list[str]]:
    """The user's one job, once the trainer runs on both its nodes: its id and nodes."""
    wait(lambda: len(starts(work)) >= 2, 60, "trainer running on 2 nodes")
    out = cluster.run("squeue", "-h", "-u", work.user, "-o", "%i").stdout.split()
    assert len(out) == 1, out
    return out[0], sorted(h["node"] for h in starts(work))


def replaced(cluster: SlurmCluster, work: Work, job_id: str, bad: str) -> list[str]:
    """Wait for the trainer's second start on 2 nodes; check the job around it; those nodes."""
    try:
        wait(lambda: len(starts(work)) >= 4, 60, f"job {job_id} running again")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; output:\n{work.output()}") from None
    second = sorted(h["node"] for h in starts(work)[2:])
    assert bad not in second and len(set(second)) == 2, (starts(work), work.output())
    info = job(cluster, job_id)
    assert info["restart_cnt"] == 0 and hosts(cluster, info["nodes"]) == second
    marker = find_marker(info["comment"])
    assert marker is not None and (marker.attempt, marker.nodes, marker.replaced) == (0, (bad,), 1)
    assert all(int(h["start"]) >= 4 for h in starts(work)[2:])  # from the checkpoint
    return second


def drained_for_replacement(cluster: SlurmCluster, bad: str) -> None:
    """``bad`` is drained by its agent with hma's reason and labelled ``replace``."""
    node = cluster.node(bad)
    assert "DRAIN" in cluster.state(bad) and node["reason"].startswith("HMA: ")
    found = label_mod.find(node["extra"])
    assert found is not None and found.action == "replace"


TRAIN = ["--steps", "40", "--step-time", "0.25"]
SCRIPT = f"hma srun --auto-resume=1 --kill-on-bad-exit=1 {EXAMPLES}/train_auto_resume.sh"


def salloc(cluster: SlurmCluster, work: Work, command: str) -> subprocess.Popen[bytes]:
    """``salloc -N2 --exclusive sh -c COMMAND`` as the user, its output in ``work.out``."""
    with open(work.out, "w") as out:
        return subprocess.Popen(
            [
                *cluster.as_user(work.user, work.env(), str(work.base)),
                "salloc",
                "-N2",
                "--exclusive",
                "sh",
                "-c",
                command,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def test_salloc_job_gets_a_replacement_in_place(
    plain: SlurmCluster, work: Work, agents: dict[str, Remediator]
) -> None:
    cluster = plain
    proc = salloc(cluster, work, f"{SCRIPT} {' '.join(TRAIN)}")
    try:
        job_id, first = first_job(cluster, work)
        wait(lambda: work.step() >= 4, 30, "a few checkpoints")
        bad = first[1]
        inject(cluster, work, agents[bad], bad, job_id)
        second = replaced(cluster, work, job_id, bad)
        assert proc.wait(timeout=90) == 0, work.output()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    text = work.output()
    assert f"job {job_id}: srun exited" in text and f"hardware fault on {bad}" in text
    assert "the job holds no GRES: replacing the faulty nodes inside the allocation" in text
    assert f"dropped {bad}, merged " in text and f"the job runs on {','.join(second)}" in text
    assert f"({' '.join(second)}), master {second[0]}" in text  # hma job-env: the new list
    assert json.loads((work.ckpt / "final.json").read_text()) == {"step": 40}
    drained_for_replacement(cluster, bad)


def test_salloc_failure_on_healthy_nodes_is_not_resumed(plain: SlurmCluster, work: Work) -> None:
    proc = salloc(plain, work, "hma srun --auto-resume=1 -l sh -c 'echo started; exit 3'")
    assert proc.wait(timeout=60) == 3, work.output()
    out = work.output()
    assert out.count("started") == 2 and "not a hardware failure, not resumed; exit 3" in out
    assert "dropped" not in out


def test_salloc_attempts_exhausted_gives_up(
    plain: SlurmCluster, work: Work, agents: dict[str, Remediator]
) -> None:
    proc = salloc(plain, work, f"{SCRIPT} --steps 400 --step-time 0.25")
    try:
        job_id, first = first_job(plain, work)
        wait(lambda: work.step() >= 4, 30, "a few checkpoints")
        inject(plain, work, agents[first[0]], first[0], job_id)
        second = replaced(plain, work, job_id, first[0])
        inject(plain, work, agents[second[0]], second[0], job_id, step_dies_first=True)
        assert proc.wait(timeout=60) != 0, work.output()  # srun's code
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert "giving up: 1 of 1 auto-resume attempt(s) used" in work.output()
    assert not (work.ckpt / "final.json").exists()


def test_sbatch_job_gets_a_replacement_in_place(
    plain: SlurmCluster, work: Work, agents: dict[str, Remediator]
) -> None:
    cluster = plain
    job_id = work.submit(*TRAIN, comment="my run")
    _id, first = first_job(cluster, work)
    assert _id == job_id
    wait(lambda: work.step() >= 4, 30, "a few checkpoints")
    host = cluster.scontrol("show", "job", job_id).split("BatchHost=")[1].split()[0]
    bad = next(n for n in first if n != host)  # the batch host's fault requeues (unit tests)
    inject(cluster, work, agents[bad], bad, job_id, step_dies_first=True)
    replaced(cluster, work, job_id, bad)
    assert job(cluster, job_id)["comment"].startswith("my run ")
    fields = finished(cluster, job_id)
    assert fields.get("JobState") in (None, "COMPLETED"), fields
    assert fields.get("Restarts", "0") == "0"
    assert json.loads((work.ckpt / "final.json").read_text()) == {"step": 40}
    assert "replacing the faulty nodes inside the allocation" in work.output()
    drained_for_replacement(cluster, bad)


def test_gres_batch_job_is_requeued(
    cluster: SlurmCluster, work: Work, agents: dict[str, Remediator]
) -> None:
    if not cluster.gres:
        pytest.skip("the GRES cluster")
    job_id = work.sbatch(
        "--gres=fpga:1",
        f"--output={work.out}",
        f"--chdir={work.base}",
        str(EXAMPLES / "batch.sh"),
        *TRAIN,
    )
    _id, first = first_job(cluster, work)
    bad = first[1]
    inject(cluster, work, agents[bad], bad, job_id)
    wait(lambda: job(cluster, job_id).get("restart_cnt") == 1, 60, f"job {job_id} requeued")
    fields = finished(cluster, job_id)
    assert fields.get("JobState") in (None, "COMPLETED"), fields
    out = work.output()
    assert "the job holds GRES (" in out and "cannot resize a GRES allocation" in out
    assert "requeueing the job so that it restarts from its checkpoint" in out
    assert json.loads((work.ckpt / "final.json").read_text()) == {"step": 40}
    assert bad not in {h["node"] for h in starts(work) if h["restart"] == "1"}


def test_config_check_reads_permit_job_expansion(cluster: SlurmCluster, tmp_path: Path) -> None:
    proc = config_check(cluster, tmp_path)
    assert proc.returncode == 0 and "permit_job_expansion" not in proc.stderr, proc.stderr
    # test_autoresume_slurm.py: the warning on a cluster without it
