"""The cluster backend contract: what remediation asks of the cluster it runs under.

Remediation decides (``planner``), records (``outbox``) and then acts through one ``Backend``.
Every backend reads this node's state and jobs, counts the peers the circuit breaker needs (one
compact filtered query, only when about to act), labels, drains and resumes a node (the core);
rebooting, replacing, setting a node down, taking a spare and the job calls of auto-resume are
capabilities a backend has by inheriting ``Reboots``, ``Replaces``, ``SetsDown``,
``TakesSpares`` and ``RequeuesJobs``. Slurm is one backend (``hma.cluster.slurm``). Backends
register under the entry point group ``hma.backends`` like probes and reporters; ``[cluster]
backend`` chooses one and its own section (``[<name>]``, its ``options``) configures it. Node
states are told in Slurm's vocabulary (base state + flags), which every backend maps to.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Collection, Mapping, Optional, Sequence

from hma.contracts.options import Option

GROUP = "hma.backends"
OWNED_PREFIX = "HMA:"  # the reasons hma sets start with it

# Base states (lower case, as sinfo --json prints them and scontrol's State= before the first +).
BASE_STATES = frozenset(
    {"idle", "allocated", "mixed", "down", "error", "future", "unknown", "completing"}
)
# Flags remediation knows; anything else makes the state "not understood".
KNOWN_FLAGS = frozenset(
    {
        "DRAIN",
        "FAIL",
        "COMPLETING",
        "NOT_RESPONDING",
        "REBOOT_REQUESTED",
        "REBOOT_ISSUED",
        "MAINTENANCE",
        "RESERVED",
        "POWER_DOWN",
        "POWERED_DOWN",
        "POWERING_DOWN",
        "POWERING_UP",
        "POWER_UP",
        "CLOUD",
        "DYNAMIC_FUTURE",
        "DYNAMIC_NORM",
        "PLANNED",
        "INVALID_REG",
        "NO_RESPOND",
        "PERFCTRS",
        "POWER_DRAIN",
        "RES",
        "MAINT",
        "UNDRAIN",
        "RESUME",
        "REBOOT_CANCEL",
        "INVALID",
        "BLOCKED",
    }
)


@dataclass(frozen=True)
class NodeState:
    """One node as Slurm sees it."""

    name: str
    base: str  # idle, allocated, mixed, down, ... (lower case)
    flags: frozenset[str] = frozenset()
    reason: str = ""
    reason_time: float = 0.0
    reason_user: str = ""
    # The backend's free-text fields of the node, by name in the backend's order (a backend fills
    # every one it has, empty ones too); the label field (``[recovery] label_field``) is one of them
    texts: tuple[tuple[str, str], ...] = ()
    partitions: tuple[str, ...] = ()
    hostname: str = ""
    boot_time: float = 0.0
    address: str = ""  # NodeAddr

    @property
    def understood(self) -> bool:
        """False when Slurm reports a base state or flag this code does not know."""
        return self.base in BASE_STATES and self.flags <= KNOWN_FLAGS

    @property
    def busy(self) -> bool:
        """Jobs are (still) on the node."""
        return self.base in ("allocated", "mixed", "completing") or "COMPLETING" in self.flags

    @property
    def drain(self) -> bool:
        """The DRAIN flag is set (draining or drained)."""
        return "DRAIN" in self.flags

    @property
    def draining(self) -> bool:
        """Drain set but jobs still run."""
        return self.drain and self.busy

    @property
    def drained(self) -> bool:
        """Drain set and no job left."""
        return self.drain and not self.busy

    @property
    def fail(self) -> bool:
        """FAIL flag (fail or failing)."""
        return "FAIL" in self.flags

    @property
    def down(self) -> bool:
        """Base state down."""
        return self.base == "down"

    @property
    def not_responding(self) -> bool:
        """slurmctld cannot reach the node's slurmd."""
        return "NOT_RESPONDING" in self.flags or "NO_RESPOND" in self.flags

    @property
    def reboot_pending(self) -> bool:
        """A reboot was requested or issued and has not completed."""
        return bool({"REBOOT_REQUESTED", "REBOOT_ISSUED"} & self.flags)

    @property
    def maintenance(self) -> bool:
        """In a maintenance reservation."""
        return bool({"MAINTENANCE", "MAINT"} & self.flags)

    @property
    def out_of_service(self) -> bool:
        """Drained, draining, down or failed: someone took it out of scheduling."""
        return self.drain or self.fail or self.down

    @property
    def owned(self) -> bool:
        """Held by hma: out of service with hma's reason (starts ``HMA:``; Slurm may append
        `` : reboot issued``). Slurm 24.11 keeps the last reason of a resumed node: on a node
        back in service it says nothing."""
        return self.out_of_service and self.reason.startswith(OWNED_PREFIX)

    @property
    def recovery(self) -> str:
        """``reboot`` or ``replace`` while the cluster carries out the recovery a backend's own
        ``reboot``/``replace`` asks for; "" when none (the default: a backend's node state says
        when it can tell). It does not say who asked: the node is hma's when it carries hma's
        label (the breaker) or hma's episode acted (the resume)."""
        return ""

    @property
    def label_text(self) -> str:
        """A compact state string like sinfo's (``drained``, ``draining@``, ``down*``)."""
        if self.fail:
            text = "failing" if self.busy else "fail"
        elif self.drain:
            text = "draining" if self.busy else "drained"
        else:
            text = self.base
        if self.not_responding:
            text += "*"
        if "REBOOT_ISSUED" in self.flags:
            text += "^"
        elif "REBOOT_REQUESTED" in self.flags:
            text += "@"
        if self.maintenance:
            text += "$"
        return text

    def field(self, name: str) -> str:
        """The text of the node's field ``name`` (``texts``); "" when it has none of that name."""
        return next((text for key, text in self.texts if key == name), "")

    def with_field(self, name: str, text: str) -> NodeState:
        """This state with its field ``name`` holding ``text`` (in its place in ``texts``; added
        at the end when the node had none of that name)."""
        texts = [(key, text if key == name else old) for key, old in self.texts]
        if all(key != name for key, _old in self.texts):
            texts.append((name, text))
        return replace(self, texts=tuple(texts))


