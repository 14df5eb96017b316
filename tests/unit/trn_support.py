"""Shared helpers for the Neuron/EFA tests: probe contexts over generated sysfs trees."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Optional

from hma.adapters.command import CommandRunner
from hma.adapters.files import RootReader
from hma.config.schema import probe_options
from hma.contracts.probe import NodeFacts, Probe, ProbeContext

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
if str(FIXTURES) not in sys.path:
    sys.path.insert(0, str(FIXTURES))

import gen_sysfs  # noqa: E402

__all__ = ["gen_sysfs", "make_ctx", "codes"]


def make_ctx(
    probe: type[Probe],
    root: Path,
    instance: Optional[str] = None,
    previous: Any = None,
    oneshot: bool = False,
    clock: Optional[Callable[[], float]] = None,
    boot_id: str = "boot-1",
    facts: Optional[NodeFacts] = None,
    **options: Any,
) -> ProbeContext:
    """A context with the probe's defaults (common keys included) and ``options`` applied."""
    schema = probe_options(
        probe.options, probe.default_interval, probe.default_timeout, probe.default_enabled
    )
    values = {key: opt.default for key, opt in schema.items()}
    values.update(options)
    ctx = ProbeContext(
        options=values,
        sysfs=RootReader(str(root)),
        procfs=RootReader("/proc"),
        runner=CommandRunner(),
        instance_type=instance,
        facts=facts or NodeFacts(),
        previous=previous,
        previous_ts=(previous or {}).get("ts", 0.0) if isinstance(previous, dict) else 0.0,
        oneshot=oneshot,
        boot_id=boot_id,
    )
    if clock is not None:
        ctx.clock = clock
    return ctx


def codes(findings: list) -> set[tuple[str, str]]:
    """{(code, component)} of findings."""
    return {(f.code, f.component) for f in findings}
