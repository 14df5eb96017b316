"""`hma watch`'s parts without a cluster: the decisions (conditions timed from the first pass
that saw them, the holds, the fleet-wide breaker), its state file, the claim, `scontrol ping`,
and what `hma fleet` shows of it (docs/watch.md). The loopback-Slurm tests are
tests/integration/test_watch_slurm.py."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from mutate import budget

from hma.commands import fleet
from hma.contracts import label
from hma.contracts.cluster import NodeState
from hma.watch import claim, decide, state
from hma.watch.options import WATCH, Watch

NOW = 1_800_000_000.0
CFG = Watch.of({**{k: o.default for k, o in WATCH.items()}, "state_dir": "/tmp/x"})
LIMITS = decide.Limits("extra", 10.0, None, 3, 7 * 86400.0)
DEADLINE = 600.0


def node(name: str, base: str = "idle", *flags: str, extra: str = "", **kw: Any) -> NodeState:
    return NodeState(name, base, frozenset(flags), texts=(("extra", extra), ("comment", "")), **kw)


def healthy(count: int) -> list[NodeState]:
    return [node(f"h{i}") for i in range(count)]


def plan(nodes: list[NodeState], seen: Any = None, actions: Any = None, **kw: Any) -> decide.Plan:
    return decide.plan(
        nodes, seen or {}, actions or {}, kw.pop("cfg", CFG), DEADLINE, kw.pop("limits", LIMITS),
        kw.pop("now", NOW),
    )  # fmt: skip


def test_not_responding_past_down_after_is_a_reboot_whatever_the_reason() -> None:
    dead = node("n1", "down", "NOT_RESPONDING", reason="HMA: GPU_XID_79 gpu:0 : drained")
    first = plan([dead, *healthy(20)])
    assert first.decisions == () and first.seen == {"n1": {"not_responding": NOW}}
    early = plan([dead, *healthy(20)], first.seen, now=NOW + CFG.down_after - 1)
    assert early.decisions == ()
    late = plan([dead, *healthy(20)], first.seen, now=NOW + CFG.down_after + 1)
    assert [(d.node, d.kind, d.code, d.held) for d in late.decisions] == [
        ("n1", "reboot", decide.NOT_RESPONDING, "")
    ]


def test_a_state_hma_does_not_understand_is_not_watched() -> None:
    odd = node("n1", "down", "NOT_RESPONDING", "SOMETHING_NEW")
    assert plan([odd], {"n1": {"not_responding": NOW - 10_000}}).decisions == ()


def test_a_node_that_answers_again_is_forgotten() -> None:
    seen = {"n1": {"not_responding": NOW - 10_000}}
    assert plan([node("n1")], seen).seen == {}


def test_reboot_issued_past_the_deadline_is_a_replace() -> None:
    n = node("n1", "idle", "DRAIN", "REBOOT_ISSUED")
    seen = {"n1": {"reboot_issued": NOW - DEADLINE - 1}}
    [item] = plan([n, *healthy(20)], seen).decisions
    assert (item.kind, item.code) == ("replace", decide.NO_BOOT)


def test_not_back_after_the_watchers_reboot_is_a_replace_not_counted_again() -> None:
    dead = node("n1", "down", "NOT_RESPONDING")
    issued = state.Action("reboot", "watch-reboot-n1-1", decide.NOT_RESPONDING, NOW - 100, "issued")
    assert plan([dead], {}, {"n1": issued}).decisions == ()
    late = replace(issued, started=NOW - DEADLINE - 1)
    [item] = plan([dead, *healthy(20)], {}, {"n1": late}).decisions
    assert (item.kind, item.code, item.count) == ("replace", decide.NO_BOOT, False)
    [back] = plan([node("n1")], {}, {"n1": late}).decisions
    assert back.kind == "back"


def test_a_failed_hook_is_retried_with_the_same_id_when_due() -> None:
    dead = node("n1", "down", "NOT_RESPONDING")
    failed = state.Action("reboot", "id-1", decide.NOT_RESPONDING, NOW - 50, "retry", 1, NOW + 5)
    assert plan([dead], {}, {"n1": failed}).decisions == ()
    [item] = plan([dead, *healthy(20)], {}, {"n1": failed}, now=NOW + 6).decisions
    assert item.acts and item.action is failed and not item.count


def test_completing_is_reported_unless_the_setting_says_reboot() -> None:
    n = node("n1", "completing")
    seen = {"n1": {"completing": NOW - CFG.completing_after - 1}}
    [item] = plan([n], seen).decisions
    assert (item.kind, item.code, item.acts) == ("report", decide.COMPLETING, False)
    cfg = replace(CFG, completing_action="reboot")
    [item] = plan([n, *healthy(20)], seen, cfg=cfg).decisions
    assert item.acts


def test_the_breaker_holds_every_action_when_many_nodes_stop_at_once() -> None:
    nodes = healthy(6) + [node(f"d{i}", "down", "NOT_RESPONDING") for i in range(4)]
    seen = {f"d{i}": {"not_responding": NOW - 10_000} for i in range(4)}
    made = plan(nodes, seen)  # 10% of 10 nodes: one
    assert made.open and made.limit == 1
    assert [d.held for d in made.decisions] == ["breaker"] * 4
    one = plan(nodes[:7], {"d0": seen["d0"]})
    assert not one.open and [d.acts for d in one.decisions] == [True]


def test_maintenance_reservations_and_repeat_offenders_hold() -> None:
    seen = {"n1": {"not_responding": NOW - 10_000}}
    cases = {
        "maintenance": node("n1", "down", "NOT_RESPONDING", "MAINT"),
        "reservation": node("n1", "down", "NOT_RESPONDING", "RESERVED"),
        "repeat_offender": node(
            "n1", "down", "NOT_RESPONDING", extra="hmah=1799990000:A,1799990001:B,1799990002:C"
        ),
    }
    cfg = replace(CFG, hold_reserved=True)
    for held, n in cases.items():
        [item] = plan([n, *healthy(20)], seen, cfg=cfg).decisions
        assert item.held == held
    word = node("n1", "down", "NOT_RESPONDING", extra=f"hma-maint={int(NOW + 60)}")
    assert plan([word, *healthy(20)], seen).decisions[0].held == "maintenance"
    ended = node("n1", "down", "NOT_RESPONDING", extra=f"hma-maint={int(NOW - 60)}")
    assert plan([ended, *healthy(20)], seen).decisions[0].acts


def test_the_watchers_remediation_is_recorded_in_hmah_as_the_agents_read_it() -> None:
    text = decide.recorded("site=x hma=unhealthy:GPU_XID_79:reboot", decide.NOT_RESPONDING, NOW)
    history = label.find_history(text, NOW)
    assert history is not None and history.entries == ((int(NOW), decide.NOT_RESPONDING),)
    assert text.startswith("site=x hma=unhealthy:GPU_XID_79:reboot hmah=")


NODE = st.builds(
    node,
    st.sampled_from([f"n{i}" for i in range(12)]),
    st.sampled_from(["idle", "down", "allocated", "completing", "future"]),
    st.sampled_from(["NOT_RESPONDING", "REBOOT_ISSUED", "DRAIN", "MAINT", "COMPLETING", "CLOUD"]),
)


@budget(150)
@given(
    st.lists(NODE, max_size=12, unique_by=lambda n: n.name),
    st.floats(1, 100),
    st.integers(0, 20_000),
)
def test_prop_an_open_breaker_acts_on_nothing_and_a_closed_one_within_its_limit(
    nodes: list[NodeState], percent: float, age: int
) -> None:
    seen = {n.name: {c: NOW - age for c in decide.conditions(n)} for n in nodes}
    made = plan(nodes, seen, limits=replace(LIMITS, percent=percent))
    acting = [d for d in made.decisions if d.acts]
    if made.open:
        assert not acting
    assert len([d for d in acting if d.code == decide.NOT_RESPONDING]) <= made.limit
    assert all(decide.conditions(next(n for n in nodes if n.name == d.node)) for d in acting)


def test_state_round_trip_and_a_damaged_file_moved_aside(tmp_path: Path) -> None:
    st_ = state.State()
    st_.actions["n1"] = state.Action("reboot", "id-1", decide.NOT_RESPONDING, NOW, "issued")
    st_.actions["n1"].evidence = "/var/lib/hma/watch/evidence/1-reboot-n1"
    st_.seen["n1"] = {"not_responding": NOW}
    state.save(str(tmp_path), st_)
    back = state.load(str(tmp_path))
    assert (back.holder, back.actions, back.seen) == (st_.holder, st_.actions, st_.seen)
    (tmp_path / "state.json").write_text("{not json")
    assert state.load_quiet(str(tmp_path)) is None
    fresh = state.load(str(tmp_path))
    assert fresh.actions == {} and (tmp_path / "state.bad").exists()


def test_one_claim_holder_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "claim.json"
    a, b = claim.Claim(path, "a" * 32, 90), claim.Claim(path, "b" * 32, 90)
    assert a.take(NOW) == ""
    assert "lock" in b.take(NOW)  # a's pass holds the lock
    a.release()
    assert "claim held by watcher bbbbbbbb"[:21] in b.take(NOW + 1)
    assert a.take(NOW + 1) == ""  # its own claim back (a restart keeps its holder id)
    a.release()
    assert b.take(NOW + 1000) == ""  # a's lease ended: taken over
    b.release()


def test_scontrol_ping_in_service() -> None:
    both = "Slurmctld(primary) at ctl1 is DOWN\nSlurmctld(backup) at ctl2 is UP\n"
    assert claim.in_service(both) == "ctl2"
    assert (
        claim.in_service("Slurmctld(primary) at ctl1 is UP\nSlurmctld(backup) at ctl2 is UP")
        == "ctl1"
    )
    assert claim.in_service("") is None


def test_fleet_shows_the_watchers_pass_escaped(tmp_path: Path) -> None:
    st_ = state.State()
    st_.actions["n\x1b[31m1"] = state.Action("reboot", "id-1", decide.NOT_RESPONDING, NOW, "issued")
    item = decide.Decision("n1", "reboot", decide.NOT_RESPONDING, "not responding")
    st_.last = {
        "time": NOW, "role": "active", "breaker": {"affected": ["n1"], "total": 5, "limit": 1},
        "decisions": [item.to_json()],
    }  # fmt: skip
    state.save(str(tmp_path), st_)
    doc = {"nodes": [], "partitions": [], "watch": fleet.watcher(str(tmp_path))}
    text = fleet.render_text(doc)
    assert "WATCHER active" in text and "id-1" in text and "\x1b" not in text
    assert json.loads(json.dumps(doc))["watch"]["actions"][0]["id"] == "id-1"
    assert fleet.watcher(str(tmp_path / "none")) is None


def test_config_check_validates_the_watch_section(tmp_path: Path) -> None:
    import subprocess
    import sys

    good = tmp_path / "good.toml"
    good.write_text('[watch]\ninterval = 10\ndown_after = "x"\n')
    res = subprocess.run(
        [sys.executable, "-m", "hma", "--config", str(good), "config", "check"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert res.returncode == 2 and "watch.down_after" in res.stderr
    good.write_text('[watch]\ninterval = 10\ndown_after = 120\ncompleting_action = "reboot"\n')
    res = subprocess.run(
        [sys.executable, "-m", "hma", "--config", str(good), "config", "check"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr


class FakeBackend:
    """What the actor calls of the Slurm backend, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def reboot(self, name: str, reason: str, mode: str) -> None:
        self.calls.append(("reboot", name, mode))

    def replace(self, name: str, reason: str, mode: str) -> None:
        self.calls.append(("replace", name, mode))

    def label(self, name: str, text: str) -> None:
        self.calls.append(("label", name, text))

    def env(self) -> dict[str, str]:
        return {}


