"""contrib/monitoring against real parts: Debian's promtool, Prometheus and node_exporter.

`hma run` writes its textfile for one node of a loopback Slurm; node_exporter's textfile
collector serves it; Prometheus (on loopback, 1 s scrapes and evaluations) scrapes it and
evaluates hma-alerts.rules.yml with every `for:` cut to 1 s and the stale threshold and
counter window cut to seconds (promtool test rules checks the real `for:` durations). Faults
are injected for real: node_exporter serving no hma textfile before the agent starts, executable
probes that fail while a flag file exists, a replace hook that fails, another node drained by hma
(the circuit breaker opens), the agent stopped (SIGSTOP).
Every alert must fire on its fault and resolve after it; every PromQL expression of the Grafana
dashboard must return data from that server.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from tests.integration.remediation_helpers import write_config
from tests.slurmcluster import SlurmCluster, available, free_ports

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
CONTRIB = ROOT / "contrib" / "monitoring"
RULES = CONTRIB / "hma-alerts.rules.yml"
DASHBOARD = CONTRIB / "hma-dashboard.json"
PLUGINS = ROOT / "tests" / "plugins"
WAIT_S = 60.0


def binary(name: str) -> str:
    """The path of a monitoring binary, or skip saying which package provides it."""
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin")
    if path is None:
        package = "prometheus-node-exporter" if "exporter" in name else "prometheus"
        pytest.skip(
            f"{name} not installed (Debian package {package}; scripts/bootstrap installs it)"
        )
    return path


def alert_names(text: str) -> list[str]:
    return re.findall(r"^\s*- alert: (\w+)$", text, re.M)


def test_promtool_checks_and_unit_tests_the_rules() -> None:
    promtool = binary("promtool")
    check = subprocess.run(
        [promtool, "check", "rules", str(RULES)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    names = alert_names(RULES.read_text())
    assert f"SUCCESS: {len(names)} rules found" in check.stdout
    # the `for:` durations, label and annotation texts: promtool's own unit tests
    unit = subprocess.run(
        [promtool, "test", "rules", "hma-alerts.test.yml"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=CONTRIB,
        check=False,
    )
    assert unit.returncode == 0, unit.stdout + unit.stderr
    tested = set(re.findall(r"alertname: (\w+)", (CONTRIB / "hma-alerts.test.yml").read_text()))
    assert tested == set(names)


def test_every_rule_has_for_severity_and_a_runbook() -> None:
    text = RULES.read_text()
    blocks = re.split(r"^\s*- alert: ", text, flags=re.M)[1:]
    assert len(blocks) == len(alert_names(text)) >= 7
    for block in blocks:
        name = block.split()[0]
        assert re.search(r"^\s+for: \d+m$", block, re.M), name
        assert re.search(r"^\s+severity: (critical|warning)$", block, re.M), name
        assert re.search(r'^\s+runbook: ".*hma (status|explain|fleet)', block, re.M), name


def dashboard_exprs() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of the dashboard."""
    doc = json.loads(DASHBOARD.read_text())
    out = []
    for panel in doc["panels"]:
        for target in panel.get("targets", []):
            out.append((panel["title"], target["expr"]))
    return out


