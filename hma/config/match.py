"""Drop-ins for some nodes only: the ``[match]`` table of an ``hma.d/*.toml`` file.

One ``/etc/hma`` serves a mixed cluster: a drop-in with ``[match]`` is merged only on the nodes
it names, by host name (Slurm hostlist ranges ``gpu-[001-128]`` and shell wildcards ``p5-*``) and
by hardware seen on the PCI bus (``nvidia``, ``neuron``, ``efa``; ``!kind`` for "none of it")
and by the DMI product name (``product``: the node's model, which a failed part never changes).
Every key given must hold. docs/configuration.md ("Drop-ins for some nodes") documents
it. Light on purpose: read by every command before the configuration is validated.
"""

from __future__ import annotations

import os
import re
import socket
from typing import Any, Callable, Mapping, NamedTuple, Optional

KEYS = ("hosts", "hardware", "product")
PRODUCT = "class/dmi/id/product_name"  # under sysfs: the DMI product name (`hma genconf`)

# PCI ids (sysfs ``bus/pci/devices/*/{vendor,device,class}``), present whether a driver is loaded
# or not: NVIDIA VGA/3D controllers (as the gpu probe counts them); the Neuron devices of
# aws-neuron-driver's neuron_pci.c (Inf1 0x7064-0x7067, Trn1 0x7164, Inf2 0x7264, Trn2 0x7364,
# Trn3 0x7564); the EFA functions of the efa driver's efa_main.c (0xefa0-0xefa4).
NVIDIA = 0x10DE
AMAZON = 0x1D0F
GPU_CLASSES = (0x0300, 0x0302)
NEURON_IDS = frozenset({0x7064, 0x7065, 0x7066, 0x7067, 0x7164, 0x7264, 0x7364, 0x7564})
EFA_IDS = frozenset({0xEFA0, 0xEFA1, 0xEFA2, 0xEFA3, 0xEFA4})
HARDWARE = ("nvidia", "neuron", "efa")
# the Neuron driver's device class: a node whose driver lists devices has Neuron hardware
NEURON_CLASS = "devices/virtual/neuron_device"

_PCI_ID = re.compile(r"0x[0-9a-fA-F]{1,6}")
DIGITS = frozenset("0123456789")
# a number in a range: at most 18 digits (it fits in 64 bits); a range: at most 64 Ki numbers
# (more names than a cluster has: a typo, refused rather than read)
MAX_DIGITS = 18
MAX_RANGE = 64 * 1024
SHOWN = 60  # characters of a pattern quoted in an error


class PatternError(ValueError):
    """A host pattern that is not valid hostlist/wildcard syntax."""


class _Range(NamedTuple):
    low: int
    high: int
    width: int  # digits, zero-padded (``001-128``: 3)

    def holds(self, digits: str) -> bool:
        value = int(digits)
        return self.low <= value <= self.high and digits == f"{value:0{self.width}d}"


class HostPattern:
    """``gpu-[001-128,200]``, ``rack[1-4]-n[01-16]``, ``p5-*``, ``node?``: Slurm hostlist
    brackets (numbers, ranges, commas; zero padding kept) and shell wildcards ``*`` and ``?``;
    compared without case."""

    def __init__(self, text: str) -> None:
        if not isinstance(text, str) or not text.strip():
            raise PatternError(f"bad host pattern {text!r}: empty")
        self.text = text
        self._tokens = _tokens(text)

    def matches(self, name: str) -> bool:
        """Whether ``name`` is one of the host names the pattern covers."""
        return _match(self._tokens, name.lower())


_Token = Any  # a literal (str), "*" / "?" (wildcards, as _STAR / _ONE), or a list of _Range
_STAR, _ONE = object(), object()


def _tokens(text: str) -> list[_Token]:
    out: list[_Token] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "[":
            end = text.find("]", i)
            if end < 0:
                raise PatternError(f"bad host pattern {_shown(text)}: '[' without ']'")
            out.append(_ranges(text, text[i + 1 : end]))
            i = end + 1
            continue
        if ch == "]":
            raise PatternError(f"bad host pattern {_shown(text)}: ']' without '['")
        if ch == "*":
            out.append(_STAR)
        elif ch == "?":
            out.append(_ONE)
        elif (ch.isascii() and ch.isalnum()) or ch in "-_.":
            if out and isinstance(out[-1], str):
                out[-1] += ch.lower()
            else:
                out.append(ch.lower())
        else:
            raise PatternError(
                f"bad host pattern {_shown(text)}: {ch!r} is not allowed in a host name"
            )
        i += 1
    return out