def recovery(tmp: Path, text: str) -> Any:
    """The typed ``[recovery]`` of a configuration holding ``text`` in that section."""
    from hma import assembly
    from hma.remediation.options import Recovery

    path = tmp / "hma.toml"
    path.write_text("[recovery]\n" + text)
    return Recovery.of(assembly.load(str(path)).config.section("recovery"))


def test_hyperpod_mode_asks_hyperpod_and_records_hmah(tmp_path: Path) -> None:
    from hma.watch.act import Actor

    backend, st_ = FakeBackend(), state.State()
    saves: list[str] = []
    rec = recovery(tmp_path, 'replace_mode = "hyperpod"\n')
    actor = Actor(backend, rec, st_, lambda: saves.append(st_.actions["n1"].state), lambda: NOW)  # type: ignore[arg-type]
    item = decide.Decision("n1", "replace", decide.NO_BOOT, "REBOOT_ISSUED for 700 s")
    done = actor.act(item, node("n1", "idle", "REBOOT_ISSUED"))
    assert done.state == "issued" and saves == ["running", "issued"]
    assert backend.calls[0][:2] == ("label", "n1") and ":HMA_WATCH_NO_BOOT" in backend.calls[0][2]
    assert backend.calls[1] == ("replace", "n1", "hyperpod")


