"""The Slurm backend: the ``[slurm]`` section and ``SlurmBackend`` (entry point ``hma.backends``:
``slurm``), remediation's calls as Slurm commands, HyperPod modes included."""

from __future__ import annotations

import os
import shutil
from typing import Any, Collection, Mapping, Optional, Sequence

from hma.cluster.slurm.client import SlurmClient
from hma.cluster.slurm.parse import COMMENT, EXTRA, HYPERPOD_REBOOT, HYPERPOD_REPLACE
from hma.contracts.cluster import (
    Backend,
    Job,
    JobInfo,
    NodeState,
    Reboots,
    Replaces,
    RequeuesJobs,
    SetsDown,
    TakesSpares,
)
from hma.contracts.options import Option, positive
from hma.topology import spares

# ``[slurm]``: the Slurm backend's own section (docs/remediation.md).
OPTIONS: dict[str, Option] = {
    "scontrol": Option("argv", ["scontrol"], "scontrol command."),
    "sinfo": Option("argv", ["sinfo"], "sinfo command."),
    "squeue": Option("argv", ["squeue"], "squeue command (jobs on the node)."),
    "conf": Option("path", None, "SLURM_CONF for every Slurm call (unset: Slurm's default)."),
    "path": Option(
        "str",
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "PATH for Slurm calls and hooks (HealthCheckProgram runs with no PATH).",
    ),
    "node_name": Option(
        "str", None, "This node's Slurm name; unset: match this host to NodeHostname/NodeName."
    ),
    "spool_dir": Option(
        "str",
        None,
        "SlurmdSpoolDir of this node (%n: node name): its jobs are read from the step sockets "
        "there; unset: asked once (scontrol show config); unreadable: scontrol listpids.",
    ),
    "timeout": Option("float", 20.0, "Seconds one Slurm client call may take.", check=positive),
    "heartbeat": Option(
        "float",
        600.0,
        "Seconds between reads of the node's Slurm state while nothing happens (jittered by "
        "10%; each read is one single-node sinfo: 2 controller RPCs).",
        check=positive,
        minimum=1.0,
    ),
    "facts_interval": Option(
        "float",
        10.0,
        "Seconds between reads of the node's jobs (local slurmd), and of its Slurm state while "
        "something happens (a fault, an action, a drain being watched, a controller outage).",
        check=positive,
        minimum=0.02,
    ),
    "enabled": Option(
        "bool",
        True,
        "Use Slurm at all (false: no facts, no labels, no actions).",
    ),
}

# ``[recovery]`` keys whose choices are Slurm's (``Backend.recovery``): the node field that
# carries the label, and the reboot and replace modes (HyperPod's among them; ``command`` runs
# the hook whatever the backend, ``drain_only`` leaves the node to a human), and the command
# that prints the node's record into an evidence bundle (hma.remediation.evidence).
RECOVERY: dict[str, Option] = {
    "label_field": Option(
        "choice",
        EXTRA,
        "Node field that carries the hma=... label token (edited in place).",
        choices=(EXTRA, COMMENT),
    ),
    "reboot_mode": Option(
        "choice",
        "scontrol",
        "How a reboot is done: scontrol reboot (node stays drained), HyperPod "
        "State=FAIL Reason=Action:Reboot, or reboot_command.",
        choices=("scontrol", "hyperpod", "command"),
    ),
    "replace_mode": Option(
        "choice",
        "drain_only",
        "How a replacement is asked for: stay drained for a human, HyperPod "
        "State=FAIL Reason=Action:Replace, or replace_command.",
        choices=("drain_only", "hyperpod", "command"),
    ),
    "evidence_node_record": Option(
        "strlist",
        ["scontrol", "-o", "show", "node"],
        "The node's record in an evidence bundle, on stdout (the node name is added; [] none).",
    ),
}


