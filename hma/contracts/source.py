"""The event-source contract: a blocking loop that pushes findings as they happen.

Event sources (kernel log, NVML Xid events) register under the entry point group ``hma.sources``
and are configured in ``[sources.<name>]``. The daemon runs each in its own thread; every finding
passed to ``emit`` goes through the health model, the outbox and the status file at once.
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping, Optional, Protocol

from hma.adapters.command import CommandRunner
from hma.adapters.files import RootReader
from hma.contracts.catalogue import Entry
from hma.contracts.model import Finding
from hma.contracts.options import Option

GROUP = "hma.sources"
# An event source's states as the daemon shows them (status.json ``sources``, the
# ``hma_source_state`` metric; docs/status.md)
STATES = ("starting", "running", "blind", "not-applicable", "restarting", "failed")


class KeyValue(Protocol):
    """Small persistent key/value store (the state database's ``kv`` table)."""

    def get(self, key: str, default: Any = None) -> Any:
        """Stored JSON value or ``default``."""

    def set(self, key: str, value: Any) -> None:
        """Store a JSON-able value."""


class MemoryKV:
    """In-memory ``KeyValue`` for one-shot commands and tests."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        """Stored value or ``default``."""
        return self.data.get(key, default)

    def set(self, key: str, value: Any) -> None:
        """Store a value."""
        self.data[key] = value


def untold(backend: str, reason: str = "", blind: bool = False) -> None:
    """``SourceContext.started`` where nobody listens (one-shot commands, tests)."""


@dataclass
class SourceContext:
    """What the core hands an event source. ``started(backend, reason, blind)``: the source
    tells what it reads (``kmsg``, ``journal``, ``nvml``), why that one when there was a choice
    (``reason``), and whether it reads nothing it is for (``blind``, ``reason`` says why); again
    when that changes. The daemon shows it (status.json ``sources``)."""

    options: Mapping[str, Any]
    sysfs: RootReader
    procfs: RootReader
    runner: CommandRunner
    boot_id: str
    kv: KeyValue = field(default_factory=MemoryKV)  # cursors survive restarts through this
    stop: threading.Event = field(default_factory=lambda: StopEvent())
    started: Callable[..., None] = untold


class StopEvent(threading.Event):
    """``ctx.stop`` as the daemon makes it: its ``fileno`` turns readable when it is set, so a
    source blocked in ``poll`` can wait for a stop too instead of waking to look."""

    def __init__(self) -> None:
        super().__init__()
        self._read, self._write = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)

    def fileno(self) -> int:
        """Readable once the event is set."""
        return self._read

    def set(self) -> None:
        """Set the event and wake a ``poll`` on ``fileno``."""
        super().set()
        with contextlib.suppress(OSError):
            os.write(self._write, b"x")

    def __del__(self) -> None:
        for fd in (self._read, self._write):
            with contextlib.suppress(OSError):
                os.close(fd)


class EventSource:
    """Base class of event sources."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    options: ClassVar[Mapping[str, Option]] = {}
    default_enabled: ClassVar[bool] = True

    def applies(self, ctx: SourceContext) -> Optional[str]:
        """None when the source can run here, else why not."""
        return None

    @classmethod
    def declared_codes(cls, options: Mapping[str, Any]) -> list[Entry]:
        """Catalogue entries this source declares from its configuration (the ``SITE_`` codes of
        site rule files); ``CatalogueError``/``ValueError`` for a broken declaration. None here."""
        return []

    def blind_finding(self, ctx: SourceContext, reason: str) -> Optional[Finding]:
        """The finding to raise while this source cannot read what it is for here (it does not
        apply, or reads nothing: ``reason``); None (the default): nothing beyond its state."""
        return None

    def run(self, ctx: SourceContext, emit: Callable[[Finding], None]) -> None:
        """Block, calling ``emit`` per finding, until ``ctx.stop`` is set. Exceptions are
        reported by the daemon (``HMA_PROBE_ERROR`` on ``source:<name>``) and the source restarted
        with backoff."""
        raise NotImplementedError
