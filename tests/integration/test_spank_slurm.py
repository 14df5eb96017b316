"""``srun --auto-resume=1`` on a real Slurm through the SPANK plugin (issue 29 item 4).

A loopback cluster whose ``PlugStackConfig`` loads contrib/spank/hma_auto_resume.so, built here
against that Slurm's headers (22.05: the host's libslurm-dev; 24.11: trixie's libslurm-dev,
fetched once and cached, see ``headers``). Jobs run as an ordinary user, as in
test_autoresume_slurm.py (whose agents, fault injection and trainer this reuses): the job's
script types plain ``srun --auto-resume=1``, and the outcome must be that of
``hma srun --auto-resume=1``: a hardware fault resumes the trainer from its checkpoint without
the faulty node, a failure on healthy nodes ends the job with the step's code, unlooped.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from hma.remediation.engine import Remediator
from tests import spankplugin
from tests.install import chroots
from tests.integration.autoresume_helpers import (  # noqa: F401 (the user fixture)
    EXAMPLES,
    ROOT,
    USER,
    Work,
    finished,
    inject,
    job_work,
    node_agents,
    python_for,
    user,
)
from tests.integration.remediation_helpers import SLURM_VERSIONS, wait
from tests.slurmcluster import SlurmCluster, available

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

HEADERS_2411 = chroots.CACHE / "trixie-slurm-headers"  # usr/include/slurm of trixie's 24.11


def headers(cluster: SlurmCluster) -> str:
    """The include folder with this cluster's Slurm headers (the plugin must be built for it).

    24.11: ``apt-get download libslurm-dev`` inside the cluster's trixie root (its overlay takes
    the writes; the files land in /tmp, shared with the host), unpacked, and its usr/include
    kept in the cache (once: the first 24.11 run here took no longer than a cached one); the
    host's compiler builds against it."""
    if cluster.chroot is None:
        return spankplugin.INCLUDE
    include = HEADERS_2411 / "usr" / "include"
    if (include / "slurm" / "spank.h").is_file():
        return str(include)
    with tempfile.TemporaryDirectory(prefix="hma-spank-") as tmp:
        os.chmod(tmp, 0o777)  # apt's download sandbox user writes here
        chroots.run([*cluster.chroot.argv("env")[:2], "/usr/bin/env", "-C", tmp,
                     "apt-get", "download", "-q", "libslurm-dev"], timeout=120)  # fmt: skip
        deb = next(Path(tmp).glob("libslurm-dev_*.deb"))
        unpacked = Path(tmp) / "x"
        chroots.run(["dpkg-deb", "-x", str(deb), str(unpacked)], timeout=60)
        staged = HEADERS_2411.with_name(HEADERS_2411.name + f".{os.getpid()}")
        shutil.rmtree(staged, ignore_errors=True)
        (staged / "usr").mkdir(parents=True)
        shutil.copytree(unpacked / "usr" / "include", staged / "usr" / "include")
        (staged / "source.txt").write_text(f"{deb.name}, from the trixie archive\n")
        try:
            staged.rename(HEADERS_2411)  # atomic; another run may have won the race
        except OSError:
            shutil.rmtree(staged, ignore_errors=True)
    return str(include)


