"""Shared pieces of the auto-resume test and benchmark: the job user, a work folder the user can
write (hma wrapper, checkpoints, output), job queries."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

import pytest

from hma.remediation.engine import Remediator
from tests.integration.remediation_helpers import fault, make, verdict, wait, write_config
from tests.slurmcluster import SlurmCluster, available

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "docs" / "examples"
USER = "hmaresume"


def ensure_user(name: str = USER) -> bool:
    """Create the ordinary user ``name`` if absent; returns whether it was created here."""
    try:
        pwd.getpwnam(name)
        return False
    except KeyError:
        subprocess.run(["useradd", "-M", "-s", "/bin/sh", name], check=True, timeout=30)
        return True


def remove_user(name: str = USER) -> None:
    """Remove a user created by ``ensure_user``."""
    subprocess.run(["userdel", name], check=False, timeout=30)


@pytest.fixture(scope="session")
def user() -> Iterator[str]:
    """An ordinary user for the jobs (root hides permission errors)."""
    if available():
        pytest.skip(str(available()))
    created = ensure_user(USER)
    try:
        yield USER
    finally:
        if created:
            remove_user(USER)


def python_for(name: str, cluster: Optional[SlurmCluster] = None) -> Optional[str]:
    """A Python >= 3.9 the user can run where the cluster's jobs run (the test venv may live in
    root's home; Slurm 24.11 jobs run in its trixie root, whose Python is /usr/bin/python3)."""
    prefix = cluster.as_user(name, [], "/") if cluster else ["runuser", "-u", name, "--"]
    for candidate in (sys.executable, "/usr/bin/python3"):
        proc = subprocess.run(
            [
                *prefix,
                candidate,
                "-c",
                "import sys; assert sys.version_info >= (3, 9)",
            ],
            capture_output=True,
            timeout=30,
            check=False,
        )
        if proc.returncode == 0:
            return candidate
    return None


