"""``hma deep-check run NODES``: deep checks of several nodes from a login or controller node.

1. The reservation ``hma-deep-check`` (IGNORE_JOBS) takes the nodes: no new job lands on them.
   Creating it is the lock: while it exists a second run is refused.
2. Nodes with jobs are waited on up to ``[deep_check] busy_wait`` seconds, then left out of the
   reservation and reported as skipped; nodes already down or drained are skipped at once.
3. One Slurm job per node runs the node stages (``node_command``: ``hma deep-check --json`` on
   the node, which records its findings in that node's agent).
4. The connectivity stage runs one job across the nodes that passed (nccl-tests all_reduce_perf
   or nccom-test); when it falls short, pair jobs blame only the slow nodes
   (hma.deepcheck.connectivity). Each node's connectivity verdict goes to its agent with one more
   job (``--connectivity-result``), so a blamed node is drained by its own agent.
5. Every node gets a ``hma-deep=<verdict>:<time>`` token in its label field; the reservation is
   deleted (passed nodes are back in service; failed ones are held by their agents).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from hma.adapters.text import printable
from hma.cluster.slurm.client import SlurmClient
from hma.cluster.slurm.parse import SlurmError
from hma.contracts.cluster import NodeState
from hma.deepcheck import connectivity, parse
from hma.deepcheck.options import NODE_STAGES
from hma.deepcheck.record import finding_json
from hma.deepcheck.stages import stage_timeout

RESERVATION = "hma-deep-check"
LABEL_PREFIX = "hma-deep="
POLL_S = 1.0
JOB_MARGIN_S = 60.0


class RunRefused(Exception):
    """Another deep check holds the reservation, or Slurm refused it."""


@dataclass
class NodeReport:
    """One row of the table."""

    node: str
    verdict: str = "unknown"
    stages: dict[str, str] = field(default_factory=dict)
    connectivity: str = ""
    note: str = ""
    instance_type: Optional[str] = None

    def to_json(self) -> dict[str, Any]:
        """The node in ``hma deep-check run --json``."""
        return {
            "node": self.node,
            "verdict": self.verdict,
            "stages": self.stages,
            "connectivity": self.connectivity or None,
            "note": self.note,
        }


@dataclass
class Orchestrator:
    """Drives one run; ``client`` is the Slurm client, ``opts`` the ``[deep_check]`` section."""

    client: SlurmClient
    opts: Mapping[str, Any]
    label_field: str = "extra"
    instance_type: Optional[str] = None  # when the node jobs do not say (no node stages)
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    connectivity_detail: dict[str, Any] = field(default_factory=dict)

    def run(self, names: Sequence[str], stages: Sequence[str]) -> list[NodeReport]:
        """The whole run; raises ``RunRefused`` when the reservation cannot be taken."""
        reports = {n: NodeReport(n) for n in names}
        self._reserve(names)
        try:
            ready = self._wait_idle(reports)
            node_stages = [s for s in stages if s in NODE_STAGES]
            if node_stages:
                self._node_jobs(ready, node_stages, reports)
            else:  # connectivity alone: judged by it
                for name in ready:
                    reports[name].verdict, reports[name].instance_type = "pass", self.instance_type
            if "connectivity" in stages:
                passed = [n for n in ready if reports[n].verdict in ("pass", "warn")]
                self._connectivity(passed, reports)
            for report in reports.values():
                self._label(report)
        finally:
            self._release()
        return [reports[n] for n in names]

    # --- reservation ----------------------------------------------------------------------------

    def _reserve(self, names: Sequence[str]) -> None:
        argv = [
            *self.client.scontrol,
            "create",
            "reservation",
            f"ReservationName={RESERVATION}",
            "StartTime=now",
            "Duration=infinite",
            "Users=root",
            f"Nodes={','.join(names)}",
            "Flags=IGNORE_JOBS",
        ]
        result = self.client.runner.run(argv, self.client.timeout, env=self.client.env())
        if result.ok:
            return
        text = (result.stderr or result.stdout or result.error).strip()
        if self._reservation_exists():
            raise RunRefused(
                f"another deep check is running (reservation {RESERVATION} exists); "
                f"`scontrol delete ReservationName={RESERVATION}` if it is stale"
            )
        raise RunRefused(f"cannot create reservation {RESERVATION}: {text}")

    def _reservation_exists(self) -> bool:
        argv = [*self.client.scontrol, "show", "reservation", RESERVATION]
        result = self.client.runner.run(argv, self.client.timeout, env=self.client.env())
        return result.ok and f"ReservationName={RESERVATION} " in result.stdout

    def _shrink(self, keep: Sequence[str]) -> None:
        """Leave skipped nodes out of the reservation (they return to service at once)."""
        if keep:
            argv = [*self.client.scontrol, "update", f"ReservationName={RESERVATION}"]
            self.client.runner.run(
                [*argv, f"Nodes={','.join(keep)}"], self.client.timeout, env=self.client.env()
            )

    def _release(self) -> None:
        argv = [*self.client.scontrol, "delete", f"ReservationName={RESERVATION}"]
        self.client.runner.run(argv, self.client.timeout, env=self.client.env())

    # --- waiting --------------------------------------------------------------------------------

    def _wait_idle(self, reports: dict[str, NodeReport]) -> list[str]:
        """Nodes free of jobs within ``busy_wait``; the others are reported and left out."""
        deadline = self.clock() + float(self.opts["busy_wait"])
        pending = list(reports)
        ready: list[str] = []
        while pending:
            try:
                states = {s.name: s for s in self.client.nodes(pending)}
            except SlurmError as exc:
                for name in pending:
                    reports[name].note = f"skipped: Slurm state unreadable ({exc})"
                    reports[name].verdict = "skipped"
                break
            still = []
            for name in pending:
                state = states.get(name)
                why = _unavailable(state)
                if why:
                    reports[name].verdict, reports[name].note = "skipped", f"skipped: {why}"
                elif state is not None and state.busy:
                    still.append(name)
                else:
                    ready.append(name)
            pending = still
            if pending and self.clock() >= deadline:
                for name in pending:
                    reports[name].verdict = "skipped"
                    reports[
                        name
                    ].note = (
                        f"skipped: still running jobs after {float(self.opts['busy_wait']):g} s"
                    )
                break
            if pending:
                self.sleep(POLL_S)
        if len(ready) != len(reports):
            self._shrink(ready)
        return ready

    # --- jobs -----------------------------------------------------------------------------------

    def _srun(self, nodes: Sequence[str], argv: Sequence[str], timeout: float) -> Any:
        cmd = [*self.opts["srun_command"], f"--reservation={RESERVATION}", "-N", str(len(nodes))]
        cmd += ["--ntasks-per-node=1", "-w", ",".join(nodes), f"--job-name={RESERVATION}"]
        if self.opts["partition"]:
            cmd.append(f"--partition={self.opts['partition']}")
        return self.client.runner.run([*cmd, *argv], timeout, env=self.client.env())

    def _node_jobs(
        self, nodes: Sequence[str], stages: Sequence[str], reports: dict[str, NodeReport]
    ) -> None:
        timeout = sum(stage_timeout(s, self.opts) for s in stages) + JOB_MARGIN_S
        argv = [*self.opts["node_command"], "--stages", ",".join(stages)]

        def one(name: str) -> None:
            result = self._srun([name], argv, timeout)
            report = reports[name]
            try:
                doc = json.loads(result.stdout)
                report.verdict = str(doc["verdict"])
                report.stages = {s["stage"]: s["verdict"] for s in doc["stages"]}
                report.instance_type = doc.get("instance_type")
            except (ValueError, KeyError, TypeError):
                report.verdict = "unknown"
                why = "timed out" if result.timed_out else (result.stderr or result.error).strip()
                report.note = f"node job gave no result: {why[-200:]}"

        threads = [threading.Thread(target=one, args=(n,), daemon=True) for n in nodes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    # --- connectivity ---------------------------------------------------------------------------

    def _connectivity(self, nodes: Sequence[str], reports: dict[str, NodeReport]) -> None:
        if len(nodes) < 2:
            for name in nodes:
                _connected(reports[name], "skipped")
            self.connectivity_detail = {"verdict": "skipped", "why": "needs 2 nodes that passed"}
            return
        types = [reports[n].instance_type for n in nodes if reports[n].instance_type]
        itype = max(set(types), key=types.count) if types else None
        minimum = connectivity.minimum(itype, dict(self.opts["busbw_min_gbps"]))
        if minimum is None:
            for name in nodes:
                _connected(reports[name], "unknown")
            self.connectivity_detail = {
                "verdict": "unknown",
                "why": f"no bus bandwidth minimum for instance type {itype!r}: set "
                "[deep_check] busbw_min_gbps",
            }
            return
        argv = self._collective(itype)
        timeout = stage_timeout("connectivity", self.opts)

        def measure(group: Sequence[str]) -> Optional[float]:
            result = self._srun(group, argv, timeout)
            try:
                return float(parse.busbw(result.stdout)["busbw_gbps"]) if result.ok else None
            except ValueError:
                return None

        outcome = connectivity.judge(nodes, minimum, measure)
        self.connectivity_detail = {
            "verdict": outcome.verdict,
            "instance_type": itype,
            "minimum_gbps": minimum,
            "group_gbps": outcome.group_gbps,
            "pairs": outcome.pairs,
            "blamed": outcome.blamed,
        }
        blamed = {f.details["node"]: f for f in outcome.findings()}
        for name in nodes:
            report = reports[name]
            if name in outcome.unjudged:
                _connected(report, "unknown")
                continue
            finding = blamed.get(name)
            _connected(report, "fail" if finding else "pass")
            payload = {"findings": [finding_json(finding)] if finding else []}
            self._srun(
                [name],
                [*self.opts["node_command"], "--connectivity-result", json.dumps(payload)],
                self.client.timeout + JOB_MARGIN_S,
            )

    def _collective(self, instance_type: Optional[str]) -> list[str]:
        kind = self.opts["collective"]
        if kind == "auto":
            kind = "nccom" if (instance_type or "").startswith(("trn", "inf")) else "nccl"
        if kind == "nccom":
            return [*self.opts["nccom_command"], "allr"]
        return list(self.opts["all_reduce_command"])

    # --- label ----------------------------------------------------------------------------------

    def _label(self, report: NodeReport) -> None:
        """``hma-deep=<verdict>:<unix time>`` in the label field, replacing an earlier one."""
        if report.verdict == "skipped":
            return
        try:
            current = self.client.node(report.node).field(self.label_field)
            token = f"{LABEL_PREFIX}{report.verdict}:{int(time.time())}"
            self.client.update(
                report.node, **{self.label_field.capitalize(): label(current, token)}
            )
        except SlurmError as exc:
            report.note = (report.note + f"; label not written: {exc}").lstrip("; ")


def _connected(report: NodeReport, verdict: str) -> None:
    """The node's connectivity verdict, and what it does to the node's own: a fail fails it,
    an unknown makes a pass unknown, a skip leaves it (skipped when connectivity was all)."""
    report.connectivity = verdict
    if verdict == "fail":
        report.verdict = "fail"
    elif verdict == "unknown" and report.verdict in ("pass", "warn"):
        report.verdict = "unknown"
    elif verdict == "skipped" and not report.stages:
        report.verdict = "skipped"


def label(text: str, token: str) -> str:
    """``text`` with its ``hma-deep=`` token replaced by ``token`` (or ``token`` added)."""
    words = [w for w in text.split(" ") if w and not w.startswith(LABEL_PREFIX)]
    return " ".join([*words, token])


def _unavailable(state: Optional[NodeState]) -> str:
    if state is None:
        return "not known to Slurm"
    if state.down or state.fail or state.drain:
        return f"not in service ({state.label_text}{': ' + state.reason if state.reason else ''})"
    return ""


def render_table(reports: Sequence[NodeReport], detail: Mapping[str, Any]) -> str:
    """The per-node table an operator reads."""
    stage_names = sorted({s for r in reports for s in r.stages})
    head = ["NODE", "VERDICT", *[s.upper() for s in stage_names], "CONNECTIVITY", "NOTE"]
    rows = [head]
    for r in reports:
        rows.append(
            [
                r.node,
                r.verdict,
                *[r.stages.get(s, "-") for s in stage_names],
                r.connectivity or "-",
                printable(r.note),
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1] for row in rows]
    if detail:
        bw = detail.get("group_gbps")
        lines.append(
            f"connectivity: {detail.get('verdict')}"
            + (f", group {bw:g} GB/s" if isinstance(bw, float) else "")
            + (f", minimum {detail['minimum_gbps']:g} GB/s" if "minimum_gbps" in detail else "")
            + (f" ({printable(str(detail['why']))})" if "why" in detail else "")
        )
    return "\n".join(line.rstrip() for line in lines)
