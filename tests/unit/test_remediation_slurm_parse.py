"""Slurm output parsing (recorded sinfo -O / squeue -O / listpids) and the client's queries."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hma.adapters.command import CommandResult
from hma.cluster.slurm.backend import SlurmBackend
from hma.cluster.slurm.client import OUTPUT_CAP, SlurmClient
from hma.cluster.slurm.parse import SEP, SlurmError, parse_listpids, parse_sinfo, parse_squeue
from hma.contracts.cluster import NodeState

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm" / "autoresume"


def recorded(name: str) -> str:
    return (FIXTURES / name).read_text()


def state(base: str, *flags: str, reason: str = "") -> NodeState:
    return NodeState("n1", base, frozenset(flags), reason)


def test_sinfo_free_text_fields_keep_spaces_and_key_like_text() -> None:
    nodes = {n.name: n for n in parse_sinfo(recorded("sinfo-faulty.txt"))}
    one = nodes["node1"]
    assert one.base == "allocated" and one.flags == {"DRAIN"} and one.draining and one.owned
    assert one.reason == "HMA: GPU_XID_79 gpu:0000:3b:00" and one.reason_user == "root"
    assert one.reason_time > 0 and one.partitions == ("batch",) and one.address == "127.0.0.1"
    assert (
        one.field("extra").startswith("hma=unhealthy:GPU_XID_79:replace,")
        and one.field("comment") == ""
    )
    assert (
        nodes["node2"].field("extra")
        == "rack=12 hma=unhealthy:GPU_XID_79:reboot,c=gpu:0000:3b:00,h=breaker"
    )
    assert nodes["node2"].reason == "" and not nodes["node2"].out_of_service
    assert nodes["node3"].fail and nodes["node3"].reason == "Action:Replace"
    four = nodes["node4"]  # an admin's drain whose comment looks like more fields
    assert four.reason == "maintenance window [ops]" and four.drained and not four.owned
    assert four.field("comment") == "ticket 7 Extra=none Reason=x" and four.field("extra") == ""
    healthy = parse_sinfo(recorded("sinfo-healthy.txt"))
    assert [n.label_text for n in healthy] == ["idle"] * 4
    assert all(n.reason == "" and n.reason_user == "" and n.reason_time == 0 for n in healthy)


def test_sinfo_lists_a_node_once_per_partition_and_cut_lines_are_errors() -> None:
    line = recorded("sinfo-healthy.txt").splitlines()[0]
    both = parse_sinfo(line + "\n" + line.replace("batch*", "gpu") + "\n")
    assert len(both) == 1 and both[0].partitions == ("batch", "gpu")
    with pytest.raises(SlurmError, match="unreadable"):
        parse_sinfo(SEP.join(line.split(SEP)[:4]))


def test_squeue_and_listpids_recorded() -> None:
    (running,) = parse_squeue(recorded("squeue-running.txt"))
    assert (running.id, running.user, running.state, running.nodes) == (
        "1",
        "root",
        "RUNNING",
        "node[1-2]",
    )
    assert running.note == "my run hma-resume=1,a=0" and running.requeue and running.batch
    (requeued,) = parse_squeue(recorded("squeue-requeued.txt"))
    assert requeued.state == "PENDING" and requeued.reason == "BeginTime"
    assert requeued.nodes == "" and requeued.restarts == 1 and requeued.eligible_time > 0
    assert parse_listpids(recorded("listpids-node1.txt")) == {"1": ("0", "batch")}


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


def test_hyperpod_recovery_is_the_slurm_backends_to_read() -> None:
    """HyperPod's FAIL reasons are a recovery under way (what the breaker counts with hma's
    label) and tell the backend that its reboot or replace is in effect already."""
    nodes = {n.name: n for n in parse_sinfo(recorded("sinfo-faulty.txt"))}
    failed = nodes["node3"]
    assert failed.recovery == "replace" and nodes["node1"].recovery == ""
    assert state("idle", "FAIL", reason="Action:Replace").recovery == ""  # the contract's state
    backend = SlurmBackend({}, "extra", SlurmClient())
    assert backend.replacing(failed, "hyperpod") == "already State=FAIL Reason=Action:Replace"
    rebooting = replace(failed, reason="Action:Reboot")
    assert rebooting.recovery == "reboot" and backend.replacing(rebooting, "hyperpod") == ""
    assert backend.rebooting(rebooting, "hyperpod") == "already State=FAIL Reason=Action:Reboot"
    assert backend.rebooting(rebooting, "scontrol") == ""
    requested = state("idle", "DRAIN", "REBOOT_REQUESTED")
    assert backend.rebooting(requested, "scontrol") == "reboot already requested"


class CannedRunner:
    """Serves one canned output per tool (the outermost boundary)."""

    def __init__(self, outputs: dict[str, Any], truncated: bool = False) -> None:
        self.outputs = outputs
        self.truncated = truncated
        self.calls: list[list[str]] = []

    def run(self, argv: Any, timeout: float, env: Any = None, stdin: Any = None) -> CommandResult:
        self.calls.append(list(argv))
        answer = self.outputs[Path(argv[0]).name]
        rc, out, err = answer(argv) if callable(answer) else answer
        return CommandResult(tuple(argv), rc, out, err, 0.01, truncated=self.truncated)


def test_node_is_a_single_node_query_and_the_name_comes_from_the_host() -> None:
    table = recorded("sinfo-faulty.txt").replace("localhost", "gpu-a", 1)
    runner = CannedRunner({"sinfo": (0, table, "")})
    client = SlurmClient(runner=runner)  # type: ignore[arg-type]
    assert client.find_node_name(["gpu-a"]) == "node1"  # no node gpu-a: the table, once
    assert runner.calls[-1][-2:] != ["-n", "gpu-a"] and "-n" not in runner.calls[-1]
    assert client.find_node_name(["nope"]) is None
    assert client.node("node4").drained
    assert runner.calls[-1][-2:] == ["-n", "node4"]  # one name: slurmctld reads one node
    with pytest.raises(SlurmError, match="not found"):
        client.node("node9")
    env = SlurmClient(conf="/etc/x/slurm.conf", path="/opt/slurm/bin").env()
    assert env["SLURM_CONF"] == "/etc/x/slurm.conf" and env["PATH"] == "/opt/slurm/bin"
    assert SlurmClient().runner.output_cap == OUTPUT_CAP >= 64 << 20


def test_node_named_as_the_host_is_found_with_one_single_node_read() -> None:
    line = recorded("sinfo-healthy.txt").splitlines()[0].replace("localhost", "node1") + "\n"
    runner = CannedRunner({"sinfo": (0, line, "")})
    client = SlurmClient(runner=runner)  # type: ignore[arg-type]
    assert client.find_node_name(["node1"]) == "node1"
    assert len(runner.calls) == 1 and runner.calls[0][-2:] == ["-n", "node1"]


def test_cut_output_is_an_error_never_parsed() -> None:
    runner = CannedRunner({"sinfo": (0, recorded("sinfo-faulty.txt"), "")}, truncated=True)
    client = SlurmClient(runner=runner)  # type: ignore[arg-type]
    with pytest.raises(SlurmError, match="not read"):
        client.node("node1")


def test_breaker_view_is_one_filtered_sinfo_and_the_partition_size() -> None:
    held = "".join(
        ln for ln in recorded("sinfo-faulty.txt").splitlines(True) if "drain" in ln or "fail" in ln
    )
    part = "PartitionName=batch AllowGroups=ALL Nodes=node[1-4],ph[1-2000] TotalNodes=2004\n"
    names = "\n".join([f"node{i}" for i in range(1, 5)] + [f"ph{i}" for i in range(1, 2001)])

    def scontrol(argv: list[str]) -> tuple[int, str, str]:
        return (0, names if "hostnames" in argv else part, "")

    runner = CannedRunner({"sinfo": (0, held, ""), "scontrol": scontrol})
    client = SlurmClient(runner=runner)  # type: ignore[arg-type]
    me = NodeState("node2", "idle", partitions=("batch",))
    nodes, total = client.held_view(me)
    assert [n.name for n in nodes] == ["node1", "node3", "node4", "node2"] and total == 2004
    assert runner.calls[0][-4:] == ["-p", "batch", "-t", "drain,fail,down"]
    assert runner.calls[1][1:] == ["-o", "show", "partition"]
    assert runner.calls[2][1:] == ["show", "hostnames", "node[1-4],ph[1-2000]"]


def test_slurm_24_11_prints_the_same_fields() -> None:
    base = FIXTURES.parent
    nodes = {n.name: n for n in parse_sinfo((base / "sinfo-24.11.txt").read_text())}
    assert nodes["node1"].base == "allocated" and nodes["node1"].reason == ""
    two = nodes["node2"]
    assert two.drained and two.reason == "maint window [ops]" and two.reason_user == "root"
    assert two.field("comment") == "ticket 7 Extra=none" and two.field("extra") == "hma=x y"
    (job,) = parse_squeue((base / "squeue-24.11.txt").read_text())
    assert (job.id, job.state, job.nodes, job.note) == ("1", "RUNNING", "node1", "my c Extra=x")
