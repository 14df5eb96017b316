"""hma's Slurm parsers on real outputs of both tested Slurm versions (22.05 and 24.11), captured
in the same cluster state by tests/fixtures/slurm/capture.py (see each file's .src.txt)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hma.adapters.command import CommandResult
from hma.cluster.slurm.client import SlurmClient
from hma.cluster.slurm.parse import parse_sinfo, parse_squeue

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
VERSIONS = ("22.05", "24.11")


def capture(version: str, name: str) -> str:
    return (FIXTURES / version / name).read_text()


class Canned:
    """Serves the captured output of each tool (the outermost boundary), recording calls."""

    def __init__(self, version: str) -> None:
        self.outputs = {
            "sinfo": capture(version, "sinfo-nodes.txt"),
            "squeue": capture(version, "squeue-jobs.txt"),
        }
        self.calls: list[tuple[str, ...]] = []

    def run(self, argv: Any, timeout: float, env: Any = None, stdin: Any = None) -> CommandResult:
        self.calls.append(tuple(argv))
        return CommandResult(tuple(argv), 0, self.outputs[Path(argv[0]).name], "", 0.01)


@pytest.mark.parametrize("version", VERSIONS)
def test_sinfo_fields_give_the_captured_state(version: str) -> None:
    nodes = {n.name: n for n in parse_sinfo(capture(version, "sinfo-nodes.txt"))}
    assert sorted(nodes) == ["node1", "node2", "node3", "node4"]
    one, two, three, four = (nodes[f"node{i}"] for i in range(1, 5))
    assert one.drained and one.owned and one.reason == "HMA: a b Extra=x"
    assert one.reason_user == "root" and one.reason_time > 0
    assert (
        one.field("comment") == "my comment Reason=z"
        and one.field("extra") == "foo hma=unhealthy:X bar"
    )
    assert two.draining and two.reason == "HMA: GPU_XID_79 gpu:0000:3b:00"
    assert two.field("extra") == "hma=draining:GPU_XID_79" and two.field("comment") == ""
    assert three.down and not three.owned and three.reason == "disk swap by bob"
    assert four.base == "idle" and not four.flags and not four.out_of_service
    # drained by hma, then resumed: 22.05 clears the reason, 24.11 keeps it; not hma's either way
    assert four.reason == ("" if version == "22.05" else "HMA: GPU_LOST gpu:1")
    assert not four.owned
    assert all(n.understood and n.partitions == ("batch",) for n in nodes.values())


@pytest.mark.parametrize("version", VERSIONS)
def test_client_reads_one_node_with_a_single_node_query(version: str) -> None:
    runner = Canned(version)
    client = SlurmClient(runner=runner)  # type: ignore[arg-type]
    node = client.node("node2")
    assert node.draining and node.reason == "HMA: GPU_XID_79 gpu:0000:3b:00"
    (argv,) = runner.calls
    assert argv[0] == "sinfo" and argv[argv.index("-n") + 1] == "node2"


@pytest.mark.parametrize("version", VERSIONS)
def test_squeue_fields_on_both_versions(version: str) -> None:
    jobs = {j.id: j for j in parse_squeue(capture(version, "squeue-jobs.txt"))}
    running, held = jobs["1"], jobs["2"]
    assert (running.state, running.nodes) == ("RUNNING", "node2")
    assert running.note == "train run 7" and running.user == "root"
    assert running.requeue and running.batch and running.restarts == 0
    assert running.eligible_time > 1.7e9
    assert (held.state, held.reason, held.nodes, held.eligible_time) == (
        "PENDING",
        "JobHeldUser",
        "",
        0.0,
    )


@pytest.mark.parametrize("version", VERSIONS)
def test_scontrol_show_job_names_the_node_and_comment(version: str) -> None:
    """The text the auto-resume test compares `hma job-env` with: same keys on both versions."""
    lines = capture(version, "scontrol-show-job.txt").splitlines()
    running = next(line for line in lines if line.startswith("JobId=1 "))
    for token in (" JobState=RUNNING ", " NodeList=node2 ", " Comment=train run 7 ", " Requeue=1 "):
        assert token in f" {running} "
