"""`hma watch` on a real loopback Slurm (tests/slurmcluster.py): a wedged slurmd (SIGSTOP) and a
dead one, 40% of the nodes stopped at once, a node left REBOOT_ISSUED, two watchers on one
cluster, a watcher restarted in the middle of an action (docs/watch.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

from tests.integration.remediation_helpers import SLURM_VERSIONS, toml_value
from tests.slurmcluster import SlurmCluster, available

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[2]
# slurmctld notices a dead or wedged slurmd within seconds
FAST_SLURM = ("SlurmdTimeout=6", "MessageTimeout=3")

HOOK = """#!{python}
import fcntl, json, os, sys, time
entry = {{k: os.environ.get(k, "") for k in ("HMA_NODE", "HMA_ACTION", "HMA_ACTION_ID",
         "HMA_REASON", "HMA_SPARE", "HMA_EVIDENCE")}}
with open({log!r}, "a") as fh:
    fcntl.flock(fh, fcntl.LOCK_EX)
    fh.write(json.dumps(dict(entry, phase="start")) + "\\n")
time.sleep({sleep!r})
with open({log!r}, "a") as fh:
    fcntl.flock(fh, fcntl.LOCK_EX)
    fh.write(json.dumps(dict(entry, phase="end")) + "\\n")
"""


def _cluster(nodes: int, version: str = "22.05", **kw: Any) -> Iterator[SlurmCluster]:
    why = available(version)
    if why:
        pytest.skip(f"Slurm {version}: {why}")
    with SlurmCluster(nodes, conf_lines=FAST_SLURM, version=version, **kw) as cluster:
        yield cluster


@pytest.fixture(scope="module", params=SLURM_VERSIONS, ids=lambda v: f"slurm{v}")
def cluster(request: pytest.FixtureRequest) -> Iterator[SlurmCluster]:
    yield from _cluster(5, request.param)


@pytest.fixture
def fresh(cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    cluster.reset()
    yield cluster
    for node in cluster.nodes:  # a stopped slurmd is continued, a dead one started (reset)
        pid = _pid(cluster, node)
        if pid is not None:
            os.kill(pid, signal.SIGCONT)
    while WEDGED:  # and started again: continued, it may answer no ping for a long while
        cluster.stop_node(WEDGED.pop())
    cluster.reset()


WEDGED: set[str] = set()  # nodes whose slurmd a test stopped with SIGSTOP


def _pid(cluster: SlurmCluster, node: str) -> Optional[int]:
    path = cluster.base / "run" / f"slurmd-{node}.pid"
    try:
        pid = int(path.read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def wedge(cluster: SlurmCluster, node: str) -> None:
    """SIGSTOP the node's slurmd (continued and restarted by the ``fresh`` fixture)."""
    pid = _pid(cluster, node)
    assert pid is not None
    WEDGED.add(node)
    os.kill(pid, signal.SIGSTOP)


