#!/usr/bin/env python3
"""What the agent costs a node: `hma run` on a simulated p5.48xlarge and trn1.32xlarge.

The node: a generated sysfs tree (tests/fixtures/gen_sysfs.py: DMI product name, 32 or 8 EFA
adapters, 16 Neuron devices on trn1), the stand-in NVML with 8 H100 on p5 (none on trn1), the
stand-in nvidia-smi serving a captured H100 document, the /dev/kmsg stand-in for kernel_log,
Slurm off (``[slurm] enabled = false``), default probe intervals. efa_mesh is off here (it needs
fi_pingpong between adapters: bench/bench_efa_mesh.py gives its cost per screen and per
tournament).

After a warm-up (every probe has run once), for ``--duration`` seconds: the CPU share of the whole
process tree (the agent, its workers, and children it reaped: /proc/PID/stat utime+stime+cutime+
cstime), runs per probe (status.json), the children started (nvidia-smi is the only command run
between meshes: its stand-in logs each run), then PSS per process (smaps_rollup). Then, in this
process, CPU per run of each probe (its collect+evaluate, a worker's CPU included). Needs root
only for the stand-in kmsg FIFOs under /tmp; prints the machine and its load, which matter on a
shared host.

    .venv/bin/python bench/bench_node_cost.py [--instances p5.48xlarge,trn1.32xlarge]
        [--duration 600] [--runs 10] [--beside prometheus-node-exporter]

``--beside PROGRAM`` starts that exporter (node_exporter: listening on a free loopback port, not
scraped, as an idle node runs it) before the window and measures its CPU share and PSS over the
same seconds, so the two figures come from one machine at one load.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from common import machine, pss_kib, split_cpu, stop, tree, tree_cpu  # noqa: E402

from tests.fixtures import gen_sysfs  # noqa: E402
from tests.standin import nvmlstub  # noqa: E402
from tests.standin.kmsg import KmsgStandIn  # noqa: E402

# run_dir on a tmpfs, as /run is on a node (status.json is rewritten after each probe run: on
# ext4 each rename over the old file flushes the new one's data, auto_da_alloc)
RUN_PARENT = "/dev/shm" if os.path.isdir("/dev/shm") else None


def _toml(value: Any) -> str:
    return json.dumps(value)  # strings, numbers, booleans and lists are the same in TOML


def build(base: Path, run: Path, instance: str) -> tuple[Path, dict[str, str], KmsgStandIn]:
    """The node's roots, stand-ins and hma.toml (``run``: its run_dir); returns (config,
    environment, kmsg stand-in)."""
    sysfs, procfs = base / "sysfs", base / "proc"
    gen_sysfs.build(sysfs, instance)
    for name in ("online", "present"):
        cpu = sysfs / "devices/system/cpu" / name
        cpu.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f"/sys/devices/system/cpu/{name}", cpu)
    (procfs / "self").mkdir(parents=True)
    (procfs / "sys/kernel/random").mkdir(parents=True)
    (procfs / "sys/kernel/random/boot_id").write_text(
        Path("/proc/sys/kernel/random/boot_id").read_text()
    )
    shutil.copyfile("/proc/meminfo", procfs / "meminfo")
    shutil.copyfile("/proc/self/mountinfo", procfs / "self/mountinfo")
    (procfs / "1").mkdir()
    (procfs / "1/comm").write_text("nv-fabricmanage\n")
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
    gpu: dict[str, Any] = {}
    if instance.startswith("p5"):
        lib = nvmlstub.build(base / "lib")
        scenario = nvmlstub.Scenario(base / "scenario.txt", ngpus=8)
        env[nvmlstub.ENV] = str(scenario.path)
        gpu = {"library": str(lib), "expected_gpus": 8}
    else:
        gpu = {"library": str(base / "no-libnvidia-ml.so.1")}
    smi: dict[str, Any] = {}  # trn1: no nvidia-smi there (unsupported)
    if instance.startswith("p5"):
        env["HMA_SMI_DOCUMENT"] = str(nvmlstub.SMI_FIXTURES / "h100-v13.xml")
        env["HMA_SMI_ARGS_LOG"] = str(base / "nvidia-smi.log")  # one line a run: the count
        # The stand-in (a Python script) through this interpreter: its `#!/usr/bin/env python3`
        # may find a pyenv shim: about 40 processes a run (bash, pyenv scripts) no real node has.
        smi = {"command": [sys.executable, str(nvmlstub.NVIDIA_SMI), "-q", "-x"]}
    kmsg = KmsgStandIn(base / "dev-kmsg", base / "kmsg")
    (base / "probes.d").mkdir(mode=0o755)
    sections: dict[str, dict[str, Any]] = {
        "agent": {
            "state_dir": str(base / "state"),
            "run_dir": str(run),
            "node_name": "bench",
            "probes_dir": str(base / "probes.d"),
        },
        "paths": {"sysfs": str(sysfs), "procfs": str(procfs)},
        "probes.gpu": gpu,
        "probes.nvidia_smi": smi,
        "probes.efa_mesh": {"enabled": False},
        "probes.system": {"filesystems": [], "processes": []},
        "sources.kernel_log": {"path": str(base / "kmsg"), "backend": "kmsg"},
        "sources.nvml_events": {"library": gpu["library"]},
        "reporters.journald": {"enabled": False},
        "slurm": {"enabled": False},  # else sinfo retries an absent controller with backoff
    }
    text = "".join(
        f"[{name}]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in values.items()) + "\n"
        for name, values in sections.items()
    )
    config = base / "hma.toml"
    config.write_text(text)
    env["HMA_CONFIG"] = str(config)
    return config, env, kmsg


def status(run_dir: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((run_dir / "status.json").read_text()))
    except (OSError, ValueError):
        return {}


def free_port() -> int:
    """A loopback TCP port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_beside(program: str, base: Path) -> subprocess.Popen:
    """The exporter measured beside the agent, on a free loopback port."""
    log = open(base / "beside.log", "w")  # noqa: SIM115 - the process owns it until stopped
    return subprocess.Popen(
        [program, f"--web.listen-address=127.0.0.1:{free_port()}"],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def report_beside(proc: subprocess.Popen, cpu0: float, seconds: float) -> None:
    """The exporter's CPU share over the window and its PSS."""
    if proc.poll() is not None:
        print(f"  beside: exited with {proc.returncode} (see beside.log)")
        return
    used = tree_cpu(proc.pid) - cpu0
    kib = sum(pss_kib(pid) for pid in tree(proc.pid))
    print(
        f"  beside {Path(proc.args[0]).name}: {used / seconds * 100:.3f}% of a core "
        f"({used:.2f} CPU s), PSS {kib / 1024:.1f} MiB"
    )


def measure_agent(
    base: Path,
    run: Path,
    env: dict[str, str],
    config: Path,
    duration: float,
    beside: str = "",
) -> None:
    """Start the agent, wait until every probe ran, then measure the tree for ``duration``
    (and ``beside``, an exporter started next to it, over the same window)."""
    log = open(base / "agent.log", "w")  # noqa: SIM115 - closed below
    agent = subprocess.Popen(
        [sys.executable, "-m", "hma", "--config", str(config), "run"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    other: subprocess.Popen | None = None
    try:
        deadline = time.monotonic() + 120
        while True:
            probes = status(run).get("probes") or []
            if probes and all(p.get("status") != "pending" for p in probes):
                break
            if agent.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the agent did not start; see {base / 'agent.log'}")
            time.sleep(0.2)
        other = start_beside(beside, base) if beside else None
        time.sleep(2.0)  # the first runs' workers settle
        other_cpu0 = tree_cpu(other.pid) if other else 0.0
        smi_log = base / "nvidia-smi.log"
        smi0 = len(smi_log.read_text().splitlines()) if smi_log.exists() else 0
        cpu0, t0 = split_cpu(agent.pid), time.monotonic()
        runs: dict[str, int] = {}
        last: dict[str, Any] = {}
        while time.monotonic() - t0 < duration:
            for p in status(run).get("probes") or []:
                if p.get("last_run") != last.get(p["name"]):
                    if p["name"] in last:
                        runs[p["name"]] = runs.get(p["name"], 0) + 1
                    last[p["name"]] = p.get("last_run")
            time.sleep(0.5)
        cpu1, t1 = split_cpu(agent.pid), time.monotonic()
        used = {k: cpu1[k] - cpu0[k] for k in cpu1}
        share = sum(used.values()) / (t1 - t0) * 100
        parts = ", ".join(f"{k} {v:.2f}" for k, v in used.items())
        print(
            f"  tree CPU: {share:.3f}% of a core over {t1 - t0:.0f} s "
            f"({sum(used.values()):.2f} CPU s: {parts})"
        )
        print("  runs:    " + ", ".join(f"{n} {c}" for n, c in sorted(runs.items())))
        smi_log = base / "nvidia-smi.log"
        smi_runs = len(smi_log.read_text().splitlines()) - smi0 if smi_log.exists() else 0
        print(f"  children started: nvidia-smi {smi_runs} (the only command run between meshes)")
        total = 0
        for pid in tree(agent.pid):
            try:
                kib = pss_kib(pid)
                comm = " ".join(Path(f"/proc/{pid}/cmdline").read_text().split("\0")[1:4])
            except OSError:
                continue
            total += kib
            print(f"  PSS {kib / 1024:6.1f} MiB  pid {pid} {comm}")
        print(f"  PSS {total / 1024:6.1f} MiB  the tree")
        if other:
            report_beside(other, other_cpu0, t1 - t0)
    finally:
        if other:
            stop(other)
        stop(agent)
        log.close()


def _own_cpu(slot: Any) -> float:
    """CPU seconds of this process, its reaped children (commands) and the slot's worker."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    worker = getattr(slot, "pid", None)
    return (
        time.process_time()
        + children.ru_utime
        + children.ru_stime
        + (tree_cpu(worker) if worker else 0.0)
    )


def measure_probes(config: Path, env: dict[str, str], runs: int) -> None:
    """CPU per run (collect + evaluate) of each enabled probe, as the daemon runs it."""
    os.environ.update(env)
    from hma import assembly
    from hma.detection.runner import make_slot, run_probe

    setup = assembly.load(str(config))
    previous: dict[str, Any] = {}
    for name in setup.enabled():
        slot = make_slot(setup.probes[name])
        try:
            costs = []
            for i in range(runs + 1):
                ctx = setup.context(name)
                ctx.previous = previous.get(name)
                before = _own_cpu(slot)
                run = run_probe(slot, ctx, 60.0, time.time())
                after = _own_cpu(slot)
                previous[name] = run.snapshot
                if i:  # the first run starts a worker and fills caches
                    costs.append(after - before)
            costs.sort()
            print(
                f"  {name:12} {str(run.status):12} CPU per run: median "
                f"{costs[len(costs) // 2] * 1000:7.2f} ms  (n={len(costs)})"
            )
        finally:
            slot.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", default="p5.48xlarge,trn1.32xlarge")
    parser.add_argument("--duration", type=float, default=600.0, help="seconds per node")
    parser.add_argument("--runs", type=int, default=10, help="runs per probe for CPU per run")
    parser.add_argument("--beside", default="", help="an exporter to measure over the same window")
    args = parser.parse_args()
    print(machine())
    for instance in args.instances.split(","):
        node = tempfile.TemporaryDirectory(prefix="hma-bench-node-")
        run_dir = tempfile.TemporaryDirectory(prefix="hma-bench-run-", dir=RUN_PARENT)
        with node as tmp, run_dir as run_tmp:
            base, run = Path(tmp), Path(run_tmp)
            config, env, kmsg = build(base, run, instance)
            try:
                print(f"{instance}: hma run, default intervals, Slurm off, efa_mesh off")
                measure_agent(base, run, env, config, args.duration, args.beside)
                print(f"{instance}: CPU per probe run")
                measure_probes(config, env, args.runs)
            finally:
                kmsg.close()
    print(f"after: {machine()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
