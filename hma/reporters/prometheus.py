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
from typing import Any, ClassVar, Iterable, Iterator, Mapping, Optional

from hma.contracts.model import Action, Severity
from hma.contracts.options import Option
from hma.contracts.reporter import Reporter

DEFAULT_TEXTFILE = "/var/lib/prometheus/node-exporter/hma.prom"  # Debian's textfile folder


class TextfileError(RuntimeError):
    """The textfile could not be written (or prometheus-client is missing)."""


def _check_textfile(value: Any) -> Optional[str]:
    return (
        None
        if str(value).endswith(".prom")
        else "must end in .prom (node_exporter reads only those)"
    )


def _severity(text: Any) -> int:
    try:
        return int(Severity.parse(str(text)))
    except ValueError:
        return int(Severity.UNKNOWN)


def _action(text: Any) -> int:
    try:
        return int(Action.parse(str(text)))
    except ValueError:
        return 0


# (name, help, label names); every family is a gauge.
FAMILIES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("hma_up", "1: the agent wrote this file (check the timestamp for freshness).", ()),
    (
        "hma_info",
        "Agent version, node and instance type (value 1).",
        ("version", "node", "instance_type"),
    ),
    ("hma_status_generated_timestamp_seconds", "Unix time the status was written.", ()),
    ("hma_start_timestamp_seconds", "Unix time the agent started.", ()),
    (
        "hma_node_severity",
        "Node health as a Nagios code: 0 ok, 1 warning, 2 critical, 3 unknown.",
        (),
    ),
    ("hma_node_action", "Recommended action: 0 none, 1 reboot, 2 replace.", ()),
    (
        "hma_component_severity",
        "Worst active fault of a component, Nagios code (components with faults only).",
        ("component",),
    ),
    ("hma_findings_active", "Active faults (value 1 each).", ("code", "severity", "component")),
    (
        "hma_probe_success",
        "1 when the probe's last run completed, 0 when it failed or timed out.",
        ("probe",),
    ),
    ("hma_probe_duration_seconds", "Duration of the probe's last run.", ("probe",)),
    ("hma_probe_last_run_timestamp_seconds", "Unix time of the probe's last run.", ("probe",)),
    ("hma_probe_findings", "Findings of the probe's last run.", ("probe",)),
    ("hma_actions", "Remediation actions in the outbox by kind and state.", ("kind", "state")),
    (
        "hma_remediation_held",
        "1 while remediation holds actions back (breaker, policy, dry run).",
        (),
    ),
    ("hma_maintenance", "1 while hma maintenance is on (no action is taken on the node).", ()),
    (
        "hma_maintenance_until_timestamp_seconds",
        "Unix time the maintenance window ends (absent: off, or on until turned off).",
        (),
    ),
)
_PROBE_RAN = "ran"
_PROBE_COUNTED = ("ran", "failed", "timed_out")


def samples(status: Mapping[str, Any]) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The metric samples of a status document (docs/status.md), by family name, sorted."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {name: [] for name, _h, _l in FAMILIES}
    out["hma_up"].append(({}, 1.0))
    out["hma_info"].append(
        (
            {
                "version": str(status.get("version", "")),
                "node": str(status.get("node", "")),
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
    out["hma_node_severity"].append(({}, float(_severity(status.get("severity", "ok")))))
    out["hma_node_action"].append(({}, float(_action(status.get("action", "none")))))

    worst: dict[str, Severity] = {}
    for fault in status.get("faults") or []:
        if not fault.get("active", True):
            continue
        sev = Severity(_severity(fault.get("severity")))
        comp = str(fault.get("component", ""))
        if comp not in worst or sev.rank > worst[comp].rank:
            worst[comp] = sev
        labels = {"code": str(fault.get("code", "")), "severity": str(sev), "component": comp}
        out["hma_findings_active"].append((labels, 1.0))
    for comp, sev in worst.items():
        out["hma_component_severity"].append(({"component": comp}, float(int(sev))))

    for probe in status.get("probes") or []:
        if probe.get("status") not in _PROBE_COUNTED or probe.get("last_run") is None:
            continue  # never ran, disabled or not applicable on this node
        labels = {"probe": str(probe.get("name", ""))}
        out["hma_probe_success"].append((labels, 1.0 if probe["status"] == _PROBE_RAN else 0.0))
        out["hma_probe_duration_seconds"].append((labels, float(probe.get("duration_s") or 0.0)))
        out["hma_probe_last_run_timestamp_seconds"].append((labels, float(probe["last_run"])))
        out["hma_probe_findings"].append((labels, float(probe.get("findings") or 0)))

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
    for rows in out.values():
        rows.sort(key=lambda row: sorted(row[0].items()))
    return out


class _Snapshot:
    """A prometheus-client collector over one status document."""

    def __init__(self, status: Mapping[str, Any]) -> None:
        self.status = status

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        rows = samples(self.status)
        for name, doc, labels in FAMILIES:
            family = GaugeMetricFamily(name, doc, labels=list(labels))
            for values, value in rows[name]:
                family.add_metric([values[label] for label in labels], value)
            yield family


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
        try:
            import prometheus_client  # noqa: F401 - fail at start, not at the first change
        except ImportError as exc:
            raise TextfileError(
                "the prometheus reporter needs prometheus-client "
                "(pip install 'hma[prometheus]' or apt install python3-prometheus-client)"
            ) from exc

    def publish(self, status: Mapping[str, Any]) -> None:
        """Write the textfile atomically; ``TextfileError`` when that is impossible."""
        write(self.path, status)


def render(status: Mapping[str, Any]) -> str:
    """The exposition text of a status document (what the textfile contains)."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(status))
    return generate_latest(registry).decode("utf-8")


def write(path: str, status: Mapping[str, Any]) -> None:
    """Write ``render(status)`` to ``path`` through ``write_to_textfile`` (temp file + rename)."""
    from prometheus_client import CollectorRegistry, write_to_textfile

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(status))
    try:
        write_to_textfile(path, registry)
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
    return [name for name, _h, _l in FAMILIES]
