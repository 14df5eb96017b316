"""Pure: spare nodes per domain.

A spare is a healthy node of a domain held out of service by ``hma topology`` on the controller:
drained with the reason ``hma-spare`` (not ``HMA:``, so the node's own agent neither takes the
drain up as its own nor resumes it, and the circuit breaker does not count it); only that exact
reason on a drained node is a spare, never an admin's reason that merely starts with it. When hma
replaces a faulty node, a healthy spare of the same domain is resumed in its place; the next ``hma
topology`` run makes up the count again from the domain's idle nodes.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from hma.contracts import label
from hma.contracts.cluster import NodeState
from hma.topology import conf
from hma.topology import domain as domain_mod

SPARE_REASON = "hma-spare"


def published(node: NodeState) -> str:
    """The domain text a node publishes (the first of its fields, in the backend's order, that
    has one: Extra, then Comment on Slurm), as written; "" when none."""
    return next((dom for dom in (domain_mod.of(text) for _name, text in node.texts) if dom), "")


def node_domain(node: NodeState) -> str:
    """The domain a node publishes; "" when none or unusable (``domain.problem``)."""
    text = published(node)
    return "" if domain_mod.problem(text) else text


def is_spare(node: NodeState) -> bool:
    """Drained by ``hma topology`` as a spare: the DRAIN flag and exactly hma's reason."""
    return node.drain and node.reason == SPARE_REASON


def healthy(node: NodeState) -> bool:
    """Reachable, not down or failed, understood, and no hma label that says unhealthy or does
    not read (a label may keep a node out of service, never put it in)."""
    tokens = (label.find_token(text, label.PREFIX) for _name, text in node.texts)
    labels = [label.parse(token) for token in tokens if token is not None]
    return (
        node.understood
        and not node.not_responding
        and not node.down
        and not node.fail
        and not node.reboot_pending
        and not any(lab is None or lab.state == "unhealthy" for lab in labels)
    )


def choose_spare(nodes: Sequence[NodeState], domain: str, faulty: str) -> Optional[NodeState]:
    """The spare that takes the place of ``faulty`` in ``domain``: a healthy spare of that
    domain, the first in natural order; None when the domain has none (or is unknown)."""
    if not domain:
        return None
    found = [
        n
        for n in nodes
        if n.name != faulty and is_spare(n) and healthy(n) and node_domain(n) == domain
    ]
    return min(found, key=lambda n: conf.natural_key(n.name)) if found else None


def plan(nodes: Sequence[NodeState], per_domain: int) -> tuple[list[str], list[str]]:
    """(nodes to make spares, spares to put back in service) so that every domain holds
    ``per_domain`` healthy spares. New spares are the domain's last idle healthy nodes in natural
    order (only an idle node is taken: no job is disturbed); extra spares are released."""
    by_domain: dict[str, list[NodeState]] = {}
    for node in nodes:
        dom = node_domain(node)
        if dom:
            by_domain.setdefault(dom, []).append(node)
    mark: list[str] = []
    release: list[str] = []
    for dom in sorted(by_domain):
        members = sorted(by_domain[dom], key=lambda n: conf.natural_key(n.name))
        spares = [n for n in members if is_spare(n) and healthy(n)]
        if len(spares) > per_domain:
            release += [n.name for n in spares[: len(spares) - per_domain]]
            continue
        idle = [
            n
            for n in members
            if n.base == "idle" and not n.out_of_service and not n.busy and healthy(n)
        ]
        want = per_domain - len(spares)
        mark += [n.name for n in idle[max(0, len(idle) - want) :]] if want > 0 else []
    return mark, release


def take_spare(client: Any, faulty: str, domain: str) -> Optional[str]:
    """Resume the spare that takes ``faulty``'s place in ``domain`` (one read of the node table,
    at replace time only); returns its name, None when the domain has no healthy spare."""
    spare = choose_spare(client.nodes(), domain, faulty)
    if spare is None:
        return None
    client.update(spare.name, State="RESUME")
    return spare.name
