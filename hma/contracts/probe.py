"""The probe contract: ``applies`` -> ``collect`` (all I/O) -> ``evaluate`` (pure).

Built-in and third-party probes are classes registered under the ``hma.probes`` entry point group.
``collect`` returns plain JSON-able data (the snapshot) so that probes with ``isolation =
"process"`` can collect in a worker process; ``evaluate`` turns a snapshot into findings and never
does I/O, so tests feed it snapshots directly. The helpers for writing probes (counters,
discovery, read failures) live beside the probes, in hma.probes.support.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, ClassVar, Mapping, Optional

from hma.adapters.command import CommandRunner
from hma.adapters.files import RootReader
from hma.contracts.model import Finding, Severity
from hma.contracts.options import Option


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
    clock: Callable[[], float] = time.time  # not sent to a worker process: it uses time.time

    def to_wire(self, previous_keys: Optional[tuple[str, ...]] = None) -> dict[str, Any]:
        """This context as JSON for a worker process (``from_wire`` reads it back). With
        ``previous_keys``, only those keys of a mapping ``previous`` are sent."""
        previous = self.previous
        if previous_keys is not None and isinstance(previous, Mapping):
            previous = {k: previous[k] for k in previous_keys if k in previous}
        return {
            "options": dict(self.options),
            "sysfs": str(self.sysfs.root),
            "procfs": str(self.procfs.root),
            "output_cap": self.runner.output_cap,
            "instance_type": self.instance_type,
            "facts": asdict(self.facts),
            "previous": previous,
            "previous_ts": self.previous_ts,
            "oneshot": self.oneshot,
            "boot_id": self.boot_id,
            "device_events": self.device_events,
        }

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> ProbeContext:
        """The context ``to_wire`` wrote. Raises KeyError, TypeError or ValueError on a bad one."""
        facts: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in dict(wire["facts"]).items()
        }
        return cls(
            options=dict(wire["options"]),
            sysfs=RootReader(str(wire["sysfs"])),
            procfs=RootReader(str(wire["procfs"])),
            runner=CommandRunner(int(wire["output_cap"])),
            instance_type=wire["instance_type"],
            facts=NodeFacts(**facts),
            previous=wire["previous"],
            previous_ts=float(wire["previous_ts"]),
            oneshot=bool(wire["oneshot"]),
            boot_id=str(wire["boot_id"]),
            device_events=int(wire["device_events"]),
        )


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
    # The keys of the previous snapshot that ``collect`` reads: a worker process is sent only
    # these. None: the whole snapshot (``evaluate`` always gets all of it, in the agent).
    previous_keys: ClassVar[Optional[tuple[str, ...]]] = None
    # True when "unsupported" depends only on the node's devices and drivers (not on jobs, Slurm
    # or other facts): the agent then does not run the probe again (no thread, no worker process)
    # until a device event of its triggers, or an hour later.
    unsupported_stands: ClassVar[bool] = False
    # True when the probe judges the node's state or jobs from the cluster (``ctx.facts``): a
    # one-shot command (`hma check`) then reads them from the backend first, as the agent's
    # facts thread does; else it passes only the node's name (no controller query).
    needs_facts: ClassVar[bool] = False

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

    def expectations(self, snapshot: Any) -> dict[str, Any]:
        """Pure: option values of this probe that hold the node to what ``snapshot`` shows
        (``hma genconf`` writes them to a drop-in); empty (the default) when it records nothing.
        Only what was read counts: a value the snapshot lacks is left out, never guessed."""
        return {}


def unknown(code: str, component: str, message: str, **details: Any) -> Finding:
    """A finding that says "could not measure": severity unknown whatever the catalogue says."""
    return Finding(code, component, message, details, severity=Severity.UNKNOWN)
