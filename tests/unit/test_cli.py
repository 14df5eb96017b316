"""The command line as a newcomer meets it: explain, ack, check's arguments, logscan errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hma import cli
from hma.contracts import catalogue


def run(capsys: Any, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_explain_says_only_true_things(capsys: Any) -> None:
    rc, out, _ = run(capsys, "explain", "KERNEL_MCE_HW_ERROR")
    assert rc == 0
    assert "severity:  warning" in out and "drains:    yes" not in out
    assert "drains:    not at its severity warning; yes when a probe or rule reports it" in out
    _, out, _ = run(capsys, "explain", "GPU_XID_OTHER")
    assert "severity:  warning" in out and "fatal" not in out
    assert "raised:    on the first observation" in out
    _, out, _ = run(capsys, "explain", "gpu_xid_79")
    assert "drains:    yes" in out and "clears:    when the node reboots" in out


def test_explain_without_code_prints_usage(capsys: Any) -> None:
    rc, out, err = run(capsys, "explain")
    assert rc == 2 and out == ""
    assert err.startswith("usage: hma explain CODE") and "--list" in err


@pytest.mark.parametrize(
    "typed, meant",
    [("79", "GPU_XID_79"), ("079", "GPU_XID_79"), ("9999", "GPU_XID_OTHER"), ("mce", "KERNEL_MCE")],
)
def test_explain_suggests_codes(capsys: Any, typed: str, meant: str) -> None:
    rc, _, err = run(capsys, "explain", typed)
    assert rc == 2 and f"unknown code {typed!r}; did you mean {meant}" in err


def test_explain_list_sorts_numbers_by_value(capsys: Any) -> None:
    rc, out, _ = run(capsys, "explain", "--list")
    codes = [line.split()[0] for line in out.splitlines()]
    assert rc == 0 and len(codes) == len(catalogue.load_builtin())
    assert codes.index("GPU_XID_13") < codes.index("GPU_XID_109")
    assert codes.index("GPU_XID_8") < codes.index("GPU_XID_13")


def test_ack_of_a_code_that_clears_at_reboot_says_so(hma_env: Any, capsys: Any) -> None:
    rc, _, err = run(capsys, "ack", "GPU_XID_79", "--config", str(hma_env.config))
    assert rc == 2
    assert err == (
        "hma ack: GPU_XID_79 is not acknowledged by an operator: it clears when the node "
        "reboots (a new boot id). Nothing to do.\n"
    )


@pytest.mark.parametrize(
    "argv", [["ack", "HMA_STATE_RESET"], ["reset", "--all", "--reason", "new GPU"]]
)
def test_ack_and_reset_say_when_the_state_store_cannot_be_opened(
    hma_env: Any, capsys: Any, tmp_path: Path, argv: list[str]
) -> None:
    if os.geteuid() != 0:
        pytest.skip("ack and reset check root first")
    blocker = tmp_path / "file"
    blocker.write_text("")  # a state folder below a file: the store cannot be opened
    hma_env.state = blocker / "state"
    hma_env.write("[reporters.journald]\nenabled = false\n")
    rc, out, err = run(capsys, *argv, "--config", str(hma_env.config))
    assert (rc, out) == (73, "")
    assert err.startswith(f"hma {argv[0]}: cannot open the state store: "), err


AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable]


def as_nobody(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*AS_NOBODY, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd="/",
        env={**os.environ, "HMA_CONFIG": "/nonexistent/hma.toml"},
    )


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv"
)
@pytest.mark.parametrize(
    "argv",
    [["ack", "HMA_STATE_RESET"], ["reset", "--all", "--reason", "x"], ["maintenance", "on"]],
)
def test_commands_that_change_the_store_as_an_ordinary_user_need_root(
    argv: list[str], trusted_dir: Path
) -> None:
    if as_nobody("-c", "import hma").returncode != 0:
        pytest.skip("this interpreter cannot run as an ordinary user (a folder under /root?)")
    config = trusted_dir / "hma.toml"  # maintenance reads it first (its status needs no root)
    config.write_text(f'[agent]\nstate_dir = "{trusted_dir}/state"\n')
    config.chmod(0o644)
    res = as_nobody("-m", "hma", *argv, "--config", str(config))
    assert res.returncode == 77, res.stderr
    assert res.stderr == (
        f"hma {argv[0]}: needs root (it changes the agent's state store); run it with sudo\n"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["check", "--json", "--config", "X"],
        ["check", "--config", "X", "--json"],
        ["--config", "X", "check", "--json"],
        ["check", "--config=X", "--json"],
    ],
)
def test_check_takes_config_anywhere(argv: list[str]) -> None:
    args = cli.build_parser().parse_args(argv)
    assert args.config == "X" and args.json and args.probes == []


def test_check_json_with_config_after_the_subcommand(hma_env: Any) -> None:
    hma_env.write("[probes.system]\nfilesystems = []\n")
    res = hma_env.hma("check", "--json", "--config", str(hma_env.config), env=dict(os.environ))
    doc = json.loads(res.stdout)
    assert doc["node"] == "testnode" and "system" in [p["name"] for p in doc["probes"]]


def test_check_of_an_event_source_says_what_it_is(hma_env: Any, capsys: Any) -> None:
    rc, _, err = run(capsys, "check", "kernel_log", "nosuch", "--config", str(hma_env.config))
    assert rc == 3
    assert "kernel_log is an event source, not a probe" in err and "hma logscan FILE" in err
    assert "unknown probe 'nosuch' (probes: efa, efa_mesh, gpu" in err


def test_check_help_lists_the_probes(hma_env: Any, capsys: Any) -> None:
    hma_env.exec_probe("site_fans", "echo OK")
    rc, out, _ = run(capsys, "--config", str(hma_env.config), "check", "--help")
    assert rc == 0 and out.startswith("usage: hma check")
    assert "probes installed here (PROBE):\n  efa " in out
    assert "  system       filesystems, memory" in out
    assert f"\n  {hma_env.probes_d}: site_fans\n" in out
    assert "  kernel_log   Kernel messages through the kernel-log rules" in out


def test_logscan_names_a_missing_file_once(capsys: Any, tmp_path: Any) -> None:
    missing = tmp_path / "nonexistent"
    rc, out, _ = run(capsys, "logscan", str(missing))
    assert rc == 3
    assert out.count(str(missing)) == 1 and "No such file or directory" in out


# root without the capabilities that bypass file permissions: an ordinary user's view of files,
# with this interpreter still usable (it may live under /root)
WITHOUT_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", sys.executable]


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv"
)
@pytest.mark.parametrize(
    "command",
    [
        ["status"],
        ["check"],
        ["explain", "GPU_XID_79"],
        ["config", "check"],
        ["fleet"],
        ["logscan", "/dev/null"],
        ["srun", "--help"],
        ["job-env"],
    ],
)
def test_a_config_folder_that_cannot_be_entered_is_an_error_not_a_traceback(
    tmp_path: Any, command: list[str]
) -> None:
    folder = tmp_path / "locked"
    folder.mkdir(mode=0o700)
    (folder / "hma.toml").write_text("[agent]\n")
    os.chown(folder, 65534, 65534)
    res = subprocess.run(
        [*WITHOUT_DAC, "-m", "hma", *command],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd="/",
        env={**os.environ, "HMA_CONFIG": str(folder / "hma.toml")},
    )
    assert "Traceback" not in res.stderr, res.stderr
    if command[0] in ("check", "config", "fleet", "logscan"):
        assert res.returncode != 0 and "Permission denied" in res.stderr, res.stderr


@pytest.mark.parametrize(
    "extra, argv",
    [
        (
            '[slurm]\nsinfo = ["/nonexistent/sinfo"]\nscontrol = ["/nonexistent/scontrol"]\n',
            ["fleet", "--json"],
        ),
        ("[probes.nope]\nbogus = 1\n", ["fleet", "--json"]),
        ("[probes.nope]\nbogus = 1\n", ["check", "--json"]),
        ("", ["check", "nosuchprobe", "--json"]),
        ("[probes.nope]\nbogus = 1\n", ["logscan", "--json", "/dev/null"]),
    ],
)
def test_json_commands_print_a_document_that_says_what_is_missing(
    hma_env: Any, extra: str, argv: list[str]
) -> None:
    hma_env.write(extra)
    res = hma_env.hma(*argv)
    assert res.returncode == 3, res.stderr
    doc = json.loads(res.stdout)
    assert doc["command"] == argv[0] and doc["severity"] == "unknown" and doc["problem"]