def test_a_failing_hook_is_kept_for_a_retry_with_the_same_id(tmp_path: Path) -> None:
    from hma.watch.act import Actor

    hook = tmp_path / "hook"
    hook.write_text("#!/bin/sh\necho refused >&2\nexit 3\n")
    hook.chmod(0o755)
    backend, st_ = FakeBackend(), state.State()
    rec = recovery(tmp_path, f'reboot_command = ["{hook}"]\nretry_min = 2.0\n')
    actor = Actor(backend, rec, st_, lambda: None, lambda: NOW)  # type: ignore[arg-type]
    item = decide.Decision("n1", "reboot", decide.NOT_RESPONDING, "not responding for 700 s")
    first = actor.act(item, node("n1", "down", "NOT_RESPONDING"))
    assert (first.state, first.next_try) == (
        "retry",
        NOW + 2.0,
    ) and "exited 3: refused" in first.error
    again = actor.act(
        replace(item, action=first, count=False), node("n1", "down", "NOT_RESPONDING")
    )
    assert again.id == first.id and again.attempts == 2 and again.next_try == NOW + 4.0
    assert [c[0] for c in backend.calls] == ["label"]  # recorded once, for the first attempt


def test_an_action_gets_an_evidence_bundle_and_its_retry_keeps_it(tmp_path: Path) -> None:
    import sys

    from hma.remediation import evidence
    from hma.watch.act import Actor, Bundles

    def program(name: str, body: str) -> str:
        path = tmp_path / name
        path.write_text(f"#!{sys.executable}\nimport os, sys\n{body}\n")
        path.chmod(0o755)
        return str(path)

    # the hook records HMA_EVIDENCE and fails once; the "ssh" stand-in prints its argv
    hook = program(
        "hook",
        "open(sys.argv[1], 'a').write(os.environ['HMA_EVIDENCE'] + '\\n')\n"
        "sys.exit(0 if len(open(sys.argv[1]).read().split()) > 1 else 3)",
    )
    ssh = program("ssh", "print('ssh', *sys.argv[1:])")
    settings = evidence.Settings(
        True, str(tmp_path / "evidence"), "", 3, 1024**2, 65536, 0, 20.0,
        (program("nvidia-bug-report.sh", "sys.exit(9)"),),
        ("journalctl", "-k", "-b", "0"),
        (program("scontrol", "print('NodeName=' + sys.argv[-1] + ' State=COMPLETING')"),),
    )  # fmt: skip
    rec = recovery(
        tmp_path, f'reboot_command = ["{hook}", "{tmp_path / "seen"}"]\nretry_min = 1.0\n'
    )
    st_ = state.State()
    bundles = Bundles(settings, (ssh, "-o", "BatchMode=yes"), 30.0, dict)
    actor = Actor(FakeBackend(), rec, st_, lambda: None, lambda: NOW, bundles)  # type: ignore[arg-type]
    stuck = decide.Decision("n1", "reboot", decide.COMPLETING, "COMPLETING for 2000 s")
    first = actor.act(stuck, node("n1", "completing"))
    assert first.state == "retry" and first.evidence
    bundle = Path(first.evidence)
    assert bundle.parent == tmp_path / "evidence" and bundle.name.endswith("-reboot-n1")
    # the node still answers: its kernel log through the remote prefix; never its bug report
    assert (bundle / "kernel.log").read_text() == "ssh -o BatchMode=yes n1 journalctl -k -b 0\n"
    assert not (bundle / "nvidia-bug-report.log.gz").exists()
    assert "State=COMPLETING" in (bundle / "node-record.txt").read_text()
    doc = json.loads((bundle / "hma.json").read_text())
    assert doc["decision"]["code"] == decide.COMPLETING and "status_json" not in doc
    again = actor.act(replace(stuck, action=first, count=False), node("n1", "completing"))
    assert again.state == "issued" and again.evidence == first.evidence
    assert (tmp_path / "seen").read_text().split() == [first.evidence, first.evidence]
    # a node that does not answer: what the controller knows, nothing run through the prefix
    dead = decide.Decision("n2", "reboot", decide.NOT_RESPONDING, "not responding for 700 s")
    other = Path(actor.act(dead, node("n2", "down", "NOT_RESPONDING")).evidence)
    assert sorted(p.name for p in other.iterdir()) == [
        "MANIFEST.json",
        "hma.json",
        "node-record.txt",
    ]
    # the pass's time for bundles spent: the action goes on without one
    spent = Actor(
        FakeBackend(), rec, st_, lambda: None, lambda: NOW, Bundles(settings, (), 0.0, dict)
    )  # type: ignore[arg-type]
    assert spent.act(replace(dead, node="n3"), node("n3", "down", "NOT_RESPONDING")).evidence == ""


def test_a_crash_the_node_s_agent_read_on_its_next_boot_is_reported() -> None:
    """The agent's post-mortem (``hmap=``) tells the watcher how the previous boot ended: a
    report on the node (never an action), as long as the token stays."""
    crashed = node("n1", extra=f"hmah={int(NOW) - 60}:KERNEL_PREVIOUS_BOOT_CRASH "
                   f"hmap={int(NOW) - 60}:KERNEL_PANIC")  # fmt: skip
    forged = node("n2", extra="hmap=junk:KERNEL_PANIC")
    made = plan([crashed, forged, *healthy(20)])
    assert [(d.node, d.kind, d.code) for d in made.decisions] == [
        ("n1", "postmortem", label.POSTMORTEM_CODE)
    ]
    [item] = made.decisions
    assert "KERNEL_PANIC" in item.why and not item.acts
