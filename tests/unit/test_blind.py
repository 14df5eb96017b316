"""A check that cannot check says so (hma.remediation.blind): the label it writes and lifts,
and ``hma run`` refusing an invalid configuration in journald and the unit's status."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Iterator

import pytest

from hma.contracts import label
from hma.contracts.cluster import NodeState
from hma.remediation import blind
from hma.reporters import journal

FIELD = "extra"


def node(text: str) -> NodeState:
    return NodeState("n1", "idle", texts=((FIELD, text),))


def test_the_blind_label_is_written_once_and_keeps_its_time() -> None:
    text = blind.marked(node("site=a"), FIELD, 1000.0)
    assert text == "site=a hma=blind:HMA_CONFIG_INVALID:none,c=agent,t=1000"
    found = label.parse_strict(text.split()[1])
    assert found is not None and found.state == "blind"
    assert blind.marked(node(text), FIELD, 2000.0) is None  # marked already: no write


def test_an_episode_label_is_left_as_it_is() -> None:
    text = "hma=unhealthy:GPU_XID_79:reboot,c=gpu:0000:3b:00,t=5,r=1"
    assert blind.marked(node(text), FIELD, 1000.0) is None
    assert blind.lifted(node(text), FIELD) is None


def test_lifted_removes_only_the_blind_label() -> None:
    text = "site=a hma=blind:HMA_CONFIG_INVALID:none,c=agent,t=1000 hmah=10:GPU_XID_79"
    assert blind.lifted(node(text), FIELD) == "site=a hmah=10:GPU_XID_79"
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
