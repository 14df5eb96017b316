"""Circuit breaker: no single bug may drain a fleet.

``count`` is a pure function over a node listing (``Backend.peers``: the drained, failed and
down nodes of the partitions, and their size); ``Breaker`` asks the backend for it when an
action is about to be taken. The nodes that count are those of this node's partitions
that hma holds out of scheduling: a reason starting ``HMA:``, or a recovery the cluster carries
out (``NodeState.recovery``, as the backend reads it: HyperPod's on Slurm) on a node that carries
hma's label. The limit is ``max_drained_percent`` of those nodes and ``max_drained_nodes``, never
below one node.

Which drains are beyond the limit (and undo themselves) is decided by Slurm's own record alone:
the drains it shows with an ``HMA:`` reason, in (reason time, node name) order. slurmctld sets
the reason time; nothing written in a node's Extra or Comment (a forged ``d=``, a label on
someone else's FAIL node) orders a drain or resumes one.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from hma.contracts import label as label_mod
from hma.contracts.alert import Alert
from hma.contracts.cluster import Backend, NodeState
from hma.contracts.model import Action, Severity
from hma.remediation.planner import Episode

log = logging.getLogger("hma.remediation")


@dataclass(frozen=True)
class Count:
    """What the breaker saw."""

    held: tuple[str, ...]  # nodes hma holds, in (reason time, name) order
    ranked: tuple[str, ...]  # those of them Slurm's own record shows held by hma (``recorded``)
    total: int  # nodes in the partitions
    limit: int
    partitions: tuple[str, ...]

    def others(self, node: str) -> int:
        """Held nodes other than ``node``."""
        return sum(1 for n in self.held if n != node)

    def blocks(self, node: str) -> bool:
        """A new drain/reboot/replace of ``node`` must be held."""
        return self.others(node) >= self.limit

    def beyond(self, node: str) -> bool:
        """``node`` is drained by hma (``recorded``) but not among the first ``limit`` of those
        drains (it must undo itself)."""
        return node in self.ranked and self.ranked.index(node) >= self.limit

    def to_json(self) -> dict:
        """Status form."""
        return {
            "held_nodes": list(self.held),
            "total": self.total,
            "limit": self.limit,
            "open": len(self.held) >= self.limit,
            "partitions": list(self.partitions),
        }


def limit_for(total: int, percent: float, max_nodes: Optional[int]) -> int:
    """Nodes hma may hold among ``total``: ``percent`` of them and ``max_nodes``, at least one."""
    value = math.floor(total * percent / 100.0 + 1e-9)
    if max_nodes is not None:
        value = min(value, max_nodes)
    return max(1, value)


def held_by_hma(node: NodeState, field: str) -> bool:
    """hma holds this node out of scheduling."""
    if recorded(node):
        return True
    if node.recovery:
        found = label_mod.find(node.field(field))
        return found is not None and found.state == "unhealthy" and not found.held
    return False


def recorded(node: NodeState) -> bool:
    """Slurm's own record says hma holds this node: out of service with an ``HMA:`` reason."""
    return node.owned and node.out_of_service


def count(
    nodes: Sequence[NodeState],
    me: str,
    field: str,
    percent: float,
    max_nodes: Optional[int],
    total: Optional[int] = None,
) -> Count:
    """Count hma-held nodes in the partitions of ``me`` (all nodes when ``me`` has none).

    ``total``: the partitions' size when ``nodes`` holds only some of them (``held_view``)."""
    mine = next((n for n in nodes if n.name == me), None)
    parts = set(mine.partitions) if mine is not None and mine.partitions else set()
    scope = [n for n in nodes if not parts or parts & set(n.partitions)]
    held = sorted(
        (n for n in scope if held_by_hma(n, field)), key=lambda n: (n.reason_time, n.name)
    )
    size = len(scope) if total is None else max(total, len(scope))
    return Count(
        tuple(n.name for n in held),
        tuple(n.name for n in held if recorded(n)),
        size,
        limit_for(size, percent, max_nodes),
        tuple(sorted(parts)),
    )


BREAKER_CODE = "HMA_BREAKER_OPEN"


class Breaker:
    """The breaker of one engine: counts through the backend's peer query (only when about to
    act), remembers the last count (status.json) and alerts once while it holds actions
    (``add_alert``: the engine's alert queue)."""

    def __init__(
        self,
        backend: Backend,
        add_alert: Callable[[Alert], None],
        clock: Callable[[], float],
        percent: float,
        max_nodes: Optional[int],
    ) -> None:
        self.backend = backend
        self.add_alert = add_alert
        self.clock = clock
        self.percent = percent
        self.max_nodes = max_nodes
        self.last: Optional[Count] = None  # replaced whole: safe to read from any thread
        self._alerted = False

    def count(self, node: NodeState) -> Count:
        """The count for ``node`` (one filtered query)."""
        nodes, total = self.backend.peers(node)
        result = count(
            nodes, node.name, self.backend.label_field, self.percent, self.max_nodes, total
        )
        self.last = result
        return result

    def was_open(self, node: str) -> bool:
        """The last count held actions on ``node``."""
        return self.last is not None and self.last.blocks(node)

    def passed(self) -> None:
        """An action got through (or ended otherwise than held): the next hold alerts again."""
        self._alerted = False

    def alert(self, ep: Optional[Episode], result: Count, what: str) -> None:
        """``HMA_BREAKER_OPEN`` (once until an action gets through again)."""
        if self._alerted:
            return
        self._alerted = True
        msg = (
            f"circuit breaker open: {len(result.held)} of {result.total} nodes in "
            f"{','.join(result.partitions) or 'the cluster'} held by hma (limit {result.limit}); "
            f"{what} held"
        )
        self.add_alert(
            Alert(
                "action_held",
                BREAKER_CODE,
                "node",
                Severity.CRITICAL,
                msg,
                Action.NONE,
                "remediation",
                {"held": "breaker", "fault": ep.code if ep else None, **result.to_json()},
                self.clock(),
            )
        )
        log.warning(msg)
