"""The example hooks of `hma watch` (docs/examples/watch-*): the command each sends, run once per
action id, refused input (a stand-in ipmitool and aws on PATH record their argv)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
STANDIN = (
    '#!{python}\nimport json, sys\nopen({log!r}, "a").write(json.dumps(sys.argv[1:]) + "\\n")\n'
)


@pytest.fixture
def tools(tmp_path: Path) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in ("ipmitool", "aws"):
        tool = folder / name
        tool.write_text(STANDIN.format(python=sys.executable, log=str(tmp_path / "calls")))
        tool.chmod(0o755)
    return tmp_path


def run(hook: str, tmp: Path, **env: str) -> subprocess.CompletedProcess:
    environ = {
        "PATH": f"{tmp / 'bin'}:/usr/bin:/bin",
        "HMA_HOOK_DONE_DIR": str(tmp / "done"),
        "HMA_INSTANCE_MAP": str(tmp / "instances.json"),
        **env,
    }
    return subprocess.run(
        [str(EXAMPLES / hook)], env=environ, capture_output=True, text=True, timeout=60, check=False
    )


def calls(tmp: Path) -> list[list[str]]:
    path = tmp / "calls"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_ipmi_hook_power_cycles_once_per_action_id(tools: Path) -> None:
    env = {"HMA_NODE": "node7", "HMA_ACTION": "reboot", "HMA_ACTION_ID": "watch-reboot-node7-1"}
    assert run("watch-ipmi-power-cycle.sh", tools, **env).returncode == 0
    assert run("watch-ipmi-power-cycle.sh", tools, **env).returncode == 0  # a retry: nothing sent
    [argv] = calls(tools)
    assert argv[:4] == ["-I", "lanplus", "-H", "node7-bmc"] and argv[-3:] == [
        "chassis",
        "power",
        "cycle",
    ]
    bad = run("watch-ipmi-power-cycle.sh", tools, **{**env, "HMA_NODE": "x;rm -rf /"})
    assert bad.returncode == 2 and len(calls(tools)) == 1


def test_aws_hook_reboots_and_replaces_once_per_action_id(tools: Path) -> None:
    (tools / "instances.json").write_text(json.dumps({"node7": "i-0123456789abcdef0"}))
    env = {"HMA_NODE": "node7", "HMA_ACTION": "reboot", "HMA_ACTION_ID": "a1"}
    assert run("watch-aws-reboot.py", tools, **env).returncode == 0
    assert run("watch-aws-reboot.py", tools, **env).returncode == 0
    replace = {**env, "HMA_ACTION": "replace", "HMA_ACTION_ID": "a2", "HMA_HYPERPOD_CLUSTER": "c"}
    assert run("watch-aws-reboot.py", tools, **replace).returncode == 0
    assert calls(tools) == [
        ["ec2", "reboot-instances", "--instance-ids", "i-0123456789abcdef0"],
        [
            "sagemaker",
            "batch-replace-cluster-nodes",
            "--cluster-name",
            "c",
            "--node-ids",
            "i-0123456789abcdef0",
        ],
    ]
    unknown = {**env, "HMA_NODE": "node8", "HMA_ACTION_ID": "a3"}
    assert run("watch-aws-reboot.py", tools, **unknown).returncode == 2
