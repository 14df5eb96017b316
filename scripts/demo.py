#!/usr/bin/env python3
"""`make demo`: a fatal Xid on a simulated GPU node, from detection to the node back in service.

On this machine, with no configuration and nothing changed outside one temporary folder
(/tmp/hma-slurm-<id>, removed at the end):

1. a real Slurm on loopback (munged, slurmctld, 4 slurmd; tests/slurmcluster.py) whose
   RebootProgram is a stand-in: it restarts the node's slurmd with ``-b`` and gives the node a
   new boot id instead of rebooting the machine;
2. node ``p5-002`` made a simulated p5.48xlarge (tests/simnode.py): 8 H100 through a stand-in
   NVML library, 32 EFA adapters in a generated sysfs tree, a /dev/kmsg stand-in;
3. ``hma run`` for that node, ``[recovery] policy = automatic``;
4. ``hma inject xid --xid 79`` (GPU has fallen off the bus) into the /dev/kmsg stand-in, and
   the stand-in NVML loses that GPU until the reboot; then the timeline: detected, drained,
   reboot issued, rebooted (the agent restarts on the new boot id, as after a real reboot),
   healthy, resumed -- with ``hma status`` and ``sinfo -R`` at each step. See docs/demo.md.

Each step prints a line ``[+SECONDS] STEP <name>: ...`` (tests/integration/test_demo.py reads
them). A step that does not happen in time stops the demo with ``demo: FAILED at step <name>``
and exit status 1; everything is torn down either way (processes stopped by PID, the folder
removed; ``HMA_KEEP_SLURM=1`` keeps the folder for a look at the logs).
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.simnode import GPUS, INSTANCE, RECOVERY, SimNode  # noqa: E402
from tests.slurmcluster import SlurmCluster, available  # noqa: E402
from tests.standin import nvmlstub  # noqa: E402

NODES = ["p5-001", "p5-002", "p5-003", "p5-004"]
NODE = "p5-002"
GPU = 3  # the stand-in GPU that "falls off the bus"
XID = 79
SINFO_FORMAT = "%48E %19H %10T %N"  # sinfo -R, with the whole reason and the node state
STEP_TIMEOUT = 30.0  # seconds any one step may take
REBOOT_DELAY = 3.0  # seconds the RebootProgram stand-in "shuts down" before the new boot
T0 = time.monotonic()
TIMELINE: list[tuple[float, str]] = []  # (seconds since the start, step) of the steps seen
CURRENT = "start"  # the step in progress (named when the demo is interrupted)


class StepFailed(Exception):
    """A step did not happen; the message names it."""


def say(text: str = "") -> None:
    """Print at once (the demo is watched live)."""
    print(text, flush=True)


def step(name: str, text: str) -> None:
    """The timeline line of a step that happened (the test parses these)."""
    at = time.monotonic() - T0
    TIMELINE.append((at, name))
    say(f"\n[+{at:5.1f}s] STEP {name}: {text}")


def indent(text: str, prefix: str = "    ") -> str:
    """Indent a block of command output."""
    return "\n".join(prefix + line for line in text.rstrip().splitlines())


def trim(text: str, probes: bool) -> str:
    """`hma status` without the evidence blocks (and the probe table unless ``probes``)."""
    out: list[str] = []
    section, evidence_depth = "", None
    for line in text.rstrip().splitlines():
        depth = len(line) - len(line.lstrip())
        if line.strip() and not depth:
            section = line.split()[0]
            if out and out[-1].strip() and not (section == "Probes" and not probes):
                out.append("")  # the blank line before a section (an evidence block took it)
        if section == "Probes" and not probes:
            continue
        if evidence_depth is not None and (depth > evidence_depth or not line.strip()):
            continue  # inside an evidence block
        evidence_depth = depth if line.strip() == "evidence:" else None
        if evidence_depth is None and (line.strip() or (out and out[-1].strip())):
            out.append(line)  # (no two blank lines in a row)
    return "\n".join(out)


def show(node: SimNode, cluster: SlurmCluster, probes: bool = False) -> None:
    """`hma status` (trimmed) and `sinfo -R` as an admin would run them."""
    res = node.hma("status")
    say(f"  $ hma status            (exit {res.returncode}; evidence trimmed)")
    say(indent(trim(res.stdout, probes)))
    say(f"  $ sinfo -R -o '{SINFO_FORMAT}'")
    say(indent(cluster.run("sinfo", "-R", "-o", SINFO_FORMAT).stdout or "(nothing)"))


def run_step(name: str, action: Callable[[], Any]) -> Any:
    """Run one step; any failure becomes StepFailed naming the step."""
    global CURRENT
    CURRENT = name
    try:
        return action()
    except StepFailed:
        raise
    except Exception as exc:  # noqa: BLE001 - the demo reports every failure by step
        raise StepFailed(f"{name}: {exc}") from exc


def slurm_node(cluster: SlurmCluster) -> dict[str, Any]:
    """The demo node's `sinfo --json` object."""
    return cluster.node(NODE)


