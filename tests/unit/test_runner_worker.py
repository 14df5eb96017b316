"""Worker lifecycle: a probe that does not apply keeps no worker process."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hma.adapters.command import CommandRunner
from hma.adapters.files import RootReader
from hma.contracts.model import RunStatus
from hma.contracts.probe import ProbeContext
from hma.detection.runner import ProcessSlot, run_probe
from hma.probes.nvidia.gpu import GpuProbe

pytestmark = pytest.mark.timeout(60)


def test_unsupported_worker_exits(tmp_path: Path) -> None:
    """The worker answers "unsupported" and exits; when to ask again is the daemon's decision
    (Probe.unsupported_stands, tests/unit/test_daemon_wakeups.py)."""
    options = {k: o.default for k, o in GpuProbe.options.items()}
    options.update({"library": str(tmp_path / "no-libnvidia-ml.so"), "expected_gpus": None})
    ctx = ProbeContext(
        options=options,
        sysfs=RootReader(str(tmp_path)),
        procfs=RootReader("/proc"),
        runner=CommandRunner(),
        boot_id="boot-1",
    )
    slot = ProcessSlot(GpuProbe())
    try:
        first = run_probe(slot, ctx, 30.0, time.time())
        assert first.status is RunStatus.UNSUPPORTED, first.error
        assert slot.spawned == 1 and slot.pid is None  # the worker answered and is gone
        again = run_probe(slot, ctx, 30.0, time.time())
        assert again.status is RunStatus.UNSUPPORTED and again.error == first.error
        assert slot.spawned == 2 and slot.pid is None
    finally:
        slot.close()
