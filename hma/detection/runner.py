"""Running one probe once, isolated so that a raise, garbage or a hang never reaches the caller.

Mechanism (docs/architecture.md): ``isolation = "thread"`` probes collect in a daemon thread of
the agent; ``isolation = "process"`` probes (those calling into C, e.g. NVML) collect in a
persistent worker process (``python -m hma.detection.worker``) that answers JSON lines on a pipe.
The caller
waits at most the probe's timeout. A timed-out thread cannot be killed: while it is still stuck the
probe reports ``HMA_PROBE_HUNG`` and no second thread is started. A timed-out worker process is
killed with its process group; one that survives SIGKILL (D state) is reported hung and replaced
only once it has exited. Either way at most one stuck worker exists per probe.
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Sequence

from hma.adapters.command import kill_group
from hma.adapters.logs import debug_logger
from hma.contracts.model import Finding, ProbeRun, RunStatus
from hma.contracts.probe import NodeFacts, Probe, ProbeContext

LOG = "hma.probe"  # debug: each probe's options, result and decisions

if TYPE_CHECKING:  # subprocess: imported when a worker process starts (thread probes need none)
    import subprocess

    from hma.detection.setup import Setup


@dataclass(frozen=True)
class Collected:
    """Raw outcome of the collect step."""

    status: RunStatus
    snapshot: Any = None
    error: str = ""
    hung: bool = False


def probe_component(name: str) -> str:
    """Component key for findings about a probe itself."""
    return f"probe:{name}"


class ThreadSlot:
    """Collects in a fresh daemon thread per run; remembers a thread that is still stuck."""

    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        self._stuck: Optional[threading.Thread] = None
        self._stuck_since = 0.0

    def collect(self, ctx: ProbeContext, timeout: float) -> Collected:
        """Run applies+collect, waiting at most ``timeout`` seconds."""
        if self._stuck is not None:
            if self._stuck.is_alive():
                since = time.monotonic() - self._stuck_since
                return Collected(
                    RunStatus.TIMED_OUT,
                    error=f"previous run still stuck after {since:.0f} s",
                    hung=True,
                )
            self._stuck = None
        box: list[Collected] = []

        def work() -> None:
            box.append(collect_guarded(self.probe, ctx))

        thread = threading.Thread(target=work, name=f"probe-{self.probe.name}", daemon=True)
        thread.start()
        thread.join(timeout)
        if box:
            return box[0]
        self._stuck, self._stuck_since = thread, time.monotonic()
        return Collected(RunStatus.TIMED_OUT, error=f"no result within {timeout:g} s")

    def close(self) -> None:
        """Nothing to release: a stuck thread dies with the process."""


DEBUG_ENV = "WORKER_DEBUG"


def worker_env() -> dict[str, str]:
    """The environment of a worker: this process's import path first, so that the worker imports
    the same hma (the packages' private /usr/lib/hma is on sys.path only through the launcher).
    The caller's PYTHONPATH is kept in ``WORKER_CALLER_PYTHONPATH`` for the worker to restore."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    if debug_logger("hma") is not None:  # the worker logs its reads too
        env[DEBUG_ENV] = "1"
    env["WORKER_CALLER_PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


class ProcessSlot:
    """Collects in a persistent worker process; kills it on timeout. A worker that answers
    "unsupported" exits (the daemon decides when to ask again: ``Probe.unsupported_stands``)."""

    def __init__(self, probe: Probe, python: str = sys.executable) -> None:
        self.probe = probe
        self.python = python
        self._proc: Optional[subprocess.Popen] = None
        self._hung_since = 0.0
        self.spawned = 0  # workers started so far

    @property
    def pid(self) -> Optional[int]:
        """Pid of the running worker, None when none runs."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def _worker(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            if self._proc is not None:
                _release(self._proc)  # a hung worker that has exited since
            import subprocess

            self.spawned += 1
            self._proc = subprocess.Popen(  # noqa: S603 - argv list
                [self.python, "-m", "hma.detection.worker", self.probe.name],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                start_new_session=True,
                env=worker_env(),
                cwd="/",  # `-m` puts the working folder first on sys.path: root's only
            )
        return self._proc

    def collect(self, ctx: ProbeContext, timeout: float) -> Collected:
        """Send one request to the worker and wait for its answer."""
        if self._hung_since:
            assert self._proc is not None
            if self._proc.poll() is None:
                since = time.monotonic() - self._hung_since
                return Collected(
                    RunStatus.TIMED_OUT,
                    error=f"worker pid {self._proc.pid} unkillable for {since:.0f} s (D state?)",
                    hung=True,
                )
            self._hung_since = 0.0
        try:
            proc = self._worker()
        except OSError as exc:
            return Collected(RunStatus.FAILED, error=f"cannot start worker: {exc}")
        import json  # here and below: a thread-isolated probe (`hma check system`) needs none

        request = json.dumps(ctx.to_wire(self.probe.previous_keys)) + "\n"
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(request.encode())
            proc.stdin.flush()
        except OSError as exc:
            self.close()
            return Collected(RunStatus.FAILED, error=f"worker died: {exc}")
        line = _readline(proc.stdout, timeout)
        if line is None:
            return self._timed_out(proc, timeout)
        if not line:
            self.close()
            return Collected(RunStatus.FAILED, error="worker exited without an answer")
        try:
            answer = _decode_answer(line)
        except (ValueError, KeyError) as exc:
            self.close()
            return Collected(RunStatus.FAILED, error=f"garbled answer from worker: {exc}")
        if answer.status is RunStatus.UNSUPPORTED:  # the worker exits after such an answer
            self.close()
        return answer

    def _timed_out(self, proc: subprocess.Popen, timeout: float) -> Collected:
        import subprocess

        kill_group(proc)
        try:
            proc.wait(2.0)
        except subprocess.TimeoutExpired:
            self._hung_since = time.monotonic()
            return Collected(
                RunStatus.TIMED_OUT,
                error=f"no result within {timeout:g} s; worker pid {proc.pid} survives SIGKILL",
                hung=True,
            )
        _release(proc)
        self._proc = None
        return Collected(
            RunStatus.TIMED_OUT, error=f"no result within {timeout:g} s (worker killed)"
        )

    def close(self) -> None:
        """Stop the worker (SIGKILL to its group) if it runs."""
        if self._proc is not None and self._proc.poll() is None:
            import subprocess

            kill_group(self._proc)
            try:
                self._proc.wait(2.0)
            except subprocess.TimeoutExpired:
                return
        if self._proc is not None:
            _release(self._proc)
        self._proc = None


def _release(proc: subprocess.Popen) -> None:
    """Close the pipes of a worker that has exited (else each leaks two descriptors)."""
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            with contextlib.suppress(OSError):  # unflushed input to a dead worker
                stream.close()


def _readline(stream: Any, timeout: float) -> Optional[bytes]:
    deadline = time.monotonic() + timeout
    buf = b""
    fd = stream.fileno()
    while not buf.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            return None
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return buf  # EOF
        buf += chunk
    return buf


def encode_answer(collected: Collected) -> str:
    """One JSON line for the worker protocol."""
    import json

    return json.dumps(
        {"status": str(collected.status), "snapshot": collected.snapshot, "error": collected.error},
        allow_nan=False,  # NaN/Infinity are not JSON: the worker answers "snapshot not JSON"
    )


def _decode_answer(line: bytes) -> Collected:
    import json

    data = json.loads(line)
    return Collected(RunStatus(data["status"]), data.get("snapshot"), str(data.get("error", "")))


def collect_guarded(probe: Probe, ctx: ProbeContext) -> Collected:
    """applies + collect with every exception turned into a FAILED outcome."""
    try:
        reason = probe.applies(ctx)
        if reason:
            return Collected(RunStatus.UNSUPPORTED, error=reason)
        return Collected(RunStatus.RAN, probe.collect(ctx))
    except Exception as exc:  # noqa: BLE001 - a probe bug must not escape
        return Collected(RunStatus.FAILED, error=_describe(exc))


def _describe(exc: BaseException) -> str:
    import traceback

    tb = traceback.extract_tb(exc.__traceback__)
    where = f" at {os.path.basename(tb[-1].filename)}:{tb[-1].lineno}" if tb else ""
    return f"{type(exc).__name__}: {exc}{where}"


def make_slot(probe: Probe) -> Any:
    """The slot matching the probe's declared isolation."""
    return ProcessSlot(probe) if probe.isolation == "process" else ThreadSlot(probe)


def run_probe(slot: Any, ctx: ProbeContext, timeout: float, now: float) -> ProbeRun:
    """Collect through the slot, then evaluate; every failure becomes an ``unknown`` finding."""
    probe: Probe = slot.probe
    start = time.monotonic()
    collected = slot.collect(ctx, timeout)
    findings: list[Finding] = []
    status = collected.status
    error = collected.error
    comp = probe_component(probe.name)
    if status is RunStatus.RAN:
        try:
            findings = list(probe.evaluate(collected.snapshot, ctx))
            if not all(isinstance(f, Finding) for f in findings):
                raise TypeError("evaluate returned something that is not a Finding")
        except Exception as exc:  # noqa: BLE001
            status, error, findings = RunStatus.FAILED, f"evaluate: {_describe(exc)}", []
    if status is RunStatus.FAILED:
        findings = [
            Finding(
                "HMA_PROBE_ERROR", comp, f"probe {probe.name} failed: {error}", {"error": error}
            )
        ]
    elif status is RunStatus.TIMED_OUT:
        code = "HMA_PROBE_HUNG" if collected.hung else "HMA_PROBE_TIMEOUT"
        findings = [Finding(code, comp, f"probe {probe.name}: {error}", {"error": error})]
    duration = time.monotonic() - start
    log = debug_logger(LOG)
    if log is not None:
        _debug_run(log, probe.name, ctx, status, error, findings)
    stamped = tuple(f.with_(probe=f.probe or probe.name, ts=f.ts or now) for f in findings)
    snapshot = collected.snapshot if status is RunStatus.RAN else None
    return ProbeRun(probe.name, status, now, duration, stamped, error, snapshot)


def _debug_run(
    log: Any,
    name: str,
    ctx: ProbeContext,
    status: RunStatus,
    error: str,
    findings: Sequence[Finding],
) -> None:
    """What ``--debug`` shows of one run: the thresholds in effect (the probe's options), the
    result, and each finding with its evidence (why it decided); the reads and commands are
    logged where they happen (hma.adapters.files, hma.adapters.command)."""
    import json

    from hma.adapters.text import printable

    def text(value: Any) -> str:
        return printable(json.dumps(value, sort_keys=True, default=str))

    log.debug("probe %s: options %s", name, text(dict(ctx.options)))
    if ctx.instance_type:
        log.debug("probe %s: instance type %s", name, printable(ctx.instance_type))
    log.debug("probe %s: %s%s", name, status, f" ({printable(error)})" if error else "")
    for f in findings:
        log.debug(
            "probe %s: decided %s%s on %s: %s; evidence %s",
            name,
            f"{f.severity} " if f.severity else "",  # else the catalogue's (`hma explain`)
            f.code,
            printable(f.component),
            printable(f.message),
            text(f.details),
        )
    if status is RunStatus.RAN and not findings:
        log.debug("probe %s: no finding: every reading within its threshold", name)


def run_once(
    setup: Setup, names: Sequence[str], boot_id: str = "", facts: Optional[NodeFacts] = None
) -> list[ProbeRun]:
    """Run the named probes concurrently, each under its own timeout; results in name order
    (``facts``: what the probes may know of the node; its name only when not given)."""
    results: dict[str, ProbeRun] = {}

    def one(name: str) -> None:
        opts = setup.config.probe(name)
        now = time.time()
        if not opts["enabled"]:
            results[name] = ProbeRun(name, RunStatus.DISABLED, now, 0.0)
            return
        slot = make_slot(setup.probes[name])
        try:
            ctx = setup.context(name, facts, oneshot=True, boot_id=boot_id)
            run = run_probe(slot, ctx, float(opts["timeout"]), now)
        finally:
            slot.close()
        results[name] = ProbeRun(
            run.probe,
            run.status,
            run.started,
            run.duration_s,
            tuple(setup.catalogue.resolve_all(run.findings)),
            run.error,
            run.snapshot,
        )

    threads = [threading.Thread(target=one, args=(n,), daemon=True) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [results[n] for n in names]
