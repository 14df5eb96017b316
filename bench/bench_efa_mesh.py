#!/usr/bin/env python3
"""efa_mesh wall time: ring screen and full tournament, concurrent vs. one pair after another.

Simulated adapters are network namespaces joined by a bridge (tests/integration/netns_fabric.py),
the pair test is the real fi_pingpong over the tcp provider. For 4, 8 and 16 adapters it times
the ring screen and the full tournament as the probe runs them (disjoint pairs of a round run
concurrently, max_concurrency 16) and the same pair tests run one after another
(max_concurrency 1), and prints medians and the ratio sequential / concurrent. Needs root.

    .venv/bin/python bench/bench_efa_mesh.py [--repeat 3] [--sizes 4,8,16] [--iterations 100]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "unit"))
sys.path.insert(0, str(HERE.parent / "tests" / "integration"))

from common import machine  # noqa: E402
from netns_fabric import Fabric, sweep, usable  # noqa: E402
from trn_support import make_ctx  # noqa: E402

from hma.probes.efa_mesh import (  # noqa: E402
    EfaMeshProbe,
    Mesh,
    resolve_endpoints,
    ring_rounds,
    tournament_rounds,
)


def timed(fabric: Fabric, tmp: str, rounds, concurrency: int, iterations: int, size: int):  # type: ignore[no-untyped-def]
    ctx = make_ctx(
        EfaMeshProbe,
        Path(tmp),
        adapters=fabric.adapters(),
        provider="tcp",
        domain_format="",
        iterations=iterations,
        size=size,
        pair_timeout=20.0,
        max_concurrency=concurrency,
        base_port=48100,
    )
    mesh = Mesh(ctx, resolve_endpoints(ctx), deadline=time.monotonic() + 3600)
    start = time.monotonic()
    pairs = mesh.run(rounds)
    wall = time.monotonic() - start
    bad = [p for p in pairs if p["status"] != "ok"]
    if bad:
        raise SystemExit(f"pair failed in a healthy fabric: {bad[0]}")
    return wall, len(pairs), sum(p["duration_s"] for p in pairs)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--sizes", default="4,8,16")
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--size", type=int, default=4096)
    args = parser.parse_args()
    reason = usable()
    if reason:
        print(f"skipped: {reason}")
        return 0
    print(machine())
    print(
        f"fi_pingpong -p tcp -e rdm -I {args.iterations} -S {args.size}; medians of {args.repeat}"
    )
    print(
        f"{'adapters':>8} {'test':10} {'pairs':>5} {'rounds':>6} {'concurrent s':>13} "
        f"{'sequential s':>13} {'ratio':>6}"
    )
    sweep()
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(x) for x in args.sizes.split(",")):
            with Fabric(n, subnet=100 + n) as fabric:
                for label, rounds in (
                    ("ring", ring_rounds(n)),
                    ("tournament", tournament_rounds(n)),
                ):
                    conc, seq = [], []
                    pairs = 0
                    for _ in range(args.repeat):
                        wall, pairs, _sum = timed(
                            fabric, tmp, rounds, 16, args.iterations, args.size
                        )
                        conc.append(wall)
                        wall, pairs, _sum = timed(
                            fabric, tmp, rounds, 1, args.iterations, args.size
                        )
                        seq.append(wall)
                    c, s = statistics.median(conc), statistics.median(seq)
                    print(
                        f"{n:>8} {label:10} {pairs:>5} {len(rounds):>6} {c:>13.2f} {s:>13.2f} "
                        f"{s / c:>6.2f}",
                        flush=True,
                    )
    print(f"after: {machine()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
