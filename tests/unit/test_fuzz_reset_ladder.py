"""Fuzz of the GPU reset ladder (issue 28, part 7): the reset tool hangs, exits 255, prints
garbage (binary, huge, escape sequences) or succeeds while the fault persists, and the agent is
killed between the reset and its record. Whatever the tool does, a reset runs at most once per
episode, the ladder goes on to the reboot when the reset did not repair, and what the tool printed
reaches the status only escaped and bounded.

The reset tool is a real program (a ``/bin/sh`` stand-in per case, run by the real
``CommandRunner``); Slurm is the in-memory client of test_remediation_engine.
"""

from __future__ import annotations

import re
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mutate import budget

from hma.adapters.command import CommandResult, CommandRunner
from hma.probes.nvidia.reset import GpuReset
from hma.remediation import remediations, repair
from hma.remediation.engine import Remediator
from tests.faults import fault
from tests.unit.test_remediation_engine import FakeSlurm, make, run, writes

pytestmark = pytest.mark.timeout(120)

GPU = "gpu:0000:5d:00"
XID46 = "GPU_XID_46"  # NVIDIA: RESET_GPU
# What may never reach an operator from a tool's output: C0 (newlines too), DEL, C1, bidi.
UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
NOTE_MAX = 2000  # a status note stays a line, not a copy of the tool's output

# Outputs a dying nvidia-smi has printed or could print.
OUTPUTS: tuple[bytes, ...] = (
    b"",
    b"GPU 00000000:5D:00.0 was successfully reset.\n",
    b"\xff\xfe\x00\x80binary\x00\xc3",
    b"\x1b[2J\x1b]0;owned\x07\x1b[31mred\r\n\x9b31m",
    "\u202egnp.exe\u2066x\u2069\u2028".encode(),
    b"Unable to reset GPU 00000000:5D:00.0: In use by another client\n" * 40,
    b"x" * 3_000_000,
)


class Killed(BaseException):
    """kill -9 of the agent, at the instant a wrapped reset returns (nothing after it runs)."""


def tool(tmp: Path, rc: Optional[int], out: bytes) -> tuple[list[str], Path]:
    """A reset tool stand-in: counts its runs in ``calls``, prints ``out`` (stdout and stderr),
    then exits ``rc`` (None: hangs until killed)."""
    calls, data = tmp / "calls", tmp / "out.bin"
    data.write_bytes(out)
    end = "exec sleep 600" if rc is None else f"exit {rc}"
    script = tmp / "reset-tool"
    script.write_text(f'#!/bin/sh\necho "$@" >> {calls}\ncat {data}\ncat {data} >&2\n{end}\n')
    script.chmod(0o755)
    return [str(script)], calls


def ran(calls: Path) -> int:
    return len(calls.read_text().splitlines()) if calls.exists() else 0


def agent(tmp: Path, fake: FakeSlurm, command: list[str]) -> Remediator:
    return make(
        tmp, fake, gpu_reset_command=command, gpu_reset_timeout=0.5, max_drained_percent=100.0
    )


def xid46(last: Optional[float] = None) -> Any:
    return fault(XID46, GPU, message="Xid 46", last=last)


def note_of(rem: Remediator) -> str:
    ep = rem.status()["episode"]
    return str(ep["gpu_reset"]["note"]) if ep and ep.get("gpu_reset") else ""


def assert_safe(text: str) -> None:
    assert not UNSAFE.search(text), repr(text[:200])
    assert len(text) <= NOTE_MAX, len(text)


