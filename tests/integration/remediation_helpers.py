"""Shared pieces of the remediation tests: config files, verdicts, a Remediator per node."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

from hma import assembly
from hma.health.model import Fault, Verdict
from hma.health.store import Store
from hma.remediation.engine import Remediator
from tests.faults import fault  # noqa: F401 (the remediation suites import it from here)
from tests.hermetic.postmortem import postmortem_section
from tests.slurmcluster import SlurmCluster, available

FAST = {
    "recheck_interval": 0.3,
    "retry_min": 0.3,
    "retry_max": 2.0,
    "resume_after": 0.0,
    "min_reboot_interval": 0.0,
}


def toml_value(value: Any) -> str:
    """A TOML literal (strings through JSON, which TOML basic strings accept)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(value)


def write_config(
    path: Path,
    cluster: SlurmCluster,
    node: str,
    recovery: Optional[dict[str, Any]] = None,
    slurm: Optional[dict[str, Any]] = None,
    extra: str = "",
    paths: Optional[dict[str, Any]] = None,
    agent: Optional[dict[str, Any]] = None,
) -> Path:
    """An hma.toml for ``node`` of ``cluster`` with fast timings (``extra``: more TOML;
    ``paths``: more ``[paths]`` keys, e.g. a generated sysfs root; ``agent``: ``[agent]`` keys
    replaced, e.g. a ``probes_dir`` under a path only root can write). Unless ``extra`` has its
    own, a ``[sources.kernel_log]`` reads a FIFO no one writes: no agent of a test reads this
    machine's kernel log (tests/hermetic), its crash records or journal (``postmortem``), and an
    evidence bundle reads the test cluster's Slurm record and no kernel log."""
    folder = path.parent
    if "[sources.kernel_log]" not in extra:
        silent = folder / f"kmsg-{node}"
        if not silent.exists():
            os.mkfifo(silent, 0o600)
        extra += f'\n[sources.kernel_log]\npath = "{silent}"\nbackend = "kmsg"\n'
    if "[sources.postmortem]" not in extra:  # nor its crash records and journal
        extra += postmortem_section(folder / f"crash-records-{node}")
    scontrol = cluster.agent_slurm().get("scontrol", ["scontrol"])
    # evidence bundles: the test cluster's Slurm record, never this machine's kernel log
    evidence = {
        "evidence_kernel_log": [],
        "evidence_node_record": [*scontrol, "-o", "show", "node"],
    }
    sections = {
        "agent": {
            "state_dir": str(folder / f"state-{node}"),
            "run_dir": str(folder / f"run-{node}"),
            "node_name": node,
            "probes_dir": str(folder / "probes.d"),
            **(agent or {}),
        },
        "paths": {"procfs": str(cluster.procfs(node)), **(paths or {})},
        "slurm": {
            "conf": str(cluster.conf),
            "node_name": node,
            "facts_interval": 0.3,
            "timeout": 15.0,
            **cluster.agent_slurm(),
            **(slurm or {}),
        },
        "recovery": {**FAST, **evidence, **(recovery or {})},
    }
    lines = []
    for name, values in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in values.items()]
        lines.append("")
    path.write_text("\n".join(lines) + "\n" + extra)
    return path


def make(
    tmp: Path,
    cluster: SlurmCluster,
    node: str,
    recovery: Optional[dict[str, Any]] = None,
    slurm: Optional[dict[str, Any]] = None,
) -> tuple[Remediator, Store]:
    """A started Remediator for ``node`` with its own state database."""
    cfg = write_config(tmp / f"hma-{node}.toml", cluster, node, recovery, slurm)
    setup = assembly.load(str(cfg))
    store = Store(str(tmp / f"state-{node}" / "state.db"))
    return Remediator(setup, store), store


def write_hook(hook: Path, out: Path) -> Path:
    """A reboot/replace hook that writes its HMA_* environment and findings file to ``out``
    (as JSON ``{"env", "findings"}``, atomically)."""
    hook.write_text(
        f"#!{sys.executable}\nimport json, os\n"
        "env = {k: v for k, v in os.environ.items() if k.startswith('HMA_')}\n"
        "findings = json.load(open(os.environ['HMA_FINDINGS_FILE']))\n"
        f"json.dump({{'env': env, 'findings': findings}}, open({str(out)!r} + '.tmp', 'w'))\n"
        f"os.replace({str(out)!r} + '.tmp', {str(out)!r})\n"
    )
    hook.chmod(0o755)
    return hook


def verdict(*faults: Fault, boot: str = "boot-1") -> Verdict:
    """A verdict with these active faults."""
    return Verdict(time.time(), boot, tuple(faults))


def wait(predicate: Any, timeout: float = 20.0, what: str = "condition") -> None:
    """Poll until true."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def wait_alert(rem: Remediator, predicate: Any, what: str, timeout: float = 20.0) -> list[Any]:
    """Take the remediator's alerts until one satisfies ``predicate`` (an alert is queued after
    the cluster call it reports returns, so it may come a moment after the state Slurm shows);
    returns every alert taken."""
    taken: list[Any] = []

    def found() -> bool:
        taken.extend(rem.alerts())
        return any(predicate(a) for a in taken)

    wait(found, timeout, what)
    return taken


def back_in_service(cluster: SlurmCluster, node: dict[str, Any]) -> bool:
    """A ``cluster.node()`` object that is neither drained nor down, with no reason left where
    Slurm clears it on resume (22.05; 24.11 keeps a resumed node's last reason)."""
    held = "DRAIN" in node["state_flags"] or node["state"] == "down"
    return not held and (node["reason"] == "" or cluster.version != "22.05")


def kinds(rem: Remediator) -> list[tuple[str, str]]:
    """(kind, state) of the outbox rows, oldest first."""
    return [(r["kind"], r["state"]) for r in rem.status()["actions"]]


# The Slurm versions every cluster test runs on (docs/remediation.md); HMA_SLURM_VERSIONS narrows.
SLURM_VERSIONS = tuple(os.environ.get("HMA_SLURM_VERSIONS", "22.05 24.11").split())


def slurm_cluster(version: str, nodes: int = 4) -> Iterator[SlurmCluster]:
    """A started loopback Slurm of ``version``, stopped afterwards (skipped where it cannot run:
    not root, no Slurm packages, or for 24.11 no cached root and no reachable Debian mirror)."""
    why = available(version)
    if why:
        pytest.skip(f"Slurm {version}: {why}")
    c = SlurmCluster(nodes, version=version)
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module", params=SLURM_VERSIONS, ids=lambda v: f"slurm{v}")
def cluster(request: pytest.FixtureRequest) -> Iterator[SlurmCluster]:
    """A 4-node loopback Slurm for the test module, once per version in SLURM_VERSIONS."""
    yield from slurm_cluster(request.param)


@pytest.fixture
def fresh(cluster: SlurmCluster) -> SlurmCluster:
    """The module's cluster with every node back to idle and no labels."""
    cluster.reset()
    return cluster
