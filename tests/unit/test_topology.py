"""hma.topology: hostlists, the three file formats, the domain token and the spare plan (pure)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hma.cluster.slurm.backend import SlurmBackend
from hma.commands import topology as command
from hma.contracts.cluster import NodeState
from hma.topology import conf, domain, options, spares


def test_compress_hostlists() -> None:
    assert conf.compress([f"node{i}" for i in (3, 1, 2, 10, 12, 11, 7)]) == "node[1-3,7,10-12]"
    assert conf.compress(["gpu001", "gpu002", "gpu018"]) == "gpu[001-002,018]"
    assert conf.compress(["login", "n5", "n05", "n6"]) == "login,n05,n[5-6]"
    assert conf.compress(["a1"]) == "a1"
    assert conf.compress([]) == ""


def two_domains(nodes: int = 36, per: int = 18) -> dict[str, str]:
    return {f"node{i}": f"dom{(i - 1) // per}" for i in range(1, nodes + 1)}


def test_block_form() -> None:
    found, lonely = conf.blocks({**two_domains(), "node37": ""})
    assert lonely == ["node37"]
    text = conf.render(found, "block", conf.block_size(found, None, 1))
    assert text.splitlines()[1:] == [
        "BlockName=dom0 Nodes=node[1-18]",
        "BlockName=dom1 Nodes=node[19-36]",
        "BlockName=nodomain-node37 Nodes=node37",
        "BlockSizes=1",  # slurmctld refuses a block smaller than the base size
    ]
    found, _ = conf.blocks(two_domains())
    assert conf.block_size(found, None, 1) == 17
    assert conf.block_size(found, 18, 0) == 18
    assert conf.block_size(found, 20, 0) == 18  # a domain not full yet: its size


def test_tree_and_yaml_forms() -> None:
    found, _ = conf.blocks(two_domains(4, 2))
    assert conf.render(found, "tree", 2).splitlines()[1:] == [
        "SwitchName=dom0 Nodes=node[1-2]",
        "SwitchName=dom1 Nodes=node[3-4]",
        "SwitchName=hma-top Switches=dom0,dom1",
    ]
    yaml = conf.render(found, "yaml", 2)
    assert (
        "- topology: hma\n  cluster_default: true\n  block:\n    block_sizes:\n      - 2\n" in yaml
    )
    assert "      - block: dom1\n        nodes: node[3-4]\n" in yaml


def test_block_names_are_safe() -> None:
    assert conf.block_name("8c3e61a2-57d4:7/x y") == "8c3e61a2-57d4_7_x_y"


def test_domain_resolution_order() -> None:
    sums = {"gpu": {"domain": "a.1"}, "nvidia_smi": {"domain": "b.2"}}
    assert domain.resolve("us-1", sums) == ("us-1", "config")
    assert domain.resolve(None, sums) == ("a.1", "nvml")
    assert domain.resolve(None, {"gpu": None, "nvidia_smi": {"domain": "b.2"}}) == (
        "b.2",
        "nvidia-smi",
    )
    assert domain.resolve(None, {"gpu": {"error": "x"}}) == ("", "")


def test_domain_token_edits_keep_other_words() -> None:
    text = "rack=7 hma=unhealthy:GPU_LOST:reboot"
    new = domain.update_for(text, "d1.3")
    assert new == "rack=7 hma=unhealthy:GPU_LOST:reboot hma-domain=d1.3"
    assert domain.of(new) == "d1.3"
    assert domain.update_for(new, "d1.3") is None  # published: nothing to write
    assert domain.update_for(new, "") is None  # unknown never removes a published domain
    assert domain.update_for(new, "d2.0") == "rack=7 hma=unhealthy:GPU_LOST:reboot hma-domain=d2.0"


class Recorder:
    """The outermost boundary: records scontrol updates instead of running them."""

    def __init__(self, nodes: list[NodeState] = ()) -> None:  # type: ignore[assignment]
        self.updates: list[tuple[str, dict[str, str]]] = []
        self.node_list = list(nodes)
        self.reconfigured = 0

    def update(self, node: str, **fields: str) -> None:
        self.updates.append((node, fields))

    def nodes(self) -> list[NodeState]:
        return self.node_list

    def reconfigure(self) -> None:
        self.reconfigured += 1


def test_publish_only_when_changed() -> None:
    client = Recorder()
    backend = SlurmBackend({}, "extra", client=client)  # type: ignore[arg-type]
    node = NodeState("node1", "idle", extra="x=1")
    assert domain.publish(backend, node, "d.1") == "x=1 hma-domain=d.1"
    assert client.updates == [("node1", {"Extra": "x=1 hma-domain=d.1"})]
    assert (
        domain.publish(backend, NodeState("node1", "idle", extra="hma-domain=d.1"), "d.1") is None
    )
    backend = SlurmBackend({}, "comment", client=client)  # type: ignore[arg-type]
    assert domain.publish(backend, NodeState("node1", "idle", extra="x"), "d.1") == "hma-domain=d.1"
    assert client.updates[-1] == ("node1", {"Comment": "hma-domain=d.1"})
    assert len(client.updates) == 2


def test_domain_option_check() -> None:
    assert options.domain_problem("us-east.ultra_7") is None
    for bad in ("", "a b", "a,b", "x=y", "é", "a" * 81):
        assert options.domain_problem(bad)


def node(name: str, dom: str, base: str = "idle", **kw: Any) -> NodeState:
    extra = kw.pop("extra", "")
    return NodeState(name, base, extra=f"{extra} hma-domain={dom}".strip() if dom else extra, **kw)


SPARE = {"flags": frozenset({"DRAIN"}), "reason": "hma-spare"}


def test_spare_plan_marks_last_idle_nodes_and_releases_extras() -> None:
    nodes = [node(f"node{i}", "a") for i in range(1, 5)]
    nodes += [node("node5", "b", **SPARE), node("node6", "b", **SPARE), node("node7", "b")]
    nodes += [node("node8", "", base="idle")]
    assert spares.plan(nodes, 1) == (["node4"], ["node5"])
    busy = [node("node1", "a", base="allocated"), node("node2", "a", base="mixed")]
    assert spares.plan(busy, 1) == ([], [])  # never takes a node with jobs
    sick = [node("node1", "a"), node("node2", "a", extra="hma=unhealthy:GPU_LOST:reboot")]
    assert spares.plan(sick, 1) == (["node1"], [])
    assert spares.plan(nodes, 2) == (["node3", "node4"], [])


def test_choose_spare_same_domain_healthy() -> None:
    nodes = [
        node("node1", "a"),
        node("node18", "a", **SPARE),
        node("node17", "a", flags=frozenset({"DRAIN", "NOT_RESPONDING"}), reason="hma-spare"),
        node("node36", "b", **SPARE),
    ]
    assert spares.choose_spare(nodes, "a", "node1").name == "node18"  # type: ignore[union-attr]
    assert spares.choose_spare(nodes, "b", "node1").name == "node36"  # type: ignore[union-attr]
    assert spares.choose_spare(nodes, "c", "node1") is None
    assert spares.choose_spare(nodes, "", "node1") is None
    admin = [node("node2", "a", flags=frozenset({"DRAIN"}), reason="broken fan")]
    assert spares.choose_spare(admin, "a", "node1") is None  # an admin's drain is no spare


def test_admin_reason_starting_like_the_spare_marker_is_no_spare() -> None:
    """Issue 23: only hma's exact reason on a drained node is a spare, never an admin's text."""
    admin = {"flags": frozenset({"DRAIN"}), "reason": "hma-spare-broken: fan, do not resume"}
    nodes = [node("node1", "a"), node("node2", "a", **admin), node("node3", "a", **SPARE)]
    assert spares.plan(nodes, 0) == ([], ["node3"])  # the admin's drain is not resumed
    assert spares.plan(nodes, 1) == ([], [])
    assert spares.choose_spare(nodes[:2], "a", "node1") is None
    undrained = [node("node4", "a", reason="hma-spare")]  # Slurm keeps a resumed node's reason
    assert spares.plan(undrained, 0) == ([], [])
    assert spares.choose_spare(undrained, "a", "node1") is None


def test_command_check_then_write(tmp_path: Path) -> None:
    nodes = [node(f"node{i}", "a") for i in range(1, 4)] + [node("node4", "")]
    client = Recorder(nodes)
    topo = {"spares_per_domain": 1, "domain_size": None, "reconfigure": True}
    path = tmp_path / "topology.conf"
    out, err = _Stream(), _Stream()
    assert command.run(client, topo, path, "block", True, out, err) == command.EX_CHANGES
    assert "+BlockName=a Nodes=node[1-3]" in out.text and "would make node3 a spare" in out.text
    assert "node4 publishes no domain" in err.text and "BlockSizes lowered to 1" in err.text
    assert not path.exists() and client.updates == [] and client.reconfigured == 0
    assert command.run(client, topo, path, "block", False, out, err) == 0
    assert client.updates == [("node3", {"State": "DRAIN", "Reason": "hma-spare"})]
    assert "BlockSizes=1\n" in path.read_text() and client.reconfigured == 1
    assert command.run(client, topo, path, "block", False, out, err) == 0  # unchanged
    assert client.reconfigured == 1


class _Stream:
    def __init__(self) -> None:
        self.text = ""

    def write(self, s: str) -> None:
        self.text += s

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)


def test_target_file_next_to_slurm_conf(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_CONF", raising=False)
    assert command.target({}, {"conf": "/x/slurm.conf"}, "yaml") == Path("/x/topology.yaml")
    assert command.target({"file": "/y/t.conf"}, {}, "block") == Path("/y/t.conf")
    assert command.target({}, {}, "tree") == Path("/etc/slurm/topology.conf")


def test_status_shows_the_domain() -> None:
    from hma.commands import status

    doc = {"node": "node1", "severity": "ok", "topology": {"domain": "d.7", "source": "nvml"}}
    assert "NVLink domain d.7 (nvml)" in status.render(doc, now=0.0)
    assert "NVLink domain" not in status.render({**doc, "topology": {"domain": ""}}, now=0.0)
