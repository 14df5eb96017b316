"""Slurm node state parsing: sinfo --json objects and scontrol -o show node lines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hma.adapters.command import CommandResult
from hma.remediation.slurm import (
    NodeState,
    SlurmClient,
    SlurmError,
    node_from_json,
    parse_show_node,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"


def state(base: str, *flags: str, reason: str = "") -> NodeState:
    return NodeState("n1", base, frozenset(flags), reason)


def test_scontrol_show_node_free_text_fields() -> None:
    nodes = parse_show_node((FIXTURES / "scontrol-show-node-22.05.txt").read_text())
    assert [n.name for n in nodes] == ["node1", "node2"]
    one = nodes[0]
    assert one.base == "idle" and one.flags == {"DRAIN"}
    assert one.reason == "HMA: a b Extra=x" and one.reason_user == "root"
    assert one.comment == "my comment Reason=z"
    assert one.extra == "foo hma=unhealthy:X bar"
    assert one.partitions == ("batch",) and one.owned and one.drained
    assert nodes[1].reason == "" and not nodes[1].out_of_service


def test_sinfo_json_node_2205_and_newer_shapes() -> None:
    old = node_from_json(
        {
            "name": "g1",
            "state": "allocated",
            "state_flags": ["DRAIN"],
            "reason": "HMA: X y",
            "reason_changed_at": 1795947456,
            "partitions": ["gpu"],
            "extra": "e",
            "comment": "",
        }
    )
    assert old.draining and not old.drained and old.owned and old.reason_time == 1795947456
    new = node_from_json(
        {
            "name": "g1",
            "state": ["IDLE", "DRAIN"],
            "reason": "x",
            "reason_changed_at": {"set": True, "number": 5},
        }
    )
    assert new.drained and new.reason_time == 5 and not new.owned


def test_state_classification() -> None:
    assert state("mixed", "DRAIN").draining
    assert state("idle", "DRAIN").drained
    assert state("idle", "DRAIN", "COMPLETING").draining
    assert state("allocated", "FAIL").label_text == "failing"
    assert state("idle", "FAIL").label_text == "fail"
    assert state("down", "DRAIN", "NOT_RESPONDING").label_text == "drained*"
    assert state("idle", "DRAIN", "REBOOT_REQUESTED").label_text == "drained@"
    assert state("down", "DRAIN", "REBOOT_ISSUED").reboot_pending
    assert state("idle", "MAINTENANCE").maintenance
    assert state("down").out_of_service and state("down").down
    assert state("idle", "DRAIN", reason="HMA: GPU_XID_79 gpu:0000:3b:00 : reboot issued").owned
    assert not state("idle", "DRAIN", reason="Kill task failed").owned


def test_unknown_states_are_not_understood() -> None:
    assert state("idle").understood
    assert not state("weird").understood
    assert not state("idle", "SOMETHING_NEW").understood


class CannedRunner:
    """Serves one canned output per tool (the outermost boundary)."""

    def __init__(self, outputs: dict[str, tuple[int, str, str]]) -> None:
        self.outputs = outputs
        self.calls: list[list[str]] = []

    def run(self, argv: Any, timeout: float, env: Any = None, stdin: Any = None) -> CommandResult:
        self.calls.append(list(argv))
        rc, out, err = self.outputs[Path(argv[0]).name]
        return CommandResult(tuple(argv), rc, out, err, 0.01)


def test_node_name_from_hostname_and_json_fallback() -> None:
    show = (FIXTURES / "scontrol-show-node-22.05.txt").read_text()
    show = show.replace("NodeHostName=localhost", "NodeHostName=gpu-a", 1)
    runner = CannedRunner(
        {"scontrol": (0, show, ""), "sinfo": (1, "", "sinfo: unrecognized option '--json'")}
    )
    client = SlurmClient(runner=runner)  # type: ignore[arg-type]
    assert client.find_node_name(["gpu-a"]) == "node1"
    assert client.find_node_name(["nope"]) is None
    assert client.node("node1").drained  # sinfo --json unsupported: scontrol -o show node
    assert client.use_json is False
    env = SlurmClient(conf="/etc/x/slurm.conf", path="/opt/slurm/bin").env()
    assert env["SLURM_CONF"] == "/etc/x/slurm.conf" and env["PATH"] == "/opt/slurm/bin"


def test_sinfo_json_error_list_is_an_error() -> None:
    runner = CannedRunner(
        {"sinfo": (0, '{"errors": [{"error": "Unspecified error"}], ' '"nodes": []}', "")}
    )
    client = SlurmClient(runner=runner)  # type: ignore[arg-type]
    with pytest.raises(SlurmError, match="slurmctld"):
        client.nodes()
