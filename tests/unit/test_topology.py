"""hma.topology: hostlists, the three file formats, the domain token and the spare plan (pure)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mutate import budget

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
    node = NodeState("node1", "idle", texts=(("extra", "x=1"),))
    assert domain.publish(backend, node, "d.1") == "x=1 hma-domain=d.1"
    assert client.updates == [("node1", {"Extra": "x=1 hma-domain=d.1"})]
    assert (
        domain.publish(
            backend, NodeState("node1", "idle", texts=(("extra", "hma-domain=d.1"),)), "d.1"
        )
        is None
    )
    backend = SlurmBackend({}, "comment", client=client)  # type: ignore[arg-type]
    assert (
        domain.publish(backend, NodeState("node1", "idle", texts=(("extra", "x"),)), "d.1")
        == "hma-domain=d.1"
    )
    assert client.updates[-1] == ("node1", {"Comment": "hma-domain=d.1"})
    assert len(client.updates) == 2


def test_domain_option_check() -> None:
    assert options.domain_problem("us-east.ultra_7") is None
    for bad in ("", "a b", "a,b", "x=y", "é", "a" * 81):
        assert options.domain_problem(bad)


def node(name: str, dom: str, base: str = "idle", **kw: Any) -> NodeState:
    extra = kw.pop("extra", "")
    text = f"{extra} hma-domain={dom}".strip() if dom else extra
    return NodeState(name, base, texts=(("extra", text),), **kw)


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


@pytest.mark.parametrize(
    "extra",
    [
        "hma=unhealthy:GPU_XID_79:none",
        "hma=unhealthy:GPU_XID_79:none,t=abc",
        "hma=unhealthy:GPU_XID_79:none,t=nan",
        "hma=unhealthy:GPU_XID_79:none,j=17\x1b[2J",
        "hma=garbled",
    ],
)
def test_a_spare_whose_label_does_not_read_is_not_healthy(extra: str) -> None:
    """Issue 28: a label that is unhealthy, or that does not read at all, keeps a spare out of
    service (a label may keep a node out, never put it in)."""
    assert spares.choose_spare([node("node18", "a", extra=extra, **SPARE)], "a", "node1") is None
    assert spares.choose_spare([node("node18", "a", **SPARE)], "a", "node1") is not None


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


# Issue 23: domains are text other nodes write; a file Slurm refuses stops slurmctld for good.
TRICKY = ["rack:1", "rack;1", "rack_1", "nodomain-node1", "hma-top", "true", "1.5", "-", "dom0"]
TRICKY += [
    "rack_1-xa575ab90",  # the name rack:1 gets
    "x\u010f\u076f",  # these two: x__ and the same first 8 hex digits of SHA-256 (497aa2a1)
    "x\u0121\u0696",
]


def test_distinct_domains_get_distinct_valid_names() -> None:
    names = conf.block_names(TRICKY)
    assert len(set(names.values())) == len(TRICKY)
    assert names["rack_1"] == "rack_1" and names["dom0"] == "dom0"  # well-formed: kept as is
    assert names["rack:1"] == "rack_1-xa575ab90" != names["rack_1-xa575ab90"]
    assert names["nodomain-node1"] != "nodomain-node1" and names["hma-top"] != "hma-top"
    assert len(names["x\u010f\u076f"]) == len("x__-x") + 64  # their 8 hex digits are the same
    assert conf.block_names(reversed(TRICKY)) == names  # deterministic
    domains = {f"node{i}": d for i, d in enumerate(TRICKY, 1)}
    found, _ = conf.blocks({**domains, "node20": ""})
    for fmt in ("block", "tree", "yaml"):
        assert conf.problems(conf.render(found, fmt, 1), fmt) == []
    assert '      - block: "true"\n' in conf.render(found, "yaml", 1)


def test_problems_read_the_file_back() -> None:
    head = conf.HEADER
    assert conf.problems(head + "BlockName=a Nodes=n[1-2]\nBlockSizes=2\n", "block") == []
    dup = conf.problems(
        head + "BlockName=a Nodes=n1\nBlockName=a Nodes=n2\nBlockSizes=1\n", "block"
    )
    assert dup == ["name 'a' defined 2 times"]
    twice = conf.problems(head + "BlockName=a Nodes=n[1-2]\nBlockName=b Nodes=n2\n", "block")
    assert twice == ["node 'n2' in 'a' and 'b'"]
    assert conf.problems(head + "BlockName=a:b Nodes=n1\n", "block") == [
        "name 'a:b' is not A-Z a-z 0-9 . _ -"
    ]
    assert conf.problems(head + "SwitchName=t Switches=a\n", "tree") == [
        "switch 'a' under 't' is not defined"
    ]
    assert conf.problems(head + "BlockName=a Nodes=n[1-2\n", "block")
    assert conf.problems(head + "BlockName=a Nodes=n1 Extra\n", "block")
    yaml = conf.render([conf.Block("x", "x", ("n1",))], "yaml", 1)
    assert conf.problems(yaml, "yaml") == []
    assert conf.problems(yaml.replace("block: x", "block: true"), "yaml")  # a YAML boolean
    assert conf.expand("login,n05,n[5-6],gpu[001-002,018]") == [
        "login", "n05", "n5", "n6", "gpu001", "gpu002", "gpu018",
    ]  # fmt: skip


def test_command_refuses_a_file_slurm_would_refuse(tmp_path: Path) -> None:
    # Two nodes without a domain whose names sanitise alike: nodomain-a_1 twice.
    nodes = [node("a:1", ""), node("a;1", ""), node("node1", "d"), node("node2", "d")]
    client = Recorder(nodes)
    topo = {"spares_per_domain": 1, "domain_size": None, "reconfigure": True}
    path = tmp_path / "topology.conf"
    path.write_text("previous\n")
    out, err = _Stream(), _Stream()
    for check in (True, False):
        assert command.run(client, topo, path, "block", check, out, err) == command.EX_REFUSED
    assert "would be refused: name 'nodomain-a_1' defined 2 times" in err.text
    assert f"{path} kept, no spare changed, no reconfigure" in err.text
    assert path.read_text() == "previous\n" and client.updates == [] and client.reconfigured == 0


def test_unusable_domains_are_no_domain(tmp_path: Path) -> None:
    nodes = [
        node("node1", "a" * 81),
        node("node2", "a\x07b"),
        node("node3", "d"),
        node("node4", "d"),
    ]
    assert [domain.problem(spares.published(n)) for n in nodes] == [
        "longer than 80 characters", "control characters", None, None,
    ]  # fmt: skip
    assert spares.plan(nodes, 1) == (["node4"], [])
    client, out, err = Recorder(nodes), _Stream(), _Stream()
    topo = {"spares_per_domain": 0, "domain_size": None, "reconfigure": False}
    assert command.run(client, topo, tmp_path / "t.conf", "tree", False, out, err) == 0
    assert "node2 publishes an unusable domain (control characters); in a block" in err.text
    assert "SwitchName=nodomain-node1 Nodes=node1\n" in (tmp_path / "t.conf").read_text()
    assert "\x07" not in err.text + out.text


DOMAIN_TEXT = st.one_of(
    st.sampled_from(TRICKY), st.text(alphabet=":;_a1-.x\u00e9", max_size=6), st.text(max_size=90)
)


@budget(300)
@given(domains=st.lists(DOMAIN_TEXT, max_size=12), fmt=st.sampled_from(["block", "tree", "yaml"]))
def test_any_domains_render_a_file_slurm_accepts(domains: list[str], fmt: str) -> None:
    names = conf.block_names(domains)
    assert len(set(names.values())) == len(names)
    mapping = {f"node{i}": d for i, d in enumerate(domains)}
    found, _ = conf.blocks(mapping)
    assert conf.problems(conf.render(found, fmt, 1), fmt) == []


@budget(150)
@given(domains=st.lists(st.one_of(DOMAIN_TEXT, st.just("")), max_size=8))
def test_command_writes_an_accepted_file_or_refuses_without_writing(domains: list[str]) -> None:
    words = [d if d.split() in ([], [d]) else "x" for d in domains]  # a domain is one word
    nodes = [node(f"n{i}", d) for i, d in enumerate(words)]
    nodes += [node("n:x", ""), node("n;x", "")] if len(domains) % 3 == 0 else []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "topology.conf"
        path.write_text("previous\n")
        client, out, err = Recorder(nodes), _Stream(), _Stream()
        topo = {"spares_per_domain": 1, "domain_size": None, "reconfigure": True}
        rc = command.run(client, topo, path, "tree", False, out, err)
        if rc == command.EX_REFUSED:
            assert (
                path.read_text() == "previous\n" and not client.updates and not client.reconfigured
            )
        else:
            assert rc == 0 and conf.problems(path.read_text(), "tree") == []
