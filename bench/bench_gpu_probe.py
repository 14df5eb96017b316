"""`gpu` probe cycle time for 8 simulated GPUs (H100 HGX readings) over the real nvidia-ml-py
binding and the stand-in libnvidia-ml.so.1 (compiled here with cc into a temporary folder).

Two figures, each the median (and p99) over RUNS runs:
- collect in this process (`read_all`: init, ~130 NVML calls per GPU incl. 18 NVLink links x 4
  counters, shutdown) + evaluate;
- a full cycle as the daemon runs it: request to the persistent worker process, collect there,
  JSON answer back, evaluate (hma.detection.runner.run_probe through a ProcessSlot).
The stand-in answers instantly, so this measures the agent's own cost, not the driver's.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests" / "standin"))
import nvmlstub  # noqa: E402
from common import machine, median_ms, p99_ms  # noqa: E402

RUNS = 50


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        lib = nvmlstub.build(Path(tmp))
        scenario = nvmlstub.Scenario(Path(tmp) / "scenario.txt", ngpus=8)
        os.environ[nvmlstub.ENV] = str(scenario.path)

        from hma.adapters.command import CommandRunner
        from hma.adapters.files import RootReader
        from hma.contracts.probe import ProbeContext
        from hma.detection.runner import ProcessSlot, run_probe
        from hma.probes.nvidia.gpu import GpuProbe, read_all

        probe = GpuProbe()
        options = {k: o.default for k, o in probe.options.items()}
        options.update(library=str(lib), expected_gpus=8, timeout=30.0)
        ctx = ProbeContext(
            options=options,
            sysfs=RootReader("/sys"),
            procfs=RootReader("/proc"),
            runner=CommandRunner(),
        )
        inproc = []
        for _ in range(RUNS):
            start = time.perf_counter()
            snap = read_all(ctx, {}).to_json()
            probe.evaluate(snap, ctx)
            inproc.append(time.perf_counter() - start)
        assert len(snap["gpus"]) == 8 and not snap["init_error"]
        calls = sum(13 + len((g.get("nvlink") or {}).get("states", {})) * 5 for g in snap["gpus"])

        slot = ProcessSlot(probe)
        cycles = []
        try:
            run_probe(slot, ctx, 30.0, time.time())  # start the worker (not counted)
            for _ in range(RUNS):
                start = time.perf_counter()
                run = run_probe(slot, ctx, 30.0, time.time())
                cycles.append(time.perf_counter() - start)
                assert str(run.status) == "ran", run.error
        finally:
            slot.close()

    print(f"machine: {machine()}")
    print(
        f"gpu probe, 8 simulated H100 (stand-in NVML, ~{calls} NVML calls per cycle), "
        f"{RUNS} runs each:"
    )
    print(
        f"  collect+evaluate in process : median {median_ms(inproc):7.2f} ms  "
        f"p99 {p99_ms(inproc):7.2f} ms"
    )
    print(
        f"  full cycle via worker       : median {median_ms(cycles):7.2f} ms  "
        f"p99 {p99_ms(cycles):7.2f} ms"
    )


if __name__ == "__main__":
    main()
