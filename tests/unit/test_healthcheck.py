"""hma healthcheck: answering from a running daemon's status.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

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