def _match(tokens: list[_Token], name: str) -> bool:
    """Whether ``tokens`` cover ``name``: the positions in ``name`` where each token can end,
    token after token (a set of at most ``len(name) + 1``), so the time is linear in the
    pattern and in the name, whatever the wildcards (no backtracking)."""
    at = {0}
    for token in tokens:
        if token is _STAR:
            at = set(range(min(at), len(name) + 1))
        elif token is _ONE:
            at = {j + 1 for j in at if j < len(name)}
        elif isinstance(token, str):
            at = {j + len(token) for j in at if name.startswith(token, j)}
        else:
            at = {k for j in at for k in _numbers(token, name, j)}
        if not at:
            return False
    return len(name) in at


def _numbers(ranges: list[_Range], name: str, j: int) -> list[int]:
    """Where a number of ``ranges`` that starts at ``name[j]`` can end (at most ``MAX_DIGITS``
    digits: no range holds a longer one)."""
    ends = []
    k = j
    while k < len(name) and k - j < MAX_DIGITS and name[k] in DIGITS:
        k += 1
        if any(r.holds(name[j:k]) for r in ranges):
            ends.append(k)
    return ends


def _ranges(text: str, inside: str) -> list[_Range]:
    ranges = []
    for item in inside.split(","):
        low, sep, high = item.partition("-")
        if not _digits(low) or (sep and not _digits(high)):
            raise PatternError(
                f"bad host pattern {_shown(text)}: [{_shown(inside)}] holds {_shown(item)}, not "
                "a number or a range like 001-128"
            )
        high = high if sep else low
        longest = max(len(low), len(high))
        if longest > MAX_DIGITS:
            raise PatternError(
                f"bad host pattern {_shown(text)}: a number of {longest} digits in "
                f"[{_shown(inside)}] (at most {MAX_DIGITS})"
            )
        if int(high) < int(low):
            raise PatternError(f"bad host pattern {_shown(text)}: range {item!r} runs backwards")
        if int(high) - int(low) >= MAX_RANGE:
            raise PatternError(
                f"bad host pattern {_shown(text)}: range {item!r} covers "
                f"{int(high) - int(low) + 1} numbers (at most {MAX_RANGE})"
            )
        ranges.append(_Range(int(low), int(high), len(low)))
    return ranges


def _digits(text: str) -> bool:
    return bool(text) and all(ch in DIGITS for ch in text)


def _shown(text: str) -> str:
    """``text`` quoted for a message, cut after ``SHOWN`` characters."""
    return repr(text) if len(text) <= SHOWN else repr(text[:SHOWN]) + f"... ({len(text)} chars)"


class Node:
    """What a ``[match]`` is judged against: this host's names and hardware (read once, on
    first need, from the PCI devices under ``sysfs``; ``reader`` replaces ``read_hardware``)."""

    def __init__(
        self,
        names: tuple[str, ...],
        sysfs: str = "/sys",
        reader: Optional[Callable[[str], frozenset[str]]] = None,
    ) -> None:
        self.names, self.sysfs, self.reader = names, sysfs, reader or read_hardware
        self._hardware: Optional[frozenset[str]] = None
        self._product: Optional[tuple[Optional[str]]] = None

    @classmethod
    def here(cls, sysfs: str = "/sys") -> Node:
        """This host: its name as the kernel has it and the short form (before the first dot)."""
        full = socket.gethostname().lower()
        return cls(tuple(dict.fromkeys([full, full.split(".")[0]])), sysfs)

    def product(self) -> Optional[str]:
        """The DMI product name under ``sysfs`` (stripped; None when unreadable), read once."""
        if self._product is None:
            self._product = (read_product(self.sysfs),)
        return self._product[0]

    def hardware(self) -> frozenset[str]:
        """The kinds of ``HARDWARE`` present; OSError when the PCI devices cannot be listed."""
        if self._hardware is None:
            self._hardware = self.reader(self.sysfs)
        return self._hardware


