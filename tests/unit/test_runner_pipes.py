"""A worker process killed on timeout leaves no pipe open (no ResourceWarning, no fd leak)."""

from __future__ import annotations

import gc
import os
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from hma.adapters.command import CommandRunner
from hma.adapters.files import RootReader
from hma.contracts.model import RunStatus
from hma.contracts.probe import ProbeContext
from hma.detection.runner import ProcessSlot, run_probe

PLUGINS = Path(__file__).resolve().parent.parent / "plugins"


@pytest.mark.timeout(60)
def test_killed_worker_leaves_no_open_pipe(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.syspath_prepend(str(PLUGINS))  # the worker finds the plugin through sys.path
    from hma_testprobes import StuckProcessProbe

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    ctx = ProbeContext({"fifo": str(fifo)}, RootReader("/"), RootReader("/"), CommandRunner())
    slot = ProcessSlot(StuckProcessProbe())
    before = len(os.listdir("/proc/self/fd"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            for _ in range(3):  # each run starts a worker that hangs and is killed
                run = run_probe(slot, ctx, 1.0, time.time())
                assert run.status is RunStatus.TIMED_OUT, run.error
                assert "worker killed" in (run.error or "")
        finally:
            slot.close()
        gc.collect()
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []
    assert len(os.listdir("/proc/self/fd")) <= before
