"""Probe plugins for tests, registered like any third-party plugin (see the dist-info folder)."""

from __future__ import annotations

import os
from typing import Any, ClassVar, Mapping

from hma.contracts.model import Finding
from hma.contracts.options import Option
from hma.contracts.probe import Probe, ProbeContext


class StuckProbe(Probe):
    """Blocks in open(2) of a FIFO until a writer appears (a call that cannot be interrupted)."""

    name = "stuck"
    default_enabled = False
    options: ClassVar[Mapping[str, Option]] = {
        "fifo": Option("str", "", "FIFO to block on; empty: return at once"),
    }

    def collect(self, ctx: ProbeContext) -> Any:
        if ctx.options["fifo"]:
            with open(ctx.options["fifo"], "rb") as handle:  # blocks in open(2) without a writer
                return {"read": handle.read(1).decode()}
        return {"read": ""}

    def evaluate(self, snapshot: Any, ctx: ProbeContext) -> list[Finding]:
        return []


class StuckProcessProbe(StuckProbe):
    """The same, collected in a worker process."""

    name = "stuckproc"
    isolation = "process"

    def collect(self, ctx: ProbeContext) -> Any:
        marker = ctx.options["fifo"] + ".pid"
        if ctx.options["fifo"]:
            with open(marker, "w") as handle:
                handle.write(str(os.getpid()))
        return super().collect(ctx)


class FlakyProbe(Probe):
    """Raises while the file named by ``fail_file`` exists."""

    name = "flaky"
    default_enabled = False
    options: ClassVar[Mapping[str, Option]] = {
        "fail_file": Option("str", "", "raise while it exists")
    }

    def collect(self, ctx: ProbeContext) -> Any:
        if ctx.options["fail_file"] and os.path.exists(ctx.options["fail_file"]):
            raise RuntimeError("simulated probe bug")
        return {}

    def evaluate(self, snapshot: Any, ctx: ProbeContext) -> list[Finding]:
        return []


class GarbageProbe(Probe):
    """Returns something that is not a list of findings."""

    name = "garbage"
    default_enabled = False

    def collect(self, ctx: ProbeContext) -> Any:
        return {"x": 1}

    def evaluate(self, snapshot: Any, ctx: ProbeContext) -> list[Finding]:
        return ["not a finding"]  # type: ignore[list-item]


class ContextProcessProbe(Probe):
    """Collects in a worker process and returns the context the worker rebuilt, as sent."""

    name = "ctxproc"
    default_enabled = False
    isolation = "process"
    previous_keys = ("kept",)

    def collect(self, ctx: ProbeContext) -> Any:
        return ctx.to_wire()

    def evaluate(self, snapshot: Any, ctx: ProbeContext) -> list[Finding]:
        return []
