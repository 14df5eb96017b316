"""The ``prometheus`` reporter: the status document as a node_exporter textfile.

Off by default. When enabled it writes ``textfile`` (``*.prom`` in node_exporter's
``--collector.textfile.directory``) after every change, through prometheus-client's
``write_to_textfile`` (temp file in the same folder, then rename: a scrape never sees half a
file). prometheus-client is imported only when the reporter is enabled. A write that fails raises
``TextfileError`` with the path and reason; the daemon logs it and goes on. Metric list:
docs/alerting.md.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any, ClassVar, Iterable, Iterator, Mapping, Optional

from hma.contracts.alert import ALERT_KINDS, Alert
from hma.contracts.model import Action, Severity
from hma.contracts.options import Option
from hma.contracts.reporter import Reporter
from hma.contracts.source import STATES as SOURCE_STATES

DEFAULT_TEXTFILE = "/var/lib/prometheus/node-exporter/hma.prom"  # Debian's textfile folder


class TextfileError(RuntimeError):
    """The textfile could not be written (or prometheus-client is missing)."""


def _check_textfile(value: Any) -> Optional[str]:
    return (
        None
        if str(value).endswith(".prom")
        else "must end in .prom (node_exporter reads only those)"
    )


def _severity(text: Any) -> Severity:
    try:
        return Severity.parse(str(text))
    except ValueError:
        return Severity.UNKNOWN


def _action(text: Any) -> int:
    try:
        return int(Action.parse(str(text)))
    except ValueError:
        return 0


@dataclass(frozen=True)
class Family:
    """One metric family of the textfile: its name as written (counters end in ``_total``),
    type, help text and label names (a sample leaves out the labels whose value is empty)."""

    name: str
    type: str  # "gauge" or "counter"
    help: str
    labels: tuple[str, ...] = ()


# One-hot states: every state has a sample, the current one is 1 (compare with ==, never >).
STATES = tuple(str(s) for s in Severity)
_ACTION_OUTCOMES = {
    "action_requested": "requested",
    "action_applied": "applied",
    "action_held": "held",
    "action_failed": "failed",
}
FAMILIES: tuple[Family, ...] = (
    Family(
        "hma_info",
        "gauge",
        "Agent version, node and instance type (value 1; an unknown instance type is left out).",
        ("version", "node", "instance_type"),
    ),
    Family(
        "hma_status_generated_timestamp_seconds",
        "gauge",
        "Unix time the agent wrote this file (at least every heartbeat): alert when it is old.",
    ),
    Family("hma_start_timestamp_seconds", "gauge", "Unix time the agent started."),
    Family("hma_node_state", "gauge", "Node health, one-hot: 1 for the current state.", ("state",)),
    Family("hma_node_action", "gauge", "Recommended action: 0 none, 1 reboot, 2 replace."),
    Family(
        "hma_component_state",
        "gauge",
        "Worst active fault of a component, one-hot (components with active faults only).",
        ("component", "state"),
    ),
    Family(
        "hma_findings_active",
        "gauge",
        "Active faults (value 1 each).",
        ("code", "severity", "component"),
    ),
    Family(
        "hma_findings_observed",
        "gauge",
        "Active faults of codes in observe mode that act mode would act on (value 1 each):"
        " would is drain, reboot or replace.",
        ("code", "component", "would"),
    ),
    Family(
        "hma_probe_success",
        "gauge",
        "1 when the probe's last run completed, 0 when it failed or timed out.",
        ("probe",),
    ),
    Family("hma_probe_duration_seconds", "gauge", "Duration of the probe's last run.", ("probe",)),
    Family(
        "hma_probe_last_run_timestamp_seconds",
        "gauge",
        "Unix time of the probe's last run.",
        ("probe",),
    ),
    Family("hma_probe_findings", "gauge", "Findings of the probe's last run.", ("probe",)),
    Family(
        "hma_source_state",
        "gauge",
        "Event source state, one-hot: starting, running, blind (reads nothing it is for),"
        " not-applicable, restarting or failed.",
        ("source", "state"),
    ),
    Family(
        "hma_actions",
        "gauge",
        "Remediation actions in the outbox by kind and state.",
        ("kind", "state"),
    ),
    Family(
        "hma_remediation_held",
        "gauge",
        "1 while remediation holds an action back (breaker, maintenance, limits: hma status).",
    ),
    Family(
        "hma_maintenance",
        "gauge",
        "1 while hma maintenance is on: faults are alerted, no action is taken on the node.",
    ),
    Family(
        "hma_maintenance_until_timestamp_seconds",
        "gauge",
        "Unix time the maintenance window ends (no sample: off, or on until turned off).",
    ),
    Family(
        "hma_alerts_total",
        "counter",
        "Alerts (state changes) since the agent started, by kind.",
        ("kind",),
    ),
    Family(
        "hma_remediation_actions_total",
        "counter",
        "Remediation action alerts since the agent started, by kind and outcome.",
        ("action", "outcome"),
    ),
)
_PROBE_RAN = "ran"
_PROBE_COUNTED = ("ran", "failed", "timed_out")

Rows = dict[str, list[tuple[dict[str, str], float]]]


class Tally:
    """The counters of one reporter's life: alerts by kind, action alerts by kind and outcome."""

    def __init__(self) -> None:
        self.alerts: Counter[str] = Counter({kind: 0 for kind in ALERT_KINDS})
        self.actions: Counter[tuple[str, str]] = Counter()

    def add(self, alert: Alert) -> None:
        """Count one alert."""
        self.alerts[alert.kind] += 1
        outcome = _ACTION_OUTCOMES.get(alert.kind)
        if outcome is not None:
            self.actions[(str(alert.details.get("action_kind", "")), outcome)] += 1


