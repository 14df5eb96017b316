#!/usr/bin/env python3
"""CPU share of the kernel_log source under a storm of unrelated kernel lines, and proof that a
fatal Xid inside the storm is still detected.

    .venv/bin/python bench/bench_kernel_log.py [--rate 100000] [--seconds 60]

The source runs in a child process reading a FIFO in the /dev/kmsg record format (as it reads
/dev/kmsg); this process writes ``--rate`` unrelated lines per minute into it, evenly paced, with
one Xid 79 line in the middle. The child's CPU time (user + system, from /proc) over the
storm divided by the wall time is the CPU share of one core.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, tree_cpu  # noqa: E402

NOISE = [
    'audit: type=1400 audit({t}:{i}): apparmor="DENIED" operation="open" profile="snap"',
    "eth0: renamed from veth{i}",
    "IPv6: ADDRCONF(NETDEV_CHANGE): veth{i}: link becomes ready",
    "nvme nvme0: I/O {i} QID 3 timeout, completion polled",
    "NVRM: GPU at PCI:0000:3b:00: GPU-5e4c0b1a-{i}",
    "EXT4-fs (nvme0n1p1): mounted filesystem with ordered data mode. Quota mode: none.",
    "br0: port 2(veth{i}) entered forwarding state",
    "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Data {{0x{i:08x}, 0x00000000}}",
    "pcieport 0000:00:1c.5: AER: Corrected error received: 0000:00:1c.5",
    "XFS (nvme0n1p2): Ending clean mount",
]
XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


def child(fifo: str) -> int:
    """Run the source on ``fifo``; print one JSON line per finding, then the stats."""
    from hma.adapters.command import CommandRunner
    from hma.adapters.files import RootReader
    from hma.contracts.source import SourceContext
    from hma.probes.kernel_log.source import KernelLogSource

    options = {k: o.default for k, o in KernelLogSource.options.items()}
    options.update(path=fifo, backend="kmsg", rules_dir="/nonexistent")
    ctx = SourceContext(options, RootReader("/sys"), RootReader("/proc"), CommandRunner(), "b")
    signal.signal(signal.SIGTERM, lambda *_: ctx.stop.set())
    source = KernelLogSource()

    def emit(f: object) -> None:
        print(json.dumps({"t": time.time(), "finding": f.to_json()}), flush=True)  # type: ignore[attr-defined]

    print(json.dumps({"ready": True}), flush=True)
    source.run(ctx, emit)
    print(json.dumps({"stats": source.stats}), flush=True)
    return 0


def main() -> int:
    """Run the storm and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=100_000, help="lines per minute")
    parser.add_argument("--seconds", type=float, default=60.0, help="storm duration")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child)
    with tempfile.TemporaryDirectory(prefix="hma-bench-") as tmp:
        fifo = os.path.join(tmp, "kmsg")
        os.mkfifo(fifo)
        proc = subprocess.Popen(
            [sys.executable, __file__, "--child", fifo], stdout=subprocess.PIPE, text=True
        )
        lines: list[dict] = []
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert json.loads(first).get("ready"), first

        def collect() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(json.loads(line))

        reader = threading.Thread(target=collect, daemon=True)
        reader.start()
        fd = os.open(fifo, os.O_WRONLY)
        total = int(args.rate * args.seconds / 60)
        xid_at = total // 2
        batch_s = 0.01
        per_batch = max(1, round(args.rate / 60 * batch_s))
        seq = 0
        xid_written = 0.0
        cpu0 = tree_cpu(proc.pid)
        start = time.monotonic()
        while seq < total:
            chunk = []
            for _ in range(per_batch):
                seq += 1
                if seq == xid_at:
                    text = XID
                else:
                    text = NOISE[seq % len(NOISE)].format(i=seq, t=int(time.time()))
                chunk.append(f"6,{seq},{seq * 600},-;{text}\n")
                if seq == xid_at:
                    xid_written = time.time()
                if seq >= total:
                    break
            data = "".join(chunk).encode()
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            delay = start + seq / (args.rate / 60) - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        wall = time.monotonic() - start
        time.sleep(0.5)  # let the child drain the FIFO
        cpu1 = tree_cpu(proc.pid)
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
        reader.join(5)
        os.close(fd)
    findings = [x for x in lines if "finding" in x]
    stats = next((x["stats"] for x in lines if "stats" in x), {})
    hit = [x for x in findings if x["finding"]["code"] == "GPU_XID_79"]
    cpu = cpu1 - cpu0
    print(f"machine: {machine()}")
    print(
        f"storm: {total} lines in {wall:.1f} s ({total / wall * 60:,.0f} lines/min),"
        f" one Xid 79 at line {xid_at}"
    )
    print(f"child records handled: {stats.get('records')}, stats: {stats}")
    share = 100 * cpu / (wall + 0.5)
    print(
        f"kernel_log CPU: {cpu:.2f} s over {wall + 0.5:.1f} s = {share:.2f}% of one core"
        f" ({1e6 * cpu / max(total, 1):.1f} us per line)"
    )
    if hit:
        latency = (hit[0]["t"] - xid_written) * 1000
        print(f"Xid 79 inside the storm: DETECTED, {latency:.1f} ms after it was written")
    else:
        print("Xid 79 inside the storm: NOT DETECTED")
    print(
        f"findings emitted: {len(findings)} ({', '.join(x['finding']['code'] for x in findings)})"
    )
    return 0 if hit else 1


if __name__ == "__main__":
    sys.exit(main())
