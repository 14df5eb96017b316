"""A second cluster backend, registered through the ``hma.backends`` entry point group like any
third-party plugin and chosen by ``[cluster] backend``, drives the same engine."""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Iterator

import pytest

from hma import assembly
from hma.adapters import entrypoints
from hma.config.schema import ConfigError
from hma.contracts.cluster import NodeState
from hma.contracts.options import Option
from hma.health.model import Verdict
from hma.health.store import Store
from hma.remediation.engine import Remediator
from hma.remediation.options import RECOVERY, recovery_options
from tests.faults import fault

pytestmark = pytest.mark.timeout(30)
PLUGINS = Path(__file__).resolve().parent.parent / "plugins"


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.syspath_prepend(str(PLUGINS))
    entrypoints.rescan()
    yield
    monkeypatch.undo()
    sys.modules.pop("hma_testbackend", None)
    entrypoints.rescan()


def config(tmp: Path, *lines: str) -> Path:
    path = tmp / "hma.toml"
    path.write_text(
        "\n".join(
            [
                "[agent]",
                f'state_dir = "{tmp}/state"',
                f'run_dir = "{tmp}/run"',
                f'probes_dir = "{tmp}/probes.d"',
                "[recovery]",
                "resume_after = 0.0",
                "min_reboot_interval = 0.0",
                *lines,
            ]
        )
        + "\n"
    )
    return path


def test_memory_backend_drains_reboots_and_resumes(tmp_path: Path, plugins: None) -> None:
    setup = assembly.load(
        str(config(tmp_path, "[cluster]", 'backend = "memory"', "[memory]", 'me = "m2"'))
    )
    rem = Remediator(setup, Store(str(tmp_path / "state" / "state.db")), start=False)
    try:
        mem = rem.backend
        assert type(mem).__name__ == "MemoryBackend" and mem.label_field == "extra"
        rem.refresh()  # finds its node name through the backend
        assert rem.facts().node_name == "m2"
        now = time.time()
        rem.update(Verdict(now, "b1", (fault(first=now, last=now),)), "b1")
        rem.flush(5)
        calls = [c[0] for c in mem.calls]  # type: ignore[attr-defined]
        assert calls == ["drain", "reboot"]  # the label goes with the drain, in one call
        drained = mem.node("m2")
        assert drained.reason == "HMA: GPU_XID_79 gpu:0000:3b:00"
        assert drained.field("extra").startswith("hma=unhealthy:GPU_XID_79:reboot,")
        assert rem.status()["breaker"]["total"] == 4  # counted through the backend's peers
        later = time.time()
        rem.update(Verdict(later, "b2", ()), "b2")  # rebooted, healthy
        rem.flush(5)
        assert mem.calls[-1][0] == "resume"  # type: ignore[attr-defined]
        assert not mem.node("m2").out_of_service and rem.status()["episode"] is None
    finally:
        rem.close()


def test_missing_capability_holds_the_action(tmp_path: Path, plugins: None) -> None:
    """A backend with the core only drains; the reboot it cannot do is held and says why."""
    from hma_testbackend import CoreBackend

    setup = assembly.load(
        str(config(tmp_path, "[cluster]", 'backend = "memory"', "[memory]", 'me = "m2"'))
    )
    core = CoreBackend(setup.config.section("memory"), "extra")
    rem = Remediator(setup, Store(str(tmp_path / "state" / "state.db")), start=False, backend=core)
    try:
        rem.refresh()
        now = time.time()
        rem.update(Verdict(now, "b1", (fault(first=now, last=now),)), "b1")
        rem.flush(5)
        assert [c[0] for c in core.calls] == ["drain", "label"]  # the label says why it waits
        assert "h=unsupported" in core.node("m2").field("extra") and core.node("m2").drain
        status = rem.status()
        assert status["held"] == (
            "unsupported: the memory backend cannot reboot a node (reboot_mode = scontrol)"
        )
        assert [(r["kind"], r["state"]) for r in status["actions"]] == [
            ("drain", "done"),
            ("reboot", "held"),
        ]
        held = [a.details["held"] for a in rem.alerts() if a.kind == "action_held"]
        assert held == ["unsupported"]
    finally:
        rem.close()