def timeline(cluster: SlurmCluster, node: SimNode) -> None:
    """The demo proper, one step after the other."""
    pci = node.gpu_pci(GPU)

    def ready() -> None:
        node.start_agent()
        node.wait(node.healthy, STEP_TIMEOUT, "a first healthy verdict (every probe ok)")

    run_step("agent-started", ready)
    boot = node.boot_id()
    step(
        "agent-started",
        f"hma run on {NODE} ({INSTANCE}: {GPUS} GPUs, 32 EFA), boot id {boot[:8]}, all probes ok",
    )
    show(node, cluster, probes=True)

    say(f"\n  $ hma inject xid --gpu {pci} --xid {XID} --yes-really-drain --kmsg {node.dev_kmsg}")
    res = node.hma(
        "inject", "xid", "--gpu", pci, "--xid", str(XID), "--yes-really-drain", "--kmsg",
        str(node.dev_kmsg),
    )  # fmt: skip
    say(indent(res.stdout + res.stderr))
    if res.returncode != 0:
        raise StepFailed(f"inject: hma inject exited {res.returncode}")

    node.lose_gpu(GPU)
    say(f"  (and the driver loses GPU {GPU}: the stand-in NVML answers GPU_IS_LOST for {pci})")

    def detected() -> list[dict[str, Any]]:
        want = {f"GPU_XID_{XID}", "GPU_LOST"}
        node.wait(
            lambda: want <= {f["code"] for f in node.faults()},
            STEP_TIMEOUT,
            f"GPU_XID_{XID} (kernel log) and GPU_LOST (gpu probe) in hma status",
        )
        return [f for f in node.faults() if f["code"] in want]

    faults = run_step("detected", detected)
    step(
        "detected",
        "; ".join(
            f"{f['code']} on {f['component']} ({f['severity']}, action {f['action']},"
            f" from {f['probe']})"
            for f in faults
        ),
    )
    show(node, cluster)

    def drained() -> dict[str, Any]:
        node.wait(
            lambda: slurm_node(cluster)["reason"].startswith("HMA: ")
            and "DRAIN" in slurm_node(cluster)["state_flags"]
            and ("drain", "done") in node.actions(),
            STEP_TIMEOUT,
            f"{NODE} drained with an HMA: reason",
        )
        return slurm_node(cluster)

    info = run_step("drained", drained)
    step("drained", f"{NODE} drained by hma, reason {info['reason']!r} (no jobs: drained at once)")
    show(node, cluster)

    def reboot_issued() -> None:
        node.wait(
            lambda: NODE in cluster.reboots() and ("reboot", "done") in node.actions(),
            STEP_TIMEOUT,
            "scontrol reboot of the node (RebootProgram run, hma status: reboot done)",
        )

    run_step("reboot-issued", reboot_issued)
    step(
        "reboot-issued",
        f"hma ran `scontrol reboot {NODE}`; slurmd ran the RebootProgram (stand-in: restarts"
        " slurmd with -b and writes a new boot id instead of rebooting this machine)",
    )
    show(node, cluster)

    def rebooted() -> None:
        node.wait(lambda: node.boot_id() != boot, STEP_TIMEOUT, "a new boot id")
        node.stop_agent()  # the agent went down with the machine
        node.restore_gpus()  # and the GPU came back with the new boot
        node.wait(
            lambda: slurm_node(cluster)["state"] == "idle"
            and "NOT_RESPONDING" not in slurm_node(cluster)["state_flags"],
            STEP_TIMEOUT,
            "slurmd back after the reboot",
        )
        node.start_agent()  # systemd starts hma.service again at boot

    run_step("rebooted", rebooted)
    step(
        "rebooted",
        f"new boot id {node.boot_id()[:8]} (was {boot[:8]}), GPU {GPU} answers again; slurmd"
        " registered again, node still drained; hma run started again (as systemd does at boot)",
    )
    show(node, cluster)

    def healthy() -> None:
        node.wait(node.healthy, STEP_TIMEOUT, "a healthy verdict after the reboot")

    run_step("healthy", healthy)
    step(
        "healthy",
        f"GPU_XID_{XID} cleared by the new boot, GPU_LOST by the gpu probe seeing the GPU again;"
        f" every probe ok on {NODE}",
    )
    show(node, cluster)

    def resumed() -> dict[str, Any]:
        node.wait(
            lambda: cluster.state(NODE) == "IDLE"
            and not slurm_node(cluster)["reason"]
            and ("resume", "done") in node.actions()
            and "drain" not in str((node.status().get("remediation") or {}).get("state")),
            STEP_TIMEOUT,
            f"{NODE} resumed by hma",
        )
        kinds = [kind for kind, _state in node.actions()]
        if cluster.reboots() != [NODE] or kinds != ["drain", "reboot", "resume"]:
            raise StepFailed(
                f"resumed: expected one drain, one reboot, one resume; hma did {kinds},"
                f" the RebootProgram ran for {cluster.reboots()}"
            )
        return slurm_node(cluster)

    run_step("resumed", resumed)
    step(
        "resumed",
        f"hma resumed {NODE} after {RECOVERY['resume_after']:g} s of healthy verdicts; label"
        " cleared, node back in service (actions: drain, reboot, resume; 1 reboot)",
    )
    show(node, cluster)


