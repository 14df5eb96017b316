"""The tree form on a real Slurm 22.05 (no block plugin): 36 slurmd on loopback in two 18-node
NVLink domains, one leaf switch per domain under one top switch. A job fills one domain before
it spans two (best effort, as with blocks); placement from ``sbatch --test-only``."""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.integration.topology_helpers import (
    DOMAINS,
    NODES,
    Fabric,
    controller_back,
    hma_topology,
    per_domain,
    placed,
    publish,
    reason,
    start,
)
from tests.slurmcluster import SlurmCluster

pytestmark = pytest.mark.timeout(300)
ALL = [f"node{i}" for i in range(1, NODES + 1)]
BOOT = "SwitchName=all Nodes=node[1-36]\n"


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    work = tmp_path_factory.mktemp("topology")
    for cluster in start("22.05", "topology/tree", BOOT):
        assert publish(cluster, Fabric(work), ALL) == NODES
        run = hma_topology(cluster, work, fmt="tree")
        assert run.returncode == 0, run.stderr
        controller_back(cluster)
        yield cluster


def test_tree_form_one_switch_per_domain(written: SlurmCluster) -> None:
    text = (written.base / "etc" / "topology.conf").read_text()
    assert text.split("\n", 1)[1] == (
        f"SwitchName={DOMAINS[1]} Nodes=node[1-18]\nSwitchName={DOMAINS[2]} Nodes=node[19-36]\n"
        f"SwitchName=hma-top Switches={DOMAINS[1]},{DOMAINS[2]}\n"
    )
    shown = written.scontrol("show", "topology")
    assert f"SwitchName={DOMAINS[1]} Level=0" in shown and "SwitchName=hma-top Level=1" in shown
    assert reason(written, "node18") == reason(written, "node36") == "hma-spare"


def test_best_effort_locality(written: SlurmCluster) -> None:
    assert per_domain(placed(written, "-N14")) == [14]
    assert per_domain(placed(written, "-N20")) == [17, 3]