class Work:
    """A folder the job user can write: hma wrapper, checkpoints, job output."""

    def __init__(self, cluster: SlurmCluster, name: str, python: str) -> None:
        self.cluster = cluster
        self.user, self.python = name, python
        self.base = Path(f"/tmp/hma-ar-{uuid.uuid4().hex[:8]}")
        self.bin = self.base / "bin"
        self.ckpt = self.base / "ckpt"
        for folder in (self.base, self.bin, self.ckpt):
            folder.mkdir()
            os.chmod(folder, 0o777)
        hma = self.bin / "hma"
        hma.write_text(f'#!/bin/sh\nPYTHONPATH={ROOT} exec {python} -m hma "$@"\n')
        hma.chmod(0o755)
        self.config = self.base / "hma.toml"
        self.config.write_text("")
        self.config.chmod(0o644)

    def env(self) -> list[str]:
        """``env`` arguments of a job submission."""
        return [
            f"SLURM_CONF={self.cluster.conf}",
            f"PATH={self.bin}:/usr/local/bin:/usr/bin:/bin",
            f"HMA_CONFIG={self.config}",
            f"CKPT_DIR={self.ckpt}",
            f"EXAMPLES={EXAMPLES}",
            "HMA_EXAMPLE_TRAINER=1",
            "HMA_AUTO_RESUME_GRACE=5",
            "HMA_AUTO_RESUME_REPLACE_WAIT=30",
        ]

    def sbatch(self, *args: str) -> str:
        """Submit as the user; returns the job id."""
        proc = subprocess.run(
            [*self.cluster.as_user(self.user, self.env(), str(self.base)), "sbatch", "--parsable"]
            + list(args),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip().split(";")[0]

    def submit(self, *trainer: str, comment: str = "") -> str:
        """docs/examples/batch.sh with trainer options."""
        extra = [f"--comment={comment}"] if comment else []
        return self.sbatch(
            *extra,
            f"--output={self.out}",
            f"--chdir={self.base}",
            str(EXAMPLES / "batch.sh"),
            *trainer,
        )

    @property
    def out(self) -> Path:
        """The job's output file (all attempts)."""
        return self.base / "out.txt"

    def output(self) -> str:
        """The output so far."""
        return self.out.read_text() if self.out.exists() else ""

    def history(self) -> list[dict[str, str]]:
        """The trainer's start lines (ts, restart, node, rank, start)."""
        path = self.ckpt / "history.log"
        lines = path.read_text().splitlines() if path.exists() else []
        out = []
        for line in lines:
            ts, *rest = line.split()
            out.append({"ts": ts, **dict(p.split("=", 1) for p in rest)})
        return out

    def step(self) -> int:
        """The checkpointed step."""
        path = self.ckpt / "checkpoint.json"
        return int(json.loads(path.read_text())["step"]) if path.exists() else 0

    def remove(self) -> None:
        """Delete the folder."""
        shutil.rmtree(self.base, ignore_errors=True)


def job(cluster: SlurmCluster, job_id: str) -> dict:
    """The job's ``squeue --json`` object ({} once gone; 22.05 ignores -j, so filter here)."""
    out = cluster.run("squeue", "--json", "-j", job_id).stdout
    jobs = json.loads(out).get("jobs", []) if out.strip() else []
    return next((j for j in jobs if str(j.get("job_id")) == str(job_id)), {})


def hosts(cluster: SlurmCluster, nodelist: str) -> list[str]:
    """A node list expression expanded."""
    return cluster.scontrol("show", "hostnames", nodelist).split()


def show_job(cluster: SlurmCluster, job_id: str) -> dict[str, str]:
    """``scontrol -o show job`` as key=value (free-text fields may be cut: not used here)."""
    proc = cluster.run("scontrol", "-o", "show", "job", job_id)
    return dict(p.split("=", 1) for p in proc.stdout.split() if "=" in p)


def inject(
    cluster: SlurmCluster,
    work: Work,
    rem: Remediator,
    node: str,
    job_id: str,
    step_dies_first: bool = False,
) -> None:
    """The agent drains ``node`` with its reason and the rank there dies, in either order
    (``step_dies_first``: hma srun must wait, within its grace period, for the agent's drain)."""
    wait(lambda: job_id in rem.facts().job_ids, 20, f"job {job_id} in {node}'s facts")
    if step_dies_first:
        died = work.output().count("simulated Xid 79")
        (work.ckpt / f"FAULT-{node}").write_text("Xid 79\n")
        wait(lambda: work.output().count("simulated Xid 79") > died, 20, f"rank on {node} dead")
    rem.update(verdict(fault()), "boot-1")
    wait(lambda: "DRAIN" in cluster.state(node), 20, f"{node} drained")
    (work.ckpt / f"FAULT-{node}").write_text("Xid 79\n")


def finished(cluster: SlurmCluster, job_id: str) -> dict[str, str]:
    """Wait for the job's end; its ``scontrol show job`` fields (read before MinJobAge)."""
    last: dict[str, str] = {}

    def ended() -> bool:
        nonlocal last
        fields = show_job(cluster, job_id)
        if fields:
            last = fields
        return fields.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED") or (
            not fields and bool(last)
        )

    wait(ended, 90, f"job {job_id} finished")
    return last


def config_check(cluster: SlurmCluster, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``hma config check`` with the Slurm options of ``cluster``."""
    cfg = write_config(tmp_path / "hma.toml", cluster, cluster.nodes[0])
    return subprocess.run(
        [sys.executable, "-m", "hma", "--config", str(cfg), "config", "check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )


@contextmanager
def job_work(cluster: SlurmCluster, user: str) -> Iterator[Work]:
    """A work folder for ``user``'s jobs on a reset ``cluster`` (skipped where the user cannot
    read the tree or run a Python >= 3.9); the user's jobs cancelled and the folder removed
    after."""
    if not os.access(ROOT, os.R_OK):
        pytest.skip("the source tree must be readable by the job user")
    python = python_for(user, cluster)
    if python is None:
        pytest.skip(f"no Python >= 3.9 that {user} can run")
    cluster.reset()
    w = Work(cluster, user, python)
    try:
        yield w
    finally:
        cluster.run("scancel", "-u", user)
        w.remove()


@contextmanager
def node_agents(cluster: SlurmCluster, tmp: Path) -> Iterator[dict[str, Remediator]]:
    """One Remediator ("the agent") per node of ``cluster``, closed after (no circuit breaker:
    a test may fault two nodes)."""
    recovery = {"max_drained_percent": 100.0}
    rems = {n: make(tmp, cluster, n, recovery, {"facts_interval": 0.5})[0] for n in cluster.nodes}
    try:
        yield rems
    finally:
        for rem in rems.values():
            rem.close()
