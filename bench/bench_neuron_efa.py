#!/usr/bin/env python3
"""Cycle time (applies + collect + evaluate) of `neuron` on 16 devices, `efa` on 32 adapters and
`infiniband` on 8 mlx5 ports.

Trees come from tests/fixtures/gen_sysfs.py in a temporary folder; the mlx5 tree is the real
captured mlx5_0 of tests/fixtures/roots/ib-procfs copied as mlx5_0..mlx5_7. The steady-state
daemon cycle is measured: each run has the previous snapshot as its baseline (rates and growth
evaluated). "cold" is a new probe object per run: discovery included (`hma check` without its
second sample, or the first run after a device event).

    .venv/bin/python bench/bench_neuron_efa.py [--runs 30]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "unit"))

from common import machine  # noqa: E402
from trn_support import gen_sysfs, make_ctx  # noqa: E402

from hma.probes.efa.adapters import EfaProbe  # noqa: E402
from hma.probes.infiniband.ports import InfinibandProbe  # noqa: E402
from hma.probes.neuron.probe import NeuronProbe  # noqa: E402

IB_CAPTURE = HERE.parent / "tests" / "fixtures" / "roots" / "ib-procfs" / "class" / "infiniband"


def cycle(probe_cls, root: Path, instance: str, runs: int, cold: bool = False) -> list[float]:  # type: ignore[no-untyped-def]
    probe = probe_cls()
    previous = None
    times = []
    for _ in range(runs + 1):
        ctx = make_ctx(probe_cls, root, instance, previous=previous)
        probe = probe_cls() if cold else probe
        start = time.perf_counter()
        assert probe.applies(ctx) is None
        snap = probe.collect(ctx)
        findings = probe.evaluate(snap, ctx)
        times.append(time.perf_counter() - start)
        assert findings == [], findings
        previous = snap
    return times[1:]  # the first run has no baseline


def report(label: str, times: list[float]) -> None:
    times = sorted(times)
    p90 = times[int(0.9 * (len(times) - 1))]
    print(
        f"{label:42} median {statistics.median(times) * 1000:7.1f} ms   "
        f"p90 {p90 * 1000:7.1f} ms   min {times[0] * 1000:7.1f} ms   (n={len(times)})"
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    print(machine())
    with tempfile.TemporaryDirectory() as tmp:
        trn2 = gen_sysfs.build(Path(tmp) / "trn2", "trn2.48xlarge")
        trn1 = gen_sysfs.build(Path(tmp) / "trn1", "trn1.32xlarge")
        p5 = gen_sysfs.build(Path(tmp) / "p5", "p5.48xlarge")
        report(
            "neuron, trn2.48xlarge (16 devices, 64 cores)",
            cycle(NeuronProbe, trn2, "trn2.48xlarge", args.runs),
        )
        report(
            "neuron, trn1.32xlarge (16 devices, 32 cores)",
            cycle(NeuronProbe, trn1, "trn1.32xlarge", args.runs),
        )
        report(
            "efa, p5.48xlarge (32 adapters + mlx5_0)", cycle(EfaProbe, p5, "p5.48xlarge", args.runs)
        )
        report(
            "efa, p5.48xlarge, cold (discovery)",
            cycle(EfaProbe, p5, "p5.48xlarge", args.runs, cold=True),
        )
        mlx = Path(tmp) / "mlx5" / "class" / "infiniband"
        for index in range(8):
            shutil.copytree(IB_CAPTURE / "mlx5_0", mlx / f"mlx5_{index}")
        report(
            "infiniband, 8 x mlx5 (real capture, copied)",
            cycle(InfinibandProbe, mlx.parent.parent, "", args.runs),
        )
        report(
            "infiniband, 8 x mlx5, cold (discovery)",
            cycle(InfinibandProbe, mlx.parent.parent, "", args.runs, cold=True),
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
