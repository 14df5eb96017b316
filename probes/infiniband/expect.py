"""The compute fabric a GPU board comes with: expected InfiniBand/RoCE ports from the GPU product.

An 8-GPU HGX/DGX board of a known product is cabled with one compute HCA per GPU at the rate of
``FABRICS`` (leptonai/gpud ``components/accelerator/nvidia/infiniband/threshold_default.go``;
tests/fixtures/gpud/threshold_default.go.src.txt). The product is read from the PCI device id of
the NVIDIA GPUs under the sysfs root (hma.probes.support.pci), never from the NVIDIA check family.
docs/infiniband.md "Expected from the GPUs".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from hma.adapters.files import ReadError, RootReader
from hma.contracts.model import Finding, Severity
from hma.probes.support import pci


@dataclass(frozen=True)
class Fabric:
    """What a board of ``gpus`` GPUs of ``product`` comes with: ``ports`` compute ports at
    ``rate_gbps``."""

    product: str
    gpus: int
    ports: int
    rate_gbps: float


# PCI device id (pci.ids, vendor 10de) -> the board's compute fabric (gpud's gpuPortConfigs:
# "h100", "h200", "b200": AtLeastPorts 8, AtLeastRate 400). gpud's "a100" row (1 port at 200)
# does not describe an 8-GPU board's fabric and is left out.
FABRICS: dict[int, Fabric] = {
    0x2330: Fabric("H100 SXM5 80GB", 8, 8, 400.0),
    0x2335: Fabric("H200 SXM 141GB", 8, 8, 400.0),
    0x2901: Fabric("B200", 8, 8, 400.0),
}


def fabric_of(sysfs: RootReader) -> Optional[Fabric]:
    """The fabric of this board: every NVIDIA GPU on the PCI bus has one device id of
    ``FABRICS`` and there are as many as the table's board has; None otherwise, or when the bus
    or a GPU's ids cannot be read (no inferred expectation)."""
    gpus = pci.nvidia_devices(sysfs)
    if not gpus:
        return None
    try:
        ids = {sysfs.pci_id(f"{pci.DEVICES}/{dev}/device") for dev in gpus}
    except ReadError:
        return None
    fabric = FABRICS.get(ids.pop()) if len(ids) == 1 else None
    return fabric if fabric is not None and fabric.gpus == len(gpus) else None


def odd_ports(ports: Mapping[str, Any], fabric: Fabric, listed: bool) -> list[Finding]:
    """The odd ports out when fewer ports than ``fabric`` has run at its rate (those are the
    compute ports, InfiniBand or RoCE; the others are left alone): each other InfiniBand port
    DOWN (IB_PORT_DOWN) or slower (IB_RATE_DEGRADED), and, when even those and the unreadable
    ports do not make up the count, IB_PORT_MISSING (warning) on the node. An Ethernet port
    that is down or slower cannot be told from the management NIC and is not judged."""
    rate = fabric.rate_gbps
    full = [k for k, p in ports.items() if (p.get("rate_gbps") or 0.0) >= rate]
    if len(full) >= fabric.ports:
        return []
    why = f"an 8-GPU {fabric.product} board has {fabric.ports} compute ports at {rate:g} Gb/sec"
    out = []
    unknown = 0
    for key, info in sorted(ports.items()):
        state, got = info.get("state"), info.get("rate_gbps")
        if key in full:
            continue
        if state is None or (state == "ACTIVE" and got is None):
            unknown += 1  # IB_READ_FAILED says so; it may be a compute port
        elif info.get("link_layer") != "InfiniBand":
            continue  # an Ethernet port down or slow: the management or storage NIC, or unknown
        elif state != "ACTIVE":
            phys = info.get("phys_state")
            out.append(
                Finding(
                    "IB_PORT_DOWN",
                    f"ib:{key}",
                    f"{key} is {state} (phys {phys}); expected ACTIVE ({why})",
                    {"state": state, "phys_state": phys, "expected_from": fabric.product},
                )
            )
        else:
            out.append(
                Finding(
                    "IB_RATE_DEGRADED",
                    f"ib:{key}",
                    f"{key} runs at {info.get('rate')}, below {rate:g} Gb/sec ({why})",
                    {"rate_gbps": got, "expected_gbps": rate, "expected_from": fabric.product},
                )
            )
    if listed and len(full) + len(out) + unknown < fabric.ports:
        out.append(
            Finding(
                "IB_PORT_MISSING",
                "node",
                f"{len(full) + len(out)} compute port(s) in class/infiniband; {why}",
                {"compute_ports": len(full) + len(out), "expected_ports": fabric.ports,
                 "expected_from": fabric.product},
                severity=Severity.WARNING,
            )
        )  # fmt: skip
    return out
