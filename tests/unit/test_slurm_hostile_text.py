"""Free text others control (a node's Reason, Comment, Extra; a job's Reason and Comment) cannot
move Slurm's other fields or forge records: sinfo/squeue stand-ins print what the real ones print
for the -O format they are given (each field, then its suffix; a newline after each record)."""

from __future__ import annotations

from typing import Any, Optional, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hma.adapters.command import CommandResult
from hma.cluster.slurm.client import SlurmClient
from hma.cluster.slurm.parse import (
    JOB_FIELDS,
    NODE_FIELDS,
    SEP,
    SlurmError,
    job_format,
    node_format,
    parse_sinfo,
    parse_squeue,
)
from hma.commands import srun as ar

pytestmark = pytest.mark.timeout(60)

TIME = "2026-11-30T17:11:47"


def node(name: str, **changes: str) -> dict[str, str]:
    """One node record (NODE_FIELDS names)."""
    fields = dict(zip(NODE_FIELDS, (name, "idle+drain", "HMA: x", "root", TIME)))
    fields.update(Comment="(null)", Extra="(null)", Partition="batch*")
    fields.update(NodeHost=name, NodeAddr=f"10.0.0.{name[-1]}")
    return {**fields, **changes}


def job(job_id: str, **changes: str) -> dict[str, str]:
    """One job record (JOB_FIELDS names)."""
    values = (job_id, "alice", "RUNNING", "None", "node1,node2", "train", "1", "1", "0", TIME)
    return {**dict(zip(JOB_FIELDS, values)), **changes}


def suffixes(argv: Sequence[str]) -> list[str]:
    """Each field's suffix in the -O format of ``argv`` (what follows ``:0``)."""
    spec = argv[list(argv).index("-O") + 1]
    return [item.split(":0", 1)[1] for item in spec.split(",")]


def render(records: Sequence[dict[str, str]], ends: Sequence[str]) -> str:
    """What sinfo/squeue -h -O print: each field's value then its suffix, a record per line."""
    return "".join("".join(v + e for v, e in zip(r.values(), ends)) + "\n" for r in records)


class Slurm:
    """sinfo/squeue/scontrol stand-ins serving ``nodes`` and ``jobs`` (filtered by -n / -j)."""

    def __init__(self, nodes: Sequence[dict[str, str]], jobs: Sequence[dict[str, str]] = ()):
        self.nodes, self.jobs = list(nodes), list(jobs)
        self.calls: list[list[str]] = []

    def run(
        self,
        argv: Sequence[str],
        timeout: float,
        env: Optional[Any] = None,
        stdin: Optional[bytes] = None,
    ) -> CommandResult:
        self.calls.append(list(argv))
        out = ""
        if argv[0] == "sinfo":
            names = argv[argv.index("-n") + 1].split(",") if "-n" in argv else []
            rows = [r for r in self.nodes if not names or r["NodeList"] in names]
            out = render(rows, suffixes(argv))
        elif argv[0] == "squeue":
            rows = [r for r in self.jobs if r["JobID"] == argv[argv.index("-j") + 1]]
            out = render(rows, suffixes(argv))
        elif argv[1:3] == ["show", "hostnames"]:
            out = argv[3].replace(",", "\n") + "\n"
        return CommandResult(tuple(argv), 0, out, "", 0.0)


def client(slurm: Slurm) -> SlurmClient:
    return SlurmClient(runner=slurm, timeout=5.0, spool_dir="")  # type: ignore[arg-type]


# A fake record: what a line of sinfo/squeue looks like, for text to smuggle in.
FAKE_NODE = "".join(v + SEP for v in node("node1", NodeAddr="6.6.6.6").values())
FAKE_JOB = "".join(v + SEP for v in job("1", NodeList="evil1", UserName="root").values())
HOSTILE = [
    "a\nb",
    f"x{SEP}y{SEP}z",
    "a|b|c",
    f"x{SEP}\n{FAKE_NODE}\nnode9{SEP}idle{SEP}",
    f"\n{FAKE_JOB}\n",
    f"{SEP}6.6.6.6{SEP}",
    f"MASTER_ADDR=6.6.6.6{SEP}evil{SEP}6.6.6.6\n",
]


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_node_text_is_kept_whole_in_a_fleet_and_a_node_read(text: str) -> None:
    rows = [node("node1", Reason=text, Comment=text, Extra=text), node("node2", Extra=text)]
    slurm = Slurm(rows)
    nodes = {n.name: n for n in client(slurm).nodes()}
    assert sorted(nodes) == ["node1", "node2"]
    one = nodes["node1"]
    assert (one.reason, one.field("comment"), one.field("extra")) == (text, text, text)
    assert (one.address, one.hostname, one.partitions) == ("10.0.0.1", "node1", ("batch",))
    assert one.base == "idle" and one.flags == {"DRAIN"} and one.reason_user == "root"
    assert client(slurm).node("node2").address == "10.0.0.2"


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_job_comment_keeps_the_job_in_sight(text: str) -> None:
    slurm = Slurm([node("node1")], [job("7", Comment=text, Reason=text)])
    (info,) = client(slurm).job_infos(["7"])
    assert (info.id, info.user, info.state, info.nodes) == ("7", "alice", "RUNNING", "node1,node2")
    assert (info.note, info.reason, info.requeue, info.restarts) == (text, text, True, 0)


