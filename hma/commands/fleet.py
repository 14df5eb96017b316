"""``hma fleet``: the cluster's health at a glance, from Slurm alone (one ``sinfo`` call).

Lists every node that hma has labelled or drained or has a remediation history of (code,
component, action, since when, reboot count, remediations within the window, jobs hit), repeat
offenders first, and the circuit breaker's state per partition. Works for any user on a login
node: it only reads what the agents wrote into Slurm (reasons, the ``hma=`` label and the
``hmah=`` history mirror), all in the one ``sinfo`` call. On the controller it adds the
watcher's last pass (``hma watch``: its role, breaker, decisions and actions under way), read
from the watcher's state file when this host has one.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, Optional

from hma.adapters.text import printable
from hma.cluster.slurm.parse import SlurmError
from hma.commands import common
from hma.config.files import ConfigError
from hma.contracts import label, maintenance
from hma.contracts.cluster import OWNED_PREFIX, NodeState
from hma.detection.setup import Setup
from hma.remediation import breaker
from hma.remediation.options import RECOVERY
from hma.watch import state as watch_state

if TYPE_CHECKING:
    from hma.cluster.slurm.client import SlurmClient

_MAX = int(RECOVERY["max_remediations"].default)
_WINDOW = float(RECOVERY["remediation_window"].default)
# What a label's ``h=`` says in the table's note when ``held: <h>`` would not
HELD_NOTES = {"operator": "resumed by an operator while the fault is active: honoured"}


def _from_reason(reason: str) -> tuple[str, str]:
    """(code, component) from ``HMA: <CODE> <component>[ : reboot issued ...]``."""
    text = reason[len(OWNED_PREFIX) :].split(" : ", 1)[0].strip()
    code, _, component = text.partition(" ")
    return code, component.strip()


def node_row(
    node: NodeState, field: str, now: float, max_remediations: int = _MAX, window: float = _WINDOW
) -> Optional[dict[str, Any]]:
    """The fleet row of one node, or None when hma has nothing to say about it. A label that
    does not read (``label.parse``: a number out of bounds, a character hma never writes) gives
    ``label: unreadable`` and nothing of its fields."""
    token = label.find_token(node.field(field), label.PREFIX)
    found = label.parse(token, now) if token is not None else None
    unreadable = token is not None and found is None
    history = label.find_history(node.field(field), now)
    held = breaker.held_by_hma(node, field)
    maint = maintenance.in_field(node.field(field))
    if maint is not None and not maint.active(now):
        maint = None  # ended by itself; the word stays until `hma maintenance off`
    if token is None and not node.owned and history is None and maint is None:
        return None
    count = history.within(now, window) if history is not None else 0
    human = history.held if history is not None and history.held else None
    code, component = _from_reason(node.reason) if node.owned else ("", "")
    return {
        "node": node.name,
        "state": node.label_text,
        "reason": node.reason,
        "held_by_hma": held,
        "label": found.state if found else ("unreadable" if unreadable else None),
        "code": found.code if found else code,
        "component": (found.component if found else "") or component,
        "action": found.action if found else None,
        "since": (found.since if found and found.since else None) or node.reason_time or None,
        "reboots": found.reboots if found else 0,
        "remediations": count,
        "held_for_human": human,
        "repeat_offender": bool(human) or count > max_remediations,
        "jobs": list(found.jobs) if found else [],
        "held": (found.held or None) if found else None,
        "partitions": list(node.partitions),
        "maintenance": {"until": maint.until} if maint is not None else None,
    }


def collect(
    client: SlurmClient,
    field: str,
    percent: float,
    max_nodes: Optional[int],
    max_remediations: int = _MAX,
    window: float = _WINDOW,
) -> dict[str, Any]:
    """The fleet document (``hma fleet --json``): repeat offenders first, then by name."""
    nodes = client.nodes()
    now = time.time()
    found = (node_row(n, field, now, max_remediations, window) for n in nodes)
    rows = sorted((r for r in found if r), key=lambda r: (not r["repeat_offender"], r["node"]))
    partitions: dict[str, list[NodeState]] = {}
    for node in nodes:
        for part in node.partitions or ("(none)",):
            partitions.setdefault(part, []).append(node)
    parts = []
    for name, members in sorted(partitions.items()):
        held = [n.name for n in members if breaker.held_by_hma(n, field)]
        limit = breaker.limit_for(len(members), percent, max_nodes)
        parts.append(
            {
                "partition": name,
                "nodes": len(members),
                "held_by_hma": len(held),
                "limit": limit,
                "breaker": "open" if len(held) >= limit else "closed",
            }
        )
    return {"generated": time.time(), "nodes": rows, "partitions": parts}


def watcher(folder: str) -> Optional[dict[str, Any]]:
    """The watcher's last pass and its actions under way, from its state file in ``folder``;
    None when this host has none (a login node) or it cannot be read."""
    found = watch_state.load_quiet(folder)
    if found is None:
        return None
    actions = [
        {"node": node, "kind": a.kind, "id": a.id, "code": a.code, "since": a.started,
         "state": a.state, "error": a.error or None}
        for node, a in sorted(found.actions.items())
    ]  # fmt: skip
    return {**found.last, "actions": actions}


def render_watch(doc: dict[str, Any]) -> list[str]:
    """The watcher's lines of the text view (text from Slurm escaped)."""
    when = (
        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(doc["time"])) if doc.get("time") else "-"
    )
    head = f"WATCHER {printable(str(doc.get('role') or 'unknown'))}, last pass {when}"
    if doc.get("passive"):
        head += f" ({printable(str(doc['passive']))})"
    if doc.get("error"):
        head += f"; last read failed: {printable(str(doc['error']))}"
    lines = ["", head]
    brk = doc.get("breaker") or {}
    if brk:
        lines.append(
            f"  breaker {'open' if brk.get('open') else 'closed'}: "
            f"{len(brk.get('affected') or [])} of {brk.get('total', 0)} nodes not responding "
            f"(limit {brk.get('limit', 0)})"
        )
    for d in doc.get("decisions") or []:
        held = f" held: {d['held']}" if d.get("held") else ""
        lines.append(
            f"  {printable(str(d['node'])):<14} {printable(str(d['kind'])):<8} "
            f"{printable(str(d['code']))}{printable(held)}: {printable(str(d['why']))}"
        )
    for a in doc.get("actions") or []:
        error = f" ({a['error']})" if a.get("error") else ""
        lines.append(
            f"  {printable(str(a['node'])):<14} {printable(str(a['kind'])):<8} "
            f"{printable(str(a['state']))} {printable(str(a['id']))}{printable(error)}"
        )
    return lines