def _one_hot(current: Severity, **labels: str) -> list[tuple[dict[str, str], float]]:
    return [({**labels, "state": s}, 1.0 if s == str(current) else 0.0) for s in STATES]


def samples(status: Mapping[str, Any], tally: Optional[Tally] = None) -> Rows:
    """The metric samples of a status document (docs/status.md) and the counters, by family
    name, sorted; labels with an empty value are left out."""
    out: Rows = {f.name: [] for f in FAMILIES}
    out["hma_info"].append(
        (
            {
                "version": str(status.get("version") or ""),
                "node": str(status.get("node") or ""),
                "instance_type": str(status.get("instance_type") or ""),
            },
            1.0,
        )
    )
    for key, name in (
        ("generated", "hma_status_generated_timestamp_seconds"),
        ("started", "hma_start_timestamp_seconds"),
    ):
        if isinstance(status.get(key), (int, float)):
            out[name].append(({}, float(status[key])))
    out["hma_node_state"] += _one_hot(_severity(status.get("severity", "ok")))
    out["hma_node_action"].append(({}, float(_action(status.get("action", "none")))))

    worst: dict[str, Severity] = {}
    for fault in status.get("faults") or []:
        if not fault.get("active", True):
            continue
        sev = _severity(fault.get("severity"))
        comp = str(fault.get("component", ""))
        if comp not in worst or sev.rank > worst[comp].rank:
            worst[comp] = sev
        labels = {"code": str(fault.get("code", "")), "severity": str(sev), "component": comp}
        out["hma_findings_active"].append((labels, 1.0))
        if fault.get("would"):
            observed = {"code": labels["code"], "component": comp, "would": str(fault["would"])}
            out["hma_findings_observed"].append((observed, 1.0))
    for comp, sev in worst.items():
        out["hma_component_state"] += _one_hot(sev, component=comp)

    for probe in status.get("probes") or []:
        if probe.get("status") not in _PROBE_COUNTED or probe.get("last_run") is None:
            continue  # never ran, disabled or not applicable on this node
        labels = {"probe": str(probe.get("name", ""))}
        out["hma_probe_success"].append((labels, 1.0 if probe["status"] == _PROBE_RAN else 0.0))
        out["hma_probe_duration_seconds"].append((labels, float(probe.get("duration_s") or 0.0)))
        out["hma_probe_last_run_timestamp_seconds"].append((labels, float(probe["last_run"])))
        out["hma_probe_findings"].append((labels, float(probe.get("findings") or 0)))

    for source in status.get("sources") or []:
        name, state = str(source.get("name", "")), str(source.get("state", ""))
        out["hma_source_state"] += [
            ({"source": name, "state": s}, 1.0 if s == state else 0.0) for s in SOURCE_STATES
        ]

    remediation = status.get("remediation") or {}
    counts = Counter(
        (str(a.get("kind", "")), str(a.get("state", ""))) for a in remediation.get("actions") or []
    )
    for (kind, state), n in counts.items():
        out["hma_actions"].append(({"kind": kind, "state": state}, float(n)))
    out["hma_remediation_held"].append(({}, 1.0 if remediation.get("held") else 0.0))
    window = status.get("maintenance") or {}
    on = isinstance(window, Mapping) and window.get("active") is True
    out["hma_maintenance"].append(({}, 1.0 if on else 0.0))
    if on and isinstance(window.get("until"), (int, float)):
        out["hma_maintenance_until_timestamp_seconds"].append(({}, float(window["until"])))

    tally = tally or Tally()
    for kind, n in tally.alerts.items():
        out["hma_alerts_total"].append(({"kind": kind}, float(n)))
    for (action, outcome), n in tally.actions.items():
        out["hma_remediation_actions_total"].append(
            ({"action": action, "outcome": outcome}, float(n))
        )
    for rows in out.values():
        for labels, _value in rows:
            for key in [k for k, v in labels.items() if v == ""]:
                del labels[key]
        rows.sort(key=lambda row: sorted(row[0].items()))
    return out