@given(
    rc=st.sampled_from([0, 0, 1, 255, None]),
    out=st.one_of(st.sampled_from(OUTPUTS), st.binary(max_size=64)),
    persists=st.booleans(),
)
@budget(14)
def test_the_ladder_resets_once_and_goes_on_whatever_the_tool_does(
    rc: Optional[int], out: bytes, persists: bool
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        command, calls = tool(tmp, rc, out)
        fake = FakeSlurm("n1")
        rem = agent(tmp, fake, command)
        run(rem, (xid46(),))
        assert ran(calls) == 1
        assert_safe(note_of(rem))
        for row in rem.status()["actions"]:
            assert_safe(str(row["last_error"]))
        if rc != 0:  # exited non-zero or timed out: the reboot follows at once
            assert writes(fake).count("reboot") == 1 and rem.gpu_resets() == []
        else:
            assert writes(fake).count("reboot") == 0 and rem.gpu_resets()
            if persists:  # "successfully reset", and the Xid again: the reboot
                run(rem, (xid46(last=time.time() + 1),))
                assert writes(fake).count("reboot") == 1
            else:
                rem.probe_ran("gpu", time.time() + 1)
                run(rem, ())
                assert "DRAIN" not in fake.state["n1"].flags
                assert writes(fake).count("reboot") == 0
        run(rem, (xid46(last=time.time() + 2),) if persists or rc != 0 else ())
        assert ran(calls) == 1  # never a second reset in the episode
        assert writes(fake).count("reboot") <= 1


@pytest.mark.parametrize("when", ["after", "before"])
def test_kill_9_around_the_reset_gives_at_most_one_reset_and_the_reboot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    command, calls = tool(tmp_path, 0, OUTPUTS[1])
    real = repair.gpu_reset

    def killed(cmd: Any, timeout: float) -> Any:
        reset = real(cmd, timeout)

        class Dying:
            why_not = reset.why_not

            def __call__(self, component: str) -> tuple[bool, str]:
                if when == "after":
                    reset(component)
                raise Killed

        return Dying()

    fake = FakeSlurm("n1")
    monkeypatch.setattr(repair, "gpu_reset", killed)
    first = agent(tmp_path, fake, command)
    with pytest.raises(Killed):
        run(first, (xid46(),))
    assert ran(calls) == (1 if when == "after" else 0)
    monkeypatch.setattr(repair, "gpu_reset", real)
    second = agent(tmp_path, fake, command)  # the restarted agent, on the same state store
    run(second, (xid46(),))
    # the reset may have run: never a second one; its outcome is unknown: the next rung
    assert ran(calls) == (1 if when == "after" else 0)
    assert writes(fake).count("reboot") == 1
    assert "outcome unknown" in note_of(second)
    actions = [r["action"] for r in remediations.rows(second.store)]
    assert actions.count("reset_gpu") == 1


@given(
    rc=st.sampled_from([0, 1, 255, None]),
    out=st.text(max_size=400) | st.sampled_from([o.decode("utf-8", "replace") for o in OUTPUTS]),
    err=st.text(max_size=80),
    timed_out=st.booleans(),
)
@budget(200)
def test_reset_outcome_is_typed_escaped_and_bounded(
    rc: Optional[int], out: str, err: str, timed_out: bool
) -> None:
    class Canned(CommandRunner):
        def run(self, argv: Any, timeout: float, env: Any = None, stdin: Any = None) -> Any:
            return CommandResult(tuple(argv), rc, out, err, 0.1, timed_out=timed_out)

    ok, detail = GpuReset(["nvidia-smi"], 1.0, Canned())(GPU)
    assert ok is (rc == 0 and not timed_out)
    assert_safe(detail)
    if not ok:
        assert detail.startswith(f"GPU reset of {GPU} failed (")
        assert ("timed out" in detail) == timed_out


def test_a_hung_reset_is_killed_and_reported_as_timed_out(tmp_path: Path) -> None:
    command, calls = tool(tmp_path, None, b"partial output\x1b[0m")
    ok, detail = GpuReset(command, 0.5)(GPU)
    assert not ok and ran(calls) == 1
    assert detail.startswith(f"GPU reset of {GPU} failed (timed out after 0.5 s)")
    assert "\\x1b[0m" in detail
