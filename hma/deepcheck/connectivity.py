"""Connectivity across nodes: the collective's bus bandwidth against the instance type's
minimum, and, when a group falls short, pair tests that blame only the slow node(s).

``measure(nodes)`` runs one collective over ``nodes`` (nccl-tests ``all_reduce_perf`` or
``nccom-test``, one Slurm job) and returns its bus bandwidth in GB/s, or None when the tool gave
no reading (which is never blamed on a node). Everything here is pure given ``measure``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence

from hma.contracts.model import Finding

# Minimum inter-node all-reduce bus bandwidth (GB/s) per instance type: half the instance's
# network line rate (AWS instance-type pages: p5/p5e/p5en and trn2 3200 Gbps EFA, p4d/p4de
# 400 Gbps, trn1 800 Gbps, trn1n 1600 Gbps). Half is hma's margin for protocol overhead and the
# ring's steps, not a vendor figure: tune it with [deep_check] busbw_min_gbps from a healthy
# baseline. docs/deep-check.md.
BUSBW_MIN_GBPS: dict[str, float] = {
    "p5.48xlarge": 200.0,
    "p5e.48xlarge": 200.0,
    "p5en.48xlarge": 200.0,
    "p4d.24xlarge": 25.0,
    "p4de.24xlarge": 25.0,
    "trn1.32xlarge": 50.0,
    "trn1n.32xlarge": 100.0,
    "trn2.48xlarge": 200.0,
}

Measure = Callable[[Sequence[str]], Optional[float]]


def minimum(instance_type: Optional[str], configured: Mapping[str, float]) -> Optional[float]:
    """The configured minimum for ``instance_type``, else the built-in one, else None."""
    if not instance_type:
        return None
    value = configured.get(instance_type, BUSBW_MIN_GBPS.get(instance_type))
    return float(value) if value is not None else None


@dataclass
class Outcome:
    """The group's reading, each pair tested, the nodes blamed and those left unjudged."""

    group_gbps: Optional[float]
    minimum_gbps: float
    pairs: list[dict[str, object]] = field(default_factory=list)
    blamed: list[str] = field(default_factory=list)
    unjudged: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        """pass, fail (a node blamed) or unknown (no reading, or no node could be blamed)."""
        if self.blamed:
            return "fail"
        if self.group_gbps is not None and self.group_gbps >= self.minimum_gbps:
            return "pass"
        return "unknown"

    def findings(self) -> list[Finding]:
        """One ``DEEP_BUSBW_LOW`` per blamed node (component ``node``, node name in details)."""
        return [
            Finding(
                "DEEP_BUSBW_LOW",
                "node",
                f"{node}: bus bandwidth below {self.minimum_gbps:g} GB/s in pair tests",
                {
                    "node": node,
                    "group_gbps": self.group_gbps,
                    "minimum_gbps": self.minimum_gbps,
                    "pairs": [p for p in self.pairs if node in p["nodes"]],  # type: ignore[operator]
                },
            )
            for node in self.blamed
        ]


def judge(nodes: Sequence[str], minimum_gbps: float, measure: Measure) -> Outcome:
    """The whole group first; when it falls short, disjoint pairs, then each suspect with a
    node that passed (or, while none has, with another suspect it was not tested with).

    A pair that reaches the minimum clears both nodes; a suspect is blamed only when it falls
    short with a node that passed, so a single slow node costs about N/2 + 2 jobs. Without a
    reading, or when no pair passes, nobody is blamed and the nodes are unjudged."""
    out = Outcome(measure(list(nodes)), minimum_gbps)
    if out.group_gbps is None or out.group_gbps >= minimum_gbps:
        out.unjudged = list(nodes) if out.group_gbps is None else []
        return out
    good: list[str] = []
    pending: list[str] = []
    tested: set[frozenset[str]] = set()
    ordered = list(nodes)
    for i in range(0, len(ordered) - 1, 2):
        pair = ordered[i : i + 2]
        tested.add(frozenset(pair))
        if _passes(out, pair, measure):
            good += pair
        else:
            pending += pair
    if len(ordered) % 2:
        pending.append(ordered[-1])
    progress = True
    while pending and progress:
        progress = False
        for node in list(pending):
            if node not in pending:
                continue
            if good:
                reading = _pair(out, [node, good[0]], measure)
                pending.remove(node)
                if reading is None:
                    out.unjudged.append(node)
                elif reading < minimum_gbps:
                    out.blamed.append(node)
                else:
                    good.append(node)
                progress = True
                continue
            partner = next(
                (p for p in pending if p != node and frozenset((node, p)) not in tested), None
            )
            if partner is None:
                continue
            tested.add(frozenset((node, partner)))
            if _passes(out, [node, partner], measure):
                good += [node, partner]
                pending.remove(node)
                pending.remove(partner)
            progress = True
    out.unjudged += pending
    return out


def _passes(out: Outcome, pair: Sequence[str], measure: Measure) -> bool:
    reading = _pair(out, pair, measure)
    return reading is not None and reading >= out.minimum_gbps


def _pair(out: Outcome, pair: Sequence[str], measure: Measure) -> Optional[float]:
    reading = measure(list(pair))
    out.pairs.append({"nodes": list(pair), "busbw_gbps": reading})
    return reading
