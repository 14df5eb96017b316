"""Pure: the topology file Slurm reads, from the nodes of each domain.

- ``block`` (topology.conf, Slurm 23.11+, topology/block): one ``BlockName=... Nodes=...`` line per
  domain and ``BlockSizes=`` the domain size minus the spares;
- ``yaml`` (topology.yaml, Slurm 25.05+): the same blocks as a ``block`` topology;
- ``tree`` (topology.conf, topology/tree, Slurm 22.05 has no block plugin): one leaf switch per
  domain under one top switch, so that a job fills one domain before it spans two.

A node with no known domain gets a block (leaf switch) of its own: on Slurm 24.x only nodes in a
block can be scheduled. No block may be smaller than the base block size, so such a block (or a
domain not yet full) lowers ``BlockSizes`` to its size.

Domains are text that other nodes write, and Slurm stops for good on a file that defines a name
twice, so distinct domains get distinct names (``block_names``) and ``problems`` parses a
rendered file back before it is written.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Sequence

HEADER = "# Written by hma topology from the nodes' NVLink domains; edits are overwritten.\n"
NO_DOMAIN = "nodomain"
TOP_SWITCH = "hma-top"
_NUMBERED = re.compile(r"^(.*?)(\d+)$")
NAME = re.compile(r"[A-Za-z0-9_.-]+")
# Names hma makes itself: a domain that looks like one is not taken as its own name.
_RESERVED = re.compile(rf"^{NO_DOMAIN}-|^{TOP_SWITCH}$|-x(?:[0-9a-f]{{8}}|[0-9a-f]{{64}})$")
# Plain YAML scalars that a YAML reader may take for something else than a string.
_YAML_TYPED = re.compile(
    r"[-+.].*|[0-9][0-9._eE+-]*|0[xXoObB].*|(?i:true|false|yes|no|on|off|y|n|null)"
)


@dataclass(frozen=True)
class Block:
    """One block: its name, the domain it stands for ("" for a node without one), its nodes."""

    name: str
    domain: str
    nodes: tuple[str, ...]


def natural_key(name: str) -> tuple[str, int, str]:
    """Sort key that puts node2 before node10."""
    m = _NUMBERED.match(name)
    return (m.group(1), int(m.group(2)), name) if m else (name, -1, name)


def compress(names: Iterable[str]) -> str:
    """A Slurm hostlist expression: ``node[1-3,7],gpu[001-018]``; names without a number, or
    with a different zero padding, stay apart."""
    groups: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    for name in sorted(set(names), key=natural_key):
        m = _NUMBERED.match(name)
        if m is None:
            plain.append(name)
            continue
        digits = m.group(2)
        width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
        groups.setdefault((m.group(1), width), []).append(int(digits))
    parts = list(plain)
    for (prefix, width), numbers in groups.items():
        if len(numbers) == 1:
            parts.append(f"{prefix}{numbers[0]:0{width}d}")
            continue
        runs: list[list[int]] = []
        for n in numbers:
            if runs and n == runs[-1][1] + 1:
                runs[-1][1] = n
            else:
                runs.append([n, n])
        ranges = [f"{a:0{width}d}" if a == b else f"{a:0{width}d}-{b:0{width}d}" for a, b in runs]
        parts.append(f"{prefix}[{','.join(ranges)}]")
    return ",".join(parts)


def block_name(domain: str) -> str:
    """The block (switch) name of a domain: its name without characters Slurm splits on."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", domain)


def _digest(domain: str, width: int) -> str:
    """The first ``width`` hex digits of the domain's SHA-256."""
    return hashlib.sha256(domain.encode("utf-8", "surrogatepass")).hexdigest()[:width]


def block_names(domains: Iterable[str]) -> dict[str, str]:
    """Distinct names for distinct domains. A domain that is a valid name and not reserved (like
    ``nodomain-*``, ``hma-top`` or a name ending ``-x`` + 8 or 64 hex digits) is its own name;
    any other is ``block_name(domain)-x`` + the first 8 hex digits of its SHA-256, or all 64
    when two such names meet."""
    short = {
        d: d
        if block_name(d) == d and not _RESERVED.search(d)
        else f"{block_name(d)}-x{_digest(d, 8)}"
        for d in domains
    }
    count = Counter(short.values())
    return {
        d: n if count[n] == 1 else f"{block_name(d)}-x{_digest(d, 64)}" for d, n in short.items()
    }


def blocks(domains: Mapping[str, str]) -> tuple[list[Block], list[str]]:
    """Blocks from node -> domain ("" unknown), sorted by their first node, and the nodes without
    a domain (each in a block of its own)."""
    members: dict[str, list[str]] = {}
    lonely = []
    for node, domain in domains.items():
        if domain:
            members.setdefault(domain, []).append(node)
        else:
            lonely.append(node)
    names = block_names(members)
    out = [Block(names[d], d, tuple(sorted(n, key=natural_key))) for d, n in members.items()]
    out += [Block(f"{NO_DOMAIN}-{block_name(n)}", "", (n,)) for n in lonely]
    out.sort(key=lambda b: natural_key(b.nodes[0]))
    return out, sorted(lonely, key=natural_key)


def block_size(found: Sequence[Block], domain_size: Optional[int], spares: int) -> int:
    """BlockSizes' base: the domain size (configured, else the largest domain) minus spares, but
    never above the smallest block: slurmctld 24.11 stops (``fatal: Block configuration ...
    children count lower than bblock_node_cnt``) on a block smaller than the base size, and
    ``scontrol reconfigure`` restarts it."""
    largest = max((len(b.nodes) for b in found if b.domain), default=1)
    size = (domain_size if domain_size else largest) - spares
    return max(1, min([size, *(len(b.nodes) for b in found)]))


