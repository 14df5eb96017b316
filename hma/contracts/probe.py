"""The probe contract: ``applies`` -> ``collect`` (all I/O) -> ``evaluate`` (pure).

Built-in and third-party probes are classes registered under the ``hma.probes`` entry point group.
``collect`` returns plain JSON-able data (the snapshot) so that probes with ``isolation =
"process"`` can collect in a worker process; ``evaluate`` turns a snapshot into findings and never
does I/O, so tests feed it snapshots directly.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, ClassVar, Generic, Iterable, Mapping, Optional, TypeVar

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


T = TypeVar("T")


class Discovery(Generic[T]):
    """What a probe found below a sysfs ``folder`` (its devices), found again only when the
    sysfs root, the boot, the device events seen, the listing of ``folder`` (one directory read
    a run) or the ``extra`` key of the options it used change; a result ``keep`` refuses (one
    with read errors) is found again next run. ``applies`` and ``collect`` of one run share one
    result until ``done``."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self._kept: Optional[tuple[tuple[Any, ...], T]] = None
        self._run: Optional[tuple[ProbeContext, T]] = None

    def get(
        self,
        ctx: ProbeContext,
        extra: tuple[Any, ...],
        find: Callable[[], T],
        keep: Callable[[T], bool],
    ) -> T:
        """The result for this run; ReadError when ``folder`` cannot be listed."""
        if self._run is not None and self._run[0] is ctx:
            return self._run[1]
        root, listing = str(ctx.sysfs.root), tuple(ctx.sysfs.listdir(self.folder))
        key = (root, ctx.boot_id, ctx.device_events, listing, *extra)
        if self._kept is not None and self._kept[0] == key:
            found = self._kept[1]
        else:
            found = find()
            self._kept = (key, found) if keep(found) else None
        self._run = (ctx, found)
        return found

    def done(self) -> None:
        """The run has read what it needed: the next ``get`` looks at the folder again."""
        self._run = None


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


def read_failures(
    code: str, errors: Iterable[Mapping[str, Any]], component: Callable[[Mapping[str, Any]], str]
) -> list[Finding]:
    """An ``unknown`` finding ``code`` for each read error a snapshot recorded
    (``RootReader.failure``), on the component ``component`` names from the record."""
    return [
        unknown(
            code,
            component(e),
            f"cannot read {e['path']}: {e['error']}",
            path=e["path"],
            error=e["error"],
        )
        for e in errors
    ]
