"""The probe contract: ``applies`` -> ``collect`` (all I/O) -> ``evaluate`` (pure).

Built-in and third-party probes are classes registered under the ``hma.probes`` entry point group.
``collect`` returns plain JSON-able data (the snapshot) so that probes with ``isolation =
"process"`` can collect in a worker process; ``evaluate`` turns a snapshot into findings and never
does I/O, so tests feed it snapshots directly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping, Optional

from hma.adapters.command import CommandRunner
from hma.adapters.files import RootReader
from hma.model import Finding, Severity
from hma.options import Option


@dataclass(frozen=True)
class NodeFacts:
    """Read-only facts about the node that probes may use (from the core; probes never call Slurm).

    ``job_running`` is None when unknown (no Slurm or Slurm unreachable)."""

    node_name: str = ""
    job_running: Optional[bool] = None
    job_ids: tuple[str, ...] = ()
    slurm_configured: bool = False
    job_users: tuple[str, ...] = ()
    slurm_state: str = ""  # sinfo-style state (drained, draining@, down*); "" when unknown
    slurm_reason: str = ""  # the node's drain/down/fail reason as Slurm shows it


@dataclass
class ProbeContext:
    """What the core hands a probe for one run."""

    options: Mapping[str, Any]
    sysfs: RootReader
    procfs: RootReader
    runner: CommandRunner
    instance_type: Optional[str] = None
    facts: NodeFacts = field(default_factory=NodeFacts)
    # The snapshot of this probe's previous completed run and its time (kept in the state store by
    # the daemon), for rates and "increasing" counters. None on the first run and under `hma check`.
    previous: Any = None
    previous_ts: float = 0.0
    oneshot: bool = False  # True under `hma check`
    boot_id: str = ""
    # Device (udev) events seen so far for this probe's triggers: a probe that caches discovery
    # keys the cache on it, so an added or removed device is discovered again.
    device_events: int = 0
    clock: Callable[[], float] = time.time


class Probe:
    """Base class of probes. Subclasses set the class attributes and implement the three steps."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    options: ClassVar[Mapping[str, Option]] = {}
    default_interval: ClassVar[float] = 60.0
    default_timeout: ClassVar[float] = 30.0
    default_enabled: ClassVar[bool] = True
    # Device subsystems whose udev add/remove events trigger an immediate run (pci, net, ...).
    subsystems: ClassVar[tuple[str, ...]] = ()
    # "thread" for pure-Python probes; "process" for probes that call into C (a hung driver call
    # cannot be interrupted in a thread, but a worker process can be killed).
    isolation: ClassVar[str] = "thread"

    def applies(self, ctx: ProbeContext) -> Optional[str]:
        """None when the probe applies to this node, else why not (reported as ``unsupported``)."""
        return None

    def collect(self, ctx: ProbeContext) -> Any:
        """Gather raw readings (all I/O happens here). Returns JSON-able data."""
        raise NotImplementedError

    def evaluate(self, snapshot: Any, ctx: ProbeContext) -> list[Finding]:
        """Pure: turn a snapshot plus expectations into findings."""
        raise NotImplementedError

    def summary(self, snapshot: Any) -> Optional[dict]:
        """Pure: a small JSON-able digest of a snapshot for the status document (probes[].summary),
        e.g. the efa_mesh matrix; None (the default) when there is nothing worth showing."""
        return None


def unknown(code: str, component: str, message: str, **details: Any) -> Finding:
    """A finding that says "could not measure": severity unknown whatever the catalogue says."""
    return Finding(code, component, message, details, severity=Severity.UNKNOWN)