class _Snapshot:
    """A prometheus-client collector over one status document and the counters."""

    def __init__(self, status: Mapping[str, Any], tally: Optional[Tally]) -> None:
        self.status = status
        self.tally = tally

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import Metric

        rows = samples(self.status, self.tally)
        for family in FAMILIES:
            base = family.name[: -len("_total")] if family.type == "counter" else family.name
            metric = Metric(base, family.help, family.type)
            for labels, value in rows[family.name]:
                metric.add_sample(family.name, labels, value)
            yield metric


def missing_library() -> Optional[str]:
    """Why the reporter cannot run here (prometheus-client is not importable), or None."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return (
            "needs prometheus-client, which is not installed "
            "(pip install 'hma[prometheus]' or apt install python3-prometheus-client)"
        )
    return None


class PrometheusReporter(Reporter):
    """Writes the node_exporter textfile after every status change."""

    name = "prometheus"
    default_enabled = False
    options: ClassVar[Mapping[str, Option]] = {
        "textfile": Option(
            "path",
            DEFAULT_TEXTFILE,
            "File to write, in node_exporter's --collector.textfile.directory; ends in .prom.",
            check=_check_textfile,
        ),
    }

    def __init__(self, options: Mapping[str, Any]) -> None:
        super().__init__(options)
        self.path = str(options.get("textfile") or DEFAULT_TEXTFILE)
        self.tally = Tally()
        problem = self.unmet(options)  # fail at start, not at the first change
        if problem:
            raise TextfileError(f"the prometheus reporter {problem}")

    @classmethod
    def unmet(cls, options: Mapping[str, Any]) -> Optional[str]:
        """prometheus-client missing (``hma config check`` fails on it when enabled)."""
        return missing_library()

    def alert(self, alert: Alert) -> None:
        """Count the alert (written with the next ``publish``)."""
        self.tally.add(alert)

    def publish(self, status: Mapping[str, Any]) -> None:
        """Write the textfile atomically; ``TextfileError`` when that is impossible."""
        write(self.path, status, self.tally)


def _registry(status: Mapping[str, Any], tally: Optional[Tally]) -> Any:
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(status, tally))
    return registry


def render(status: Mapping[str, Any], tally: Optional[Tally] = None) -> str:
    """The exposition text of a status document (what the textfile contains)."""
    from prometheus_client import generate_latest

    return generate_latest(_registry(status, tally)).decode("utf-8")


def write(path: str, status: Mapping[str, Any], tally: Optional[Tally] = None) -> None:
    """Write ``render(status, tally)`` to ``path`` through ``write_to_textfile`` (temp file +
    rename)."""
    from prometheus_client import write_to_textfile

    try:
        write_to_textfile(path, _registry(status, tally))
    except OSError as exc:
        # prometheus-client < 0.17 leaves its temp file behind when the rename fails
        leftover = f"{path}.{os.getpid()}.{threading.current_thread().ident}"
        if os.path.lexists(leftover) and not os.path.isdir(leftover):
            os.unlink(leftover)
        folder = os.path.dirname(path) or "."
        why = exc.strerror or str(exc)
        if not os.path.isdir(folder):
            why = f"folder {folder} does not exist"
        elif os.path.isdir(path):
            why = "it is a folder"
        raise TextfileError(f"cannot write the Prometheus textfile {path}: {why}") from exc


def families() -> Iterable[str]:
    """Names of every metric family the reporter writes."""
    return [f.name for f in FAMILIES]
