"""hma healthcheck: answering from a running daemon's status.json."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hma.commands.healthcheck import daemon_status, run


def write(folder: Path, **fields: object) -> None:
    doc = {
        "schema": 1,
        "pid": os.getpid(),
        "generated": time.time(),
        "heartbeat_s": 15.0,
        "node": "n1",
        "severity": "critical",
        "faults": [],
        **fields,
    }
    (folder / "status.json").write_text(json.dumps(doc))


def test_fresh_live_daemon_is_used(tmp_path: Path) -> None:
    write(tmp_path)
    assert daemon_status(str(tmp_path), time.time()) is not None


def test_stale_or_dead_daemon_is_ignored(tmp_path: Path) -> None:
    write(tmp_path, generated=time.time() - 100)
    assert daemon_status(str(tmp_path), time.time()) is None
    write(tmp_path, pid=2**22 + 12345)
    assert daemon_status(str(tmp_path), time.time()) is None
    (tmp_path / "status.json").write_text("{not json")
    assert daemon_status(str(tmp_path), time.time()) is None


def test_a_status_file_of_an_earlier_boot_or_schema_is_ignored(tmp_path: Path) -> None:
    """The healthcheck trusts status.json exactly when ``hma status`` does."""
    write(tmp_path, boot_id="11111111-2222-3333-4444-555555555555")
    assert daemon_status(str(tmp_path), time.time(), "11111111-2222-3333-4444-555555555555")
    assert daemon_status(str(tmp_path), time.time(), "99999999-2222-3333-4444-555555555555") is None
    write(tmp_path, schema=2)
    assert daemon_status(str(tmp_path), time.time()) is None


def test_the_console_script_is_this_module() -> None:
    from importlib.metadata import distribution

    from hma.commands import healthcheck

    (script,) = [ep for ep in distribution("hma").entry_points if ep.name == "hma-healthcheck"]
    assert script.load() is healthcheck.main


def test_exit_code_is_the_daemons_severity(tmp_path: Path, capsys: object) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write(run_dir, faults=[{"code": "GPU_XID_79", "component": "gpu:0000:3b:00", "active": True}])
    cfg = tmp_path / "hma.toml"
    cfg.write_text(
        f'[agent]\nrun_dir = "{run_dir}"\nstate_dir = "{tmp_path}/state"\n'
        f'probes_dir = "{tmp_path}/probes.d"\n'
    )
    assert run(str(cfg)) == 2
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert "CRITICAL" in out and "GPU_XID_79 gpu:0000:3b:00" in out


def test_plain_hma_without_arguments_is_the_healthcheck_under_slurmd(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write(run_dir, severity="warning")
    cfg = tmp_path / "hma.toml"
    cfg.write_text(
        f'[agent]\nrun_dir = "{run_dir}"\nstate_dir = "{tmp_path}/s"\n'
        f'probes_dir = "{tmp_path}/p"\n'
    )
    env = {"SLURMD_NODENAME": "n1", "HMA_CONFIG": str(cfg)}  # all slurmd gives, plus the config
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-m", "hma"],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 1 and "WARNING" in out.stdout, out.stderr


# --- bounds: slurmd kills a HealthCheckProgram after 60 s (docs/slurm.md) ----------------------


def test_probe_timeouts_are_cut_and_skipped_probes_left_out(tmp_path: Path) -> None:
    from hma import assembly
    from hma.commands.healthcheck import bound_probes

    cfg = tmp_path / "hma.toml"
    cfg.write_text(
        f'[agent]\nstate_dir = "{tmp_path}/s"\nrun_dir = "{tmp_path}/r"\n'
        f'probes_dir = "{tmp_path}/p"\n'
        '[healthcheck]\nprobe_timeout = 12.0\nskip = ["efa_mesh", "system"]\n'
        "[probes.nvidia_smi]\ntimeout = 60.0\ncommand_timeout = 50.0\n"
        "[probes.slurm]\ntimeout = 5.0\n"
    )
    setup = assembly.load(str(cfg))
    names = bound_probes(setup)
    assert "efa_mesh" not in names and "system" not in names
    assert "nvidia_smi" in names and "slurm" in names
    smi = setup.config.probe("nvidia_smi")
    assert smi["timeout"] == 12.0
    assert smi["command_timeout"] < 12.0  # the command is killed before the probe is abandoned
    assert setup.config.probe("slurm")["timeout"] == 5.0  # shorter ones are kept


def test_probe_timeout_must_stay_below_the_whole_run(tmp_path: Path) -> None:
    from hma import assembly
    from hma.config.files import ConfigError

    cfg = tmp_path / "hma.toml"
    cfg.write_text("[healthcheck]\ntimeout = 20.0\nprobe_timeout = 25.0\n")
    try:
        assembly.load(str(cfg))
    except ConfigError as exc:
        assert any(
            e.startswith("healthcheck.probe_timeout: must be below timeout") for e in exc.errors
        )
    else:
        raise AssertionError("accepted a probe_timeout above the health check's timeout")
    cfg.write_text("[healthcheck]\ntimeout = 90.0\n")  # slurmd would kill it first
    try:
        assembly.load(str(cfg))
    except ConfigError as exc:
        assert any(e.startswith("healthcheck.timeout: must be <= 58") for e in exc.errors)
    else:
        raise AssertionError("accepted a timeout slurmd would cut")


def test_the_health_check_stops_itself_at_its_timeout(tmp_path: Path) -> None:
    """A Slurm that never answers (a hung scontrol/sinfo) cannot keep the health check past
    ``[healthcheck] timeout``: it says why and exits unknown."""
    hang = tmp_path / "hang"
    hang.write_text("#!/bin/sh\nexec sleep 30\n")
    hang.chmod(0o755)
    cfg = tmp_path / "hma.toml"
    cfg.write_text(
        f'[agent]\nstate_dir = "{tmp_path}/s"\nrun_dir = "{tmp_path}/r"\n'
        f'probes_dir = "{tmp_path}/p"\n'
        "[healthcheck]\ntimeout = 3.0\nprobe_timeout = 1.0\n"
        f'[slurm]\nnode_name = "n1"\nscontrol = ["{hang}"]\nsinfo = ["{hang}"]\n'
        f'squeue = ["{hang}"]\ntimeout = 25.0\n'
    )
    env = {"SLURMD_NODENAME": "n1", "HMA_CONFIG": str(cfg)}
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-m", "hma"],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=20,  # the hung Slurm calls alone would take 25 s
        check=False,
    )
    assert out.returncode == 3, (out.stdout, out.stderr)
    assert "stopped after 3 s" in out.stderr


def test_without_the_daemon_disabled_probes_are_not_even_imported(tmp_path: Path) -> None:
    """The health check loads only the probes it may run (and every reporter, for its alerts)."""
    cfg = tmp_path / "hma.toml"
    cfg.write_text(
        f'[agent]\nstate_dir = "{tmp_path}/s"\nrun_dir = "{tmp_path}/r"\n'
        f'probes_dir = "{tmp_path}/p"\nnode_name = "n1"\n'
        "[slurm]\nenabled = false\n"
        + "".join(
            f"[probes.{name}]\nenabled = false\n"
            for name in ("gpu", "nvidia_smi", "neuron", "efa", "efa_mesh", "slurm")
        )
        + '[probes.system]\nfilesystems = ["/"]\n'
    )
    script = (
        "import sys; from hma.commands.healthcheck import run; rc = run(sys.argv[1], quiet=True); "
        "print(rc, sorted(m for m in sys.modules if m.startswith(('hma.probes', 'pynvml'))), "
        "'hma.reporters.journal' in sys.modules)"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", script, str(cfg)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    rc, *rest = out.stdout.split(" ", 1)
    assert rc in ("0", "1", "2")  # the system probe ran and judged this machine
    modules = rest[0]
    assert "hma.probes.system" in modules
    for family in ("nvidia", "neuron", "efa", "slurm", "kernel_log", "pynvml"):
        assert family not in modules, modules
    assert modules.rstrip().endswith("True")  # the journald reporter is there for alerts


# --- without a daemon: what the run decided, for `hma status` (issue 32) ---------------------

OFF = ("gpu", "nvidia_smi", "neuron", "efa", "efa_mesh", "slurm", "infiniband")


def standalone(tmp_path: Path, extra: str = "") -> Path:
    """A node without a daemon or Slurm whose one probe finds a configured path missing."""
    cfg = tmp_path / "hma.toml"
    cfg.write_text(
        f'[agent]\nstate_dir = "{tmp_path}/s"\nrun_dir = "{tmp_path}/r"\n'
        f'probes_dir = "{tmp_path}/p"\nnode_name = "n1"\n'
        "[slurm]\nenabled = false\n"
        + "".join(f"[probes.{name}]\nenabled = false\n" for name in OFF)
        + f'[probes.system]\nfilesystems = ["{tmp_path}/scratch"]\n'
        + "[codes.SYS_FS_MISSING]\nfail_after = 1\nclear_after = 1\n"
        + extra
    )
    return cfg


def hma(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    root = Path(__file__).resolve().parents[2]
    return subprocess.run(
        [sys.executable, "-m", "hma", *args],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_a_run_without_daemon_leaves_its_verdict_for_hma_status(
    tmp_path: Path, capsys: object
) -> None:
    from hma import cli

    cfg = standalone(tmp_path, "[healthcheck]\ninterval = 60.0\n")
    assert run(str(cfg), quiet=True) == 2
    doc = json.loads((tmp_path / "r" / "status.json").read_text())
    assert doc["writer"] == "healthcheck" and doc["heartbeat_s"] == 60.0
    assert doc["node"] == "n1" and doc["severity"] == "critical" and doc["sources"] == []
    (fault,) = [f for f in doc["faults"] if f["code"] == "SYS_FS_MISSING"]
    assert fault["active"] and fault["probe"] == "system" and fault["count"] == 1
    assert [p["name"] for p in doc["probes"]] == ["system"] and doc["probes"][0]["status"] == "ran"
    assert doc["remediation"]["policy"] and "actions" in doc["remediation"]
    capsys.readouterr()  # type: ignore[attr-defined]
    assert cli.main(["--config", str(cfg), "status"]) == 2
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert out.startswith("hma status: no daemon; last health check ")
    assert "n1: CRITICAL" in out and "[critical] SYS_FS_MISSING on " in out
    assert cli.main(["--config", str(cfg), "status", "--json"]) == 2
    (tmp_path / "scratch").mkdir()  # repaired: the next run's document says so
    assert run(str(cfg), quiet=True) == 0
    assert cli.main(["--config", str(cfg), "status"]) == 0


def test_a_run_never_overwrites_a_running_daemons_status(tmp_path: Path) -> None:
    cfg = standalone(tmp_path)
    (tmp_path / "r").mkdir()
    write(tmp_path / "r", severity="ok", boot_id="")  # a live daemon (this process), fresh
    before = (tmp_path / "r" / "status.json").read_text()
    from hma import assembly
    from hma.commands import healthcheck

    setup = assembly.load(str(cfg))
    # the daemon started while the run was checking: its document stays
    healthcheck._standalone(setup, time.time(), True, healthcheck.runlog.RunLog(None, 0.0))
    assert (tmp_path / "r" / "status.json").read_text() == before


# --- NHC's habits: -d, -t, the run log (issue 32) -----------------------------------------------


def blocks_of(tmp_path: Path) -> list[str]:
    from hma.reporters import runlog

    return runlog.blocks((tmp_path / "s" / "healthcheck.log").read_text())


def test_every_run_is_kept_in_the_run_log_even_quiet(tmp_path: Path) -> None:
    cfg = standalone(tmp_path)
    assert run(str(cfg), quiet=True) == 2
    (tmp_path / "scratch").mkdir()
    assert run(str(cfg)) == 0
    first, second = blocks_of(tmp_path)
    assert first.startswith("=== ") and ": exit 2, " in first.splitlines()[0]
    assert "\n  n1: CRITICAL: SYS_FS_MISSING " in first
    assert ": exit 0, " in second.splitlines()[0] and "\n  n1: OK: no active fault" in second
    path = tmp_path / "s" / "healthcheck.log"
    assert stat.S_IMODE(path.stat().st_mode) & 0o007 == 0  # not for every user: evidence


def test_a_run_answered_by_the_daemon_is_logged_too(tmp_path: Path, capsys: object) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write(run_dir, severity="ok")
    cfg = tmp_path / "hma.toml"
    cfg.write_text(f'[agent]\nrun_dir = "{run_dir}"\nstate_dir = "{tmp_path}/s"\n')
    (tmp_path / "s").mkdir()
    assert run(str(cfg)) == 0
    (block,) = blocks_of(tmp_path)
    assert f"\n  n1: OK (daemon pid {os.getpid()}): no active fault" in block
    cfg.write_text(
        f'[agent]\nrun_dir = "{run_dir}"\nstate_dir = "{tmp_path}/s"\n[healthcheck]\nlog = false\n'
    )
    assert run(str(cfg)) == 0
    assert len(blocks_of(tmp_path)) == 1  # log = false: not kept


def test_the_run_log_is_never_written_through_a_symlink(tmp_path: Path) -> None:
    cfg = standalone(tmp_path)
    (tmp_path / "s").mkdir()
    target = tmp_path / "passwd"
    target.write_text("root:x:0:0::/root:/bin/sh\n")
    (tmp_path / "s" / "healthcheck.log").symlink_to(target)
    done = hma("--config", str(cfg), "healthcheck")
    assert done.returncode == 2, done.stderr
    assert target.read_text() == "root:x:0:0::/root:/bin/sh\n"
    assert (tmp_path / "s" / "healthcheck.log").is_symlink()
    assert "run log not written: " in done.stderr and "is a symlink" in done.stderr
    assert "Traceback" not in done.stderr


def test_debug_lines_on_stderr_and_in_the_run_log(tmp_path: Path) -> None:
    cfg = standalone(tmp_path)
    done = hma("--config", str(cfg), "healthcheck", "-d")
    assert done.returncode == 2, done.stderr
    assert "hma: DEBUG " in done.stderr and "scratch" in done.stderr
    assert "\n  hma: DEBUG " in blocks_of(tmp_path)[-1]
    quiet = hma("--config", str(cfg), "healthcheck")
    assert "DEBUG" not in quiet.stderr and "DEBUG" not in blocks_of(tmp_path)[-1]


def test_debug_from_the_configuration_for_slurmds_runs(tmp_path: Path) -> None:
    """slurmd runs HealthCheckProgram without arguments: ``[healthcheck] debug`` is its -d."""
    cfg = standalone(tmp_path, "[healthcheck]\ndebug = true\n")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from hma.commands.healthcheck import main; "
         "sys.exit(main())"],
        env={"SLURMD_NODENAME": "n1", "HMA_CONFIG": str(cfg)},
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "\n  hma: DEBUG " in blocks_of(tmp_path)[-1]


@pytest.mark.parametrize(
    ("value", "expect"),
    [
        ("abc", "expected seconds"),
        ("0", "must be > 0"),
        ("90", "must be <= 58"),
        ("nan", "expected seconds"),
        ("-5", "expected seconds"),
    ],
)
def test_a_bad_timeout_is_one_line_and_unknown(tmp_path: Path, value: str, expect: str) -> None:
    from hma.commands import healthcheck

    cfg = standalone(tmp_path)
    done = hma("--config", str(cfg), "healthcheck", "-t", value)
    assert done.returncode == 3, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("hma healthcheck: -t: ") and expect in line
    assert healthcheck.main(["--config", str(cfg), "--quiet", "-t", value]) == 3


def test_the_timeout_option_overrides_the_configuration(tmp_path: Path) -> None:
    """``-t 2`` with ``[healthcheck] timeout = 50`` and a Slurm that never answers: the run stops
    after 2 s, says so, and its run log has the block (exit 3)."""
    hang = tmp_path / "hang"
    hang.write_text("#!/bin/sh\nexec sleep 30\n")
    hang.chmod(0o755)
    cfg = standalone(tmp_path)
    cfg.write_text(
        cfg.read_text().replace("[slurm]\nenabled = false\n", "")
        + f'[slurm]\nnode_name = "n1"\nscontrol = ["{hang}"]\nsinfo = ["{hang}"]\n'
        f'squeue = ["{hang}"]\ntimeout = 25.0\n'
    )
    done = hma("--config", str(cfg), "healthcheck", "-t", "2", timeout=20)
    assert done.returncode == 3, (done.stdout, done.stderr)
    assert "stopped after 2 s" in done.stderr
    last = blocks_of(tmp_path)[-1]
    assert ": exit 3, " in last.splitlines()[0] and "stopped after 2 s" in last


def test_hma_healthcheck_takes_the_same_options_by_hand(tmp_path: Path) -> None:
    from hma.commands import healthcheck

    cfg = standalone(tmp_path)
    assert healthcheck.main(["--config", str(cfg)]) == 2  # as before
    assert healthcheck.main(["--config", str(cfg), "--quiet", "-d", "-t", "20"]) == 2
    assert len(blocks_of(tmp_path)) == 2


def test_a_run_that_cannot_check_says_so_in_hma_status(tmp_path: Path, capsys: object) -> None:
    """A typo in the configuration after a good run: `hma status` shows the node unknown and
    why, never the earlier run's verdict as if it were this one's."""
    from hma import cli

    cfg = standalone(tmp_path)
    assert run(str(cfg), quiet=True) == 2
    cfg.write_text(cfg.read_text() + "[recovery]\nresume_afterr = 0\n")
    assert run(str(cfg), quiet=True) == 3
    doc = json.loads((tmp_path / "r" / "status.json").read_text())
    assert doc["writer"] == "healthcheck" and doc["severity"] == "unknown"
    (fault,) = doc["faults"]
    assert fault["code"] == "HMA_CONFIG_INVALID" and "resume_afterr" in fault["message"]
    capsys.readouterr()  # type: ignore[attr-defined]
    assert cli.main(["--config", str(cfg), "status"]) == 3
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert "n1: UNKNOWN" in out and "HMA_CONFIG_INVALID on agent" in out
    assert "SYS_FS_MISSING" not in out
