"""Running the node stages in order, each under its timeout, with progress on a terminal."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import IO, Any, Iterable, Iterator, Mapping, Optional, Sequence

from hma.adapters.command import CommandRunner
from hma.adapters.text import printable
from hma.deepcheck.stages import (
    NODE_STAGE_FUNCS,
    SKIPPED,
    StageContext,
    StageResult,
    stage_timeout,
    unknown,
    verdict_of,
)
from hma.detection.setup import Setup

TICK_S = 5.0


@contextmanager
def progress(stage: str, timeout: float, out: Optional[IO[str]]) -> Iterator[None]:
    """A line per ``TICK_S`` seconds on ``out`` (a terminal) while a stage runs."""
    if out is None:
        yield
        return
    done = threading.Event()
    started = time.monotonic()

    def tick() -> None:
        while not done.wait(TICK_S):
            out.write(f"\r{stage}: {time.monotonic() - started:.0f} s (limit {timeout:.0f} s)")
            out.flush()

    out.write(f"{stage}: running (limit {timeout:.0f} s)")
    out.flush()
    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        out.write("\r\033[K")
        out.flush()


def run_stages(
    setup: Setup,
    stages: Sequence[str],
    env: Optional[Mapping[str, str]] = None,
    out: Optional[IO[str]] = None,
) -> list[StageResult]:
    """Run ``stages`` in order; findings resolved against the catalogue. A stage that raises
    is unknown (its bug must not lose the other stages)."""
    opts = setup.config.section("deep_check")
    results = []
    for stage in stages:
        timeout = stage_timeout(stage, opts)
        ctx = StageContext(
            setup, opts, CommandRunner(), timeout, instance_type=setup.instance_type(), env=env
        )
        started, mono = time.time(), time.monotonic()
        with progress(stage, timeout, out):
            try:
                result = NODE_STAGE_FUNCS[stage](ctx)
            except Exception as exc:  # noqa: BLE001 - reported as unknown, with the error
                result = unknown(stage, f"{type(exc).__name__}: {exc}")
        result.started, result.duration_s = started, time.monotonic() - mono
        result.findings = setup.catalogue.resolve_all(
            [f.with_(probe=f"deep_check.{stage}", ts=started) for f in result.findings]
        )
        if result.verdict != SKIPPED:  # severities are the catalogue's (and the operator's)
            result.verdict = verdict_of(result.findings)
        results.append(result)
    return results


def document(
    node: str, results: Sequence[StageResult], instance_type: Optional[str] = None
) -> dict[str, Any]:
    """``hma deep-check --json``: the node, its instance type, overall verdict and each stage."""
    return {
        "node": node,
        "instance_type": instance_type,
        "verdict": overall(r.verdict for r in results),
        "stages": [r.to_json() for r in results],
    }


def overall(verdicts: Iterable[str]) -> str:
    """fail > unknown > warn > pass; only skipped ones (or none) is ``skipped``."""
    verdicts = set(verdicts)
    for v in ("fail", "unknown", "warn", "pass"):
        if v in verdicts:
            return v
    return "skipped"


def render_text(doc: Mapping[str, Any]) -> str:
    """The per-stage table an operator reads."""
    lines = [f"deep check of {printable(doc['node'])}: {doc['verdict'].upper()}"]
    for s in doc["stages"]:
        lines.append(
            f"  {s['stage']:<13} {s['verdict']:<8} {s['duration_s']:>8.1f} s  "
            + printable(s["message"])
        )
        for f in s["findings"]:
            lines.append(
                f"      {printable(f['code'])} {printable(f['component'])}: "
                + printable(f["message"])
            )
    if "recorded" in doc:
        lines.append(f"recorded: {printable(str(doc['recorded']))}")
    return "\n".join(lines)
