"""Shared pieces of the topology tests: a cluster of two 18-node NVLink domains whose nodes
learn their domain from the stand-in NVML (the real binding and the real gpu probe) and publish
it in Slurm, and ``hma topology`` run as operators run it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

from hma.adapters.command import CommandRunner
from hma.adapters.files import RootReader
from hma.cluster.slurm.backend import SlurmBackend
from hma.cluster.slurm.client import SlurmClient
from hma.contracts.probe import ProbeContext
from hma.probes.nvidia.gpu import GpuProbe
from hma.topology import domain
from tests.integration.remediation_helpers import write_config
from tests.slurmcluster import SlurmCluster, available
from tests.standin import nvmlstub

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_UUID = "8c3e61a2-57d4-4c1e-9b0a-3f2e1d0c4b5a"
PER_DOMAIN = 18
NODES = 2 * PER_DOMAIN
DOMAINS = {1: f"{CLUSTER_UUID}.1", 2: f"{CLUSTER_UUID}.2"}  # two cliques: two NVL72 racks


def domain_of(node: str) -> str:
    """The domain a test node is in: node1-18 clique 1, node19-36 clique 2."""
    return DOMAINS[1 if int(node[4:]) <= PER_DOMAIN else 2]


def start(version: str, plugin: str, conf_text: str) -> Iterator[SlurmCluster]:
    """A started 36-node cluster with ``TopologyPlugin=plugin`` and this topology.conf."""
    why = available(version)
    if why:
        pytest.skip(f"Slurm {version}: {why}")
    if nvmlstub.compiler() is None:
        pytest.skip("no C compiler (cc) to build the stand-in NVML library")
    cluster = SlurmCluster(
        NODES,
        version=version,
        extra_conf=f"TopologyPlugin={plugin}",
        conf_files={"topology.conf": conf_text},
    )
    cluster.start(timeout=120)
    try:
        yield cluster
    finally:
        cluster.stop()


class Fabric:
    """Each node's GPUs through the stand-in NVML: ``read(node)`` runs the gpu probe over a
    scenario whose 8 GPUs report the node's cluster UUID and clique id."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.lib = nvmlstub.build(folder / "lib")

    def read(self, node: str, dom: Optional[str] = None) -> str:
        """The domain the node's agent finds (hma.topology.domain.resolve over the summary)."""
        cluster, _, clique = (dom or domain_of(node)).partition(".")
        scenario = nvmlstub.Scenario(self.folder / f"{node}.txt")
        for index in scenario.devices:
            scenario.devices[index]["fabric_domain"] = f"{cluster} {clique}"
        scenario.write()
        old = os.environ.get(nvmlstub.ENV)
        os.environ[nvmlstub.ENV] = str(scenario.path)
        try:
            probe = GpuProbe()
            options = {k: o.default for k, o in GpuProbe.options.items()}
            ctx = ProbeContext(
                options={**options, "library": str(self.lib)},
                sysfs=RootReader(str(self.folder / "nosysfs")),
                procfs=RootReader("/proc"),
                runner=CommandRunner(),
            )
            summary = probe.summary(probe.collect(ctx))
        finally:
            if old is None:
                os.environ.pop(nvmlstub.ENV, None)
            else:
                os.environ[nvmlstub.ENV] = old
        return domain.resolve(None, {"gpu": summary})[0]


def client(cluster: SlurmCluster) -> SlurmClient:
    """A Slurm client of this cluster's version."""
    tools = cluster.agent_slurm()
    return SlurmClient(
        scontrol=tools.get("scontrol", ["scontrol"]),
        sinfo=tools.get("sinfo", ["sinfo"]),
        conf=str(cluster.conf),
    )


def publish(cluster: SlurmCluster, fabric: Fabric, nodes: list[str]) -> int:
    """Each node finds its domain and publishes it as its agent does; returns the writes."""
    slurm = client(cluster)
    backend = SlurmBackend({}, "extra", client=slurm)
    return sum(domain.publish(backend, slurm.node(n), fabric.read(n)) is not None for n in nodes)


def topology_section(spares: int, fmt: str = "block", path: Optional[Path] = None) -> str:
    """A ``[topology]`` section of hma.toml."""
    lines = ["[topology]", f"spares_per_domain = {spares}", f'format = "{fmt}"']
    if path is not None:
        lines.append(f'file = "{path}"')
    return "\n".join(lines) + "\n"


def hma_topology(
    cluster: SlurmCluster, folder: Path, *args: str, spares: int = 1, fmt: str = "block"
) -> subprocess.CompletedProcess:
    """``hma topology ARGS`` with a config for this cluster (``[topology]`` given here)."""
    extra = topology_section(spares, fmt, cluster.base / "etc" / "topology.conf")
    cfg = write_config(folder / "hma-topology.toml", cluster, "node1", extra=extra)
    return subprocess.run(
        [sys.executable, "-m", "hma", "topology", "--config", str(cfg), *args],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def controller_back(cluster: SlurmCluster) -> None:
    """Wait until slurmctld answers (24.11's reconfigure restarts it)."""
    cluster.wait(lambda: cluster.run("scontrol", "ping").returncode == 0, 60, "slurmctld back")


def placed(cluster: SlurmCluster, *args: str) -> list[str]:
    """The nodes ``sbatch --test-only ARGS`` says the job would start on (no job is queued)."""
    proc = cluster.run("sbatch", "--test-only", *args, "--wrap=true")
    text = proc.stderr + proc.stdout
    assert " on nodes " in text, text
    expr = text.split(" on nodes ", 1)[1].split()[0]
    return cluster.scontrol("show", "hostnames", expr).split()


def per_domain(nodes: list[str]) -> list[int]:
    """How many of ``nodes`` each domain holds, largest first (domains holding none left out)."""
    counts: dict[str, int] = {}
    for node in nodes:
        counts[domain_of(node)] = counts.get(domain_of(node), 0) + 1
    return sorted(counts.values(), reverse=True)


def reason(cluster: SlurmCluster, node: str) -> Any:
    """The node's drain reason as slurmctld keeps it."""
    return cluster.show(node).get("Reason", "").split(" [", 1)[0]
