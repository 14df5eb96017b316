"""hma's Slurm parsers on real outputs of both tested Slurm versions (22.05 and 24.11), captured
in the same cluster state by tests/fixtures/slurm/capture.py (see each file's .src.txt)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hma.adapters.command import CommandResult
from hma.remediation.slurm import SlurmClient, job_from_json, node_from_json, parse_show_node

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
VERSIONS = ("22.05", "24.11")


def capture(version: str, name: str) -> str:
    return (FIXTURES / version / name).read_text()


class Canned:
    """Serves the captured output of each tool (the outermost boundary), recording calls."""

    def __init__(self, version: str) -> None:
        self.outputs = {
            "sinfo": capture(version, "sinfo.json"),
            "scontrol": capture(version, "scontrol-show-node.txt"),
            "squeue": capture(version, "squeue.json"),
        }
        self.calls: list[str] = []

    def run(self, argv: Any, timeout: float, env: Any = None, stdin: Any = None) -> CommandResult:
        tool = Path(argv[0]).name
        self.calls.append(tool)
        return CommandResult(tuple(argv), 0, self.outputs[tool], "", 0.01)


def facts(node: Any) -> tuple[Any, ...]:
    return (node.base, node.flags, node.reason, node.comment, node.extra, node.partitions)


@pytest.mark.parametrize("version", VERSIONS)
def test_scontrol_show_node_gives_the_captured_state(version: str) -> None:
    nodes = {n.name: n for n in parse_show_node(capture(version, "scontrol-show-node.txt"))}
    assert sorted(nodes) == ["node1", "node2", "node3", "node4"]
    one, two, three, four = (nodes[f"node{i}"] for i in range(1, 5))
    assert one.drained and one.owned and one.reason == "HMA: a b Extra=x"
    assert one.reason_user == "root" and one.reason_time > 0
    assert one.comment == "my comment Reason=z" and one.extra == "foo hma=unhealthy:X bar"
    assert two.draining and two.reason == "HMA: GPU_XID_79 gpu:0000:3b:00"
    assert two.extra == "hma=draining:GPU_XID_79" and two.comment == ""
    assert three.down and not three.owned and three.reason == "disk swap by bob"
    assert four.base == "idle" and not four.flags and not four.out_of_service
    # drained by hma, then resumed: 22.05 clears the reason, 24.11 keeps it; not hma's either way
    assert four.reason == ("" if version == "22.05" else "HMA: GPU_LOST gpu:1")
    assert not four.owned and four.label_text == "idle"
    assert all(n.understood and n.partitions == ("batch",) for n in nodes.values())


def test_sinfo_json_2205_agrees_with_scontrol() -> None:
    items = json.loads(capture("22.05", "sinfo.json"))["nodes"]
    from_json = {i["name"]: facts(node_from_json(i)) for i in items}
    text = parse_show_node(capture("22.05", "scontrol-show-node.txt"))
    assert from_json == {n.name: facts(n) for n in text}


@pytest.mark.parametrize("version", VERSIONS)
def test_client_reads_nodes_on_both_versions(version: str) -> None:
    """22.05: from sinfo --json. 24.11's sinfo --json has node sets, no reasons: scontrol,
    and sinfo is not asked again."""
    runner = Canned(version)
    client = SlurmClient(runner=runner)  # type: ignore[arg-type]
    first = {n.name: facts(n) for n in client.nodes()}
    again = client.node("node2")
    expected = {n.name: facts(n) for n in parse_show_node(runner.outputs["scontrol"])}
    assert first == expected and facts(again) == expected["node2"]
    if version == "22.05":
        assert client.use_json is True and runner.calls == ["sinfo", "sinfo"]
    else:
        assert client.use_json is False and runner.calls == ["sinfo", "scontrol", "scontrol"]


@pytest.mark.parametrize("version", VERSIONS)
def test_squeue_json_jobs_on_both_versions(version: str) -> None:
    client = SlurmClient(runner=Canned(version))  # type: ignore[arg-type]
    running, held = client.job_infos(["1", "2"])
    assert (running.id, running.state, running.nodes) == ("1", "RUNNING", "node2")
    assert running.comment == "train run 7" and running.user == "root"
    assert running.requeue and running.batch and running.restarts == 0
    assert running.eligible_time > 1.7e9
    assert (held.state, held.reason, held.nodes, held.eligible_time) == (
        "PENDING",
        "JobHeldUser",
        "",
        0.0,
    )


@pytest.mark.parametrize("version", VERSIONS)
def test_squeue_json_shape_differs_as_recorded(version: str) -> None:
    """What the parser must absorb: 24.11 gives job_state as a list and times as
    {"set", "infinite", "number"}; 22.05 gives plain values."""
    item = json.loads(capture(version, "squeue.json"))["jobs"][0]
    listed = isinstance(item["job_state"], list)
    assert listed == (version == "24.11")
    assert isinstance(item["eligible_time"], dict) == (version == "24.11")
    assert job_from_json(item).state == "RUNNING"


@pytest.mark.parametrize("version", VERSIONS)
def test_scontrol_show_job_names_the_node_and_comment(version: str) -> None:
    """The text the auto-resume test compares `hma job-env` with: same keys on both versions."""
    lines = capture(version, "scontrol-show-job.txt").splitlines()
    running = next(line for line in lines if line.startswith("JobId=1 "))
    for token in (" JobState=RUNNING ", " NodeList=node2 ", " Comment=train run 7 ", " Requeue=1 "):
        assert token in f" {running} "