def test_drain_past_its_timeout_without_down_waits_for_the_jobs(
    tmp_path: Path, plugins: None
) -> None:
    """Without ``SetsDown`` a drain past ``drain_timeout`` is held until its jobs are gone."""
    from hma_testbackend import CoreBackend

    path = config(tmp_path, "drain_timeout = 60.0", "[cluster]", 'backend = "memory"')
    setup = assembly.load(str(path))
    core = CoreBackend(setup.config.section("memory"), "extra")
    core.state["m1"] = replace(core.state["m1"], base="allocated")  # a job runs
    now = [1000.0]
    store = Store(str(tmp_path / "state" / "state.db"))
    rem = Remediator(setup, store, clock=lambda: now[0], start=False, backend=core)
    try:
        rem.refresh()
        rem.update(Verdict(now[0], "b1", (fault(first=now[0], last=now[0]),)), "b1")
        rem.flush(5)
        now[0] += 61.0  # drain_timeout passed, the job still runs
        rem.flush(5)
        assert rem.status()["held"] == (
            "unsupported: the memory backend cannot set a node down; the drain waits for its jobs"
        )
        core.state["m1"] = replace(core.state["m1"], base="idle")  # the job ended
        now[0] += 16.0  # recheck_interval
        rem.flush(5)
        assert "down" not in [c[0] for c in core.calls]
        assert [(r["kind"], r["state"]) for r in rem.status()["actions"]] == [
            ("drain", "done"),
            ("down", "skipped"),
            ("reboot", "held"),
        ]
    finally:
        rem.close()


def test_backend_section_is_declared_by_the_backend(tmp_path: Path, plugins: None) -> None:
    with pytest.raises(ConfigError) as err:
        assembly.load(
            str(config(tmp_path, "[cluster]", 'backend = "memory"', "[memory]", "nope = 1"))
        )
    assert "memory.nope: unknown key" in str(err.value)
    with pytest.raises(ConfigError) as err:
        assembly.load(str(config(tmp_path, "[cluster]", 'backend = "k8s"')))
    assert "cluster.backend" in str(err.value) and "memory" in str(err.value)


def test_slurm_is_the_default_backend(tmp_path: Path) -> None:
    setup = assembly.load(str(config(tmp_path, "[slurm]", 'node_name = "n9"')))
    assert setup.config.section("cluster")["backend"] == "slurm"
    rem = Remediator(setup, Store(str(tmp_path / "state" / "state.db")), start=False)
    try:
        assert type(rem.backend).__name__ == "SlurmBackend" and rem.facts().node_name == "n9"
    finally:
        rem.close()


def test_one_probe_load_checks_only_the_backends_the_config_names(
    tmp_path: Path, plugins: None
) -> None:
    """`hma check NAME` loads the backends the configuration names, not every installed one."""
    path = config(tmp_path, "[cluster]", 'backend = "memory"', "[memory]", 'me = "m3"')
    setup = assembly.load(str(path), only=["system"])
    assert setup.config.section("memory")["me"] == "m3" and "slurm" not in setup.config.sections
    with pytest.raises(ConfigError) as err:
        assembly.load(str(config(tmp_path, "[memroy]", 'me = "m3"')), only=["system"])
    assert "memroy: unknown section" in str(err.value)


def test_recovery_keys_a_backend_declares_are_checked_without_the_daemon(tmp_path: Path) -> None:
    """`hma check NAME` loads the backend whose ``[recovery]`` keys the file sets."""
    path = config(tmp_path, 'label_field = "comment"', 'reboot_mode = "hyperpod"')
    setup = assembly.load(str(path), only=["system"])
    recovery = setup.config.section("recovery")
    assert (recovery["label_field"], recovery["reboot_mode"]) == ("comment", "hyperpod")
    with pytest.raises(ConfigError) as err:
        assembly.load(str(config(tmp_path, 'label_field = "nope"')), only=["system"])
    assert "recovery.label_field" in str(err.value)
    plain = assembly.load(str(config(tmp_path)), only=["system"]).config
    assert "label_field" not in plain.section("recovery") and "slurm" not in plain.sections


def _choice(default: str, *choices: str) -> Option:
    return Option("choice", default, f"{default} text", choices=choices)


