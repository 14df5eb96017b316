"""Entry points of hma's groups (``hma.*``): the one reader for probes, event sources, reporters,
backends, kernel-log decoders and repairs.

hma's own distribution is read from its ``entry_points.txt`` by hand (looking up a built-in costs
a directory listing and one small file); a third-party distribution's are read by
``importlib.metadata``, imported only when its ``entry_points.txt`` names an hma group (the
import costs more than the health check's probes). As ``importlib.metadata`` does, the first
distribution of a name on ``sys.path`` wins.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import sys
from dataclasses import dataclass
from typing import Any, Collection, Iterator, Optional, Protocol

PREFIX = "hma."  # every group of hma's starts so


class EntryPoint(Protocol):
    """What hma uses of an entry point (``importlib.metadata.EntryPoint`` or hma's own)."""

    @property
    def name(self) -> str:
        """The name it registers."""

    @property
    def value(self) -> str:
        """``module:attr``."""

    @property
    def group(self) -> str:
        """Its entry point group."""

    def load(self) -> Any:
        """The object ``value`` names."""


@dataclass(frozen=True)
class Own:
    """An entry point of hma's own distribution, read without importing ``importlib.metadata``."""

    name: str
    value: str
    group: str

    def load(self) -> Any:
        """The object ``module:attr`` names."""
        module, _, attr = self.value.partition(":")
        obj = importlib.import_module(module.strip())
        for part in filter(None, attr.strip().split(".")):
            obj = getattr(obj, part)
        return obj


def _dist_folders() -> Iterator[tuple[str, str]]:
    """(normalized distribution name, metadata folder) of every ``*.dist-info`` / ``*.egg-info``
    folder on ``sys.path``, in path order (the folders ``importlib.metadata`` reads; the name
    comes from the folder's name, as it normalizes it, not from parsing METADATA)."""
    for folder in sys.path:
        try:
            names = sorted(os.listdir(folder or "."))
        except OSError:
            continue
        for name in names:
            stem, _, suffix = name.rpartition(".")
            if suffix in ("dist-info", "egg-info"):
                dist = re.sub(r"[-_.]+", "_", stem.split("-")[0]).lower()
                yield dist, os.path.join(folder or ".", name)


def parse(text: str) -> tuple[Own, ...]:
    """The entry points of an ``entry_points.txt`` (INI: ``[group]`` then ``name = value``;
    ``#`` and ``;`` start a comment line)."""
    out, group = [], ""
    for line in map(str.strip, text.splitlines()):
        if line.startswith("[") and line.endswith("]"):
            group = line[1:-1].strip()
        elif "=" in line and group and not line.startswith(("#", ";")):
            name, _, value = line.partition("=")
            out.append(Own(name.strip(), value.strip(), group))
    return tuple(out)


def _read(folder: str) -> Optional[str]:
    """The ``entry_points.txt`` of a metadata folder; None without one."""
    try:
        with open(os.path.join(folder, "entry_points.txt"), encoding="utf-8") as fh:
            return fh.read()
    except OSError:
        return None


@functools.cache
def own() -> tuple[Own, ...]:
    """The entry points of the first ``hma`` distribution on ``sys.path``."""
    for dist, folder in _dist_folders():
        if dist == "hma":
            return parse(_read(folder) or "")
    return ()


def _third_party(folder: str) -> tuple[EntryPoint, ...]:
    """The entry points of the distribution whose metadata is in ``folder`` (none unless its
    ``entry_points.txt`` names an hma group)."""
    if PREFIX not in (_read(folder) or ""):
        return ()
    from importlib import metadata

    return tuple(metadata.Distribution.at(folder).entry_points)


@functools.cache
def installed() -> tuple[EntryPoint, ...]:
    """The entry points of hma's groups in every installed distribution, in path order, the
    first distribution of a name only; ``rescan`` forgets them."""
    seen: set[str] = set()
    out: list[EntryPoint] = []
    for dist, folder in _dist_folders():
        if dist in seen:
            continue
        seen.add(dist)
        eps = own() if dist == "hma" else _third_party(folder)
        out += [ep for ep in eps if ep.group.startswith(PREFIX)]
    return tuple(out)


def entry_points(group: str, among: Optional[Collection[str]] = None) -> list[EntryPoint]:
    """The group's entry points; with ``among``, hma's own suffice when they name all of
    ``among`` (third-party distributions are looked at only otherwise)."""
    if among is not None:
        mine: list[EntryPoint] = [ep for ep in own() if ep.group == group]
        if set(among) <= {ep.name for ep in mine}:
            return mine
    return [ep for ep in installed() if ep.group == group]


def find(group: str, name: str) -> Optional[EntryPoint]:
    """The entry point ``name`` of ``group`` (hma's own first, then the first on the path);
    None when none registers it."""
    return next((ep for ep in entry_points(group, [name]) if ep.name == name), None)


def load(group: str, name: str) -> Any:
    """The object entry point ``name`` of ``group`` names; ``LookupError`` when none does."""
    ep = find(group, name)
    if ep is None:
        raise LookupError(f"no {name} in entry point group {group} (is hma installed?)")
    return ep.load()


def rescan() -> None:
    """Read the installed entry points again at the next look-up (a reload may follow an
    installation)."""
    own.cache_clear()
    installed.cache_clear()
