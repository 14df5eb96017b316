"""``hma fleet``: the cluster's health at a glance, from Slurm alone (one ``sinfo`` call).

Lists every node that hma has labelled or drained (code, component, action, since when, reboot
count, jobs hit) and the circuit breaker's state per partition. Works for any user on a login
node: it only reads what the agents wrote into Slurm (reasons and the ``hma=`` label).
"""

from __future__ import annotations

import sys
import time
from typing import Any, Optional

from hma.adapters.text import printable
from hma.cluster.slurm.client import SlurmClient
from hma.cluster.slurm.parse import SlurmError
from hma.commands import jsondoc
from hma.contracts import label as label_mod
from hma.contracts import maintenance
from hma.contracts.cluster import OWNED_PREFIX, NodeState
from hma.detection.setup import Setup
from hma.remediation import breaker


def _from_reason(reason: str) -> tuple[str, str]:
    """(code, component) from ``HMA: <CODE> <component>[ : reboot issued ...]``."""
    text = reason[len(OWNED_PREFIX) :].split(" : ", 1)[0].strip()
    code, _, component = text.partition(" ")
    return code, component.strip()


def node_row(node: NodeState, field: str) -> Optional[dict[str, Any]]:
    """The fleet row of one node, or None when hma has nothing to say about it."""
    found = label_mod.find(node.field(field))
    held = breaker.held_by_hma(node, field)
    window = maintenance.in_field(node.field(field))
    if window is not None and not window.active(time.time()):
        window = None  # ended by itself; the word stays until `hma maintenance off`
    if found is None and not node.owned and window is None:
        return None
    code, component = _from_reason(node.reason) if node.owned else ("", "")
    return {
        "node": node.name,
        "state": node.label_text,
        "reason": node.reason,
        "held_by_hma": held,
        "label": found.state if found else None,
        "code": found.code if found else code,
        "component": (found.component if found else "") or component,
        "action": found.action if found else None,
        "since": (found.since if found and found.since else None) or node.reason_time or None,
        "reboots": found.reboots if found else 0,
        "jobs": list(found.jobs) if found else [],
        "held": (found.held or None) if found else None,
        "partitions": list(node.partitions),
        "maintenance": {"until": window.until} if window is not None else None,
    }


def collect(
    client: SlurmClient, field: str, percent: float, max_nodes: Optional[int]
) -> dict[str, Any]:
    """The fleet document (``hma fleet --json``)."""
    nodes = client.nodes()
    rows = [r for r in (node_row(n, field) for n in sorted(nodes, key=lambda n: n.name)) if r]
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


def render_text(doc: dict[str, Any]) -> str:
    """Human-readable fleet view; text from Slurm is escaped (hma.adapters.text)."""
    lines = []
    if not doc["nodes"]:
        lines.append("no node is labelled or drained by hma")
    else:
        head = f"{'NODE':<14} {'STATE':<10} {'CODE':<24} {'COMPONENT':<18} {'ACTION':<8} "
        lines.append(head + f"{'SINCE':<17} {'REBOOTS':>7}  JOBS / NOTE")
        for r in doc["nodes"]:
            since = (
                time.strftime("%Y-%m-%d %H:%M", time.localtime(r["since"])) if r["since"] else "-"
            )
            note = ",".join(r["jobs"])
            if r["held"]:
                note = (note + " " if note else "") + f"held: {r['held']}"
            if r["label"] == "recovered":
                note = (note + " " if note else "") + "recovered"
            if r.get("maintenance"):
                note = (note + " " if note else "") + "maintenance"
            lines.append(
                f"{printable(r['node']):<14} {printable(r['state']):<10} "
                f"{printable(r['code'] or '-'):<24} {printable(r['component'] or '-'):<18} "
                f"{printable(r['action'] or '-'):<8} {since:<17} "
                f"{r['reboots']:>7}  {printable(note)}"
            )
    lines.append("")
    lines.append(f"{'PARTITION':<14} {'NODES':>5} {'HELD':>5} {'LIMIT':>5}  BREAKER")
    for p in doc["partitions"]:
        lines.append(
            f"{printable(p['partition']):<14} {p['nodes']:>5} {p['held_by_hma']:>5} "
            f"{p['limit']:>5}  {p['breaker']}"
        )
    return "\n".join(lines)


def main(setup: Setup, as_json: bool) -> int:
    """``hma fleet [--json]`` with the configuration's Slurm client; 3 when Slurm cannot say."""
    rec = setup.config.section("recovery")
    client = SlurmClient.from_options(setup.config.section("slurm"))
    try:
        doc = collect(
            client, rec["label_field"], float(rec["max_drained_percent"]), rec["max_drained_nodes"]
        )
    except SlurmError as exc:
        print(f"hma fleet: {printable(str(exc))}", file=sys.stderr)
        if as_json:
            jsondoc.dump(jsondoc.problem("fleet", f"no Slurm: {exc}", generated=time.time()))
        return 3
    if as_json:
        jsondoc.dump(doc)
    else:
        print(render_text(doc))
    return 0
