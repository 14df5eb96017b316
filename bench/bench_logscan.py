#!/usr/bin/env python3
"""``hma logscan`` throughput: lines per second on noise, on mixed logs, and on a gzip of newlines.

    .venv/bin/python bench/bench_logscan.py [--lines 2000000] [--runs 5]

Files are generated in a temporary folder (removed after):

- noise: dmesg and syslog lines that no rule matches, some of them close (``NVRM: GPU at ...``);
- mixed: the same with one line in 1,000 a fault (Xid, machine check, hung task, fallen off the
  bus in three lines, Neuron, SXid, AER, mlx5, NVMe, EXT4, NFS, soft lockup, EFA) and one in 100
  a user-space ``NVRM[pid]: Xid`` syslog line;
- newlines.gz: 200 MB of newlines, gzip-compressed (about 1 MB);
- matching: every line an Xid (256 GPUs x 150 Xids, more faults than ``MAX_FINDINGS`` keeps);
  and every line a fault of the other rules (NVSwitch SXid, NVMe, EXT4, NFS, mlx5).

Each is scanned ``--runs`` times in this process (``hma.commands.logscan.scan``, the rules loaded
once); the median wall time gives lines per second; the ``hma logscan`` command's wall time is shown
beside it. For comparison, the per-line path of the kernel_log
source (``Matcher.feed`` of each message, literal prefilter first) over the noise messages.
On a shared machine compare the lines per CPU second, against another tree run in the same
minute (``PYTHONPATH=<tree>``), not the wall-clock figures.
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, time_command  # noqa: E402

NOISE = [
    '[ {s}.{i:06d}] audit: type=1400 audit(1700000000.123:{i}): apparmor="DENIED" operation="open"'
    ' profile="snap.lxd" name="/proc/{i}/mounts" pid={i} comm="lxd" requested_mask="r"',
    "[ {s}.{i:06d}] eth0: renamed from veth{i}",
    "Dec  2 10:43:30 worker4 systemd[1]: Started Session {i} of user ubuntu.",
    "[ {s}.{i:06d}] nvme nvme0: I/O {i} QID 3 timeout, completion polled",
    "[ {s}.{i:06d}] NVRM: GPU at PCI:0000:3b:00: GPU-5e4c0b1a-{i}",
    "Dec  2 10:43:31 worker4 kernel: [ {s}.{i:06d}] br0: port 2(veth{i}) entered forwarding state",
    "[ {s}.{i:06d}] EXT4-fs (nvme0n1p1): mounted filesystem with ordered data mode.",
    "[ {s}.{i:06d}] nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Data {{0x{i:08x}, 0x0}}",
    "[ {s}.{i:06d}] pcieport 0000:00:1c.5: AER: Corrected error received: 0000:00:1c.5",
    "[ {s}.{i:06d}] XFS (nvme0n1p2): Ending clean mount",
]
FAULTS = [
    "[ {s}.{i:06d}] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen"
    " off the bus.",
    "[ {s}.{i:06d}] mce: [Hardware Error]: Machine check events logged",
    "[ {s}.{i:06d}] INFO: task python3:{i} blocked for more than 120 seconds.",
    "[ {s}.{i:06d}] NVRM: The NVIDIA GPU 0000:b3:00.0\n[ {s}.{i:06d}] NVRM: (PCI ID: 10de:26b5)"
    " installed in this system has\n[ {s}.{i:06d}] NVRM: fallen off the bus and is not responding"
    " to commands.",
    "[ {s}.{i:06d}] neuron3: NEURON_HW_ERR=SRAM_UNCORRECTABLE_ERROR nd-id=3 nc-id=0",
    "[ {s}.{i:06d}] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault"
    " Up",
    "[ {s}.{i:06d}] nvidia 0000:3b:00.0: AER: PCIe Bus Error: severity=Uncorrected (Fatal),"
    " type=Transaction Layer, (Receiver ID)",
    "[ {s}.{i:06d}] mlx5_core 0000:41:00.0: poll_health:852:(pid 0): device's health compromised"
    " - reached miss count",
    "[ {s}.{i:06d}] nvme nvme0: I/O 25 QID 0 timeout, reset controller",
    "[ {s}.{i:06d}] EXT4-fs error (device sdb): ext4_journal_check_start:61: Detected aborted"
    " journal",
    "[ {s}.{i:06d}] nfs: server 10.66.16.116 not responding, still trying",
    "[ {s}.{i:06d}] watchdog: BUG: soft lockup - CPU#18 stuck for 27s! [python3:{i}]",
    "[ {s}.{i:06d}] efa 0000:00:1d.0 rdmap0s29: Wait for completion (polling) timeout",
]
# every line a fault of the issue 21 rules (a file of nothing but matches, rules other than Xid)
MATCHING_NEW = [
    "[ {s}.{i:06d}] nvidia-nvswitch{k}: SXid (PCI:0000:{bus:02x}:00.0): 20034, Fatal, Link {k} up",
    "[ {s}.{i:06d}] nvme nvme{k}: I/O {i} QID 3 timeout, aborting",
    "[ {s}.{i:06d}] EXT4-fs error (device sd{k}): ext4_lookup:1855: inode #{i}: comm x: bad",
    "[ {s}.{i:06d}] nfs: server 10.0.{k}.{bus} not responding, still trying",
    "[ {s}.{i:06d}] mlx5_core 0000:{bus:02x}:00.0: cmd_work_handler:877:(pid {i}):"
    " ENABLE_HCA(0x104) timeout. Will cause a leak of a command resource",
]
MATCHING = "[ {s}.{i:06d}] NVRM: Xid (PCI:0000:{bus:02x}:00): {xid}, pid={i}, name=python3, Ch 1\n"
USER = "Dec  2 10:43:35 worker4 NVRM[{i}]: Xid (PCI:0000:01:00): 79, pid=1, name=x, planted"


def generate(path: Path, lines: int, mixed: bool) -> int:
    """Write ``path``; returns its number of lines."""
    count = 0
    with open(path, "w", encoding="utf-8") as out:
        for i in range(lines):
            s = 1000 + i // 1000
            if mixed and i % 1000 == 500:
                text = FAULTS[(i // 1000) % len(FAULTS)].format(s=s, i=i)
            elif mixed and i % 100 == 50:
                text = USER.format(i=i)
            else:
                text = NOISE[i % len(NOISE)].format(s=s, i=i)
            out.write(text + "\n")
            count += text.count("\n") + 1
    return count


CPU: dict[str, float] = {}  # label -> median CPU seconds of the last timed() call


def timed(fn, runs: int, label: str = "") -> float:  # type: ignore[no-untyped-def]
    """Median wall time of ``runs`` calls; the median CPU time goes to ``CPU[label]`` (on a
    shared machine the wall time also counts the time other work held the cores)."""
    samples, cpu = [], []
    for _ in range(runs):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        samples.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    CPU[label] = statistics.median(cpu)
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=2_000_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    from hma.commands.logscan import scan
    from hma.probes.kernel_log.lines import saved_line
    from hma.probes.kernel_log.rules import RuleSet

    rules = RuleSet.load(None)
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory(prefix="hma-bench-logscan-") as tmp:
        folder = Path(tmp)
        config = folder / "hma.toml"
        config.write_text("")  # defaults: the built-in rules
        results: dict[str, float] = {}  # lines per second (wall)
        per_cpu: dict[str, float] = {}  # lines per CPU second
        for name, mixed in (("noise", False), ("mixed", True)):
            path = folder / f"{name}.log"
            count = generate(path, args.lines, mixed)
            hits, errors = scan([str(path)], rules)
            assert not errors and (bool(hits) == mixed), (name, hits, errors)
            if mixed:
                assert {h.finding.code for h in hits} >= {"GPU_XID_79", "GPU_FALLEN_OFF_BUS"}
                assert all(h.finding.component != "gpu:0000:01:00" for h in hits)  # user lines
            median = timed(lambda p=path: scan([str(p)], rules), args.runs, name)  # type: ignore[misc]
            results[name], per_cpu[name] = count / median, count / CPU[name]
            size = path.stat().st_size / 1e6
            print(
                f"{name:>8}: {count:,} lines ({size:.0f} MB) in {median:.3f} s (median of"
                f" {args.runs}): {count / median:,.0f} lines/s, {size / median:,.0f} MB/s;"
                f" per CPU second: {count / CPU[name]:,.0f} lines/s"
            )
            argv = [sys.executable, "-m", "hma", "--config", str(config), "logscan", str(path)]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
            assert done.returncode == (2 if mixed else 0), done.stdout + done.stderr
            wall = statistics.median(time_command(argv, args.runs))
            print(f"          `hma logscan` command, interpreter start included: {wall:.3f} s")
        packed = folder / "newlines.gz"
        total = 200 * (1 << 20)
        with gzip.open(packed, "wb", compresslevel=1) as out:
            for _ in range(200):
                out.write(b"\n" * (1 << 20))
        median = timed(lambda: scan([str(packed)], rules), args.runs)
        print(
            f"  gzip: 200 MB of newlines ({packed.stat().st_size / 1e6:.1f} MB packed) in"
            f" {median:.3f} s: {total / median:,.0f} lines/s"
        )
        matching = folder / "matching.log"
        with open(matching, "w", encoding="utf-8") as out:
            for i in range(args.lines // 4):
                out.write(MATCHING.format(s=1000 + i // 1000, i=i, bus=i % 256, xid=i % 150 + 1))
        median = timed(lambda: scan([str(matching)], rules), args.runs, "matching")
        print(
            f"matching: {args.lines // 4:,} Xid lines in {median:.3f} s:"
            f" {args.lines // 4 / median:,.0f} lines/s;"
            f" per CPU second: {args.lines // 4 / CPU['matching']:,.0f} lines/s"
        )
        results["matching"] = args.lines // 4 / median
        per_cpu["matching"] = args.lines // 4 / CPU["matching"]
        matching_new = folder / "matching-new.log"
        with open(matching_new, "w", encoding="utf-8") as out:
            for i in range(args.lines // 4):
                text = MATCHING_NEW[i % len(MATCHING_NEW)]
                out.write(text.format(s=1000 + i // 1000, i=i, bus=i % 256, k=i % 8) + "\n")
        hits, _errors = scan([str(matching_new)], rules)
        assert len({h.finding.code for h in hits}) == len(MATCHING_NEW), hits
        median = timed(lambda: scan([str(matching_new)], rules), args.runs, "matching-new")
        print(
            f"matching: {args.lines // 4:,} lines of the other rules in {median:.3f} s:"
            f" {args.lines // 4 / median:,.0f} lines/s;"
            f" per CPU second: {args.lines // 4 / CPU['matching-new']:,.0f} lines/s"
        )
        results["matching-new"] = args.lines // 4 / median
        per_cpu["matching-new"] = args.lines // 4 / CPU["matching-new"]
        messages = []
        with open(folder / "noise.log", encoding="utf-8") as src:
            for _i, line in zip(range(200_000), src):
                message = saved_line(line)[1]
                if message is not None:
                    messages.append(message)
        matcher = rules.matcher("kernel_log")

        def feed_all() -> None:
            for message in messages:
                matcher.feed(message)

        median = timed(feed_all, args.runs)
        print(
            f"kernel_log per-line path (Matcher.feed, prefilter first): {len(messages):,}"
            f" messages in {median:.3f} s: {len(messages) / median:,.0f} lines/s"
        )
        print(
            f"rules: {len(rules.rules)} built-in, {len(rules.prefilter.needles)} needles in"
            f" {rules.prefilter.passes()} passes over a block"
        )
        # issue 31: not below the figures of the tree before its wordings (per CPU second)
        targets = (("noise", 1_280_000), ("matching", 244_000), ("matching-new", 200_000))
        for name, target in targets:
            verdicts = [
                f"{rate:,.0f} lines/s {label}{'meets' if rate >= target else 'MISSES'}"
                for label, rate in (("", results[name]), ("per CPU second ", per_cpu[name]))
            ]
            print(f"{name}: {' and '.join(verdicts)} the {target:,} lines/s target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