@pytest.mark.parametrize(
    "declared, want",
    [
        ([], {}),
        ([{"label_field": _choice("a", "a", "b")}], {"label_field": ("a", ("a", "b"))}),
        (  # the first backend's default, the choices of both
            [{"label_field": _choice("a", "a", "b")}, {"label_field": _choice("c", "c", "a")}],
            {"label_field": ("a", ("a", "b", "c"))},
        ),
        (
            [{"reboot_mode": _choice("x", "x", "command")}, {"label_field": _choice("a", "a")}],
            {"reboot_mode": ("x", ("x", "command")), "label_field": ("a", ("a",))},
        ),
    ],
)
def test_recovery_options_add_what_backends_declare_after_dry_run(
    declared: list[dict[str, Option]], want: dict[str, tuple[str, tuple[str, ...]]]
) -> None:
    got = recovery_options(declared)
    keys = list(got)
    assert keys[:2] == ["policy", "dry_run"] and keys[2 + len(want) :] == list(RECOVERY)[2:]
    assert {k: (got[k].default, tuple(got[k].choices)) for k in keys[2 : 2 + len(want)]} == want


@pytest.mark.parametrize(
    "name, text, want",
    [
        ("extra", "hma=x", ("hma=x", "c")),
        ("comment", "hma=x", ("e", "hma=x")),
    ],
)
def test_with_field_sets_the_field_that_field_reads(
    name: str, text: str, want: tuple[str, str]
) -> None:
    node = NodeState("n1", "idle", texts=(("extra", "e"), ("comment", "c"))).with_field(name, text)
    assert (node.field("extra"), node.field("comment")) == want and node.field(name) == text


@pytest.mark.parametrize(
    "texts, name, text, want",
    [
        ((), "a", "x", (("a", "x"),)),  # a field the node lacks is added
        ((("a", "1"), ("b", "2")), "b", "x", (("a", "1"), ("b", "x"))),  # kept in its place
        ((("a", "1"), ("b", "2")), "a", "", (("a", ""), ("b", "2"))),  # emptied, not dropped
        ((("a", "1"),), "", "x", (("a", "1"), ("", "x"))),  # "" is a name like any other
    ],
)
def test_texts_by_name(
    texts: tuple[tuple[str, str], ...], name: str, text: str, want: tuple[tuple[str, str], ...]
) -> None:
    before = NodeState("n1", "idle", texts=texts)
    after = before.with_field(name, text)
    assert after.texts == want and after.field(name) == text and before.texts == texts
    assert NodeState("n1", "idle", texts=texts).field("absent") == ""


def test_commands_reach_the_configured_backend(tmp_path: Path, plugins: None) -> None:
    """`hma maintenance` marks the node through the backend `[cluster] backend` names."""
    from hma.commands import common, maintenance
    from hma.contracts.maintenance import Maintenance

    memory = assembly.load(str(config(tmp_path, "[cluster]", 'backend = "memory"')))
    assert type(common.scheduler(memory)).__name__ == "MemoryBackend"
    window = Maintenance(since=time.time(), until=None, who="root", reason="")
    assert maintenance.mark_in_slurm(memory, window) == "marked in Slurm (m1 extra)"
    slurm = assembly.load(str(config(tmp_path, "[slurm]", "enabled = false")))
    assert type(common.scheduler(slurm)).__name__ == "SlurmBackend"
    assert (
        maintenance.mark_in_slurm(slurm, window) == "not marked in Slurm (Slurm is not used here)"
    )


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["fleet"], 3),
        (["topology", "--check"], 2),
        (["deep-check", "run", "n[1-2]"], 3),
        (["job-env"], 2),
        (["srun", "true"], 2),
    ],
)
def test_slurm_only_commands_refuse_another_backend(
    tmp_path: Path, plugins: None, capsys: pytest.CaptureFixture[str], argv: list[str], code: int
) -> None:
    """What only Slurm has comes from the configured backend; with another, the command says so
    and exits with its code for an invalid configuration."""
    from hma import cli

    path = config(tmp_path, "[cluster]", 'backend = "memory"')
    assert cli.main(["--config", str(path), *argv]) == code
    err = capsys.readouterr().err
    assert "cluster.backend: 'memory' is not Slurm: this command needs the Slurm backend" in err
