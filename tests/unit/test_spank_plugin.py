"""The SPANK plugin contrib/spank/hma_auto_resume.so, built with the C compiler and driven by an
srun stand-in (tests/standin/spank/harness.c: srun's getopt_long parsing and the SPANK calls the
plugin makes): which command line it hands to ``hma srun``, and how it refuses (issue 29 item 4).
The real srun on a real Slurm: tests/integration/test_spank_slurm.py."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Iterator, NamedTuple, Optional

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mutate import budget

from hma.commands import srun
from tests import spankplugin

FAKE_HMA = """#!/bin/sh
printf '%s\\0' "$@" > "$HMA_ARGV_OUT"
printf '%s' "${HMA_AUTORESUME_INNER-unset}" > "$HMA_ARGV_OUT.inner"
"""


class Built(NamedTuple):
    plugin: Path
    harness: Path
    hma: Path


class Ran(NamedTuple):
    rc: int
    stdout: str
    stderr: str
    argv: Optional[list[str]]  # what the hma stand-in was started with (None: not started)
    inner: Optional[str]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    why = spankplugin.why_not()
    if why:
        pytest.skip(why)
    out = tmp_path_factory.mktemp("spank")
    hma = out / "hma"
    hma.write_text(FAKE_HMA)
    hma.chmod(0o755)
    yield Built(spankplugin.build_plugin(out), spankplugin.build_harness(out), hma)


def run(
    built: Built,
    args: list[str],
    tmp: Path,
    plugargs: Optional[str] = None,
    context: str = "local",
    env: Optional[dict[str, str]] = None,
) -> Ran:
    out = tmp / "argv"
    for path in (out, Path(f"{out}.inner")):
        if path.exists():
            path.unlink()
    environ = {
        "PATH": "/usr/bin:/bin",
        "HARNESS_PLUGIN": str(built.plugin),
        "HARNESS_CONTEXT": context,
        "HARNESS_PLUGARGS": f"hma={built.hma}" if plugargs is None else plugargs,
        "HMA_ARGV_OUT": str(out),
        **(env or {}),
    }
    proc = subprocess.run(
        [str(built.harness), *args], env=environ, capture_output=True, timeout=60, check=False
    )
    argv = out.read_bytes().split(b"\0")[:-1] if out.exists() else None
    return Ran(
        proc.returncode,
        proc.stdout.decode(),
        proc.stderr.decode(),
        None if argv is None else [a.decode("utf-8", "surrogateescape") for a in argv],
        Path(f"{out}.inner").read_text() if argv is not None else None,
    )


def test_option_is_replaced_by_hma_srun_and_the_rest_kept(built: Built, tmp_path: Path) -> None:
    ran = run(built, ["--auto-resume=2", "-N", "2", "-l", "train.sh", "--auto-resume=5"], tmp_path)
    assert ran.rc == 0, ran.stderr
    # the command's own --auto-resume (after srun's options) is the command's
    assert ran.argv == ["srun", "--auto-resume=2", "--", "-N", "2", "-l", "train.sh",
                        "--auto-resume=5"]  # fmt: skip
    assert ran.inner == "1"
    opts = srun.parse_args(ran.argv[1:], env={})  # what hma srun makes of it
    assert opts.attempts == 2 and opts.srun_args == ["-N", "2", "-l", "train.sh", "--auto-resume=5"]


@pytest.mark.parametrize(
    ("args", "attempts", "rest"),
    [
        (["--auto-resume", "cmd"], "1", ["cmd"]),  # the default
        (["-l", "--auto-res=3", "cmd"], "3", ["-l", "cmd"]),  # getopt_long's abbreviation
        (["--auto-resume=1", "--auto-resume=4", "cmd"], "4", ["cmd"]),  # the last one counts
        (["--auto-resume=0007", "--", "cmd"], "7", ["--", "cmd"]),
    ],
)
def test_forms(built: Built, tmp_path: Path, args: list[str], attempts: str, rest: list) -> None:
    ran = run(built, args, tmp_path)
    assert ran.rc == 0, ran.stderr
    assert ran.argv == ["srun", f"--auto-resume={attempts}", "--", *rest]
    assert srun.parse_args(ran.argv[1:], env={}).srun_args == rest


@pytest.mark.parametrize("value", ["0", "x", "-1", "+1", "1.5", "", " 1", "1 ", "1e3", "99999999",
                                   "\u0663", "1\n"])  # fmt: skip
def test_bad_value_fails_srun(built: Built, tmp_path: Path, value: str) -> None:
    ran = run(built, [f"--auto-resume={value}", "cmd"], tmp_path)
    assert ran.rc != 0 and ran.argv is None
    assert "not a whole number from 1 to 1000000" in ran.stderr


def test_separate_value_is_refused_not_run_as_the_command(built: Built, tmp_path: Path) -> None:
    # srun's getopt gives an optional value only after '=': `2` would be the command
    ran = run(built, ["--auto-resume", "2", "train.sh"], tmp_path)
    assert ran.rc == 1 and ran.argv is None
    assert "write --auto-resume=N" in ran.stderr and "srun does not run" in ran.stderr


@pytest.mark.parametrize("case", ["missing", "not executable", "relative"])
def test_unusable_hma_fails_srun(built: Built, tmp_path: Path, case: str) -> None:
    noexec = tmp_path / "noexec"
    noexec.write_text("#!/bin/sh\n")
    noexec.chmod(0o644)  # no x bit: not even root may run it
    plugargs, why = {
        "missing": ("hma=/nonexistent/hma", "/nonexistent/hma: No such file or directory"),
        "not executable": (f"hma={noexec}", f"{noexec}: Permission denied"),
        "relative": ("hma=bin/hma", "hma= must be an absolute path"),
    }[case]
    ran = run(built, ["--auto-resume=1", "cmd"], tmp_path, plugargs=plugargs)
    assert ran.rc == 1 and ran.argv is None and "harness: srun runs" not in ran.stdout
    assert why in ran.stderr and "srun does not run without the auto-resume" in ran.stderr


@pytest.mark.skipif(Path("/usr/bin/hma").exists(), reason="hma is installed here")
def test_default_hma_is_usr_bin_hma(built: Built, tmp_path: Path) -> None:
    ran = run(built, ["--auto-resume", "cmd"], tmp_path, plugargs="")
    assert ran.rc == 1 and "/usr/bin/hma: No such file or directory" in ran.stderr


def test_unknown_plugstack_argument_fails_init(built: Built, tmp_path: Path) -> None:
    ran = run(built, ["cmd"], tmp_path, plugargs="hma_path=/x")
    assert ran.rc == 3 and "unknown plugstack.conf argument 'hma_path=/x'" in ran.stderr


@pytest.mark.parametrize(
    ("args", "context", "env"),
    [
        (["-N", "2", "cmd", "--auto-resume=1"], "local", {}),  # not given (the command's own)
        (["--auto-resume=1", "cmd"], "remote", {}),  # slurmstepd: only registered
        (["--auto-resume=1", "cmd"], "local", {"HMA_AUTORESUME_INNER": "1"}),  # hma's own srun
    ],
)
def test_plain_srun(built: Built, tmp_path: Path, args: list, context: str, env: dict) -> None:
    ran = run(built, args, tmp_path, context=context, env=env)
    assert ran.rc == 0 and ran.argv is None, ran.stderr
    # the marker is consumed: the step's tasks (a nested srun --auto-resume) do not inherit it
    assert "HMA_AUTORESUME_INNER unset" in ran.stdout


def test_allocator_context_has_no_option(built: Built, tmp_path: Path) -> None:
    ran = run(built, ["--auto-resume=1", "cmd"], tmp_path, context="allocator")
    assert ran.rc == 2 and ran.argv is None  # sbatch/salloc: unrecognized option


def test_huge_command_line_is_passed_whole(built: Built, tmp_path: Path) -> None:
    big = "x" * 100_000  # near the kernel's 128 KiB limit per argument
    many = [f"arg-{i:05d}-" + "y" * 40 for i in range(20_000)]  # about 1 MiB in all
    ran = run(built, ["--auto-resume=3", "-l", "cmd", big, *many], tmp_path)
    assert ran.rc == 0, ran.stderr[-500:]
    assert ran.argv == ["srun", "--auto-resume=3", "--", "-l", "cmd", big, *many]


ARG = st.one_of(
    st.sampled_from(["--auto-resume", "--auto-resume=2", "--", "-l", "-N", "x y", "", "--auto"]),
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=12),
)

SRUN_OPTIONS = [["-l"], ["-N", "3"], ["--nodes=2"], ["-J", "a b"], ["--kill-on-bad-exit=1"]]


@given(
    before=st.lists(
        st.sampled_from([["-l"], ["-N", "3"], ["--nodes=2"], ["-J", "a b"]]), max_size=3
    ),
    value=st.one_of(st.none(), st.integers(1, 1000)),
    command=st.lists(ARG, min_size=1, max_size=6).filter(lambda c: not c[0].startswith("-")),
)
@budget(40)
def test_any_command_after_the_option_is_kept(
    built: Built, tmp_path: Path, before: list, value: Optional[int], command: list
) -> None:
    opts = [a for pair in before for a in pair]
    flag = "--auto-resume" if value is None else f"--auto-resume={value}"
    if value is None and command[0].isdigit() and command[0].isascii():
        command = ["cmd", *command]
    ran = run(built, [*opts, flag, *command], tmp_path)
    assert ran.rc == 0, ran.stderr
    assert ran.argv == ["srun", f"--auto-resume={value or 1}", "--", *opts, *command]
    assert srun.parse_args(ran.argv[1:], env={}).srun_args == [*opts, *command]