def test_dashboard_shape() -> None:
    doc = json.loads(DASHBOARD.read_text())
    rows = [p["title"] for p in doc["panels"] if p["type"] == "row"]
    assert rows == ["Fleet overview", "One node ($instance)", "Remediation actions"]
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in doc["templating"]["list"]}
    assert variables == {"datasource", "instance"}
    for panel in doc["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["targets"], panel["title"]
    assert len(dashboard_exprs()) >= 15


# --- the live stack ----------------------------------------------------------------------------


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - loopback only
        body = resp.read().decode()
    return json.loads(body) if body.startswith("{") else body


def wait_for(
    cond: Callable[[], Any],
    what: str,
    procs: list[subprocess.Popen],
    detail: Callable[[], Any] = lambda: "",
) -> Any:
    deadline = time.monotonic() + WAIT_S
    while True:
        for proc in procs:
            assert proc.poll() is None, f"{proc.args[0]} exited {proc.returncode} ({what})"
        try:
            got = cond()
        except OSError:  # a server not listening yet
            got = None
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {detail()}"
        time.sleep(0.25)


class Stack:
    """node_exporter and Prometheus on loopback, each in its own folder, stopped by PID."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.procs: list[subprocess.Popen] = []
        self.instance = f"127.0.0.1:{free_ports(1)[0]}"
        self.url = f"http://127.0.0.1:{free_ports(1)[0]}"

    def run(self, textfile_dir: Path, rules: Path) -> None:
        """Start node_exporter over ``textfile_dir`` and Prometheus with ``rules``; wait until
        both answer (the folder may hold no textfile yet)."""
        self.start(
            "node_exporter",
            [
                binary("prometheus-node-exporter"),
                f"--web.listen-address={self.instance}",
                "--collector.disable-defaults",
                "--collector.textfile",
                f"--collector.textfile.directory={textfile_dir}",
            ],
        )
        config = self.base / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            f"rule_files:\n  - {rules}\n"
            "scrape_configs:\n  - job_name: node\n    static_configs:\n"
            f'      - targets: ["{self.instance}"]\n'
        )
        self.start(
            "prometheus",
            [
                binary("prometheus"),
                f"--config.file={config}",
                f"--storage.tsdb.path={self.base / 'tsdb'}",
                f"--web.listen-address={self.url[len('http://') :]}",
                "--log.level=warn",
            ],
        )
        wait_for(
            lambda: "node_textfile_scrape_error" in get(f"http://{self.instance}/metrics"),
            "node_exporter",
            self.procs,
        )
        wait_for(lambda: get(f"{self.url}/-/ready"), "Prometheus ready", self.procs)

    def start(self, name: str, argv: list[str]) -> None:
        log = (self.base / f"{name}.log").open("w")
        try:
            self.procs.append(
                subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.base)
            )
        finally:
            log.close()

    def query(self, expr: str) -> list[dict]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        doc = get(url)
        assert doc["status"] == "success", doc
        return list(doc["data"]["result"])

    def alerts(self) -> dict[str, list[dict]]:
        """Alerts now pending or firing, by name."""
        out: dict[str, list[dict]] = {}
        for alert in get(f"{self.url}/api/v1/alerts")["data"]["alerts"]:
            out.setdefault(alert["labels"]["alertname"], []).append(alert)
        return out

    def firing(self) -> set[str]:
        return {
            n for n, items in self.alerts().items() if any(a["state"] == "firing" for a in items)
        }

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def fast_rules(dest: Path) -> Path:
    """The rules with `for:` cut to 1 s, the stale threshold to 10 s and the counter window
    to 10 s (each substitution must match, or the rules file changed under the test)."""
    text = RULES.read_text()
    for pattern, new, count in (
        (r"(?m)^(\s+for: )\d+m$", r"\g<1>1s", len(alert_names(text))),
        (
            r"hma_status_generated_timestamp_seconds > 120",
            "hma_status_generated_timestamp_seconds > 10",
            1,
        ),
        (r"\[15m\]", "[10s]", 1),
    ):
        text, n = re.subn(pattern, new, text)
        assert n == count, pattern
    dest.write_text(text)
    return dest


PROBE = """#!/bin/sh
# a site probe whose fault is switched by a flag file
if [ -e {flag} ]; then
  {bad}
fi
echo "{name} ok"
exit 0
"""


@pytest.fixture
def cluster() -> Iterator[SlurmCluster]:
    why = available()
    if why:
        pytest.skip(f"Slurm: {why}")
    with SlurmCluster(2, expansion=True) as c:  # as docs/slurm.md sets it: config check is silent
        yield c


def test_alerts_fire_and_resolve_and_the_dashboard_has_data(
    cluster: SlurmCluster, tmp_path: Path, trusted_dir: Path
) -> None:
    for name in ("prometheus", "prometheus-node-exporter"):
        binary(name)
    flags = tmp_path / "flags"
    flags.mkdir()
    probes = trusted_dir / "probes.d"
    probes.mkdir()
    os.chmod(probes, 0o755)
    bad = {
        "fan": 'echo "fan 3 failed"; exit 2',  # critical; replace (below)
        "psu": 'echo "psu 2 degraded"; exit 1',  # warning
    }
    for name, body in bad.items():
        path = probes / name
        path.write_text(PROBE.format(flag=flags / name, bad=body, name=name))
        os.chmod(path, 0o755)
    hook = trusted_dir / "replace-hook"
    hook.write_text('#!/bin/sh\necho "cluster API says no" >&2\nexit 1\n')
    os.chmod(hook, 0o755)
    metrics = tmp_path / "textfiles"
    metrics.mkdir()
    textfile = metrics / "hma.prom"
    config = write_config(
        tmp_path / "hma.toml",
        cluster,
        "node1",
        {
            "replace_mode": "command",
            "replace_command": [str(hook)],
            "command_timeout": 5.0,
            "max_drained_nodes": 1,
        },
        agent={"probes_dir": str(probes)},
        extra=(
            "[probes.system]\nenabled = false\n"
            "[probes.fan]\ninterval = 0.5\n[probes.psu]\ninterval = 0.5\n"
            # a plugin probe (tests/plugins) that raises while its flag file exists
            f'[probes.flaky]\nenabled = true\ninterval = 0.5\nfail_file = "{flags / "flaky"}"\n'
            '[codes.SITE_PROBE_CRITICAL]\naction = "replace"\n'
            "[sources.kernel_log]\nenabled = false\n[sources.nvml_events]\nenabled = false\n"
            "[reporters.journald]\nenabled = false\n"
            f'[reporters.prometheus]\nenabled = true\ntextfile = "{textfile}"\n'
        ),
    )
    # only the flaky probe of tests/plugins (its other plugins are broken on purpose)
    plugins = tmp_path / "plugins"
    (plugins / "hma_monitortest-0.dist-info").mkdir(parents=True)
    (plugins / "hma_monitortest-0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: hma-monitortest\nVersion: 0\n"
    )
    (plugins / "hma_monitortest-0.dist-info" / "entry_points.txt").write_text(
        "[hma.probes]\nflaky = hma_testprobes:FlakyProbe\n"
    )
    (plugins / "hma_testprobes.py").symlink_to(PLUGINS / "hma_testprobes.py")
    env = {**os.environ, "PYTHONPATH": str(plugins)}
    check = subprocess.run(
        [sys.executable, "-m", "hma", "--config", str(config), "config", "check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert check.returncode == 0 and check.stderr == "", check.stderr
    stack = Stack(tmp_path)
    daemon: subprocess.Popen | None = None
    try:
        # node_exporter up, no hma textfile in its folder yet: the node is not monitored by hma
        stack.run(metrics, fast_rules(tmp_path / "rules.yml"))
        wait_for(
            lambda: stack.firing() == {"HmaNotReporting"},
            "HmaNotReporting firing",
            stack.procs,
            lambda: stack.alerts(),
        )
        (missing,) = stack.alerts()["HmaNotReporting"]
        assert missing["labels"]["instance"] == stack.instance
        assert missing["labels"]["severity"] == "warning"
        with (tmp_path / "daemon.log").open("w") as log:
            daemon = subprocess.Popen(
                [sys.executable, "-m", "hma", "--config", str(config), "run"],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                env=env,
            )
        procs = [daemon, *stack.procs]
        wait_for(textfile.exists, "the textfile", procs)

        def state() -> str:
            alerts = {n: [a["state"] for a in items] for n, items in stack.alerts().items()}
            lines = [line for line in textfile.read_text().splitlines() if line[0] != "#"]
            return f"alerts {alerts}; textfile:\n" + "\n".join(lines)

        wait_for(lambda: stack.query("hma_node_state"), "the first scrape", procs)
        # the agent's metrics appear: HmaNotReporting resolves, and nothing else fires
        wait_for(lambda: not stack.alerts(), "HmaNotReporting resolved", procs, state)

        # faults: a critical one that asks for replacement (the hook fails), a warning, a probe
        # that raises
        for name in (*bad, "flaky"):
            (flags / name).touch()
        expected = {
            "HmaCriticalFault",
            "HmaWarningFault",
            "HmaProbeFailing",
            "HmaNodeReplace",
            "HmaRemediationFailing",
        }
        wait_for(
            lambda: expected <= stack.firing(),
            f"{expected} firing",
            procs,
            state,
        )
        alerts = stack.alerts()
        assert not {"HmaRemediationHeld", "HmaAgentStale"} & set(alerts)
        critical = alerts["HmaCriticalFault"][0]
        assert critical["labels"]["code"] == "SITE_PROBE_CRITICAL"
        assert critical["labels"]["severity"] == "critical"
        assert critical["annotations"]["runbook"] == (
            "On the node: hma status; hma explain SITE_PROBE_CRITICAL "
            "(what it means and what to do)."
        )
        assert alerts["HmaProbeFailing"][0]["labels"]["probe"] == "flaky"
        assert alerts["HmaRemediationFailing"][0]["labels"]["action"] == "replace"

        # every expression of the dashboard has data now
        substitutions = {"$instance": stack.instance, "$__rate_interval": "1m"}
        for title, expr in dashboard_exprs():
            for var, value in substitutions.items():
                expr = expr.replace(var, value)
            assert "$" not in expr, expr
            wait_for(lambda e=expr: stack.query(e), f"data for {title!r}: {expr}", procs)

        # the faults go away: every alert resolves
        for name in (*bad, "flaky"):
            (flags / name).unlink()
        wait_for(lambda: not stack.alerts(), "every alert resolved", procs, state)

        # the circuit breaker opens: another node is held by hma, node1's drain is held back
        cluster.scontrol(
            "update", "NodeName=node2", "State=DRAIN", "Reason=HMA: SITE_PROBE_CRITICAL site:fan"
        )
        (flags / "fan").touch()
        wait_for(lambda: "HmaRemediationHeld" in stack.firing(), "HmaRemediationHeld", procs, state)
        (flags / "fan").unlink()
        cluster.scontrol("update", "NodeName=node2", "State=RESUME")
        wait_for(lambda: not stack.alerts(), "alerts resolved after the breaker", procs, state)

        # the agent stops writing (hung): the file goes stale, then fresh again
        daemon.send_signal(signal.SIGSTOP)
        try:
            wait_for(lambda: "HmaAgentStale" in stack.firing(), "HmaAgentStale", stack.procs)
        finally:
            daemon.send_signal(signal.SIGCONT)
        wait_for(lambda: not stack.alerts(), "HmaAgentStale resolved", procs, state)
    finally:
        stack.stop()
        if daemon is not None:
            daemon.send_signal(signal.SIGCONT)
            daemon.terminate()
            try:
                daemon.wait(20)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