@dataclass(frozen=True)
class Job:
    """A job on the node."""

    id: str
    user: str
    state: str = ""
    note: str = ""  # the job's free-text field (where ``hma srun`` keeps its auto-resume marker)


class BackendError(Exception):
    """A backend call failed (cluster unreachable, unknown node, unexpected output): retried."""


@dataclass(frozen=True)
class JobInfo:
    """A queued or running job (what auto-resume reads of the jobs it watches)."""

    id: str
    user: str
    state: str  # RUNNING, PENDING, COMPLETING, ... (upper case)
    reason: str = ""  # state_reason: BeginTime, Resources, None, ...
    nodes: str = ""  # node list expression (empty while pending)
    note: str = ""  # the job's free-text field, as ``Job.note``
    requeue: bool = True
    batch: bool = True
    restarts: int = 0
    eligible_time: float = 0.0


class Backend(abc.ABC):
    """One cluster backend: the core every backend has. ``options`` declares its configuration
    section ``[<name>]`` and ``recovery`` its ``[recovery]`` keys; an instance is made from
    that section's values and the label field (``[recovery] label_field``). Every call may
    raise ``BackendError``; writes are retried by the outbox. What a backend can do beyond the
    core it says by inheriting the capabilities below (``Reboots``, ``Replaces``,
    ``SetsDown``, ``TakesSpares``, ``RequeuesJobs``); remediation holds an action whose
    capability is missing and says why."""

    name: ClassVar[str] = ""  # entry point name: its section, its block in the status document
    options: ClassVar[Mapping[str, Option]] = {}
    # The [recovery] keys whose choices are the backend's: ``label_field`` (its fields that can
    # carry the label), ``reboot_mode`` and ``replace_mode`` (its modes besides ``command``,
    # the hook, and ``drain_only``); remediation reads their values
    recovery: ClassVar[Mapping[str, Option]] = {}
    no_node: ClassVar[str] = "this host matches no node of the cluster"  # find_node_name: None

    def __init__(self, options: Mapping[str, Any], label_field: str) -> None:
        self.config = options
        self.label_field = label_field

    # --- reading ------------------------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        """Whether the cluster can be used at all from this host (false: no facts, no actions)."""
        return True

    @property
    def heartbeat(self) -> float:
        """Seconds between reads of the node's state while nothing happens (its ``heartbeat``
        option; 300 s without one)."""
        return float(self.config.get("heartbeat", 300.0))

    @property
    def facts_interval(self) -> float:
        """Seconds between reads of the node's jobs, and of its state while something happens
        (its ``facts_interval`` option; 10 s without one)."""
        return float(self.config.get("facts_interval", 10.0))

    @property
    def timeout(self) -> float:
        """Seconds one call may take (its ``timeout`` option; 20 s without one)."""
        return float(self.config.get("timeout", 20.0))

    def node_name_configured(self) -> Optional[str]:
        """This node's name as configured, if it is (else ``find_node_name`` finds it)."""
        return None

    @abc.abstractmethod
    def find_node_name(self) -> Optional[str]:
        """This host's node name in the cluster, or None when no node matches."""

    @abc.abstractmethod
    def node(self, name: str) -> NodeState:
        """One node's state (one single-node query)."""

    @abc.abstractmethod
    def jobs(self, name: str) -> Sequence[Job]:
        """The jobs on the node (from the node itself where the cluster allows)."""

    @abc.abstractmethod
    def peers(self, node: NodeState) -> tuple[list[NodeState], int]:
        """What the breaker counts for ``node``: the out-of-service nodes of its partitions
        (``node`` among them) and how many nodes those partitions hold."""

    def env(self) -> dict[str, str]:
        """What a reboot/replace hook finds in its environment besides the agent's own (what
        the cluster's tools need); nothing by default."""
        return {}

    # --- writing ------------------------------------------------------------------------------

    @abc.abstractmethod
    def label(self, name: str, text: str) -> None:
        """Set the label field of the node to ``text``."""

    @abc.abstractmethod
    def drain(self, name: str, reason: str, label: Optional[str] = None) -> None:
        """Take the node out of scheduling with ``reason`` (running jobs finish), and set the
        label field to ``label`` in the same call when given."""

    @abc.abstractmethod
    def resume(self, name: str, label: Optional[str] = None) -> None:
        """Put the node back into scheduling (and set the label field when given)."""


