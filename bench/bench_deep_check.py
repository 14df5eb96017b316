#!/usr/bin/env python3
"""Wall time of each ``hma deep-check`` stage here (stand-ins for the hardware tools), and of
``hma deep-check run`` on 4 loopback Slurm nodes until the table is printed (root).

    .venv/bin/python bench/bench_deep_check.py [--runs 3] [--stress-seconds 5]

Stages: stress runs the real stress-ng for --stress-seconds; accelerators runs the gpu probe
over the real NVML binding and the stand-in library (8 healthy H100s); dcgm replays DCGM's real JSON
(tests/fixtures/deepcheck); efa runs the real fi_pingpong over tcp between 2 network namespaces;
neuron replays nccom-test's documented output and a hardware check that exits 0, on a sysfs root
with a neuron_device class. The run: 4 nodes of tests/slurmcluster.py, stages dcgm and
connectivity (all_reduce_perf stand-in replaying a real nccl-tests table, no slow node), one job
per node, the connectivity job, one result job per node. Prints medians (min/max) in seconds and
describes the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "integration"))
sys.path.insert(0, str(ROOT / "tests"))
from common import machine  # noqa: E402
from netns_fabric import Fabric, sweep, usable  # noqa: E402
from test_deepcheck_node import FIX, config, standin  # noqa: E402

sys.path.insert(0, str(ROOT / "tests" / "standin"))
import nvmlstub  # noqa: E402

from tests.integration import test_deepcheck_run as run_helpers  # noqa: E402
from tests.slurmcluster import SlurmCluster, available  # noqa: E402


def timed(argv: list[str]) -> float:
    start = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    elapsed = time.monotonic() - start
    if not proc.stdout:
        raise SystemExit(f"{' '.join(argv)}: {proc.stderr}")
    doc = json.loads(proc.stdout)
    if doc["verdict"] not in ("pass", "warn"):
        raise SystemExit(f"unexpected verdict: {json.dumps(doc)[:800]}")
    return elapsed


def stage_args(tmp: Path, stress_seconds: float, fabric: Fabric) -> dict[str, Path]:
    """One configuration per stage."""
    (tmp / "sys" / "class" / "neuron_device").mkdir(parents=True)
    passing = tmp / "dcgm-pass.json"
    passing.write_text((FIX / "dcgmi-diag-sm-stress-fail.json").read_text().replace("FAIL", "PASS"))
    standin(tmp, "dcgmi", f"cat {passing}")
    standin(tmp, "nccom-test", f"cat {FIX / 'nccom-test-allr.txt'}")
    standin(tmp, "neuron-hw-check", "exit 0")
    table = ", ".join(
        f'{n} = {{ address = "{a["address"]}", netns = "{a["netns"]}" }}'
        for n, a in fabric.adapters().items()
    )
    extra = (
        f'nccom_command = ["{tmp}/bin/nccom-test"]\n'
        f'neuron_hw_check_command = ["{tmp}/bin/neuron-hw-check"]\n'
        "[probes.efa_mesh]\n"
        'provider = "tcp"\ndomain_format = ""\niterations = 5\nsize = 64\nbase_port = 48100\n'
        f"adapters = {{ {table} }}\n"
    )
    scenario = nvmlstub.Scenario(tmp / "scenario.txt").write()
    os.environ[nvmlstub.ENV] = str(scenario.path)
    lib = nvmlstub.build(tmp / "nvml")
    extra += f'[probes.gpu]\nlibrary = "{lib}"\nexpected_gpus = 8\n'
    cfg = config(tmp, extra)
    text = cfg.read_text().replace("stress_seconds = 2", f"stress_seconds = {stress_seconds:g}")
    cfg.write_text(text)
    return {"stress": cfg, "accelerators": cfg, "dcgm": cfg, "efa": cfg, "neuron": cfg}


def report(name: str, samples: list[float]) -> None:
    print(
        f"{name:<28} median {statistics.median(samples):7.2f} s"
        f"  (min {min(samples):.2f}, max {max(samples):.2f}, {len(samples)} runs)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--stress-seconds", type=float, default=5.0)
    args = parser.parse_args()
    for why in (usable(), available()):
        if why:
            print(f"bench_deep_check: {why}", file=sys.stderr)
            return 2
    print(machine())
    hma = [sys.executable, "-m", "hma"]
    sweep()
    with tempfile.TemporaryDirectory() as tmpdir, Fabric(2, subnet=11) as fabric:
        tmp = Path(tmpdir)
        cfgs = stage_args(tmp, args.stress_seconds, fabric)
        for stage, cfg in cfgs.items():
            argv = [*hma, "--config", str(cfg), "deep-check", "--json", "--stages", stage]
            report(f"stage {stage}", [timed(argv) for _ in range(args.runs)])
    with tempfile.TemporaryDirectory() as tmpdir, SlurmCluster(nodes=4) as cluster:
        tmp = Path(tmpdir)
        run_helpers.NODES[:] = cluster.nodes
        run_helpers.SPEEDS.clear()
        login = run_helpers.setup_files(tmp, cluster)
        # node2 replays a DCGM failure in the test set-up; here every node passes
        for node in cluster.nodes:
            (tmp / node / "dcgmi").write_text(f"#!/bin/sh\ncat {tmp / 'dcgm-pass.json'}\n")
        argv = [*hma, "--config", str(login), "deep-check", "run", "node[1-4]", "--json"]
        argv += ["--stages", "dcgm,connectivity"]
        samples = []
        for _ in range(args.runs):
            cluster.reset()
            samples.append(timed(argv))
        report("run 4 nodes -> table", samples)
    return 0


if __name__ == "__main__":
    sys.exit(main())
