"""Executable probes in probes_dir: the Nagios plugin protocol, timeouts, output cap, refusal."""

from __future__ import annotations

import json
import os

import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="ownership checks need root")


def probe_doc(hma_env, name: str) -> dict:  # type: ignore[no-untyped-def]
    res = hma_env.hma("check", name, "--json")
    doc = json.loads(res.stdout)
    [probe] = doc["probes"]
    return {"rc": res.returncode, "severity": doc["severity"], **probe}


@pytest.mark.parametrize(
    "rc, severity, code",
    [
        (0, "ok", None),
        (1, "warning", "SITE_PROBE_WARNING"),
        (2, "critical", "SITE_PROBE_CRITICAL"),
        (3, "unknown", "SITE_PROBE_UNKNOWN"),
        (7, "unknown", "SITE_PROBE_UNKNOWN"),
    ],
)
def test_nagios_exit_codes(hma_env, rc: int, severity: str, code: str) -> None:  # type: ignore[no-untyped-def]
    hma_env.exec_probe("site", f'echo "first line {rc}"\necho second\nexit {rc}')
    doc = probe_doc(hma_env, "site")
    assert (
        doc["severity"] == severity
        and doc["rc"] == {"ok": 0, "warning": 1, "critical": 2, "unknown": 3}[severity]
    )
    if code is None:
        assert doc["findings"] == []
    else:
        [f] = doc["findings"]
        assert f["code"] == code and f["component"] == "site:site"
        assert f["message"].endswith(f"first line {rc}")


def test_timeout_kills_process_group(hma_env, tmp_path) -> None:  # type: ignore[no-untyped-def]
    marker = tmp_path / "child.pid"
    hma_env.exec_probe("slow", f"sleep 60 &\necho $! > {marker}\nwait")
    hma_env.write("[probes.slow]\ntimeout = 1\n")
    doc = probe_doc(hma_env, "slow")
    [f] = doc["findings"]
    assert f["code"] == "SITE_PROBE_UNKNOWN" and "timed out" in f["message"]
    child = int(marker.read_text())
    with pytest.raises(ProcessLookupError):
        for _ in range(50):
            os.kill(child, 0)
            __import__("time").sleep(0.1)


def test_megabyte_of_output_is_capped(hma_env) -> None:  # type: ignore[no-untyped-def]
    hma_env.exec_probe("loud", "echo 'too much'\nhead -c 1048576 /dev/zero | tr '\\0' x\nexit 1")
    doc = probe_doc(hma_env, "loud")
    [f] = doc["findings"]
    assert f["code"] == "SITE_PROBE_WARNING" and f["message"] == "too much"
    assert f["details"]["truncated"] is True
    assert len(f["details"]["output"]) <= 4000


@pytest.mark.parametrize("target", ["file", "folder"])
def test_world_writable_refused(hma_env, target: str) -> None:  # type: ignore[no-untyped-def]
    path = hma_env.exec_probe("ww", "exit 0")
    os.chmod(path if target == "file" else hma_env.probes_d, 0o777 if target == "folder" else 0o757)
    doc = probe_doc(hma_env, "ww")
    [f] = doc["findings"]
    assert f["code"] == "HMA_PROBE_REFUSED" and "writable by group or others" in f["message"]


def test_not_root_owned_refused(hma_env) -> None:  # type: ignore[no-untyped-def]
    path = hma_env.exec_probe("nobody", "exit 0")
    os.chown(path, 65534, 65534)
    [f] = probe_doc(hma_env, "nobody")["findings"]
    assert f["code"] == "HMA_PROBE_REFUSED" and "uid 65534" in f["message"]