# --- capabilities: what a backend can do beyond the core ---------------------------------------


class Reboots(abc.ABC):
    """The backend has a node rebooted itself (``[recovery] reboot_mode`` other than
    ``command``, which runs the hook whatever the backend)."""

    @abc.abstractmethod
    def reboot(self, name: str, reason: str, mode: str) -> None:
        """Have the node rebooted the way ``mode`` (``reboot_mode``, the backend's to read)
        says; the node stays out of scheduling."""

    @abc.abstractmethod
    def rebooting(self, node: NodeState, mode: str) -> str:
        """Why a reboot asked for in ``mode`` is in effect on ``node`` already (a note; a
        restart after ``kill -9`` must not reboot twice), "" when it is not."""


class Replaces(abc.ABC):
    """The backend has a node replaced (``[recovery] replace_mode`` other than ``drain_only``
    and ``command``)."""

    @abc.abstractmethod
    def replace(self, name: str, reason: str, mode: str, domain: Sequence[str] = ()) -> None:
        """Ask for the node to be replaced the way ``mode`` (``replace_mode``, the backend's to
        read) says; ``domain``: the other nodes of its topology domain."""

    @abc.abstractmethod
    def replacing(self, node: NodeState, mode: str) -> str:
        """Why a replacement asked for in ``mode`` is in effect on ``node`` already (a note),
        "" when it is not."""


class SetsDown(abc.ABC):
    """The backend takes a node down at once, killing its jobs (a drain that did not finish
    within ``drain_timeout``)."""

    @abc.abstractmethod
    def down(self, name: str, reason: str) -> None:
        """Set the node down with ``reason`` (its jobs are killed)."""


class TakesSpares(abc.ABC):
    """The backend puts a spare in service in place of a replaced node (docs/topology.md)."""

    @abc.abstractmethod
    def take_spare(self, name: str, domain: str) -> Optional[str]:
        """Put a healthy spare of ``domain`` in service in place of node ``name``; its name,
        None when the domain has none."""


class RequeuesJobs(abc.ABC):
    """The backend reads and changes jobs, for ``hma srun --auto-resume`` (docs/auto-resume.md):
    a job requeued by hma srun starts again at once."""

    @abc.abstractmethod
    def job_infos(self, ids: Collection[str]) -> list[JobInfo]:
        """The queued or running jobs among ``ids`` (gone ones are absent)."""

    @abc.abstractmethod
    def update_job(self, job_id: str, **fields: str) -> None:
        """Change fields of a job (auto-resume sets ``StartTime=now``)."""
