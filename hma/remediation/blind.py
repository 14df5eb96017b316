"""A check that cannot check says so where the operator looks (docs/slurm.md, "A health check
that cannot check").

``hma healthcheck`` or ``hma run`` on a configuration that does not load marks the node
``hma=blind:HMA_CONFIG_INVALID:none,c=agent,t=<since>`` in its label field (``hma fleet`` lists it
blind), sends one journal entry (code ``HMA_CONFIG_INVALID``) and, with ``[healthcheck] on_error =
"drain"``, drains the node (reason ``HMA: HMA_CONFIG_INVALID agent``) within the circuit breaker
(``h=breaker`` in the label when it holds the drain back). What it needs comes from what can be
read of the configuration (hma.assembly.salvaged). A label of an open episode (``unhealthy``,
``recovered``), or one that does not read, is left as it is: it carries what remediation takes up
after a state loss. The first remediation engine that runs on a valid configuration lifts the mark
(``lifted``, called by hma.remediation.facts with each node state read); a drain it made is then
taken up and resumed by the usual rules of a drain found without a record.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional, Sequence

from hma.config.schema import Config
from hma.contracts import label as label_mod
from hma.contracts.alert import Alert
from hma.contracts.cluster import OWNED_PREFIX, Backend, BackendError, NodeState
from hma.contracts.model import Severity
from hma.remediation import breaker
from hma.reporters.journal import JournalReporter

CODE = "HMA_CONFIG_INVALID"
STATE = "blind"
COMPONENT = "agent"
REASON = f"{OWNED_PREFIX} {CODE} {COMPONENT}"
MAX_ERRORS = 20  # errors carried in the journal entry's details


def report(config: Config, errors: Sequence[str], command: str, now: float) -> list[str]:
    """Tell journald and the cluster that ``command`` cannot check this node (its configuration
    has ``errors``); ``config``: what could be read of it. Returns one line per place it could
    not be told (the caller prints them); never raises."""
    first = errors[0] if errors else "invalid configuration"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    text = f"{command} cannot check this node: invalid configuration: {first}{more}"
    journald = config.reporters.get("journald") or {}
    if journald.get("enabled"):
        reporter = JournalReporter(journald)
        reporter.alert(
            Alert(
                "raised",
                CODE,
                COMPONENT,
                Severity.WARNING,
                text,
                probe=command,
                details={"command": command, "errors": list(errors[:MAX_ERRORS])},
                ts=now,
            )
        )
        reporter.close()
    try:
        from hma.detection.registry import make_backend

        mark(
            make_backend(config),
            config.section("healthcheck")["on_error"],
            config.section("recovery"),
            now,
        )
    except Exception as exc:  # noqa: BLE001 - a backend that cannot be made or reached
        return [f"{command}: cannot mark the node blind in the cluster: {exc}"]
    return []


def mark(backend: Backend, on_error: str, rec: Mapping[str, Any], now: float) -> None:
    """Write the blind label through ``backend``, and drain per ``on_error``:
    never with ``[recovery] dry_run`` (nothing changes in the cluster) or ``policy = "none"``
    (label only), and only within the circuit breaker (counted before and after the drain,
    which is undone beyond the limit, as remediation does: one bad drop-in pushed to every node
    must not drain the fleet); ``rec``: ``[recovery]``."""
    if not backend.enabled or rec["dry_run"]:
        return
    name = _node_name(backend)
    node = backend.node(name)
    drain = on_error == "drain" and rec["policy"] != "none" and not node.out_of_service
    held = ""
    if drain and _breaker(backend, node, rec).blocks(name):
        drain, held = False, "breaker"  # the label says why it is not drained
    text = marked(node, backend.label_field, now, held)
    if not drain:
        if text is not None:
            backend.label(name, text)
        return
    backend.drain(name, REASON, text)
    if _breaker(backend, backend.node(name), rec).beyond(name):  # others drained at once
        backend.resume(name, marked(node, backend.label_field, now, "breaker"))


def _breaker(backend: Backend, node: NodeState, rec: Mapping[str, Any]) -> breaker.Count:
    """What the circuit breaker counts for ``node`` (one query of its partitions' peers)."""
    peers, total = backend.peers(node)
    return breaker.count(
        peers,
        node.name,
        backend.label_field,
        float(rec["max_drained_percent"]),
        rec["max_drained_nodes"],
        total,
    )


def _node_name(backend: Backend) -> str:
    """This node's name: slurmd's ``SLURMD_NODENAME`` (HealthCheckProgram), the configured
    one, or the one the backend finds."""
    name = (
        os.environ.get("SLURMD_NODENAME")
        or backend.node_name_configured()
        or backend.find_node_name()
    )
    if not name:
        raise BackendError(backend.no_node)
    return name


def marked(node: NodeState, field: str, now: float, held: str = "") -> Optional[str]:
    """The label field of ``node`` with the blind label (since ``now``, or since the blind
    label it has; ``held``: why a drain ``on_error`` asks for is held back); None when it stays
    as it is (marked already, or another label: an episode's, or one that does not read)."""
    text = node.field(field)
    found = label_mod.find(text)
    token = label_mod.find_token(text, label_mod.PREFIX)
    if token is not None and (found is None or found.state != STATE):
        return None
    since = found.since if found is not None and found.since else now
    lab = label_mod.Label(STATE, CODE, "none", COMPONENT, since, held=held)
    new = label_mod.edit(text, lab)
    return None if new == text else new


def lifted(node: NodeState, field: str) -> Optional[str]:
    """The label field of ``node`` without a blind label, when it has one (a configuration
    that loads again: the node is checked); None when there is none to lift."""
    text = node.field(field)
    found = label_mod.find(text)
    if found is None or found.state != STATE:
        return None
    return label_mod.edit(text, None)
