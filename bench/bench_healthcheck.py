"""`hma healthcheck` as Slurm's HealthCheckProgram against what it replaces (docs/slurm.md).

Medians of 10 whole-process runs each (the way slurmd starts the program), on this machine:

- a bare interpreter (`python3 -c pass`), `hma status` and `hma healthcheck` with a running daemon
  (a fresh status.json whose pid is alive: the health check only reads it);
- `hma healthcheck` without the daemon, with the probes cut to the checks LBNL NHC's seven basic
  host checks make (the `system` probe: CPUs, memory, filesystems writable, free space and
  inodes, a required process; every other probe disabled; no Slurm calls on either side);
- LBNL NHC itself with those seven checks, when a checkout is given (`--nhc DIR` or
  `$HMA_BENCH_NHC`: `git clone https://github.com/mej/nhc`; Debian does not package it). Without
  one, NHC is left out and the ratio to it is not printed (no stand-in is timed in its place).

Byte code is written on a first, untimed run of each command (installed packages ship it;
`PYTHONDONTWRITEBYTECODE` is dropped for the runs), so the figures are what a node pays.

    python bench/bench_healthcheck.py [--nhc DIR] [--runs N]
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from hma.reporters import statusfile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, median_ms, time_command  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OTHER_PROBES = ("gpu", "nvidia_smi", "neuron", "efa", "efa_mesh", "slurm")
PROCESS = "sleep"  # the process both tools require (started by the bench)


def sockets() -> int:
    """Physical packages, as NHC's check_hw_cpuinfo counts them (``physical id`` in cpuinfo)."""
    ids = {
        line.split(":", 1)[1].strip()
        for line in Path("/proc/cpuinfo").read_text().splitlines()
        if line.startswith("physical id")
    }
    return max(1, len(ids))


def nhc_conf(folder: Path) -> Path:
    """Seven basic NHC checks that pass on this machine."""
    cores = psutil.cpu_count(logical=False) or 1
    threads = psutil.cpu_count() or 1
    conf = folder / "nhc.conf"
    conf.write_text(
        "* || check_fs_mount_rw -f /\n"
        "* || check_file_test -r -w -x -d -k /tmp\n"
        "* || check_fs_free / 3%\n"
        "* || check_fs_ifree / 1%\n"
        "* || check_hw_physmem 1kB 100TB\n"
        f"* || check_hw_cpuinfo {sockets()} {cores} {threads}\n"
        f"* || check_ps_service -u {getpass.getuser()} {PROCESS}\n"
    )
    return conf


def hma_conf(folder: Path, run_dir: Path) -> Path:
    """The same checks as hma's ``system`` probe; nothing else runs, no Slurm."""
    cfg = folder / "hma.toml"
    lines = [
        "[agent]",
        f'state_dir = "{folder / "state"}"',
        f'run_dir = "{run_dir}"',
        f'probes_dir = "{folder / "probes.d"}"',
        'node_name = "bench"',
        "[slurm]",
        "enabled = false",
        "[probes.system]",
        'filesystems = ["/", "/tmp"]',
        "min_free_percent = 3.0",
        "min_free_inodes_percent = 1.0",
        f'processes = ["{PROCESS}"]',
        f"expected_cpus = {psutil.cpu_count() or 1}",
    ]
    for name in OTHER_PROBES:
        lines += [f"[probes.{name}]", "enabled = false"]
    cfg.write_text("\n".join(lines) + "\n")
    return cfg


def timed(
    label: str, argv: list[str], env: dict[str, str], runs: int, ok: tuple[int, ...] = (0,)
) -> float:
    """Median wall time in ms (one untimed run first: byte code, page cache; its exit status
    must be one of ``ok``: the checks ran and passed)."""
    first = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    if first.returncode not in ok:
        raise SystemExit(f"{label}: exit {first.returncode}: {first.stdout}{first.stderr}")
    return median_ms(time_command(argv, runs, env))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nhc", default=os.environ.get("HMA_BENCH_NHC"), help="NHC checkout")
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    python = sys.executable
    hma = str(Path(python).with_name("hma"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        daemon_run, no_daemon_run = folder / "run", folder / "run-none"
        daemon_run.mkdir()
        required = subprocess.Popen([shutil.which(PROCESS) or "/bin/sleep", "600"])
        try:
            # a running daemon, as far as status.json tells: a live pid, this boot, fresh
            doc = json.loads((ROOT / "tests/fixtures/status/sample.json").read_text())
            doc.update(
                pid=os.getpid(),
                boot_id=statusfile.current_boot_id(),
                generated=time.time(),
                heartbeat_s=3600.0,
            )
            statusfile.write_atomic(statusfile.status_path(daemon_run), doc)
            with_daemon = {**env, "HMA_CONFIG": str(hma_conf(folder, daemon_run))}
            alone_folder = folder / "alone"
            alone_folder.mkdir()
            alone = {**env, "HMA_CONFIG": str(hma_conf(alone_folder, no_daemon_run))}
            rows = {
                "python3 -c pass": timed("bare", [python, "-c", "pass"], env, args.runs),
                # the sample document is critical: exit 2 is the answer
                "hma status (daemon)": timed(
                    "status", [hma, "status"], with_daemon, args.runs, (2,)
                ),
                "hma healthcheck (daemon)": timed(
                    "healthcheck", [hma, "healthcheck"], with_daemon, args.runs, (2,)
                ),
                "hma healthcheck (no daemon)": timed(
                    "healthcheck alone", [hma, "healthcheck"], alone, args.runs
                ),
            }
            if args.nhc:
                src = Path(args.nhc)
                conf = nhc_conf(folder)
                argv = [
                    "bash",
                    str(src / "nhc"),
                    "-D",
                    str(src),
                    "-c",
                    str(conf),
                    "-l",
                    "/dev/null",
                    "MARK_OFFLINE=0",  # no Slurm calls (hma: [slurm] enabled = false)
                    "NHC_RM=",
                    f"INCDIR={src / 'scripts'}",
                ]
                rows["LBNL NHC, 7 checks"] = timed("nhc", argv, env, args.runs)
        finally:
            required.kill()
            required.wait()
    print(machine())
    nhc_sha = ""
    if args.nhc and (Path(args.nhc) / ".git").exists():
        nhc_sha = subprocess.run(
            ["git", "-C", args.nhc, "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    bare = rows["python3 -c pass"]
    status = rows["hma status (daemon)"]
    for label, value in rows.items():
        print(f"{label:<28} median of {args.runs}: {value:7.1f} ms  ({value / bare:.2f}x bare)")
    daemon = rows["hma healthcheck (daemon)"]
    print(f"healthcheck with the daemon / hma status:      {daemon / status:.2f}")
    if "LBNL NHC, 7 checks" in rows:
        nhc = rows["LBNL NHC, 7 checks"]
        print(
            f"healthcheck without the daemon / NHC:          "
            f"{rows['hma healthcheck (no daemon)'] / nhc:.2f}"
            + (f"  (NHC {nhc_sha})" if nhc_sha else "")
        )
    else:
        print("LBNL NHC not measured (give --nhc DIR, a checkout of github.com/mej/nhc)")


if __name__ == "__main__":
    main()