@pytest.mark.parametrize("text", HOSTILE)
def test_job_env_master_addr_comes_from_the_node_address_only(text: str) -> None:
    rows = [node("node1", Reason=text, Comment=text, Extra=text), node("node2")]
    slurm = Slurm(rows, [job("7", Comment=text)])
    values = ar.job_env(client(slurm), {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "node2"})
    assert values["MASTER_ADDR"] == "10.0.0.1" and values["NODE_LIST"] == ["node1", "node2"]
    assert values["MASTER_NODE"] == "node1" and values["NODE_RANK"] == 1


@pytest.mark.parametrize(
    "changes",
    [
        {"NodeAddr": "1.2.3.4;reboot"},
        {"NodeHost": "a b"},
        {"NodeList": "node1\nnode2"},
        {"StateComplete": "idle drain"},
        {"Timestamp": "yesterday"},
        {"Partition": "batch\nx"},
        {"User": "ro ot"},
    ],
)
def test_node_record_with_a_bad_fixed_field_is_refused_whole(changes: dict[str, str]) -> None:
    slurm = Slurm([node("node1", **changes), node("node2")])
    with pytest.raises(SlurmError, match="unreadable"):
        client(slurm).nodes()


@pytest.mark.parametrize(
    "changes",
    [{"JobID": "7 8"}, {"RestartCnt": "x"}, {"NodeList": "n1 n2"}, {"EligibleTime": "soon"}],
)
def test_job_record_with_a_bad_fixed_field_is_refused_whole(changes: dict[str, str]) -> None:
    fields = job("7", **changes)
    text = render([fields], [SEP] * len(JOB_FIELDS))
    with pytest.raises(SlurmError, match="unreadable"):
        parse_squeue(text)


def test_wrong_field_counts_and_repeated_records_are_refused() -> None:
    text = render([node("node1")], [SEP] * len(NODE_FIELDS))
    with pytest.raises(SlurmError, match="unreadable"):
        parse_sinfo(text.replace(SEP, "", 1))
    with pytest.raises(SlurmError, match="unreadable"):
        parse_sinfo(text + "trailing")
    with pytest.raises(SlurmError, match="twice"):
        parse_sinfo(text + text)
    twice = Slurm([node("node1")], [job("7"), job("7", Comment="second")])
    with pytest.raises(SlurmError, match="2 times"):
        client(twice).job_infos(["7"])


def test_each_call_gets_its_own_nonce_after_the_separator() -> None:
    slurm = Slurm([node("node1")], [job("7")])
    cl = client(slurm)
    cl.node("node1")
    cl.node("node1")
    cl.job_infos(["7"])
    ends = [suffixes(c) for c in slurm.calls]
    assert all(len(set(e)) == 1 and e[0].startswith(SEP) and len(e[0]) > 8 for e in ends)
    assert len({e[0] for e in ends}) == 3


FREE = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40) | st.sampled_from(HOSTILE)
NONCE = "0123456789abcdef"


@settings(max_examples=200, deadline=None)
@given(texts=st.lists(st.tuples(FREE, FREE, FREE), min_size=1, max_size=4))
def test_any_node_free_text_gives_back_the_same_fixed_fields(
    texts: list[tuple[str, str, str]],
) -> None:
    rows = [
        node(f"node{i}", Reason=r or "x", Comment=c, Extra=e)
        for i, (r, c, e) in enumerate(texts, 1)
    ]
    got = parse_sinfo(render(rows, [SEP + NONCE] * len(NODE_FIELDS)), NONCE)
    assert [n.name for n in got] == [r["NodeList"] for r in rows]
    for n, r in zip(got, rows):
        assert (n.address, n.hostname, n.partitions, n.base) == (
            r["NodeAddr"],
            r["NodeHost"],
            ("batch",),
            "idle",
        )
        assert n.reason == r["Reason"]
        assert n.field("comment") == ("" if r["Comment"] in ("(null)", "N/A") else r["Comment"])
        assert n.field("extra") == ("" if r["Extra"] in ("(null)", "N/A") else r["Extra"])


@settings(max_examples=200, deadline=None)
@given(texts=st.lists(st.tuples(FREE, FREE), min_size=1, max_size=4))
def test_any_job_free_text_gives_back_the_same_fixed_fields(texts: list[tuple[str, str]]) -> None:
    rows = [job(str(i), Reason=r, Comment=c) for i, (r, c) in enumerate(texts, 1)]
    got = parse_squeue(render(rows, [SEP + NONCE] * len(JOB_FIELDS)), NONCE)
    assert [(j.id, j.user, j.state, j.nodes, j.restarts) for j in got] == [
        (r["JobID"], "alice", "RUNNING", "node1,node2", 0) for r in rows
    ]
    assert [j.note for j in got] == [
        "" if r["Comment"] in ("(null)", "N/A") else r["Comment"] for r in rows
    ]


def test_the_recorded_layout_still_reads_and_formats_differ_only_by_the_nonce() -> None:
    assert node_format("n").replace(SEP + "n", SEP) == node_format("")
    assert job_format("n").replace(SEP + "n", SEP) == job_format("")
    (one,) = parse_sinfo(render([node("node1", Reason="a b")], [SEP] * len(NODE_FIELDS)))
    assert one.reason == "a b" and one.address == "10.0.0.1"
