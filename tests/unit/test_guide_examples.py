"""The examples of docs/writing-reporters.md and docs/writing-backends.md work as written: each
is installed like a third-party plugin (a module and a dist-info folder on ``sys.path``), loaded
through its entry point group and its contract, and used as the core uses it."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from hma import assembly
from hma.adapters import entrypoints
from hma.contracts import cluster, reporter
from hma.contracts.alert import Alert
from hma.contracts.model import Severity
from hma.detection import registry
from hma.health.model import Verdict
from hma.health.store import Store
from hma.remediation.engine import Remediator
from tests.faults import fault

pytestmark = pytest.mark.timeout(30)
DOCS = Path(__file__).resolve().parents[2] / "docs"


def example(guide: str) -> str:
    """The first ``python`` code block of a guide."""
    found = re.search(r"^```python\n(.*?)^```$", (DOCS / guide).read_text(), re.S | re.M)
    assert found, f"{guide} has no python example"
    return found.group(1)


@pytest.fixture
def install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Install a guide's example as module ``module`` registered as ``group``: ``name``."""
    installed: list[str] = []

    def put(guide: str, module: str, group: str, name: str, cls: str) -> None:
        site = tmp_path / "site"
        dist = site / f"{module}-0.dist-info"
        dist.mkdir(parents=True)
        (site / f"{module}.py").write_text(example(guide))
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0\n")
        (dist / "entry_points.txt").write_text(f"[{group}]\n{name} = {module}:{cls}\n")
        monkeypatch.syspath_prepend(str(site))
        installed.append(module)
        entrypoints.rescan()

    yield put
    monkeypatch.undo()
    for module in installed:
        sys.modules.pop(module, None)
    entrypoints.rescan()


def test_reporter_example_loads_and_appends_alerts(tmp_path: Path, install: Any) -> None:
    install(
        "writing-reporters.md",
        "hma_guide_jsonlines",
        reporter.GROUP,
        "jsonlines",
        "JsonLinesReporter",
    )
    classes, broken = registry.discover(reporter.GROUP, reporter.Reporter, ["jsonlines"])
    assert broken == [] and list(classes) == ["jsonlines"]
    path = tmp_path / "alerts.jsonl"
    instance = classes["jsonlines"]({"enabled": True, "path": str(path)})
    for kind in ("raised", "cleared"):
        instance.alert(Alert(kind, "GPU_XID_79", "gpu:0", Severity.CRITICAL, "off the bus", ts=1.0))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(line["kind"], line["severity"]) for line in lines] == [
        ("raised", "critical"),
        ("cleared", "critical"),
    ]


def test_backend_example_drains_through_remediation(tmp_path: Path, install: Any) -> None:
    install("writing-backends.md", "hma_guide_filebackend", cluster.GROUP, "file", "FileBackend")
    state = tmp_path / "node.json"
    conf = tmp_path / "hma.toml"
    conf.write_text(
        "\n".join(
            [
                "[agent]",
                f'state_dir = "{tmp_path}/state"',
                f'run_dir = "{tmp_path}/run"',
                f'probes_dir = "{tmp_path}/probes.d"',
                "[recovery]",
                "resume_after = 0.0",
                "[cluster]",
                'backend = "file"',
                "[file]",
                f'path = "{state}"',
                'node_name = "n1"',
            ]
        )
        + "\n"
    )
    setup = assembly.load(str(conf))
    rem = Remediator(setup, Store(str(tmp_path / "state" / "state.db")), start=False)
    try:
        assert isinstance(rem.backend, cluster.SetsDown)
        assert not isinstance(rem.backend, cluster.Reboots)
        rem.refresh()
        assert rem.facts().node_name == "n1"
        now = time.time()
        rem.update(Verdict(now, "b1", (fault(first=now, last=now),)), "b1")
        rem.flush(5)
        node = json.loads(state.read_text())
        assert "DRAIN" in node["flags"] and node["reason"] == "HMA: GPU_XID_79 gpu:0000:3b:00"
        assert node["label"].startswith("hma=unhealthy:GPU_XID_79:reboot,")
        assert rem.status()["held"].startswith("unsupported: the file backend cannot reboot")
    finally:
        rem.close()
