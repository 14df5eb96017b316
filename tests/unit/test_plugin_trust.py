"""Broken plugins of every group (issue 23): reported with their kind, name and error by
`hma config check` and `hma check`; a broken configured backend stops `hma run` with exit 78."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ENTRY_POINTS = (
    "[hma.backends]\n"
    "halfdone = hma_trust_backend:HalfBackend\n"
    "nobackend = hma_trust_no_such_module:Backend\n"
    "[hma.reporters]\n"
    "boom = hma_trust_boom:Reporter\n"
    "[hma.probes]\n"
    "notaprobe = collections:OrderedDict\n"
    "[hma.sources]\n"
    "notasource = collections:OrderedDict\n"
)
HALF_BACKEND = (
    "from hma.contracts.cluster import Backend\n\n\n"
    "class HalfBackend(Backend):\n"
    '    name = "halfdone"\n'
)
ABSTRACT = "TypeError: hma_trust_backend:HalfBackend is abstract: it does not implement "
MISSING = "ModuleNotFoundError: No module named 'hma_trust_no_such_module'"
BOOM = "RuntimeError: boom at import"
NOT_A_PROBE = "TypeError: collections:OrderedDict is not a hma.contracts.probe.Probe subclass"


@pytest.fixture
def plugged(hma_env, tmp_path: Path):  # type: ignore[no-untyped-def]
    """hma_env with a distribution of broken plugins on PYTHONPATH; ``env`` runs hma with it."""
    folder = tmp_path / "plugins"
    dist = folder / "hma_trust_plugins-0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: hma-trust-plugins\nVersion: 0\n")
    (dist / "entry_points.txt").write_text(ENTRY_POINTS)
    (folder / "hma_trust_backend.py").write_text(HALF_BACKEND)
    (folder / "hma_trust_boom.py").write_text('raise RuntimeError("boom at import")\n')
    env = hma_env.env()
    env["PYTHONPATH"] = str(folder) + os.pathsep + env.get("PYTHONPATH", "")
    hma_env.plugin_env = env
    return hma_env


def test_unused_broken_plugins_are_warnings(plugged) -> None:  # type: ignore[no-untyped-def]
    res = plugged.hma("config", "check", env=plugged.plugin_env)
    assert res.returncode == 0 and res.stdout.startswith("configuration OK"), res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 5 and all(line.startswith("warning: ") for line in lines)
    [half] = [line for line in lines if "'halfdone'" in line]
    assert half.startswith(f"warning: backend plugin 'halfdone' failed to load: {ABSTRACT}")
    assert "drain" in half  # one of the abstract methods it lacks
    assert f"warning: backend plugin 'nobackend' failed to load: {MISSING}" in lines
    assert f"warning: reporter plugin 'boom' failed to load: {BOOM}" in lines
    assert f"warning: probe plugin 'notaprobe' failed to load: {NOT_A_PROBE}" in lines
    assert any(line.startswith("warning: source plugin 'notasource'") for line in lines)


def test_enabled_broken_plugins_fail_config_check(plugged) -> None:  # type: ignore[no-untyped-def]
    plugged.write(
        "[reporters.boom]\nenabled = true\nurl = 'x'\n[probes.notaprobe]\ninterval = 60\n"
        "[sources.notasource]\nenabled = false\n[nobackend]\nnodes = 3\n"
    )
    res = plugged.hma("config", "check", env=plugged.plugin_env)
    assert res.returncode == 2 and res.stdout == ""
    errors = [line for line in res.stderr.splitlines() if not line.startswith("warning: ")]
    assert errors == [
        f"probes.notaprobe: probe plugin failed to load: {NOT_A_PROBE}",
        f"reporters.boom: reporter plugin failed to load: {BOOM}",
    ]
    assert "warning: source plugin 'notasource'" in res.stderr  # enabled = false: not in use
    assert f"warning: backend plugin 'nobackend' failed to load: {MISSING}" in res.stderr


@pytest.mark.parametrize(("backend", "error"), [("halfdone", ABSTRACT), ("nobackend", MISSING)])
def test_configured_broken_backend_fails_config_check(  # type: ignore[no-untyped-def]
    plugged, backend: str, error: str
) -> None:
    plugged.write(f'[cluster]\nbackend = "{backend}"\n')
    res = plugged.hma("config", "check", env=plugged.plugin_env)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.startswith(f"cluster.backend: {backend!r} failed to load: {error}")


def test_check_reports_each_broken_plugin(plugged) -> None:  # type: ignore[no-untyped-def]
    plugged.write(
        "[probes.system]\nfilesystems = []\n[reporters.boom]\nenabled = true\n"
        "[halfdone]\nnodes = 3\n[nobackend]\n"
    )
    res = plugged.hma("check", "system", "notaprobe", "--json", env=plugged.plugin_env)
    doc = json.loads(res.stdout)
    assert res.returncode == 1 and [p["name"] for p in doc["probes"]] == ["system"]
    found = {f["component"]: f for f in doc["agent_findings"]}
    assert set(found) == {
        "probe:notaprobe",
        "reporter:boom",
        "backend:halfdone",
        "backend:nobackend",
    }
    assert {f["code"] for f in found.values()} == {"HMA_PLUGIN_BROKEN"}
    assert found["reporter:boom"]["message"] == f"reporter plugin 'boom' failed to load: {BOOM}"
    assert found["backend:nobackend"]["details"] == {"error": MISSING}
    assert found["backend:halfdone"]["details"]["error"].startswith(ABSTRACT)
    assert found["probe:notaprobe"]["details"] == {"error": NOT_A_PROBE}


def test_run_with_broken_backend_exits_78(plugged) -> None:  # type: ignore[no-untyped-def]
    plugged.write('[cluster]\nbackend = "halfdone"\n')
    res = plugged.hma("run", env=plugged.plugin_env, timeout=30)
    assert res.returncode == 78, res.stderr
    assert res.stderr.startswith(f"cluster.backend: 'halfdone' failed to load: {ABSTRACT}")
    assert "Traceback" not in res.stderr
