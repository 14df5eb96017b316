#!/usr/bin/env python3
"""What ``hma topology`` costs on the controller as the cluster grows (needs root).

    .venv/bin/python bench/bench_topology.py [--sizes 36,2000,10000] [--runs 5] [--version 24.11]

For each size a loopback Slurm (tests/slurmcluster.py) of 2 slurmd plus ``size - 2`` nodes
without slurmd (``ph[1-N]``), every node publishing a domain of 18 (``Extra=hma-domain=dK``, set
with one ``scontrol update`` per domain), TopologyPlugin=topology/block. Measured:

- the first ``hma topology`` (read, render, write, ``scontrol reconfigure``): wall time once;
- ``hma topology`` with nothing changed (one read, no write): median wall time over ``--runs``,
  and slurmctld's RPCs for one such run by type (``sdiag``);
- the file's size.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from common import machine, median_ms, time_command  # noqa: E402

from tests.integration.remediation_helpers import write_config  # noqa: E402
from tests.slurmcluster import SlurmCluster  # noqa: E402

PER_DOMAIN = 18


def one(size: int, runs: int, version: str, work: Path) -> None:
    cluster = SlurmCluster(
        2,
        version=version,
        placeholders=size - 2,
        extra_conf="TopologyPlugin=topology/block",
        conf_files={"topology.conf": "BlockName=boot Nodes=node[1-2]\n"},
    )
    cluster.start(timeout=300)
    try:
        cluster.scontrol("update", "NodeName=node[1-2]", "Extra=hma-domain=real")
        for k, first in enumerate(range(1, size - 1, PER_DOMAIN)):
            last = min(first + PER_DOMAIN - 1, size - 2)
            cluster.scontrol("update", f"NodeName=ph[{first}-{last}]", f"Extra=hma-domain=d{k}")
        path = cluster.base / "etc" / "topology.conf"
        extra = f'[topology]\nfile = "{path}"\n'
        cfg = write_config(work / f"hma-{size}.toml", cluster, "node1", extra=extra)
        argv = [sys.executable, "-m", "hma", "topology", "--config", str(cfg)]
        env = {"PATH": "/usr/bin:/bin"}
        first_run = time_command(argv, 1, env)[0]
        cluster.wait(lambda: cluster.run("scontrol", "ping").returncode == 0, 120, "slurmctld")
        cluster.rpc_counts(reset=True)
        time_command(argv, 1, env)
        rpcs = cluster.rpc_counts()
        steady = time_command(argv, runs, env)
        shown = ", ".join(f"{count} {name}" for name, (count, _us) in sorted(rpcs.items()))
        print(
            f"{size:>6} nodes: first run (write + reconfigure) {first_run * 1000:.0f} ms; "
            f"unchanged: median {median_ms(steady):.0f} ms over {runs}, RPCs {shown}; "
            f"{path.name} {path.stat().st_size} bytes",
            flush=True,
        )
    finally:
        cluster.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="36,2000,10000")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--version", default="24.11")
    args = parser.parse_args()
    print(machine(), f"Slurm {args.version}", flush=True)
    with tempfile.TemporaryDirectory(prefix="hma-bench-topology-") as work:
        for size in (int(s) for s in args.sizes.split(",")):
            one(size, args.runs, args.version, Path(work))
    return 0


if __name__ == "__main__":
    sys.exit(main())
