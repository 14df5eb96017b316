"""``hma deep-check`` end to end: real stress-ng, real fi_pingpong over tcp in network namespaces,
a dcgmi stand-in replaying DCGM's real JSON; results land in the state store and clear."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from netns_fabric import Fabric, ip, sweep, usable  # noqa: E402
from test_daemon import agent_factory  # noqa: E402,F401 (fixture)

from hma.health.records import load_records  # noqa: E402
from hma.health.store import Store  # noqa: E402

pytestmark = pytest.mark.integration
FIX = Path(__file__).resolve().parents[1] / "fixtures" / "deepcheck"
BASE_PORT = 47900


def config(tmp: Path, extra: str = "") -> Path:
    for d in ("state", "run"):
        (tmp / d).mkdir(exist_ok=True)
    path = tmp / "hma.toml"
    path.write_text(
        f'[agent]\nstate_dir = "{tmp}/state"\nrun_dir = "{tmp}/run"\n'
        f'[paths]\nsysfs = "{tmp}/sys"\n'
        "[deep_check]\nstress_seconds = 2\n"
        f'stress_memory = "16M"\nstress_disk_bytes = "4M"\nstress_dir = "{tmp}"\n'
        f'dcgmi_command = ["{tmp}/bin/dcgmi"]\n' + extra
    )
    return path


def standin(tmp: Path, name: str, body: str) -> None:
    """An executable stand-in in ``tmp/bin`` (replays a fixture, fails or hangs)."""
    folder = tmp / "bin"
    folder.mkdir(exist_ok=True)
    script = folder / name
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(0o755)


def deep_check(cfg: Path, *args: str, timeout: float = 60) -> tuple[int, dict[str, Any]]:
    """``hma deep-check --json ARGS``: exit status and document."""
    proc = subprocess.run(
        [sys.executable, "-m", "hma", "--config", str(cfg), "deep-check", "--json", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def faults(tmp: Path) -> dict[tuple[str, str], str]:
    store = Store(str(tmp / "state" / "state.db"))
    try:
        return {(r.code, r.component): r.probe for r in load_records(store)[0]}
    finally:
        store.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
def test_real_stress_ng_passes_and_missing_tools_are_skipped(tmp_path: Path) -> None:
    rc, doc = deep_check(config(tmp_path), "--stages", "stress,dcgm,neuron")
    verdicts = {s["stage"]: s["verdict"] for s in doc["stages"]}
    assert verdicts == {"stress": "pass", "dcgm": "skipped", "neuron": "skipped"}
    assert rc == 0 and doc["verdict"] == "pass"
    stress = doc["stages"][0]["details"]
    assert int(stress["vm"]["bogo-ops"]) > 0 and int(stress["hdd"]["bogo-ops"]) > 0
    assert faults(tmp_path) == {}


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
def test_only_skipped_stages_is_not_a_pass(tmp_path: Path) -> None:
    rc, doc = deep_check(config(tmp_path), "--stages", "dcgm")
    assert (rc, doc["verdict"]) == (3, "skipped")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
def test_dcgm_failure_recorded_kept_while_unknown_then_cleared(tmp_path: Path) -> None:
    cfg = config(tmp_path, "timeouts = { dcgm = 2 }\n")
    standin(tmp_path, "dcgmi", f"cat {FIX / 'dcgmi-diag-sm-stress-fail.json'}; exit 226")
    rc, doc = deep_check(cfg, "--stages", "dcgm")
    assert (rc, doc["verdict"]) == (2, "fail")
    assert "no agent running" in doc["recorded"]
    recorded = faults(tmp_path)
    assert recorded[("DEEP_DCGM_FAIL", "gpu:2")] == "deep_check.dcgm"
    # a hung dcgmi: unknown, killed at the stage timeout; the failure stays
    standin(tmp_path, "dcgmi", "exec sleep 30")
    rc, doc = deep_check(cfg, "--stages", "dcgm")
    assert (rc, doc["verdict"]) == (3, "unknown")
    assert "timed out" in doc["stages"][0]["message"]
    assert ("DEEP_DCGM_FAIL", "gpu:2") in faults(tmp_path)
    # DCGM passes everything: the failure clears
    passing = tmp_path / "pass.json"
    passing.write_text((FIX / "dcgmi-diag-sm-stress-fail.json").read_text().replace("FAIL", "PASS"))
    standin(tmp_path, "dcgmi", f"cat {passing}")
    rc, doc = deep_check(cfg, "--stages", "dcgm")
    assert (rc, doc["verdict"]) == (0, "pass")
    assert faults(tmp_path) == {}


REASON = usable()


@pytest.mark.skipif(REASON is not None, reason=REASON or "")
def test_efa_loopback_real_fi_pingpong_in_namespaces(tmp_path: Path) -> None:
    sweep()
    with Fabric(2, subnet=9) as fabric:
        adapters = fabric.adapters()
        table = ", ".join(
            f'{n} = {{ address = "{a["address"]}", netns = "{a["netns"]}" }}'
            for n, a in adapters.items()
        )
        extra = (
            "timeouts = { efa = 20 }\n[probes.efa_mesh]\n"
            f'provider = "tcp"\ndomain_format = ""\niterations = 5\nsize = 64\n'
            f"base_port = {BASE_PORT}\nadapters = {{ {table} }}\n"
        )
        cfg = config(tmp_path, extra)
        rc, doc = deep_check(cfg, "--stages", "efa")
        (stage,) = doc["stages"]
        assert stage["verdict"] == "pass", stage
        assert all(r["latency_us"] > 0 for r in stage["details"]["adapters"].values())
        # the adapter loses its address (a downed link still loops back locally)
        ip("-n", fabric.ns(1), "addr", "flush", "dev", "eth0")
        rc, doc = deep_check(cfg, "--stages", "efa")
        (stage,) = doc["stages"]
        bad = {f["component"]: f["code"] for f in stage["findings"]}
        assert bad == {"efa:a01": "DEEP_EFA_LOOPBACK_FAILED"}, stage
        assert stage["details"]["adapters"]["a00"]["status"] == "ok"
        assert ("DEEP_EFA_LOOPBACK_FAILED", "efa:a01") in faults(tmp_path)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
def test_gate_resumes_only_when_the_chosen_stages_pass(tmp_path: Path) -> None:
    from hma import assembly
    from hma.deepcheck.gate import gate

    none = assembly.load(str(config(tmp_path)))
    assert gate(none)[0] is True  # no after_recovery stages: resume at once
    cfg = config(tmp_path, 'after_recovery = ["stress", "dcgm", "connectivity"]\n')
    standin(tmp_path, "dcgmi", f"cat {FIX / 'dcgmi-diag-sm-stress-fail.json'}")
    ok, why, results = gate(assembly.load(str(cfg)))
    assert ok is False and "dcgm fail" in why
    assert [r.stage for r in results] == ["stress", "dcgm"]  # connectivity needs other nodes
    (tmp_path / "bin" / "dcgmi").unlink()
    ok, why, _ = gate(assembly.load(str(cfg)))
    assert ok is False and "dcgm skipped" in why  # a missing tool holds the node


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
def test_running_agent_takes_the_results_and_shows_them_in_status(hma_env, agent_factory) -> None:  # type: ignore[no-untyped-def]
    standin(hma_env.base, "dcgmi", f"cat {FIX / 'dcgmi-diag-sm-stress-fail.json'}")
    hma_env.write(f'[deep_check]\ndcgmi_command = ["{hma_env.base}/bin/dcgmi"]\n')
    agent = agent_factory()
    agent.wait_for(lambda: bool(agent.sent("READY=1")))
    proc = hma_env.hma("deep-check", "--stages", "dcgm", "--json")
    doc = json.loads(proc.stdout)
    assert doc["verdict"] == "fail" and "handed to the agent" in doc["recorded"]
    agent.wait_for(lambda: "DEEP_DCGM_FAIL" in agent.faults())
    fault = agent.faults()["DEEP_DCGM_FAIL"]
    assert fault["action"] == "replace" and fault["probe"] == "deep_check.dcgm"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
def test_recovery_gate_runs_once_per_boot_in_the_background(tmp_path: Path) -> None:
    from hma import assembly
    from hma.deepcheck.gate import RecoveryGate

    cfg = config(tmp_path, 'after_recovery = ["dcgm"]\n')
    standin(tmp_path, "dcgmi", f"cat {FIX / 'dcgmi-diag-sm-stress-fail.json'}")
    recorded: list[list[str]] = []
    gate = RecoveryGate(assembly.load(str(cfg)), lambda rs: recorded.append([r.stage for r in rs]))
    assert gate.hold("boot-1").startswith("deep check after recovery running: dcgm")
    gate.wait(30)
    assert gate.hold("boot-1") == "deep check holds the node: dcgm fail"
    assert recorded == [["dcgm"]]  # the failure goes to the agent (a DEEP_DCGM_FAIL fault)
    passing = tmp_path / "pass.json"
    passing.write_text((FIX / "dcgmi-diag-sm-stress-fail.json").read_text().replace("FAIL", "PASS"))
    standin(tmp_path, "dcgmi", f"cat {passing}")
    assert gate.hold("boot-1") != ""  # same boot: not run again
    assert "running" in gate.hold("boot-2")  # the next boot (another reboot) runs it again
    gate.wait(30)
    assert gate.hold("boot-2") == ""
    assert recorded == [["dcgm"], ["dcgm"]]
