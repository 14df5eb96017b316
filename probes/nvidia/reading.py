"""The NVIDIA readings as typed records: what both readers (NVML in ``gpu``, ``nvidia-smi -q -x``
in ``nvidia_smi``) measure, one record shape for both.

A reader builds a :class:`Snapshot` of :class:`GpuReading` records; the probe's snapshot (what
``collect`` returns, JSON-able, kept in the state store and handed over from the worker process)
is its :meth:`Snapshot.to_json`: every field under its own name, nested records as objects.
``None`` is "not measured or not supported", never a finding. The rules
(probes/nvidia/common.py) judge that stored form, which may come from an older hma: they read
it defensively, absent and ``None`` alike.

Each snapshot also carries ``pcie_baseline`` (``common.with_baseline``): per GPU
(``bus_id/uuid``) the widest PCIe link width seen at full speed, carried forward from the previous
snapshot, which the daemon keeps in the state store, so it survives restarts and reboots.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional, Union


def optional(default: Any = None) -> Any:
    """A field that the JSON form leaves out while it is unset (None, or an empty mapping):
    a reading that this reader or this GPU does not have."""
    if isinstance(default, dict):
        return field(default_factory=dict, metadata={"optional": True})
    return field(default=default, metadata={"optional": True})


class Record:
    """A reading record (a dataclass) and its JSON form."""

    def to_json(self) -> dict[str, Any]:
        """The fields in order, nested records (and lists of them) as their JSON form; an
        :func:`optional` field only when set."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.metadata.get("optional") and (value is None or value == {}):
                continue
            if isinstance(value, list):
                value = [v.to_json() if isinstance(v, Record) else v for v in value]
            elif isinstance(value, Record):
                value = value.to_json()
            elif isinstance(value, dict):
                value = dict(value)
            out[f.name] = value
        return out


@dataclass(frozen=True)
class CallError(Record):
    """A call that failed: NVML's return code (nvidia-smi reuses most numbers; -1: no answer)."""

    call: str
    code: int
    text: str


@dataclass(frozen=True)
class Hang(Record):
    """A driver call (or nvidia-smi) that did not return within ``after_s``."""

    call: str
    device: Optional[int]  # the GPU index of the call, None for a node-wide one
    after_s: float
    streak: int  # consecutive runs this reader has found hung
    still_stuck: Optional[bool] = optional()  # NVML: an earlier run's hung call has not returned


@dataclass(frozen=True)
class EccMode(Record):
    """ECC on now, and after the next reset."""

    current: bool
    pending: Optional[bool]


@dataclass(frozen=True)
class EccCounts(Record):
    """ECC error counts since the driver loaded (volatile) and over the GPU's life (aggregate)."""

    volatile_corrected: Optional[int]
    volatile_uncorrected: Optional[int]
    aggregate_corrected: Optional[int]
    aggregate_uncorrected: Optional[int]


@dataclass(frozen=True)
class Retired(Record):
    """Retired pages (before Ampere): single-bit, double-bit, and a retirement pending."""

    sbe: Optional[int]
    dbe: Optional[int]
    pending: bool


@dataclass(frozen=True)
class Remap(Record):
    """Row remapping (Ampere on): rows remapped, and a remap pending or failed."""

    corrected: Optional[int]
    uncorrected: Optional[int]
    pending: bool
    failure: bool


@dataclass(frozen=True)
class Pcie(Record):
    """The PCIe link: width and generation, now and at most."""

    width: Optional[int]
    max_width: Optional[int]
    gen: Optional[int]
    max_gen: Optional[int]
    # The other end's maximum: max_link_width of the upstream port in sysfs (None: not known,
    # e.g. a GPU on a virtual machine's root bus).
    slot_max_width: Optional[int] = optional()


@dataclass(frozen=True)
class NvLink(Record):
    """Per NVLink link (its number as a string): up, and the sum of its error counters."""

    states: dict[str, bool]
    errors: dict[str, int]


@dataclass(frozen=True)
class Clocks(Record):
    """Clock event reasons: the GPU idles, or the hardware holds the clocks down."""

    gpu_idle: bool
    hw_slowdown: bool
    hw_thermal_slowdown: bool
    hw_power_brake_slowdown: bool


@dataclass(frozen=True)
class Fabric(Record):
    """NVLink fabric registration (Hopper on): NVML's state, status (nvidia-smi's word when it
    is not ``Success``), health summary and mask (None where the reader has none), and the
    domain (cluster UUID, clique id)."""

    state: int
    status: Union[int, str]
    summary: Optional[int]
    health_mask: Optional[int]
    cluster_uuid: Optional[str]
    clique_id: Optional[int]


@dataclass(frozen=True)
class Settle(Record):
    """The GPUs are settling after a boot or a driver upgrade: counts, a driver that is not
    loaded and an unfinished fabric registration are judged only from ``until`` (unix seconds)."""

    since: float
    until: float
    why: str  # "boot", or "driver upgrade (OLD -> NEW)"


@dataclass
class GpuReading(Record):
    """What one reader measured of one GPU; a fatal error leaves ``error`` and what was read
    before it. ``call_errors``: calls that failed without making the GPU unusable."""

    index: Optional[int] = None
    bus_id: Optional[str] = None
    name: Optional[str] = None
    uuid: Optional[str] = None
    arch: Optional[str] = None
    error: Optional[CallError] = optional()
    call_errors: dict[str, str] = optional({})
    ecc_mode: Optional[EccMode] = optional()
    ecc: Optional[EccCounts] = optional()
    retired: Optional[Retired] = optional()  # before Ampere
    remap: Optional[Remap] = optional()  # Ampere on, not in MIG mode
    pcie: Optional[Pcie] = None
    nvlink: Optional[NvLink] = None
    clocks: Optional[Clocks] = None
    temp: Optional[float] = None
    temp_slowdown: Optional[float] = None
    temp_scale: Optional[str] = optional()  # "tlimit": temperatures are negated margins (smi)
    fabric: Optional[Fabric] = None
    recovery_action: Optional[int] = None  # NVML_GPU_RECOVERY_ACTION_*


@dataclass
class Snapshot(Record):
    """What one reader measured of the node: the driver, the GPU count it reports, and either
    the GPUs, an error that ended the reading (``init_error``), or a hung call (``hang``)."""

    reader: str  # "nvml" or "nvidia-smi"
    driver: Optional[str] = None
    count: Optional[int] = None
    init_error: Optional[CallError] = None
    hang: Optional[Hang] = None
    gpus: list[GpuReading] = field(default_factory=list)
    pci_gpus: list[str] = field(default_factory=list)  # NVIDIA display controllers in sysfs
    nvswitch: bool = False
    fabric_manager: Optional[bool] = None  # nv-fabricmanager runs (None: not looked at)
    call_errors: dict[str, str] = optional({})
    module_version: Optional[str] = optional()  # the loaded nvidia module (last known)
    settle: Optional[Settle] = optional()  # set while the GPUs settle (``common.observe``)
