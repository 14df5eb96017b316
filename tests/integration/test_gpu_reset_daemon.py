"""`hma run` on a simulated GPU node (tests/simnode.py) in the real (loopback) Slurm: an Xid for
which NVIDIA's catalogue prescribes a GPU reset, written to the /dev/kmsg stand-in, drains the
node; the agent resets that GPU through the stand-in nvidia-smi, clears the Xid, has the gpu
probe read the stand-in NVML again and resumes the node, without a reboot. Then `hma reset`
reaches the running agent and leaves no history in Slurm."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

from tests.integration.remediation_helpers import back_in_service
from tests.simnode import SimNode
from tests.slurmcluster import SlurmCluster, available
from tests.standin import nvmlstub

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

NODE = "node1"
TIMEOUT = 90.0


@pytest.fixture
def sim() -> Iterator[SimNode]:
    why = available()
    if why:
        pytest.skip(why)
    if nvmlstub.compiler() is None:
        pytest.skip("no C compiler (cc) for the stand-in NVML library")
    cluster = SlurmCluster(2)
    node = None
    try:
        cluster.start()
        smi = [sys.executable, str(nvmlstub.NVIDIA_SMI)]
        node = SimNode(cluster, NODE).build(recovery={"gpu_reset_command": smi})
        yield node
    finally:
        if node is not None:
            node.close()
        cluster.stop()


def test_agent_resets_the_gpu_and_resumes_without_a_reboot(
    sim: SimNode, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "smi-args.log"
    monkeypatch.setenv("HMA_SMI_ARGS_LOG", str(log))
    monkeypatch.setenv("SUDO_USER", "alice")
    cluster = sim.cluster
    sim.start_agent()
    sim.wait(sim.healthy, TIMEOUT, "a first healthy verdict")
    boot, pci = sim.boot_id(), sim.gpu_pci(3)
    res = sim.hma(
        "inject", "xid", "--gpu", pci, "--xid", "46", "--yes-really-drain",
        "--kmsg", str(sim.dev_kmsg),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    sim.wait(lambda: ("reset_gpu", "done") in sim.actions(), TIMEOUT, "the GPU reset")
    assert log.read_text().split() == ["--gpu-reset", "-i", f"0000{pci}".upper()]
    sim.wait(lambda: ("resume", "done") in sim.actions(), TIMEOUT, "the resume")
    assert [k for k, _s in sim.actions()] == ["drain", "reset_gpu", "resume"]
    assert sim.boot_id() == boot and NODE not in cluster.reboots()
    assert back_in_service(cluster, cluster.node(NODE))
    assert not [f for f in sim.faults() if f["code"] == "GPU_XID_46"]
    assert sim.status()["remediation"]["remediations"] == 1
    assert "hmah=" in cluster.node(NODE)["extra"]

    # a human says the GPU was repaired: the running agent takes the request
    res = sim.hma("reset", "GPU_XID_46", "--reason", "reseated GPU 3")
    assert res.returncode == 0 and "daemon pid" in res.stdout, res.stderr
    sim.wait(lambda: sim.status()["remediation"]["remediations"] == 0, TIMEOUT, "history cleared")
    sim.wait(lambda: "hma" not in cluster.node(NODE)["extra"], TIMEOUT, "no history in Slurm")
    assert "Traceback" not in sim.log.read_text()
