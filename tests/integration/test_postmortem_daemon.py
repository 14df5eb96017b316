"""A post-mortem through the agent loop (tests/simnode.py in the real loopback Slurm): a real
pstore panic record (gpud's capture) found on the next boot raises KERNEL_PREVIOUS_BOOT_CRASH
once, drains nothing, counts once in the node's history (``hmah=``) and names its cause for the
watcher (``hmap=``); an agent restart in the same boot, and a later boot, raise it no more."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Iterator

import pytest

from hma.contracts import label
from tests.simnode import SimNode
from tests.slurmcluster import SlurmCluster, available
from tests.standin import nvmlstub

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

NODE = "node1"
TIMEOUT = 90.0
PANIC = Path(__file__).resolve().parents[1] / "fixtures/postmortem/dmesg-erst-7530486857247752193"


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
        node = SimNode(cluster, NODE).build()
        yield node
    finally:
        if node is not None:
            node.close()
        cluster.stop()


def crashes(sim: SimNode) -> list[dict]:
    return [f for f in sim.faults() if f["code"] == label.POSTMORTEM_CODE]


def extra(sim: SimNode) -> str:
    """The node's label field (Extra) as Slurm holds it (sinfo --json: its blanks kept)."""
    return str(sim.cluster.node(NODE).get("extra") or "")


def probes_ran(sim: SimNode) -> bool:
    """Every probe has run once since the agent started (in the node's current boot)."""
    doc = sim.status()
    probes = doc.get("probes") or []
    fresh = doc.get("boot_id") == sim.boot_id()
    return fresh and bool(probes) and all(p.get("status") != "pending" for p in probes)


def test_a_pstore_capture_on_the_next_boot_raises_its_finding_once(sim: SimNode) -> None:
    sim.pstore.mkdir(parents=True, exist_ok=True)
    shutil.copy(PANIC, sim.pstore / PANIC.name)  # the kernel left it before the reboot
    sim.cluster.set_boot_id(NODE)  # the next boot
    sim.start_agent()
    sim.wait(lambda: crashes(sim), TIMEOUT, "the post-mortem's finding")
    found = crashes(sim)
    assert [(f["component"], f["details"]["cause"]) for f in found] == [("node", "KERNEL_PANIC")]
    assert found[0]["severity"] == "warning"

    sim.wait(lambda: label.find_postmortem(extra(sim)), TIMEOUT, "hmap= in the label field")
    post = label.find_postmortem(extra(sim))
    history = label.find_history(extra(sim))
    assert post is not None and post.cause == "KERNEL_PANIC"
    assert history is not None and [c for _t, c in history.entries] == ["KERNEL_PANIC"]
    assert "DRAIN" not in sim.cluster.show(NODE)["State"]  # evidence, not a current fault

    sim.stop_agent()  # a restart in the same boot: nothing read again
    sim.start_agent()
    sim.wait(lambda: probes_ran(sim), TIMEOUT, "a probe run after the restart")
    assert len(crashes(sim)) == 1  # still the one finding of this boot (the store kept it)
    sim.stop_agent()
    sim.cluster.set_boot_id(NODE)  # a later boot: the record is still there, old news
    sim.start_agent()
    sim.wait(sim.healthy, TIMEOUT, "a healthy verdict in the later boot")
    assert crashes(sim) == []
    history = label.find_history(extra(sim))
    assert history is not None and len(history.entries) == 1  # counted once
