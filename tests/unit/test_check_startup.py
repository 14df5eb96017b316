"""`hma check NAME` imports only what the named probes need, as `hma status` does."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(60)

LOADED = (
    "import sys, json; from hma import cli; rc = cli.main(['check', 'system', '--json']); "
    "print(json.dumps(sorted(sys.modules)))"
)
# imported by nothing `hma check system` needs: the full parser, the scan of every installed
# distribution, the health model (its types too), the state store, the remediation engine and
# backends (the file has no [slurm]), the daemon, event sources and their contract, reporters and
# their base module (no [sources.*] or [reporters.*] table), queue (a thread probe's result comes
# back in a list)
NOT_NEEDED = (
    "argparse",
    "importlib.metadata",
    "sqlite3",
    "hma.health.model",
    "hma.remediation.engine",
    "hma.contracts.cluster",
    "hma.cluster.slurm",
    "hma.daemon",
    "hma.contracts.source",
    "hma.health.store",
    "hma.probes.kernel_log.source",
    "hma.probes.nvidia.events",
    "hma.reporters",
    "hma.reporters.journal",
    "hma.reporters.prometheus",
    "queue",
    "traceback",
    "zipfile",
)


def test_check_system_imports_no_other_probe(hma_env) -> None:  # type: ignore[no-untyped-def]
    hma_env.write("[probes.system]\nfilesystems = []\n", kernel_log=False)  # no source read
    out = subprocess.run(
        [sys.executable, "-c", LOADED],
        env=hma_env.env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    modules = json.loads(out.stdout.strip().splitlines()[-1])
    assert [m for m in modules if m.startswith(("hma.probes.", "pynvml"))] == [
        "hma.probes.support",  # the probe writers' helpers (the mount table), no check family
        "hma.probes.support.mounts",
        "hma.probes.system",
        "hma.probes.system.probe",
    ], out.stderr
    assert [m for m in NOT_NEEDED if m in modules] == []


def test_check_finds_a_third_party_probe_past_hma_s_own(hma_env) -> None:  # type: ignore[no-untyped-def]
    """A name hma's own entry points lack is looked for in every installed distribution."""
    res = hma_env.hma("check", "system", "flaky", "--json", plugins=True)
    names = [p["name"] for p in json.loads(res.stdout)["probes"]]
    assert names == ["system", "flaky"], res.stderr


def test_unnamed_probe_sections_are_left_to_config_check(hma_env) -> None:  # type: ignore[no-untyped-def]
    hma_env.write("[probes.system]\nfilesystems = []\n[probes.gpu]\nno_such_key = 1\n")
    assert hma_env.hma("check", "system").returncode == 0
    checked = hma_env.hma("config", "check")
    assert checked.returncode == 2 and "probes.gpu.no_such_key: unknown key" in checked.stderr
    assert hma_env.hma("check", "gpu").returncode == 3  # named: its section is checked


def test_check_still_checks_a_backend_section_the_file_has(hma_env) -> None:  # type: ignore[no-untyped-def]
    hma_env.write("[probes.system]\nfilesystems = []\n[slurm]\nno_such_key = 1\n")
    res = hma_env.hma("check", "system")
    assert res.returncode == 3 and "slurm.no_such_key: unknown key" in res.stderr, res.stderr