# blind: its health check cannot check (hma.remediation.blind)
NOTES = {"recovered": "recovered", "unreadable": "label unreadable", "blind": "blind"}


def render_text(doc: dict[str, Any]) -> str:
    """Human-readable fleet view; text from Slurm is escaped (hma.adapters.text)."""
    lines = []
    if not doc["nodes"]:
        lines.append("no node is labelled or drained by hma")
    else:
        head = f"{'NODE':<14} {'STATE':<10} {'CODE':<24} {'COMPONENT':<18} {'ACTION':<8} "
        lines.append(head + f"{'SINCE':<17} {'REBOOTS':>7} {'REPAIRS':>7}  JOBS / NOTE")
        for r in doc["nodes"]:
            since = (
                time.strftime("%Y-%m-%d %H:%M", time.localtime(r["since"])) if r["since"] else "-"
            )
            note = ",".join(r["jobs"])
            if r["held"]:
                held = HELD_NOTES.get(r["held"], f"held: {r['held']}")
                note = (note + " " if note else "") + held
            if r["label"] in NOTES:
                note = (note + " " if note else "") + NOTES[r["label"]]
            if r["repeat_offender"]:
                note = (note + " " if note else "") + "repeat offender: needs hma reset"
            if r.get("maintenance"):
                note = (note + " " if note else "") + "maintenance"
            lines.append(
                f"{printable(r['node']):<14} {printable(r['state']):<10} "
                f"{printable(r['code'] or '-'):<24} {printable(r['component'] or '-'):<18} "
                f"{printable(r['action'] or '-'):<8} {since:<17} "
                f"{r['reboots']:>7} {r['remediations']:>7}  {printable(note)}"
            )
    lines.append("")
    lines.append(f"{'PARTITION':<14} {'NODES':>5} {'HELD':>5} {'LIMIT':>5}  BREAKER")
    for p in doc["partitions"]:
        lines.append(
            f"{printable(p['partition']):<14} {p['nodes']:>5} {p['held_by_hma']:>5} "
            f"{p['limit']:>5}  {p['breaker']}"
        )
    if doc.get("watch"):
        lines += render_watch(doc["watch"])
    return "\n".join(lines)


def main(setup: Setup, as_json: bool) -> int:
    """``hma fleet [--json]`` with the configuration's Slurm client; 3 when Slurm cannot say."""
    rec = setup.config.section("recovery")
    try:
        client = common.slurm_client(setup)
    except ConfigError as exc:
        return common.config_failed(exc, 3, "fleet" if as_json else "")
    try:
        doc = collect(
            client,
            rec["label_field"],
            float(rec["max_drained_percent"]),
            rec["max_drained_nodes"],
            int(rec["max_remediations"]),
            float(rec["remediation_window"]),
        )
        watch = watcher(str(setup.config.section("watch")["state_dir"]))
        if watch is not None:
            doc["watch"] = watch
    except SlurmError as exc:
        print(f"hma fleet: {printable(str(exc))}", file=sys.stderr)
        if as_json:
            common.dump(common.problem("fleet", f"no Slurm: {exc}", generated=time.time()))
        return 3
    if as_json:
        common.dump(doc)
    else:
        print(render_text(doc))
    return 0
