"""A check that cannot check says so (hma.remediation.blind): the label it writes and lifts,
and ``hma run`` refusing an invalid configuration in journald and the unit's status."""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hma.contracts import label
from hma.contracts.cluster import NodeState
from hma.remediation import blind
from hma.reporters import journal

FIELD = "extra"
NOW = 1_800_000_000.0


def node(text: str) -> NodeState:
    return NodeState("n1", "idle", texts=((FIELD, text),))


def test_the_blind_label_is_written_once_and_keeps_its_time() -> None:
    text = blind.marked(node("site=a"), FIELD, NOW)
    assert text == "site=a hma=blind:HMA_CONFIG_INVALID:none,c=agent,t=1800000000"
    found = label.parse_strict(text.split()[1])
    assert found is not None and found.state == "blind"
    assert blind.marked(node(text), FIELD, NOW + 1000) is None  # marked already: no write


def test_an_episode_label_is_left_as_it_is() -> None:
    text = "hma=unhealthy:GPU_XID_79:reboot,c=gpu:0000:3b:00,t=1799990000,r=1"
    assert blind.marked(node(text), FIELD, NOW) is None
    assert blind.lifted(node(text), FIELD) is None
    unreadable = "hma=unhealthy:GPU_XID_79:reboot,t=5"  # a time out of bounds: left alone
    assert blind.marked(node(unreadable), FIELD, NOW) is None


def test_lifted_removes_only_the_blind_label() -> None:
    text = (
        "site=a hma=blind:HMA_CONFIG_INVALID:none,c=agent,t=1800000000 hmah=1799990000:GPU_XID_79"
    )
    assert blind.lifted(node(text), FIELD) == "site=a hmah=1799990000:GPU_XID_79"
    assert blind.lifted(node("site=a"), FIELD) is None


@pytest.fixture()
def datagrams(tmp_path: Path) -> Iterator[tuple[Path, socket.socket]]:
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(10)
    try:
        yield path, sock
    finally:
        sock.close()


def test_run_refusing_a_configuration_tells_journald_and_systemd(
    hma_env, datagrams: tuple[Path, socket.socket], tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    notify, notify_sock = datagrams
    journald = tmp_path / "journal.sock"
    jsock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    jsock.bind(str(journald))
    jsock.settimeout(10)
    try:
        hma_env.write(
            f'[reporters.journald]\nsocket = "{journald}"\n'
            '[slurm]\nscontrol = ["/nonexistent/scontrol"]\n'  # no Slurm here: no label
            "[probes.system]\ninterval = 0\n"
        )
        env = {**hma_env.env(), "NOTIFY_SOCKET": str(notify)}
        res = hma_env.hma("run", timeout=60, env=env)
        assert res.returncode == 78, res.stderr
        assert "Traceback" not in res.stderr
        entry = journal.decode(jsock.recv(65536))
        status = notify_sock.recv(4096).decode()
    finally:
        jsock.close()
    assert entry["HMA_CODE"] == "HMA_CONFIG_INVALID"
    assert entry["MESSAGE_ID"] == journal.message_id("HMA", "raised")
    assert "probes.system.interval" in entry["MESSAGE"]
    assert status.startswith("STATUS=refused to start: invalid configuration: ")
    assert "probes.system.interval" in status


WORD = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters=" \t\n\r\x0b\x0c"),
    min_size=1,
    max_size=12,
).filter(lambda w: w.strip() == w and not w.startswith("hma=") and w.split() == [w])


@settings(max_examples=200, deadline=None)
@given(words=st.lists(WORD, max_size=5), now=st.floats(label.MIN_TIME, label.MAX_TIME - 3600))
def test_marking_and_lifting_touch_nothing_else(words: list[str], now: float) -> None:
    """Whatever else the field holds: the blind label is added once, parsed back strictly as
    blind, and lifting it gives the field back as it was."""
    text = " ".join(words)
    new = blind.marked(node(text), FIELD, now)
    assert new is not None
    token = label.find_token(new, label.PREFIX)
    assert token is not None
    found = label.parse_strict(token)
    assert found is not None and (found.state, found.code) == ("blind", blind.CODE)
    assert [w for w in new.split() if w != token] == text.split()
    assert blind.marked(node(new), FIELD, now + 60) is None
    assert blind.lifted(node(new), FIELD) == text


PLUGINS = Path(__file__).resolve().parent.parent / "plugins"
REC = {"dry_run": False, "policy": "automatic", "max_drained_percent": 50.0,
       "max_drained_nodes": None}  # fmt: skip


@pytest.fixture
def memory(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The tests' in-memory backend (tests/plugins/hma_testbackend.py): four nodes, me m1."""
    monkeypatch.syspath_prepend(str(PLUGINS))
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    from hma_testbackend import CoreBackend

    yield CoreBackend({"nodes": ["m1", "m2", "m3", "m4"], "me": "m1"}, FIELD)
    sys.modules.pop("hma_testbackend", None)


@pytest.mark.parametrize(
    ("on_error", "rec", "calls"),
    [
        ("note", REC, ["label"]),
        ("drain", REC, ["drain"]),
        ("drain", {**REC, "policy": "none"}, ["label"]),  # policy none: label only
        ("drain", {**REC, "dry_run": True}, []),  # dry run: nothing changes in the cluster
    ],
)
def test_on_error_drains_only_when_asked_and_allowed(
    memory: Any, on_error: str, rec: dict[str, Any], calls: list[str]
) -> None:
    blind.mark(memory, on_error, rec, NOW)
    assert [c[0] for c in memory.calls] == calls
    if calls:
        assert "hma=blind:HMA_CONFIG_INVALID:none" in memory.state["m1"].field(FIELD)
    if calls == ["drain"]:
        assert memory.state["m1"].reason == blind.REASON


def test_the_breaker_holds_a_blind_drain(memory: Any) -> None:
    """Two of four nodes held by hma already (the limit at 50 %): m1 is labelled, not drained,
    and its label says why."""
    for name in ("m2", "m3"):
        memory.drain(name, "HMA: SITE_PROBE_CRITICAL site:fan")
    memory.calls.clear()
    blind.mark(memory, "drain", REC, NOW)
    assert [c[0] for c in memory.calls] == ["label"]
    assert "h=breaker" in memory.state["m1"].field(FIELD)
    assert "DRAIN" not in memory.state["m1"].flags
