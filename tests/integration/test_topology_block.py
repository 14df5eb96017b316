"""NVLink-domain placement on a real Slurm 24.11 (topology/block): 36 slurmd on loopback in two
18-node domains whose nodes learn their domain from the stand-in NVML and th.publish it;
``hma topology`` writes topology.conf with one spare per domain; placement is read from
``sbatch --test-only`` (no job runs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest

from hma import assembly
from hma.contracts.model import Action
from hma.health.store import Store
from hma.remediation.engine import Remediator
from hma.topology import spares
from tests.integration import topology_helpers as th
from tests.integration.remediation_helpers import (
    FAST,
    fault,
    verdict,
    wait,
    write_config,
    write_hook,
)
from tests.simnode import SimNode
from tests.slurmcluster import SlurmCluster

pytestmark = pytest.mark.timeout(300)
ALL = [f"node{i}" for i in range(1, th.NODES + 1)]
BOOT = "BlockName=all Nodes=node[1-36]\n"  # what the controller starts with
EXPECTED = (
    f"BlockName={th.DOMAINS[1]} Nodes=node[1-18]\nBlockName={th.DOMAINS[2]} Nodes=node[19-36]\n"
    "BlockSizes=17\n"
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    yield from th.start("24.11", "topology/block", BOOT)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("topology")


@pytest.fixture(scope="module")
def written(cluster: SlurmCluster, work: Path) -> SlurmCluster:
    """Every node published its domain, hma topology wrote the file and reconfigured."""
    fabric = th.Fabric(work)
    assert th.publish(cluster, fabric, ALL[:-1]) == th.NODES - 1
    check = th.hma_topology(cluster, work, "--check")  # node36 has not published yet
    assert check.returncode == 1, check.stderr
    assert "+BlockName=nodomain-node36 Nodes=node36" in check.stdout
    assert "node36 publishes no domain" in check.stderr
    assert "would make node35 a spare" in check.stdout  # node36 is in no domain yet
    assert (cluster.base / "etc" / "topology.conf").read_text() == BOOT  # nothing changed
    assert th.reason(cluster, "node35") == ""
    assert th.publish(cluster, fabric, ALL) == 1  # only node36 had something to write
    run = th.hma_topology(cluster, work)
    assert run.returncode == 0, run.stderr
    th.controller_back(cluster)
    return cluster


def test_domains_and_spares_in_topology_conf(written: SlurmCluster, work: Path) -> None:
    text = (written.base / "etc" / "topology.conf").read_text()
    assert text.split("\n", 1)[1] == EXPECTED
    shown = written.scontrol("show", "topology")
    assert f"BlockName={th.DOMAINS[1]} BlockIndex=0 Nodes=node[1-18] BlockSize=17" in shown
    assert f"BlockName={th.DOMAINS[2]} BlockIndex=1 Nodes=node[19-36] BlockSize=17" in shown
    for node in ("node18", "node36"):  # the last idle node of each domain
        assert th.reason(written, node) == spares.SPARE_REASON
        assert "DRAIN" in written.state(node)
    written.rpc_counts(reset=True)
    again = th.hma_topology(written, work)  # nothing changed: no write, no reconfigure
    assert again.returncode == 0 and "unchanged" in again.stdout and "spares" not in again.stdout
    rpcs = written.rpc_counts()
    assert rpcs["REQUEST_NODE_INFO"][0] == 1  # every node's domain in one query
    assert "REQUEST_UPDATE_NODE" not in rpcs and "REQUEST_RECONFIGURE" not in rpcs
    assert th.hma_topology(written, work, "--check").returncode == 0


def test_a_job_of_14_lands_in_one_domain(written: SlurmCluster) -> None:
    assert th.per_domain(th.placed(written, "-N14")) == [14]


def test_a_job_of_20_lands_17_plus_3(written: SlurmCluster) -> None:
    nodes = th.placed(written, "-N20")
    assert th.per_domain(nodes) == [17, 3]
    assert "node18" not in nodes and "node36" not in nodes  # the spares stay out


def test_segments_stay_in_one_domain(written: SlurmCluster) -> None:
    assert th.per_domain(th.placed(written, "-N20", "--segment=10")) == [10, 10]
    assert th.per_domain(th.placed(written, "-N8", "--segment=4")) == [8]


def test_replace_puts_the_domains_spare_in_service(written: SlurmCluster, work: Path) -> None:
    slurm = th.client(written)
    written.scontrol("update", "NodeName=node5", "State=DRAIN", "Reason=HMA: GPU_LOST gpu:0")
    assert spares.take_spare(slurm, "node5", th.DOMAINS[2]) == "node36"  # the domain asked for
    assert spares.take_spare(slurm, "node5", th.DOMAINS[1]) == "node18"
    written.wait(lambda: written.state("node18") == "IDLE", 30, "node18 in service")
    assert spares.take_spare(slurm, "node5", th.DOMAINS[1]) is None  # no spare left in it
    nodes = th.placed(written, "-N17")  # a domain-sized job still fits one domain
    assert th.per_domain(nodes) == [17] and "node5" not in nodes
    written.scontrol("update", "NodeName=node5", "State=RESUME")  # the replaced node is back
    run = th.hma_topology(written, work)  # and the next run makes up the spare count
    assert run.returncode == 0 and "spares: node[18,36] drained" in run.stdout, run.stdout


def test_the_agent_finds_and_publishes_its_domain(written: SlurmCluster) -> None:
    """A real `hma run` on node7 (stand-in NVML whose GPUs report clique 1): status shows the
    domain and the agent publishes it in Slurm once."""
    written.scontrol("update", "NodeName=node7", "Extra=rack=4")
    sim = SimNode(written, "node7").build()
    assert sim.scenario is not None
    cluster_uuid, _, clique = th.DOMAINS[1].partition(".")
    for index in sim.scenario.devices:
        sim.scenario.devices[index]["fabric_domain"] = f"{cluster_uuid} {clique}"
    sim.scenario.write()
    try:
        sim.start_agent()
        sim.wait(
            lambda: sim.status().get("topology") == {"domain": th.DOMAINS[1], "source": "nvml"},
            30,
            "the domain in status.json",
        )
        assert f"NVLink domain {th.DOMAINS[1]} (nvml)" in sim.hma("status").stdout
        want = f"rack=4 hma-domain={th.DOMAINS[1]}"
        sim.wait(lambda: written.node("node7")["extra"] == want, 30, "the domain published")
        written.rpc_counts(reset=True)  # published: no more writes while it stays the same
        runs = {p["name"]: p["last_run"] for p in sim.status()["probes"]}
        sim.wait(
            lambda: any(
                p["name"] == "gpu" and p["last_run"] > runs["gpu"] for p in sim.status()["probes"]
            ),
            30,
            "another gpu probe run",
        )
        assert "REQUEST_UPDATE_NODE" not in written.rpc_counts()
    finally:
        sim.close()


def test_remediation_replace_resumes_the_spare_and_tells_the_hook(
    written: SlurmCluster, work: Path
) -> None:
    """The engine replacing node3 (a replace hook) resumes node18, its domain's spare, first."""
    assert th.hma_topology(written, work).returncode == 0  # the spares are in place
    assert "DRAIN" in written.state("node18")
    out = work / "hook.json"
    hook = write_hook(work / "hook.py", out)
    recovery = {**FAST, "replace_mode": "command", "replace_command": [str(hook)]}
    cfg = write_config(
        work / "hma-node3.toml", written, "node3", recovery, extra=th.topology_section(1)
    )
    rem = Remediator(assembly.load(str(cfg)), Store(str(work / "state-node3" / "state.db")))
    rem.set_domain(th.DOMAINS[1])
    try:
        rem.update(verdict(fault(action=Action.REPLACE)), "boot-1")
        wait(out.exists, what="replace hook run")
        env = json.loads(out.read_text())["env"]
        assert (env["HMA_NODE"], env["HMA_ACTION"]) == ("node3", "replace")
        assert (env["HMA_DOMAIN"], env["HMA_SPARE"]) == (th.DOMAINS[1], "node18")
        written.wait(lambda: written.state("node18") == "IDLE", 30, "node18 in node3's place")
        assert "DRAIN" in written.state("node3") and "DRAIN" in written.state("node36")
    finally:
        rem.close()
