"""The gate before a recovered node is resumed: ``[deep_check] after_recovery`` stages must pass.

Remediation calls ``gate`` after a reboot or a replacement and resumes the node only when it
says so. A stage that is skipped (its tool is missing) or gives no verdict holds the node: the
operator chose these stages, so a node that could not be tested is not let through.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Mapping, Optional, Sequence

from hma.detection.setup import Setup


def gate_stages(setup: Setup) -> list[str]:
    """The node stages of ``[deep_check] after_recovery`` (connectivity needs other nodes)."""
    from hma.deepcheck.options import NODE_STAGES

    return [s for s in setup.config.section("deep_check")["after_recovery"] if s in NODE_STAGES]


def gate(setup: Setup, env: Optional[Mapping[str, str]] = None) -> tuple[bool, str, Sequence[Any]]:
    """``(resume?, why, stage results)``; with no stages configured the node resumes at once."""
    from hma.deepcheck.node import run_stages

    stages = gate_stages(setup)
    if not stages:
        return True, "no after_recovery stages", []
    results = run_stages(setup, stages, env=env)
    held = [f"{r.stage} {r.verdict}" for r in results if r.verdict not in ("pass", "warn")]
    if held:
        return False, "deep check holds the node: " + ", ".join(held), results
    return True, "deep check passed: " + ", ".join(stages), results


class RecoveryGate:
    """The gate as remediation sees it: ``hold(boot_id)`` is why the resume must wait ("" when
    it may go). The stages run once per boot, in a thread of their own (they take minutes); their
    results are recorded for the agent (``record``), so a failure becomes a ``DEEP_*`` fault and
    recovery goes on (another reboot, or a replacement) by the usual rules."""

    def __init__(
        self,
        setup: Setup,
        record: Optional[Callable[[Sequence[Any]], object]] = None,
        env: Optional[Mapping[str, str]] = None,
    ) -> None:
        self.setup, self.env = setup, env
        self.record = record or self._record
        self._lock = threading.Lock()
        self._boot = ""
        self._verdict: Optional[str] = None  # None: running; "": passed; else why it holds
        self._thread: Optional[threading.Thread] = None

    def hold(self, boot_id: str) -> str:
        """ "" when the node may be resumed in this boot, else why not (yet)."""
        stages = gate_stages(self.setup)
        if not stages:
            return ""
        with self._lock:
            if boot_id != self._boot:
                self._boot, self._verdict = boot_id, None
                self._thread = threading.Thread(target=self._run, args=(boot_id,), daemon=True)
                self._thread.start()
            if self._verdict is None:
                return f"deep check after recovery running: {', '.join(stages)}"
            return self._verdict

    def wait(self, timeout: float) -> None:
        """Wait for the running check (tests, shutdown)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _run(self, boot_id: str) -> None:
        try:
            ok, why, results = gate(self.setup, self.env)
            self.record(results)
        except Exception as exc:  # noqa: BLE001 - a broken gate holds, it never lets through
            ok, why = False, f"deep check after recovery failed to run: {exc}"
        with self._lock:
            if boot_id == self._boot:
                self._verdict = "" if ok else why

    def _record(self, results: Sequence[Any]) -> None:
        from hma.deepcheck.record import record

        record(self.setup, results, "hma (after recovery)", time.time())
