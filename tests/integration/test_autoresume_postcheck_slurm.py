"""``hma srun --auto-resume`` runs the hardware checks on the failed step's nodes before it
decides, on a real Slurm 22.05 and 24.11 (4 loopback nodes, ``permit_job_expansion``) with a real
``hma run`` agent per node.

Each agent has one executable probe standing for the EFA mesh check, with an hour's interval:
after its first run only a requested check runs it again. A fault it finds once the job runs
(the mesh fails on one node) is seen by no one until the step fails: then ``hma check
--request`` on each node of the step makes that node's agent run it, drain the node and label it
``replace``, and the job is mended in place. A step that fails on healthy nodes is not resumed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from tests.integration.autoresume_helpers import (
    EXAMPLES,
    ROOT,
    USER,
    Work,
    ensure_user,
    job_work,
    remove_user,
)
from tests.integration.autoresume_helpers import job as job_info
from tests.integration.remediation_helpers import SLURM_VERSIONS, wait, write_config
from tests.integration.test_autoresume_inplace_slurm import (
    TRAIN,
    drained_for_replacement,
    first_job,
    replaced,
    salloc,
)
from tests.slurmcluster import SlurmCluster, available

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(240),
    pytest.mark.skipif(os.geteuid() != 0, reason="agents and executable probes need root"),
]


@pytest.fixture(scope="module", params=SLURM_VERSIONS, ids=lambda v: f"slurm{v}")
def cluster(request: pytest.FixtureRequest) -> Iterator[SlurmCluster]:
    version = request.param
    why = available(version)
    if why:
        pytest.skip(f"Slurm {version}: {why}")
    created = ensure_user(USER)
    c = SlurmCluster(4, version=version, expansion=True)
    c.start()
    try:
        yield c
    finally:
        c.stop()
        if created:
            remove_user(USER)


@pytest.fixture
def work(cluster: SlurmCluster) -> Iterator[Work]:
    with job_work(cluster, USER) as w:
        # hma check in a job step asks the agent of the node it runs on (one host, 4 agents)
        (w.bin / "hma").write_text(
            "#!/bin/sh\n"
            f'[ "$1" = check ] && export HMA_CONFIG="{w.base}/agent-$SLURMD_NODENAME.toml"\n'
            f'PYTHONPATH={ROOT} exec {w.python} -m hma "$@"\n'
        )
        yield w


class Agents:
    """``hma run`` for every node; each one's mesh probe fails once MESHFAIL-<node> exists."""

    def __init__(self, cluster: SlurmCluster, work: Work) -> None:
        self.trusted = Path(tempfile.mkdtemp(prefix="hma-postcheck-", dir="/run"))
        os.chmod(self.trusted, 0o755)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs = []
        for node in cluster.nodes:
            probes = self.trusted / node
            probes.mkdir(mode=0o755)
            mesh = probes / "mesh"
            flag = work.ckpt / f"MESHFAIL-{node}"
            mesh.write_text(
                f"#!/bin/sh\nif [ -e {flag} ]; then\n"
                '  echo "EFA mesh: no route to 1 peer"; exit 2\nfi\necho mesh ok\n'
            )
            mesh.chmod(0o755)
            cfg = write_config(
                work.base / f"agent-{node}.toml",
                cluster,
                node,
                recovery={"max_drained_percent": 100.0},
                slurm={"facts_interval": 0.5},
                agent={"probes_dir": str(probes), "check_request_interval": 1},
                extra="[probes.system]\nenabled = false\n[probes.mesh]\ninterval = 3600\n"
                '[codes.SITE_PROBE_CRITICAL]\naction = "reboot"\n',
            )
            cfg.chmod(0o644)
            log = open(work.base / f"agent-{node}.log", "w")  # noqa: SIM115 - closed in stop()
            self.logs.append(log)
            self.procs[node] = subprocess.Popen(
                [sys.executable, "-m", "hma", "run"],
                env={**os.environ, "HMA_CONFIG": str(cfg)},
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        for node in cluster.nodes:
            wait(lambda n=node: self._ran(work, n), 60, f"{node}'s agent")  # type: ignore[misc]

    @staticmethod
    def _ran(work: Work, node: str) -> bool:
        try:
            doc = json.loads((work.base / f"run-{node}" / "status.json").read_text())
        except (OSError, ValueError):
            return False
        if not (work.base / f"run-{node}" / "check-requests").is_dir():
            return False
        return any(p["name"] == "mesh" and p.get("last_run") for p in doc["probes"])

    def report(self, work: Work) -> str:
        """The agents' logs and requested checks, for a failure's message."""
        out = []
        for node in self.procs:
            log = work.base / f"agent-{node}.log"
            status = work.base / f"run-{node}" / "status.json"
            doc = json.loads(status.read_text()) if status.exists() else {}
            out.append(f"--- {node}: {doc.get('requested')} {os.listdir(status.parent)}")
            out.append(log.read_text()[-3000:] if log.exists() else "")
        return "\n".join(out)

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        for log in self.logs:
            log.close()
        shutil.rmtree(self.trusted, ignore_errors=True)


@pytest.fixture
def agents(cluster: SlurmCluster, work: Work) -> Iterator[Agents]:
    a = Agents(cluster, work)
    try:
        yield a
    finally:
        a.stop()


SCRIPT = f"hma srun --auto-resume=1 --kill-on-bad-exit=1 {EXAMPLES}/train_auto_resume.sh"


def test_a_fault_only_the_checks_find_is_drained_and_replaced(
    cluster: SlurmCluster, work: Work, agents: Agents
) -> None:
    proc = salloc(cluster, work, f"{SCRIPT} {' '.join(TRAIN)}")
    try:
        job_id, first = first_job(cluster, work)
        wait(lambda: work.step() >= 4, 30, "a few checkpoints")
        bad = first[1]
        (work.ckpt / f"MESHFAIL-{bad}").write_text("")  # the agent's next run is an hour away
        (work.ckpt / f"FAULT-{bad}").write_text("")  # the rank there dies: the step fails
        try:
            replaced(cluster, work, job_id, bad)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{agents.report(work)}") from None
        assert proc.wait(timeout=90) == 0, work.output()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    text = work.output()
    assert f"running the hardware checks on {','.join(first)}" in text
    assert f"hardware checks found faults on {','.join(first)}" in text
    assert "EFA mesh: no route to 1 peer" in text  # the check's output, in the job's log
    assert f"hardware fault on {bad}" in text and "SITE_PROBE_CRITICAL" in text
    assert json.loads((work.ckpt / "final.json").read_text()) == {"step": 40}
    drained_for_replacement(cluster, bad)
    assert job_info(cluster, job_id) == {} or bad not in job_info(cluster, job_id)["nodes"]


def test_a_failure_on_nodes_passing_the_checks_is_not_resumed(
    cluster: SlurmCluster, work: Work, agents: Agents
) -> None:
    proc = salloc(cluster, work, "hma srun --auto-resume=1 -l sh -c 'echo started; exit 3'")
    assert proc.wait(timeout=90) == 3, work.output()
    out = work.output()
    assert "running the hardware checks on" in out
    assert "hardware checks passed on" in out, out
    assert out.count("started") == 2 and "not a hardware failure, not resumed; exit 3" in out