class SlurmBackend(Backend, Reboots, Replaces, SetsDown, TakesSpares, RequeuesJobs):
    """The Slurm backend: ``SlurmClient`` calls behind the ``Backend`` contract, with every
    capability. Reboot modes: ``scontrol`` (``scontrol reboot``) and ``hyperpod``; replace
    mode: ``hyperpod`` (``State=FAIL Reason=Action:Reboot`` / ``Action:Replace``)."""

    name = "slurm"
    options = OPTIONS
    recovery = RECOVERY
    no_node = "this host matches no NodeHostname/NodeName in Slurm"

    def __init__(
        self, options: Mapping[str, Any], label_field: str, client: Optional[SlurmClient] = None
    ) -> None:
        super().__init__(options, label_field)
        self.client = client or SlurmClient.from_options(options)
        self._key = "Comment" if label_field == COMMENT else "Extra"

    @property
    def enabled(self) -> bool:
        """``[slurm] enabled`` and scontrol found."""
        tool = str(self.config["scontrol"][0])
        path = str(self.config["path"] or os.environ.get("PATH", ""))
        found = (
            os.path.isabs(tool) and os.access(tool, os.X_OK) or bool(shutil.which(tool, path=path))
        )
        return bool(self.config["enabled"]) and found

    def node_name_configured(self) -> Optional[str]:
        """``[slurm] node_name``."""
        value = self.config.get("node_name")
        return str(value) if value else None

    def find_node_name(self) -> Optional[str]:
        """NodeHostname (or NodeName) matching this host."""
        return self.client.find_node_name()

    def node(self, name: str) -> NodeState:
        """``sinfo -n NAME``: a single-node query."""
        return self.client.node(name)

    def jobs(self, name: str) -> Sequence[Job]:
        """From the local slurmd (``SlurmClient.jobs``)."""
        return self.client.jobs(name)

    def peers(self, node: NodeState) -> tuple[list[NodeState], int]:
        """One filtered ``sinfo`` and the partition table (``SlurmClient.held_view``)."""
        return self.client.held_view(node)

    def job_infos(self, ids: Collection[str]) -> list[JobInfo]:
        """Single-job ``squeue`` queries."""
        return self.client.job_infos(list(ids))

    def env(self) -> dict[str, str]:
        """Ours plus SLURM_CONF and PATH (a hook may call scontrol)."""
        return self.client.env()

    def _fields(self, label: Optional[str]) -> dict[str, str]:
        return {} if label is None else {self._key: label}

    def label(self, name: str, text: str) -> None:
        """``scontrol update NodeName=NAME Extra=...`` (or Comment)."""
        self.client.update(name, **self._fields(text))

    def drain(self, name: str, reason: str, label: Optional[str] = None) -> None:
        """``State=DRAIN Reason=...`` (and the label) in one update."""
        self.client.update(name, State="DRAIN", Reason=reason, **self._fields(label))

    def resume(self, name: str, label: Optional[str] = None) -> None:
        """``State=RESUME`` (and the label) in one update."""
        self.client.update(name, State="RESUME", **self._fields(label))

    def down(self, name: str, reason: str) -> None:
        """``State=DOWN Reason=...``."""
        self.client.update(name, State="DOWN", Reason=reason)

    def reboot(self, name: str, reason: str, mode: str) -> None:
        """``scontrol reboot`` or HyperPod's ``State=FAIL Reason=Action:Reboot``."""
        if mode == "hyperpod":
            self.client.update(name, State="FAIL", Reason=HYPERPOD_REBOOT)
        else:
            self.client.reboot(name, reason)

    def rebooting(self, node: NodeState, mode: str) -> str:
        """``scontrol``: a reboot is requested or issued; ``hyperpod``: FAIL with its reason."""
        if mode == "scontrol" and node.reboot_pending:
            return "reboot already requested"
        return _hyperpod_done(node, mode, HYPERPOD_REBOOT)

    def replace(self, name: str, reason: str, mode: str, domain: Sequence[str] = ()) -> None:
        """HyperPod's ``State=FAIL Reason=Action:Replace`` (the only replace Slurm itself
        has; the topology domain is not needed for it)."""
        self.client.update(name, State="FAIL", Reason=HYPERPOD_REPLACE)

    def replacing(self, node: NodeState, mode: str) -> str:
        """``hyperpod``: the node is FAIL with its reason."""
        return _hyperpod_done(node, mode, HYPERPOD_REPLACE)

    def take_spare(self, name: str, domain: str) -> Optional[str]:
        """Resume the spare (drained ``hma-spare``) of ``domain`` (one node-table read)."""
        return spares.take_spare(self.client, name, domain)

    def update_job(self, job_id: str, **fields: str) -> None:
        """``scontrol update JobId=...``."""
        self.client.update_job(job_id, **fields)


def _hyperpod_done(node: NodeState, mode: str, reason: str) -> str:
    """The note for a HyperPod recovery (``reason``) already asked for, "" when it is not."""
    if mode == "hyperpod" and node.fail and node.reason == reason:
        return f"already State=FAIL Reason={reason}"
    return ""
