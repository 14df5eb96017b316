"""A simulated accelerator node on a loopback Slurm node, with `hma run` as its agent (root only).

Used by `make demo` (scripts/demo.py) and tests. The node of a :class:`SlurmCluster` becomes a
p5.48xlarge:

- GPUs: the stand-in ``libnvidia-ml.so.1`` (tests/standin/nvml, built with cc) with 8 healthy H100
  through a scenario file (tests/standin/nvmlstub.py); the gpu probe and the nvml_events source
  load it;
- sysfs: the generated p5.48xlarge tree (tests/fixtures/gen_sysfs.py: DMI product name and 32 EFA
  adapters) plus the CPU lists of this machine, for the system probe;
- procfs: the node's fake procfs root of the cluster (its ``sys/kernel/random/boot_id`` is what
  the RebootProgram stand-in changes), plus copies of this machine's meminfo and mount table and
  one process, ``nv-fabricmanager`` (an NVSwitch node runs it; the gpu probe looks for it);
- kernel log: a /dev/kmsg stand-in (tests/standin/kmsg.py): ``hma inject xid --kmsg`` writes to
  the FIFO ``dev-kmsg``, the kernel_log source reads records from the FIFO ``kmsg``;
- crash records: the postmortem source reads ``pstore/`` (and no journal).

The configuration comes from tests/integration/remediation_helpers.write_config (the wiring the
remediation tests use), with ``[recovery] policy = automatic`` and short intervals. The
efa_mesh probe is off (it needs peers), and so is the journald reporter: the demo's alerts must
not reach the real monitoring of the machine it runs on.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

from tests.fixtures import gen_sysfs
from tests.integration.remediation_helpers import toml_value, write_config
from tests.slurmcluster import SlurmCluster
from tests.standin import nvmlstub
from tests.standin.kmsg import KmsgStandIn

INSTANCE = "p5.48xlarge"
GPUS = 8
RECOVERY = {
    "policy": "automatic",
    "resume_after": 2.0,  # seconds of healthy verdicts before hma resumes its drain
    "recheck_interval": 0.5,
    "min_reboot_interval": 0.0,
    "max_drained_percent": 50.0,
    "evidence_kernel_log": [],  # evidence bundles: never this machine's kernel log
}
PROBES = {  # [probes.<name>] of the simulated node: short intervals so that the demo is quick
    "gpu": {"interval": 2.0, "expected_gpus": GPUS},
    "nvidia_smi": {"enabled": False},  # the stand-in NVML is the GPU driver here
    "efa": {"interval": 2.0},
    "efa_mesh": {"enabled": False},  # an EFA ping-mesh needs peers and fi_pingpong
    "system": {"interval": 5.0, "filesystems": [], "processes": []},
    "slurm": {"interval": 2.0},
}


def _section(name: str, values: dict[str, Any]) -> str:
    return f"[{name}]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in values.items())


class SimNode:
    """The simulated node ``node`` of ``cluster``; its files live under the cluster's folder
    (``sim/<node>``), so that ``cluster.stop()`` removes them and the cluster's sweep of dead runs
    also stops an agent left behind (its command line names its config file there)."""

    def __init__(self, cluster: SlurmCluster, node: str) -> None:
        self.cluster = cluster
        self.node = node
        self.base = base = cluster.base / "sim" / node
        self.procfs = cluster.procfs(node)
        self.sysfs = base / "sysfs"
        self.kmsg = base / "kmsg"  # records, read by the agent
        self.pstore = base / "pstore"  # the crash records of the previous boot (postmortem)
        self.dev_kmsg = base / "dev-kmsg"  # writes, as /dev/kmsg takes them
        self.log = base / "agent.log"
        self.config = base / "hma.toml"
        self.scenario: Optional[nvmlstub.Scenario] = None
        self.agent: Optional[subprocess.Popen] = None
        self._kernel: Optional[KmsgStandIn] = None
        self.starts = 0

    # --- the node -------------------------------------------------------------------------------

    def build(
        self, recovery: Optional[dict[str, Any]] = None, slurm: Optional[dict[str, Any]] = None
    ) -> SimNode:
        """Build the NVML stand-in, the sysfs and procfs roots, the kernel-log FIFO, the config
        (``recovery``: ``[recovery]`` keys beside ``RECOVERY``; ``slurm``: ``[slurm]`` keys,
        e.g. a wrapper around scontrol)."""
        self.base.mkdir(parents=True, exist_ok=True)
        os.chmod(self.base, 0o755)
        lib = nvmlstub.build(self.base / "lib")
        self.scenario = nvmlstub.Scenario(self.base / "scenario.txt", ngpus=GPUS)
        gen_sysfs.build(self.sysfs, INSTANCE)
        self._gpus_on_pci()
        for name in ("online", "present"):
            cpu = self.sysfs / "devices/system/cpu" / name
            cpu.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f"/sys/devices/system/cpu/{name}", cpu)
        (self.procfs / "self").mkdir(parents=True, exist_ok=True)
        shutil.copyfile("/proc/meminfo", self.procfs / "meminfo")
        shutil.copyfile("/proc/self/mountinfo", self.procfs / "self/mountinfo")
        (self.procfs / "1").mkdir(exist_ok=True)
        (self.procfs / "1/comm").write_text("nv-fabricmanage\n")  # comm: 15 characters
        self._kernel = KmsgStandIn(self.dev_kmsg, self.kmsg)
        probes = dict(PROBES, gpu={**PROBES["gpu"], "library": str(lib)})
        extra = (
            "".join(_section(f"probes.{name}", values) for name, values in probes.items())
            + _section("sources.kernel_log", {"path": str(self.kmsg), "backend": "kmsg"})
            + _section(
                "sources.postmortem",
                {
                    "pstore_dir": str(self.pstore),
                    "systemd_pstore_dir": str(self.base / "systemd-pstore"),
                    "kdump_dir": str(self.base / "crash"),
                    "journal": False,
                },
            )
            + _section("sources.nvml_events", {"library": str(lib), "wait_ms": 100})
            + _section("reporters.journald", {"enabled": False})
        )
        write_config(
            self.config,
            self.cluster,
            self.node,
            recovery={**RECOVERY, **(recovery or {})},
            slurm=slurm,
            extra=extra,
            paths={"sysfs": str(self.sysfs)},
        )
        (self.base / "probes.d").mkdir(mode=0o755, exist_ok=True)
        return self

    def _gpus_on_pci(self) -> None:
        """The stand-in GPUs as NVIDIA 3D controllers in sysfs (the gpu probe names a GPU that
        NVML lost by its PCI address there). A bus the tree already uses moves to a free one."""
        assert self.scenario is not None
        pci = self.sysfs / "bus/pci/devices"
        for index in sorted(self.scenario.devices):
            readings = self.scenario.devices[index]
            bus = int(str(readings["bus_id"]).split(":")[1], 16)
            while (pci / f"0000:{bus:02x}:00.0").exists():
                bus += 1
            readings["bus_id"] = f"00000000:{bus:02X}:00.0"
            bdf = f"0000:{bus:02x}:00.0"
            dev = self.sysfs / "devices" / f"pci0000:{bus:02x}" / f"0000:{bus:02x}:02.0" / bdf
            dev.mkdir(parents=True)
            for name, value in (("vendor", "0x10de"), ("device", "0x2330"), ("class", "0x030200")):
                (dev / name).write_text(value + "\n")
            (pci / bdf).symlink_to(os.path.relpath(dev, pci))
        self.scenario.write()

    def lose_gpu(self, index: int) -> None:
        """The driver loses GPU ``index``: every NVML call on it answers GPU_IS_LOST."""
        assert self.scenario is not None
        self.scenario.set(f"err.*.{index}", nvmlstub.ERROR_GPU_IS_LOST)

    def restore_gpus(self) -> None:
        """All GPUs answer again (what the reboot did for a GPU that fell off the bus)."""
        assert self.scenario is not None
        for key in [k for k in self.scenario.extra if k.startswith("err.")]:
            del self.scenario.extra[key]
        self.scenario.write()

    def gpu_pci(self, index: int) -> str:
        """PCI address of stand-in GPU ``index`` (``0000:5d:00.0``), as ``hma inject`` takes it."""
        assert self.scenario is not None
        return str(self.scenario.devices[index]["bus_id"])[4:].lower()

    def env(self) -> dict[str, str]:
        """Environment of the agent and of `hma` commands for this node."""
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
        env["HMA_CONFIG"] = str(self.config)
        if self.scenario is not None:
            env[nvmlstub.ENV] = str(self.scenario.path)
        return env

    # --- the agent ------------------------------------------------------------------------------

    def start_agent(self) -> None:
        """Start `hma run` (output appended to ``agent.log``); waits until it wrote status."""
        with open(self.log, "a") as log:
            log.write(f"--- hma run, start {self.starts + 1}, boot id {self.boot_id()}\n")
            log.flush()
            self.agent = subprocess.Popen(
                [sys.executable, "-m", "hma", "--config", str(self.config), "run"],
                env=self.env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.starts += 1
        boot = self.boot_id()
        self.wait(lambda: self.status().get("boot_id") == boot, 30, "the agent's first status.json")

    def stop_agent(self) -> None:
        """SIGTERM the agent (SIGKILL after 20 s)."""
        proc, self.agent = self.agent, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)

    def close(self) -> None:
        """Stop the agent and the kmsg stand-in (``cluster.stop()`` removes the files)."""
        self.stop_agent()
        if self._kernel is not None:
            self._kernel.close()
            self._kernel = None

    # --- looking at it --------------------------------------------------------------------------

    def boot_id(self) -> str:
        """The node's current boot id (changed by the RebootProgram stand-in)."""
        return self.cluster.boot_id(self.node)

    def status_path(self) -> Path:
        """The agent's status.json."""
        return self.config.parent / f"run-{self.node}" / "status.json"

    def status(self) -> dict[str, Any]:
        """status.json ({} before the first one)."""
        try:
            return dict(json.loads(self.status_path().read_text()))
        except (OSError, ValueError):
            return {}

    def healthy(self) -> bool:
        """status.json says ok, every probe has run once since the agent started, no fault."""
        doc = self.status()
        probes = doc.get("probes") or []
        return (
            doc.get("severity") == "ok"
            and bool(probes)
            and all(p.get("status") != "pending" for p in probes)
            and not self.faults()
        )

    def actions(self) -> list[tuple[str, str]]:
        """(kind, state) of the remediation actions in status.json, oldest first."""
        rows = (self.status().get("remediation") or {}).get("actions") or []
        return [(str(r.get("kind")), str(r.get("state"))) for r in rows]

    def faults(self) -> list[dict[str, Any]]:
        """The active faults of status.json."""
        return [f for f in self.status().get("faults", []) if f.get("active")]

    def hma(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """Run an `hma` command against this node's configuration."""
        return subprocess.run(
            [sys.executable, "-m", "hma", *args],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def wait(self, predicate: Any, timeout: float, what: str) -> None:
        """Poll ``predicate``; raises RuntimeError naming ``what`` (and the agent's exit)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if predicate():
                    return
            except (RuntimeError, KeyError, ValueError):
                pass
            if self.agent is not None and self.agent.poll() is not None:
                raise RuntimeError(
                    f"the agent exited ({self.agent.returncode}) while waiting for {what};"
                    f" see {self.log}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {what} within {timeout:.0f} s")
            time.sleep(0.1)
