"""The tree form on a real Slurm 22.05 (no block plugin): 36 slurmd on loopback in two 18-node
NVLink domains, one leaf switch per domain under one top switch. A job fills one domain before
it spans two (best effort, as with blocks); placement from ``sbatch --test-only``."""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.integration import topology_helpers as th
from tests.slurmcluster import SlurmCluster

pytestmark = pytest.mark.timeout(300)
ALL = [f"node{i}" for i in range(1, th.NODES + 1)]
BOOT = "SwitchName=all Nodes=node[1-36]\n"


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    work = tmp_path_factory.mktemp("topology")
    for cluster in th.start("22.05", "topology/tree", BOOT):
        assert th.publish(cluster, th.Fabric(work), ALL) == th.NODES
        run = th.hma_topology(cluster, work, fmt="tree")
        assert run.returncode == 0, run.stderr
        th.controller_back(cluster)
        yield cluster


def test_tree_form_one_switch_per_domain(written: SlurmCluster) -> None:
    text = (written.base / "etc" / "topology.conf").read_text()
    assert text.split("\n", 1)[1] == (
        f"SwitchName={th.DOMAINS[1]} Nodes=node[1-18]\n"
        f"SwitchName={th.DOMAINS[2]} Nodes=node[19-36]\n"
        f"SwitchName=hma-top Switches={th.DOMAINS[1]},{th.DOMAINS[2]}\n"
    )
    shown = written.scontrol("show", "topology")
    assert f"SwitchName={th.DOMAINS[1]} Level=0" in shown and "SwitchName=hma-top Level=1" in shown
    assert th.reason(written, "node18") == th.reason(written, "node36") == "hma-spare"


def test_best_effort_locality(written: SlurmCluster) -> None:
    assert th.per_domain(th.placed(written, "-N14")) == [14]
    assert th.per_domain(th.placed(written, "-N20")) == [17, 3]
