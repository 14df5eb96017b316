"""nvml_events source: Xid events appended to the stand-in's queue come out as findings, and the
same Xid seen in the kernel log is the same fault (component, code)."""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path

import pytest

from hma.adapters.command import CommandRunner
from hma.adapters.files import RootReader
from hma.contracts.model import Finding
from hma.contracts.source import SourceContext
from hma.probes.nvidia.events import NvmlEventSource
from hma.probes.nvidia.xid import line_finding, parse_xid_line


@pytest.mark.timeout(30)
def test_xid_events_become_findings(scenario, nvml_lib: Path) -> None:
    source = NvmlEventSource()
    options = {k: o.default for k, o in source.options.items()}
    options.update(library=str(nvml_lib), wait_ms=50)
    ctx = SourceContext(
        options=options,
        sysfs=RootReader("/sys"),
        procfs=RootReader("/proc"),
        runner=CommandRunner(),
        boot_id="b",
    )
    assert source.applies(ctx) is None
    got: queue.Queue[Finding] = queue.Queue()
    thread = threading.Thread(target=source.run, args=(ctx, got.put), daemon=True)
    thread.start()
    try:
        # events only reach a set made before them (as with NVML): wait until the source listens
        for _ in range(100):
            scenario.push_xid(0, 13)
            try:
                ready = got.get(timeout=0.1)
                break
            except queue.Empty:
                continue
        assert (ready.code, ready.component) == ("GPU_XID_13", "gpu:0000:18:00")
        while not got.empty():
            got.get()
        scenario.push_xid(99, 79)  # no such device: skipped
        with scenario.events.open("a") as f:
            f.write("4 999")  # an incomplete line is not read until it ends
            f.flush()
            time.sleep(0.3)  # several wait_ms periods
            assert got.empty()
            f.write("\n")
        scenario.push_xid(6, 79)
        f0 = got.get(timeout=10)
        f1 = got.get(timeout=10)
    finally:
        ctx.stop.set()
        thread.join(5)
    assert not thread.is_alive()
    assert (f0.code, f0.component) == ("GPU_XID_OTHER", "gpu:0000:9a:00")  # "4 999\n": Xid 999
    assert (f1.code, f1.component, f1.probe) == ("GPU_XID_79", "gpu:0000:ba:00", "nvml")
    assert f1.details["xid"] == 79 and f1.details["bus_id"] == "00000000:BA:00.0"

    kernel = parse_xid_line(
        "NVRM: Xid (PCI:0000:ba:00): 79, pid=1234, name=python, GPU has " "fallen off the bus."
    )
    assert kernel is not None
    from_kmsg = line_finding(kernel, {}, "kernel_log", 0.0)
    assert (from_kmsg.component, from_kmsg.code) == (f1.component, f1.code)
