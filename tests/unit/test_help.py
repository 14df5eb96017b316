"""Help and output widths (issue 20, defect 7): every command has help text and an example, help
fits 80 columns (the terminal's when narrower), `hma srun --help` is hma's, and the long tables
(`explain --list`, the status probe table) are cut to a terminal narrower than them."""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path
from typing import Any

import pytest

from hma import cli

ROOT = Path(__file__).resolve().parents[2]


def subcommands() -> list[list[str]]:
    """Every command and subcommand the parser has (``config check``, ``inject xid``)."""
    found: list[list[str]] = []

    def walk(parser: argparse.ArgumentParser, prefix: list[str]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    found.append([*prefix, name])
                    walk(sub, [*prefix, name])

    walk(cli.build_parser(), [])
    return found


COMMANDS = subcommands()


def hma(*args: str, columns: int = 200, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hma", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": str(columns), "HMA_CONFIG": "/nonexistent.toml", **env},
    )


def on_terminal(argv: list[str], columns: int, env: dict[str, str]) -> tuple[int, str]:
    """Run ``argv`` with stdout on a pseudo-terminal ``columns`` wide; (exit code, output)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    env = {k: v for k, v in {**os.environ, **env}.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.Popen(argv, stdout=slave, stderr=subprocess.DEVNULL, env=env, cwd=ROOT)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the other side closed
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return proc.wait(60), b"".join(chunks).decode().replace("\r\n", "\n")


@pytest.mark.parametrize("argv", [[], *COMMANDS], ids=lambda a: " ".join(a) or "hma")
def test_every_command_has_help_with_an_example_within_80_columns(argv: list[str]) -> None:
    res = hma(*argv, "--help")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert "examples:" in lines, res.stdout
    assert [line for line in lines if len(line) > 80] == []
    head = res.stdout.split("\n\n")
    assert len(head) >= 3, "usage, a description and the options"


def test_help_follows_a_narrower_terminal() -> None:
    res = hma("check", "--help", columns=60)
    assert res.returncode == 0
    assert [line for line in res.stdout.splitlines() if len(line) > 60] == []


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_srun_help_is_hmas_and_srun_never_runs(tmp_path: Path, flag: str) -> None:
    marker = tmp_path / "srun-ran"
    fake = tmp_path / "srun"
    fake.write_text(f"#!/bin/sh\ntouch {marker}\n")
    fake.chmod(0o755)
    res = hma("srun", flag, PATH=f"{tmp_path}:{os.environ['PATH']}")
    assert res.returncode == 0 and res.stdout.startswith("usage: hma srun"), res.stdout
    assert "--auto-resume" in res.stdout and not marker.exists()


def test_explain_list_is_cut_to_the_terminal_and_whole_in_a_pipe() -> None:
    rc, text = on_terminal([sys.executable, "-m", "hma", "explain", "--list"], 80, {})
    lines = text.splitlines()
    assert rc == 0 and len(lines) > 100
    assert max(len(line) for line in lines) <= 80
    assert any(line.endswith("...") for line in lines)
    piped = hma("explain", "--list").stdout.splitlines()
    assert len(piped) == len(lines) and max(len(line) for line in piped) > 80


def test_status_probe_table_fits_a_narrow_terminal(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    doc = json.loads((ROOT / "tests/fixtures/status/sample.json").read_text())
    doc["probes"][0]["error"] = "x" * 300  # a long error from a probe (free text)
    (run / "status.json").write_text(json.dumps(doc))
    (tmp_path / "hma.toml").write_text(f'[agent]\nrun_dir = "{run}"\n')
    rc, text = on_terminal(
        [sys.executable, "-m", "hma", "status"], 72, {"HMA_CONFIG": str(tmp_path / "hma.toml")}
    )
    table = text.split("Probes (")[1].split("\n\n")[0].splitlines()[1:]
    assert len(table) == len(doc["probes"]) + 1
    assert all(len(line) <= 72 for line in table), table
    assert any(line.endswith("...") for line in table)


def test_lifecycle_script_answers_help() -> None:
    script = ROOT / "packaging/lifecycle/install_hma.sh"
    res = subprocess.run(
        ["bash", str(script), "--help"], capture_output=True, text=True, timeout=30, check=False
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("Usage: install_hma.sh")
    assert "HMA_EXPECTED_GPUS" in res.stdout and "no such file" not in res.stderr


def test_check_help_lists_probes_within_80_columns(hma_env: Any) -> None:
    res = hma_env.hma("check", "--help", env={**hma_env.env(), "COLUMNS": "200"})
    assert res.returncode == 0 and "probes installed here" in res.stdout
    assert [line for line in res.stdout.splitlines() if len(line) > 80] == []