class Plug:
    """The plugin's folder: the .so, plugstack.conf, and the hma that plugstack.conf names."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.conf = folder / "plugstack.conf"
        self.so = folder / "hma_auto_resume.so"
        self.hma = folder / "hma"

    def point_at(self, hma: str) -> None:
        """Write plugstack.conf (srun reads it at every start) with ``hma=`` this path."""
        self.conf.write_text(f"optional {self.so} hma={hma}\n")
        self.conf.chmod(0o644)


@pytest.fixture(scope="module", params=SLURM_VERSIONS, ids=lambda v: f"slurm{v}")
def plugged(request: pytest.FixtureRequest, user: str) -> Iterator[tuple[SlurmCluster, Plug]]:
    """A 4-node cluster loading the plugin, built for its Slurm version."""
    why = spankplugin.why_not()
    if why:
        pytest.skip(why)
    folder = Path(tempfile.mkdtemp(prefix="hma-spank-"))
    os.chmod(folder, 0o755)
    plug = Plug(folder)
    plug.point_at(str(plug.hma))
    try:
        version = request.param
        if available(version):
            pytest.skip(f"Slurm {version}: {available(version)}")
        cluster = SlurmCluster(4, version=version, conf_lines=[f"PlugStackConfig={plug.conf}"])
        cluster.start()
        try:
            try:
                include = headers(cluster)
            except (RuntimeError, StopIteration) as exc:  # the archive unreachable
                pytest.skip(f"Slurm {version}: cannot fetch trixie's libslurm-dev: {exc}")
            spankplugin.build_plugin(folder, include)  # optional: loaded from now on
            yield cluster, plug
        finally:
            cluster.stop()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def work(plugged: tuple[SlurmCluster, Plug], user: str) -> Iterator[Work]:
    cluster, plug = plugged
    with job_work(cluster, user) as w:
        shutil.copyfile(w.bin / "hma", plug.hma)  # the hma that plugstack.conf names
        plug.hma.chmod(0o755)
        plug.point_at(str(plug.hma))
        yield w


@pytest.fixture
def agents(
    plugged: tuple[SlurmCluster, Plug], tmp_path: Path, work: Work
) -> Iterator[dict[str, Remediator]]:
    """One Remediator ("the agent") per node."""
    with node_agents(plugged[0], tmp_path) as rems:
        yield rems


def batch(work: Work, *srun_args: str) -> str:
    """A batch job of 2 nodes whose script runs ``srun --auto-resume=1 ...`` (no hma in it)."""
    script = work.base / "job.sh"
    script.write_text(
        "#!/bin/sh\n"
        'echo "job $SLURM_JOB_ID attempt ${SLURM_RESTART_COUNT:-0} on $SLURM_JOB_NODELIST"\n'
        f"exec srun --auto-resume=1 {' '.join(srun_args)}\n"
    )
    script.chmod(0o755)
    return work.sbatch(
        "-N2",
        "--ntasks-per-node=1",
        "--requeue",
        "--open-mode=append",
        f"--output={work.out}",
        f"--chdir={work.base}",
        str(script),
    )


def starts(work: Work, count: int, what: str) -> list[str]:
    """Wait for ``count`` trainer starts in all; the nodes of the last two."""
    wait(lambda: len(work.history()) >= count, 90, what)
    return sorted(h["node"] for h in work.history()[count - 2 : count])


def test_srun_flag_resumes_after_a_hardware_fault(
    plugged: tuple[SlurmCluster, Plug], work: Work, agents: dict[str, Remediator]
) -> None:
    cluster = plugged[0]
    trainer = f"{EXAMPLES}/train_auto_resume.sh --steps 40 --step-time 0.25"
    job_id = batch(work, "--kill-on-bad-exit=1", trainer)
    first = starts(work, 2, f"job {job_id} running")
    wait(lambda: work.step() >= 4, 30, "a few checkpoints")
    bad = first[1]
    inject(cluster, work, agents[bad], bad, job_id)
    second = starts(work, 4, f"job {job_id} resumed")
    assert bad not in second and len(set(second)) == 2, work.output()
    fields = finished(cluster, job_id)
    assert fields.get("JobState") in (None, "COMPLETED"), (fields, work.output())
    out = work.output()
    assert f"hardware fault on {bad}" in out, out  # hma srun's decision, from srun's flag
    assert json.loads((work.ckpt / "final.json").read_text()) == {"step": 40}
    resumed = work.history()[2:4]
    assert all(int(h["start"]) >= 4 for h in resumed)  # from the checkpoint, not from 0
    assert len(work.history()) == 4  # resumed once, not looped


def test_srun_flag_failure_on_healthy_nodes_is_not_resumed(
    plugged: tuple[SlurmCluster, Plug], work: Work
) -> None:
    cluster = plugged[0]
    job_id = batch(work, "-l", "sh", "-c", "'echo started; sleep 1; exit 3'")
    fields = finished(cluster, job_id)
    out = work.output()
    assert out.count("started") == 2, out
    assert "srun exited 3; no node of the job is marked faulty" in out
    assert "not a hardware failure, not resumed; exit 3" in out
    assert fields["ExitCode"] == "3:0" and fields["Restarts"] == "0"


def test_srun_flag_refuses_to_run_without_hma(
    plugged: tuple[SlurmCluster, Plug], work: Work
) -> None:
    cluster, plug = plugged
    argv = [*cluster.as_user(work.user, work.env(), str(work.base)), "srun"]
    # outside an allocation the plugin hands over to hma srun, which says so (exit 2)
    proc = subprocess.run([*argv, "--auto-resume=1", "-N1", "true"], capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert proc.returncode == 2 and "needs a Slurm allocation" in proc.stderr, proc.stderr
    plug.point_at("/nonexistent/hma")
    try:
        for args in (["--auto-resume=1", "-N1", "true"], ["--auto-resume", "2", "true"]):
            proc = subprocess.run([*argv, *args], capture_output=True, text=True, timeout=60,
                                  check=False)  # fmt: skip
            assert proc.returncode == 1, proc.stderr
            assert "srun does not run without the auto-resume asked for" in proc.stderr
        proc = subprocess.run([*argv, "--auto-resume=0", "true"], capture_output=True, text=True,
                              timeout=60, check=False)  # fmt: skip
        assert proc.returncode != 0 and "not a whole number from 1" in proc.stderr
        proc = subprocess.run([*argv, "-N1", "echo", "plain"], capture_output=True, text=True,
                              timeout=60, check=False)  # fmt: skip
        assert proc.returncode == 0 and proc.stdout.strip() == "plain", proc.stderr
    finally:
        plug.point_at(str(plug.hma))
