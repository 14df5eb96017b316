"""Pure: the topology file Slurm reads, from the nodes of each domain.

- ``block`` (topology.conf, Slurm 23.11+, topology/block): one ``BlockName=... Nodes=...`` line per
  domain and ``BlockSizes=`` the domain size minus the spares;
- ``yaml`` (topology.yaml, Slurm 25.05+): the same blocks as a ``block`` topology;
- ``tree`` (topology.conf, topology/tree, Slurm 22.05 has no block plugin): one leaf switch per
  domain under one top switch, so that a job fills one domain before it spans two.

A node with no known domain gets a block (leaf switch) of its own: on Slurm 24.x only nodes in a
block can be scheduled. No block may be smaller than the base block size, so such a block (or a
domain not yet full) lowers ``BlockSizes`` to its size.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Sequence

HEADER = "# Written by hma topology from the nodes' NVLink domains; edits are overwritten.\n"
NO_DOMAIN = "nodomain"
TOP_SWITCH = "hma-top"
_NUMBERED = re.compile(r"^(.*?)(\d+)$")


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
    out = [Block(block_name(d), d, tuple(sorted(n, key=natural_key))) for d, n in members.items()]
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
            lines += [f"      - block: {b.name}", f"        nodes: {compress(b.nodes)}"]
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