def read_hardware(sysfs: str) -> frozenset[str]:
    """The kinds of accelerator and adapter on the PCI bus under ``sysfs`` (a device whose ids
    cannot be read is not counted); OSError when the bus cannot be listed."""
    found: set[str] = set()
    base = os.path.join(sysfs, "bus/pci/devices")
    for dev in os.listdir(base):
        vendor = _pci_id(os.path.join(base, dev, "vendor"))
        if vendor == NVIDIA:
            klass = _pci_id(os.path.join(base, dev, "class"))
            if klass is not None and klass >> 8 in GPU_CLASSES:
                found.add("nvidia")
        elif vendor == AMAZON:
            device = _pci_id(os.path.join(base, dev, "device"))
            if device in NEURON_IDS:
                found.add("neuron")
            elif device in EFA_IDS:
                found.add("efa")
    if os.path.isdir(os.path.join(sysfs, NEURON_CLASS)):
        found.add("neuron")
    return frozenset(found)


def read_product(sysfs: str) -> Optional[str]:
    """The DMI product name under ``sysfs`` (``class/dmi/id/product_name``), stripped; None when
    it cannot be read or is empty."""
    try:
        with open(os.path.join(sysfs, PRODUCT), encoding="utf-8") as fh:
            return fh.read(256).strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def _pci_id(path: str) -> Optional[int]:
    try:
        with open(path, encoding="ascii") as fh:
            text = fh.read(16).strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text, 16) if _PCI_ID.fullmatch(text) else None


def problems(table: Any) -> list[str]:
    """What is wrong with a ``[match]`` table (each ``match.KEY: problem``), none when valid."""
    if not isinstance(table, dict):
        return ["match: expected a table"]
    known = ", ".join(KEYS)
    out = [f"match.{key}: unknown key (one of: {known})" for key in table if key not in KEYS]
    if not any(key in table for key in KEYS):
        out.append(f"match: names nothing to match (give {' and/or '.join(KEYS)})")
    for key in KEYS:
        value = table.get(key)
        if key == "product" and isinstance(value, list) and all(isinstance(v, str) for v in value):
            out += [f"match.product: {p}" for p in map(_product_problem, value) if p]
        if key in table and (
            not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value)
        ):
            out.append(f"match.{key}: expected a non-empty list of strings")
    if not out:
        for pattern in table.get("hosts", []):
            try:
                HostPattern(pattern)
            except PatternError as exc:
                out.append(f"match.hosts: {exc}")
        for kind in table.get("hardware", []):
            if kind.lstrip("!") not in HARDWARE or kind.count("!") > 1:
                out.append(
                    f"match.hardware: {kind!r} is not one of {', '.join(HARDWARE)} "
                    "(or one of them after '!': absent)"
                )
    return out


def decide(table: Mapping[str, Any], node: Node) -> tuple[bool, str]:
    """Whether a valid ``[match]`` table (``problems`` found none) holds on ``node``, and why in
    words; OSError when the hardware is asked for and cannot be read."""
    why: list[str] = []
    hosts = list(table.get("hosts", []))
    if hosts:
        hit = next(((n, p) for p in hosts for n in node.names if HostPattern(p).matches(n)), None)
        if hit is None:
            return False, f"host {node.names[0]} matches none of {', '.join(hosts)}"
        why.append(f"host {hit[0]} matches {hit[1]}")
    wanted = list(table.get("hardware", []))
    if wanted:
        present = node.hardware()
        for kind in wanted:
            absent = kind.startswith("!")
            name = kind.lstrip("!")
            if (name in present) == absent:
                return False, f"{name} {'present' if absent else 'not found'}"
            why.append(f"{name} {'absent' if absent else 'present'}")
    products = list(table.get("product", []))
    if products:
        product = node.product()
        if product is None or product.lower() not in {p.strip().lower() for p in products}:
            return False, f"product {product!r} is none of {', '.join(map(repr, products))}"
        why.append(f"product {product!r}")
    return True, "; ".join(why)


def _product_problem(value: Any) -> Optional[str]:
    """What is wrong with one product name: the rule of every string option (one line, no
    control characters), and not blank."""
    from hma.contracts.options import Option

    problem = Option("str", None, "").validate(value)
    return problem or (None if value.strip() else "a product name must not be blank")
