"""Run external commands as argv lists with a timeout, an output cap and process-group kill.

Two caps: tools whose whole output is parsed (nvidia-smi, Slurm commands, fi_pingpong) get
``TOOL_OUTPUT_CAP``, a bound real outputs never reach, so a cut output is a fault of the tool, never
a document to parse; executable (Nagios) probes keep ``[agent] exec_output_cap``. A cut output is
flagged (``CommandResult.truncated``) and callers report it as cut (``cut_message``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Optional, Sequence

from hma.adapters.logs import debug_logger

if TYPE_CHECKING:  # subprocess, selectors and signal are imported when a command runs
    import subprocess

LOG = "hma.command"  # debug: every command a probe ran (`hma check --debug`)

TOOL_OUTPUT_CAP = 64 << 20
"""Bytes kept per stream of a tool's output (64 MiB: an 8-GPU ``nvidia-smi -q -x`` with MIG and
many processes is about 2 MB, ``sinfo --json`` about 1.2 KB per node)."""


@dataclass(frozen=True)
class CommandResult:
    """What a command did. ``rc`` is None when it was killed on timeout or could not start."""

    argv: tuple[str, ...]
    rc: Optional[int]
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    truncated: bool = False  # stdout or stderr was cut at ``cap`` bytes
    error: str = ""  # set when the command could not be started
    cap: int = 0  # the per-stream byte cap it ran under

    def cut_message(self) -> str:
        """Why the output must not be parsed: ``"output cut at N bytes"`` ("" when whole)."""
        return f"output cut at {self.cap} bytes" if self.truncated else ""

    @property
    def ok(self) -> bool:
        """Exited 0 within the timeout."""
        return self.rc == 0 and not self.timed_out


class CommandRunner:
    """Runs argv lists (never a shell). Replace it in tests to serve canned results.

    ``output_cap`` bounds each of stdout and stderr (bytes); the default suits tools whose output
    is parsed whole.
    """

    def __init__(self, output_cap: int = TOOL_OUTPUT_CAP) -> None:
        self.output_cap = output_cap

    def run(
        self,
        argv: Sequence[str],
        timeout: float,
        env: Optional[Mapping[str, str]] = None,
        stdin: Optional[bytes] = None,
    ) -> CommandResult:
        """Run ``argv``; on timeout kill its whole process group. Never raises for the command."""
        import subprocess

        start = time.monotonic()
        try:
            proc = subprocess.Popen(  # noqa: S603 - argv list, no shell
                list(argv),
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=dict(env) if env is not None else None,
                start_new_session=True,
            )
        except OSError as exc:
            log = debug_logger(LOG)
            if log is not None:
                log.debug("ran %s: cannot start: %s", _argv_text(argv), exc.strerror)
            return CommandResult(
                tuple(argv),
                None,
                "",
                "",
                0.0,
                error=f"{argv[0]}: {exc.strerror}",
                cap=self.output_cap,
            )
        out, err, truncated, timed_out = _collect(proc, stdin, timeout, self.output_cap)
        log = debug_logger(LOG)
        if log is not None:
            log.debug(
                "ran %s: %s in %.2f s, %d bytes out, %d bytes err",
                _argv_text(argv),
                f"timed out after {timeout:g} s" if timed_out else f"exit {proc.returncode}",
                time.monotonic() - start,
                len(out),
                len(err),
            )
        return CommandResult(
            tuple(argv),
            None if timed_out else proc.returncode,
            out.decode("utf-8", "replace"),
            err.decode("utf-8", "replace"),
            time.monotonic() - start,
            timed_out=timed_out,
            truncated=truncated,
            cap=self.output_cap,
        )


def _argv_text(argv: Sequence[str]) -> str:
    from hma.adapters.text import printable

    return printable(" ".join(argv))


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group a ``start_new_session`` child leads."""
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _collect(
    proc: subprocess.Popen, stdin: Optional[bytes], timeout: float, cap: int
) -> tuple[bytes, bytes, bool, bool]:
    import selectors
    import subprocess

    deadline = time.monotonic() + timeout
    if stdin is not None and proc.stdin is not None:
        try:
            proc.stdin.write(stdin)
            proc.stdin.close()
        except BrokenPipeError:
            pass
    assert proc.stdout is not None and proc.stderr is not None
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    bufs = {out_fd: bytearray(), err_fd: bytearray()}
    truncated = False
    timed_out = False
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        sel.register(proc.stderr, selectors.EVENT_READ)
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for key, _ in sel.select(min(remaining, 1.0)):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buf = bufs[key.fd]
                room = cap - len(buf)
                if room > 0:
                    buf += chunk[:room]
                if len(chunk) > room:
                    truncated = True
    if not timed_out:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
    if timed_out:
        kill_group(proc)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
    proc.stdout.close()
    proc.stderr.close()
    return (
        bytes(bufs[out_fd]),
        bytes(bufs[err_fd]),
        truncated,
        timed_out,
    )