class Watch:
    """One watcher's configuration and hook log, run as ``hma watch --once --json``."""

    def __init__(
        self,
        tmp: Path,
        cluster: SlurmCluster,
        name: str = "w",
        watch: Optional[dict[str, Any]] = None,
        recovery: Optional[dict[str, Any]] = None,
        sleep: float = 0.0,
        log: Optional[Path] = None,
    ) -> None:
        self.log = log or tmp / "hooks.log"
        hook = tmp / f"hook-{name}"
        hook.write_text(HOOK.format(python=sys.executable, log=str(self.log), sleep=sleep))
        hook.chmod(0o755)
        self.state = tmp / f"watch-{name}"
        sections = {
            "slurm": {"conf": str(cluster.conf), "timeout": 15.0, **cluster.agent_slurm()},
            "recovery": {
                "reboot_command": [str(hook)],
                "replace_command": [str(hook)],
                "command_timeout": 30.0,
                # the evidence bundle's node record from the test cluster's own scontrol
                "evidence_node_record": [
                    *cluster.agent_slurm().get("scontrol", ["scontrol"]),
                    "-o",
                    "show",
                    "node",
                ],
                **(recovery or {}),
            },
            "watch": {
                "interval": 1.0,
                "down_after": 2.0,
                "reboot_deadline": 600.0,
                "state_dir": str(self.state),
                "claim_file": str(tmp / "claim.json"),
                **(watch or {}),
            },
            "reporters.journald": {"enabled": False},
        }
        text = []
        for section, values in sections.items():
            text.append(f"[{section}]")
            text += [f"{k} = {toml_value(v)}" for k, v in values.items()]
        self.config = tmp / f"hma-{name}.toml"
        self.config.write_text("\n".join(text) + "\n")

    def argv(self, *extra: str) -> list[str]:
        return [sys.executable, "-m", "hma", "--config", str(self.config), "watch", *extra]

    def once(self) -> dict[str, Any]:
        proc = subprocess.run(
            self.argv("--once", "--json"),
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(proc.stdout)
        doc["stderr"] = proc.stderr
        return doc

    def calls(self, phase: str = "start") -> list[dict[str, str]]:
        if not self.log.exists():
            return []
        lines = [json.loads(line) for line in self.log.read_text().splitlines() if line]
        return [c for c in lines if c["phase"] == phase]

    def state_doc(self) -> dict[str, Any]:
        return json.loads((self.state / "state.json").read_text())


def passes_until(
    watchers: list[Watch], predicate: Any, timeout: float = 90.0
) -> list[dict[str, Any]]:
    """Run the watchers' passes in turn until ``predicate(docs)`` holds (docs: every pass's)."""
    docs: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for w in watchers:
            docs.append(w.once())
        if predicate(docs):
            return docs
        time.sleep(0.3)
    raise AssertionError(f"condition not reached in {timeout:g} s: {docs[-1]}")


def test_a_wedged_and_a_dead_node_are_rebooted_once_each(fresh: SlurmCluster, tmp_path: Path):
    w = Watch(tmp_path, fresh, recovery={"max_drained_percent": 40.0})  # limit 2 of 5
    w.once()
    wedge(fresh, "node2")
    fresh.stop_node("node4")
    passes_until([w], lambda _docs: {c["HMA_NODE"] for c in w.calls("end")} == {"node2", "node4"})
    for _ in range(3):  # more passes: nothing is repeated
        w.once()
    calls = w.calls()
    assert sorted(c["HMA_NODE"] for c in calls) == ["node2", "node4"]
    assert {c["HMA_ACTION"] for c in calls} == {"reboot"}
    assert all(c["HMA_REASON"].startswith("HMA: HMA_WATCH_NOT_RESPONDING node:") for c in calls)
    actions = w.state_doc()["actions"]
    assert {n: a["id"] for n, a in actions.items()} == {
        c["HMA_NODE"]: c["HMA_ACTION_ID"] for c in calls
    }
    extra = {n: fresh.show(n).get("Extra", "") for n in ("node2", "node4")}
    assert all("hmah=" in text and ":HMA_WATCH_NOT_RESPONDING" in text for text in extra.values())
    # each hook was told the evidence bundle gathered on the controller: the node's record
    for call in calls:
        bundle = Path(call["HMA_EVIDENCE"])
        assert bundle.parent == w.state / "evidence", call
        assert f"NodeName={call['HMA_NODE']} " in (bundle / "node-record.txt").read_text()
        decision = json.loads((bundle / "hma.json").read_text())["decision"]
        assert (decision["node"], decision["kind"]) == (call["HMA_NODE"], "reboot")


def test_forty_percent_stopped_is_held_by_the_breaker(fresh: SlurmCluster, tmp_path: Path):
    w = Watch(tmp_path, fresh)  # default max_drained_percent 10: one of 5 nodes
    w.once()
    wedge(fresh, "node1")
    fresh.stop_node("node3")
    docs = passes_until(
        [w],
        lambda docs: len([d for d in docs[-1]["decisions"] if d["held"] == "breaker"]) == 2,
    )
    assert w.calls() == []
    assert docs[-1]["breaker"]["open"] is True
    assert any("HMA_WATCH_BREAKER_OPEN" in d["stderr"] for d in docs)


def test_two_watchers_on_one_cluster_one_acts(fresh: SlurmCluster, tmp_path: Path):
    log = tmp_path / "hooks.log"
    a = Watch(tmp_path, fresh, "a", log=log)
    b = Watch(tmp_path, fresh, "b", log=log)
    fresh.stop_node("node5")
    docs = passes_until([a, b], lambda _docs: a.calls("end"))
    for _ in range(3):
        a.once(), b.once()
    assert [c["HMA_NODE"] for c in a.calls()] == ["node5"]
    roles = {d["holder"]: d["role"] for d in docs[-2:]}
    assert sorted(roles.values()) == ["active", "passive"]


def test_a_restart_mid_action_does_not_repeat_it(fresh: SlurmCluster, tmp_path: Path):
    w = Watch(tmp_path, fresh, sleep=3.0)
    fresh.stop_node("node3")
    service = subprocess.Popen(
        w.argv(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        fresh.wait(lambda: w.calls(), 60, "the reboot hook started")
        assert w.state_doc()["actions"]["node3"]["state"] == "running"
    finally:
        service.kill()
        service.wait(10)
    fresh.wait(lambda: w.calls("end"), 30, "the hook the killed watcher started ended")
    docs = [w.once() for _ in range(3)]
    assert [c["HMA_NODE"] for c in w.calls()] == ["node3"]
    action = w.state_doc()["actions"]["node3"]
    assert action["id"] == w.calls()[0]["HMA_ACTION_ID"]
    assert action["state"] == "issued"
    assert "counted as issued" in docs[0]["stderr"]


@pytest.fixture
def slow_reboots() -> Iterator[SlurmCluster]:
    """A cluster whose RebootProgram takes ten minutes: a node stays REBOOT_ISSUED."""
    yield from _cluster(2, reboot_delay=600.0)


def test_a_node_left_reboot_issued_is_replaced(slow_reboots: SlurmCluster, tmp_path: Path):
    w = Watch(tmp_path, slow_reboots, watch={"reboot_deadline": 2.0})
    slow_reboots.scontrol("reboot", "reason=test", "node2")
    slow_reboots.wait(lambda: "REBOOT_ISSUED" in slow_reboots.state("node2"), 30, "reboot issued")
    passes_until([w], lambda _docs: w.calls("end"))
    w.once()
    calls = w.calls()
    assert [(c["HMA_NODE"], c["HMA_ACTION"]) for c in calls] == [("node2", "replace")]
    assert calls[0]["HMA_REASON"].startswith("HMA: HMA_WATCH_NO_BOOT node:")