def render(found: Sequence[Block], fmt: str, size: int) -> str:
    """The file's text in format ``block``, ``yaml`` or ``tree``."""
    if fmt == "yaml":
        lines = [
            HEADER.rstrip("\n"),
            "- topology: hma",
            "  cluster_default: true",
            "  block:",
            "    block_sizes:",
            f"      - {size}",
            "    blocks:",
        ]
        for b in found:
            lines += [f"      - block: {_yaml(b.name)}", f"        nodes: {compress(b.nodes)}"]
        return "\n".join(lines) + "\n"
    if fmt == "tree":
        lines = [f"SwitchName={b.name} Nodes={compress(b.nodes)}" for b in found]
        names = ",".join(b.name for b in found)
        if names:
            lines.append(f"SwitchName={TOP_SWITCH} Switches={names}")
        return HEADER + "\n".join(lines) + "\n"
    lines = [f"BlockName={b.name} Nodes={compress(b.nodes)}" for b in found]
    lines.append(f"BlockSizes={size}")
    return HEADER + "\n".join(lines) + "\n"


def _yaml(name: str) -> str:
    """``name`` as a YAML string: quoted when a plain scalar would read as another type."""
    return f'"{name}"' if _YAML_TYPED.fullmatch(name) else name


def expand(hostlist: str) -> list[str]:
    """The names of a hostlist as ``compress`` writes it; ValueError when it is not one."""
    parts = re.findall(r"(?:[^,\[]|\[[^\]]*\])+", hostlist)
    if ",".join(parts) != hostlist:
        raise ValueError(f"not a hostlist: {hostlist!r}")
    names: list[str] = []
    for part in parts:
        m = re.fullmatch(r"([^\[\]\s=]*)\[((?:\d+(?:-\d+)?,)*\d+(?:-\d+)?)\]|[^\[\]\s=]+", part)
        if m is None:
            raise ValueError(f"not a hostlist: {hostlist!r}")
        if m.group(2) is None:
            names.append(part)
            continue
        for item in m.group(2).split(","):
            first, _, last = item.partition("-")
            width = len(first) if first.startswith("0") and len(first) > 1 else 0
            if int(last or first) < int(first):
                raise ValueError(f"not a hostlist: {hostlist!r}")
            names += [
                f"{m.group(1)}{n:0{width}d}" for n in range(int(first), int(last or first) + 1)
            ]
    return names


def parse(text: str, fmt: str) -> list[tuple[str, str, str]]:
    """The (name, key, value) entries of a file in format ``fmt`` as ``render`` writes it: key
    ``Nodes`` or ``Switches`` (tree), ``nodes`` (yaml), ``BlockSizes`` (name ""); ValueError on
    any other line."""
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    if fmt == "yaml":
        head = ["- topology: hma", "  cluster_default: true", "  block:", "    block_sizes:"]
        if lines[:4] != head or not re.fullmatch(
            r"      - \d+", lines[4] if len(lines) > 4 else ""
        ):
            raise ValueError("unexpected topology.yaml header")
        if lines[5:6] != ["    blocks:"] or len(lines) % 2:
            raise ValueError("unexpected topology.yaml blocks")
        out = [("", "BlockSizes", lines[4].split()[-1])]
        for block, nodes in zip(lines[6::2], lines[7::2]):
            b = re.fullmatch(r'      - block: ("?)([^"\s]+)\1', block)
            n = re.fullmatch(r"        nodes: (\S+)", nodes)
            if b is None or n is None or (not b.group(1) and _YAML_TYPED.fullmatch(b.group(2))):
                raise ValueError(f"unexpected block: {block!r} {nodes!r}")
            out.append((b.group(2), "nodes", n.group(1)))
        return out
    out = []
    word = "SwitchName" if fmt == "tree" else "BlockName"
    for line in lines:
        m = re.fullmatch(rf"{word}=(\S+) (Nodes|Switches)=(\S+)", line)
        if m and (m.group(2) == "Nodes" or fmt == "tree"):
            out.append((m.group(1), m.group(2), m.group(3)))
        elif fmt != "tree" and re.fullmatch(r"BlockSizes=\d+", line):
            out.append(("", "BlockSizes", line.partition("=")[2]))
        else:
            raise ValueError(f"unexpected line: {line!r}")
    return out


def problems(text: str, fmt: str) -> list[str]:
    """Why Slurm would refuse ``text`` (format ``fmt``), read back with ``parse``: a line it
    does not expect, a name outside ``A-Z a-z 0-9 . _ -`` or defined twice, a node in two
    blocks, a switch under the top switch that is not defined; [] when none."""
    try:
        entries = parse(text, fmt)
    except ValueError as exc:
        return [str(exc)]
    found: list[str] = []
    names = Counter(name for name, key, _ in entries if key != "BlockSizes")
    found += [f"name {n!r} defined {c} times" for n, c in sorted(names.items()) if c > 1]
    found += [f"name {n!r} is not A-Z a-z 0-9 . _ -" for n in names if not NAME.fullmatch(n)]
    where: dict[str, str] = {}
    for name, key, value in entries:
        if key == "BlockSizes":
            continue
        try:
            members = expand(value)
        except ValueError as exc:
            found.append(str(exc))
            continue
        if key == "Switches":
            found += [
                f"switch {m!r} under {name!r} is not defined" for m in members if m not in names
            ]
            continue
        for member in members:
            if member in where:
                found.append(f"node {member!r} in {where[member]!r} and {name!r}")
            where[member] = name
    return found