def preflight() -> None:
    """What the demo needs; `make demo` installs it (scripts/bootstrap)."""
    why = available()
    if why:
        raise StepFailed(f"preflight: {why}")
    if nvmlstub.compiler() is None:
        raise StepFailed("preflight: no C compiler (cc) for the stand-in NVML library")


def _interrupt(*_: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM: tear down as for Ctrl-C


def main() -> int:
    """Run the demo; 0 when every step was observed."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    cluster: Optional[SlurmCluster] = None
    node: Optional[SimNode] = None
    failed = ""
    try:
        run_step("preflight", preflight)
        cluster = SlurmCluster(NODES, reboot_delay=REBOOT_DELAY)
        say(f"hma demo: a fatal Xid on a simulated GPU node (files under {cluster.base})")
        run_step("slurm", cluster.start)
        step(
            "slurm",
            f"Slurm on loopback: munged, slurmctld, slurmd for {', '.join(NODES)}"
            f" (SLURM_CONF={cluster.conf})",
        )
        say("  $ sinfo")
        say(indent(cluster.run("sinfo").stdout))
        node = SimNode(cluster, NODE)
        run_step("node", node.build)
        step(
            "node",
            f"{NODE} simulated as {INSTANCE}: stand-in NVML with 8 H100, generated sysfs"
            f" (32 EFA adapters), /dev/kmsg stand-in {node.dev_kmsg}; config {node.config}",
        )
        timeline(cluster, node)
    except StepFailed as exc:
        failed = str(exc)
    except KeyboardInterrupt:
        failed = f"{CURRENT}: interrupted"
    finally:
        if failed and node is not None and node.log.exists():
            say("\n--- agent log (last lines) ---")
            say(indent("\n".join(node.log.read_text().splitlines()[-20:])))
        if node is not None:
            node.close()
        if cluster is not None:
            cluster.stop()  # also removes the node's files
        signal.signal(signal.SIGTERM, previous)
    elapsed = time.monotonic() - T0
    if failed:
        say(f"\ndemo: FAILED at step {failed}")
        say(f"demo: torn down after {elapsed:.1f} s")
        return 1
    step("done", f"everything stopped and removed; demo took {elapsed:.1f} s")
    say("\nTimeline (seconds since the start):")
    previous_at = 0.0
    for at, name in TIMELINE:
        say(f"  {at:6.1f}  (+{at - previous_at:4.1f})  {name}")
        previous_at = at
    return 0


if __name__ == "__main__":
    sys.exit(main())
