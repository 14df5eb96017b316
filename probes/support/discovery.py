"""Discovery kept between probe runs: a probe's devices below a sysfs folder, found again only
when what they depend on changes."""

from __future__ import annotations

from typing import Any, Callable, Generic, Optional, TypeVar

from hma.contracts.probe import ProbeContext

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
