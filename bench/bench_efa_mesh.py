#!/usr/bin/env python3
"""efa_mesh cost: CPU and wall time of one screen and one full tournament.

Simulated adapters are network namespaces joined by a bridge (tests/integration/netns_fabric.py),
the pair test is the real fi_pingpong over the tcp provider. For each size it runs a screen (one
tournament round: n/2 disjoint pairs) and the full tournament as the probe runs them (pairs of a
round concurrently, ``--concurrency``: 0 is the probe's default, one pair per two allowed cores)
and one pair after another (1), and prints medians of wall time, CPU seconds (this process and
every fi_pingpong it ran) and, from the CPU of one screen every interval and one tournament a day
(the defaults), the mesh's share of a core averaged over a day. Needs root.

    .venv/bin/python bench/bench_efa_mesh.py [--repeat 3] [--sizes 8,32] [--iterations 10]
"""

from __future__ import annotations

import argparse
import resource
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

from hma.probes.efa.mesh import (  # noqa: E402
    EfaMeshProbe,
    Mesh,
    resolve_endpoints,
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
    cpu0, start = _cpu(), time.monotonic()
    pairs = mesh.run(rounds)
    wall, cpu = time.monotonic() - start, _cpu() - cpu0
    bad = [p for p in pairs if p["status"] != "ok"]
    if bad:
        raise SystemExit(f"pair failed in a healthy fabric: {bad[0]}")
    return wall, len(pairs), cpu


def _cpu() -> float:
    """CPU seconds of this process and of its reaped children (every fi_pingpong)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--sizes", default="8,32")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--concurrency", type=int, default=0, help="0: the probe's default")
    parser.add_argument("--no-sequential", action="store_true", help="skip the one-by-one runs")
    parser.add_argument(
        "--tournament-cpu", type=float, default=None, help="CPU s of a tournament, not measured"
    )
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
        f"{'adapters':>8} {'test':10} {'pairs':>5} {'rounds':>6} {'wall s':>7} {'CPU s':>6} "
        f"{'seq wall s':>10} {'seq CPU s':>9}"
    )
    sweep()
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(x) for x in args.sizes.split(",")):
            cost: dict[str, float] = {}
            with Fabric(n, subnet=100 + n) as fabric:
                tests = [("screen", tournament_rounds(n)[:1])]
                if args.tournament_cpu is None:
                    tests.append(("tournament", tournament_rounds(n)))
                else:
                    cost["tournament"] = args.tournament_cpu
                for label, rounds in tests:
                    conc, conc_cpu, seq, seq_cpu = [], [], [], []
                    pairs = 0
                    for _ in range(args.repeat):
                        wall, pairs, cpu = timed(
                            fabric, tmp, rounds, args.concurrency, args.iterations, args.size
                        )
                        conc.append(wall)
                        conc_cpu.append(cpu)
                        if not args.no_sequential:
                            wall, pairs, cpu = timed(
                                fabric, tmp, rounds, 1, args.iterations, args.size
                            )
                            seq.append(wall)
                            seq_cpu.append(cpu)
                    cost[label] = statistics.median(conc_cpu)
                    s_wall = f"{statistics.median(seq):>10.2f}" if seq else f"{'-':>10}"
                    s_cpu = f"{statistics.median(seq_cpu):>9.2f}" if seq else f"{'-':>9}"
                    print(
                        f"{n:>8} {label:10} {pairs:>5} {len(rounds):>6} "
                        f"{statistics.median(conc):>7.2f} {cost[label]:>6.2f} {s_wall} {s_cpu}",
                        flush=True,
                    )
            interval = EfaMeshProbe.default_interval
            day = cost["screen"] * 86400 / interval + cost["tournament"]
            print(
                f"{n:>8} adapters: a screen every {interval:g} s and a tournament a day = "
                f"{day / 86400 * 100:.3f}% of a core averaged over a day"
            )
    print(f"after: {machine()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
