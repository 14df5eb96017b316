"""`hma check --debug` and the daemon's debug level (issue 20): what each probe read and ran, the
thresholds it compared, why it decided; nothing of it without the switch."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def config(hma_env: Any, tmp_path: Path, extra: str = "", filesystems: str = "[]") -> None:
    procfs, sysfs = tmp_path / "proc", tmp_path / "sys"
    (procfs / "self").mkdir(parents=True)
    (procfs / "meminfo").write_text("MemTotal: 1000 kB\nMemAvailable: 900 kB\n")
    cpu = sysfs / "devices/system/cpu"
    cpu.mkdir(parents=True)
    (cpu / "online").write_text("0-2\n")
    (cpu / "present").write_text("0-3\n")  # one CPU offline: SYS_CPU_OFFLINE
    hma_env.write(
        f'[paths]\nprocfs = "{procfs}"\nsysfs = "{sysfs}"\n'
        f"[probes.system]\nfilesystems = {filesystems}\nprocesses = []\n" + extra
    )


def test_check_debug_shows_reads_thresholds_and_decisions(hma_env: Any, tmp_path: Path) -> None:
    config(hma_env, tmp_path)
    res = hma_env.hma("check", "system", "--debug")
    assert res.returncode == 2, res.stderr
    err = res.stderr
    assert f"read {tmp_path}/proc/meminfo: 'MemTotal: 1000 kB" in err
    assert f"read {tmp_path}/sys/devices/system/cpu/online: '0-2'" in err
    assert "probe system: options {" in err and '"edac_ce_per_run": 100' in err
    assert "decided SYS_CPU_OFFLINE on node: 3 CPUs online, 4 expected" in err
    assert '"expected": 4' in err  # the evidence it compared
    assert "SYS_CPU_OFFLINE" in res.stdout  # the report itself stays on stdout


def test_check_debug_shows_the_mount_flags_of_the_filesystems(hma_env: Any, tmp_path: Path) -> None:
    config(hma_env, tmp_path, filesystems=f'["{tmp_path}"]')
    res = hma_env.hma("check", "system", "--debug")
    assert f"statvfs {tmp_path}: " in res.stderr and "'mount_readonly': False" in res.stderr


def test_without_debug_nothing_of_it(hma_env: Any, tmp_path: Path) -> None:
    config(hma_env, tmp_path)
    res = hma_env.hma("check", "system")
    assert res.returncode == 2 and "DEBUG" not in res.stderr, res.stderr


def test_debug_shows_commands_and_reads_of_a_worker_process(hma_env: Any, tmp_path: Path) -> None:
    config(
        hma_env,
        tmp_path,
        '[probes.nvidia_smi]\ncommand = ["/bin/false", "-q"]\nexpected_gpus = 1\n'
        '[probes.gpu]\nlibrary = "/nonexistent/libnvidia-ml.so.1"\n',
    )
    gpu = tmp_path / "sys/bus/pci/devices/0000:3b:00.0"
    gpu.mkdir(parents=True)
    (gpu / "vendor").write_text("0x10de\n")
    (gpu / "class").write_text("0x030200\n")
    res = hma_env.hma("check", "nvidia_smi", "gpu", "--debug")
    assert "ran /bin/false -q: exit 1 in " in res.stderr, res.stderr
    # the gpu probe runs in a worker process (isolation = "process"): its reads are shown too
    assert f"read {gpu}/vendor: '0x10de'" in res.stderr, res.stderr
    assert "probe gpu: decided unknown GPU_DRIVER_NOT_LOADED" in res.stderr


def test_daemon_log_level_debug(hma_env: Any, tmp_path: Path) -> None:
    config(hma_env, tmp_path)
    text = hma_env.config.read_text()
    hma_env.config.write_text(text.replace("[agent]\n", '[agent]\nlog_level = "debug"\n', 1))
    proc = subprocess.Popen(
        [sys.executable, "-m", "hma", "run"],
        env=hma_env.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # readline returns at the latest when hma exits
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            if "probe system: decided" in line:
                break
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
    assert any("probe system: decided" in line for line in lines), "".join(lines)
    assert any(f"read {tmp_path}/proc/meminfo" in line for line in lines)


def test_run_refuses_an_unknown_log_level(hma_env: Any) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "hma", "run", "--log-level", "loud"],
        env=hma_env.env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 2 and "invalid choice" in res.stderr
