"""Fuzz of the GPU probes' PCI reader (issue 28, part 7): ``bus/pci/devices/*/{vendor,class}``
with garbage, huge, negative or non-UTF-8 values, a symlink loop, a folder in a file's place or
a whole entry unreadable. The NVIDIA GPUs on the bus are those whose entries read exactly; when
any entry cannot be read the answer is "cannot tell" (None), never a shorter list: a shorter
list would shift NVML's index order onto the wrong PCI address, and "no GPUs" would make a
GPU node without its driver "unsupported" (silently unchecked) instead of unknown.
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import Any, Optional

from hypothesis import given
from hypothesis import strategies as st
from mutate import apply_file, budget

from hma.adapters.files import RootReader
from hma.probes.support import pci

NVIDIA = ("0x10de", "0x030200")
OTHER = ("0x1a03", "0x030000")  # a BMC's VGA
CLASSES = ("0x0300", "0x0302")  # VGA and 3D controllers
NO_LIBRARY = "/nonexistent/libnvidia-ml.so.1"
NO_SMI = "/nonexistent/nvidia-smi"
VALUES = st.one_of(
    st.binary(max_size=24),
    st.sampled_from(
        [b"", b"0x10de", b"0x10DE\n", b" 0x10de", b"0x10de\x00", b"-1\n", b"0x" + b"f" * 30,
         b"0x030200extra", b"\xff\xfe", b"0x0302", b"1" * 70000]
    ),
)  # fmt: skip
SHAPES = st.sampled_from(["missing", "folder", "loop", "dangling", "fifo"])
MUTATION = st.tuples(
    st.integers(0, 3),
    st.sampled_from(["vendor", "class", ""]),
    st.one_of(VALUES.map(lambda v: ("bytes", v)), SHAPES.map(lambda s: ("shape", s))),
)


def bus(root: Path, entries: list[tuple[str, str]]) -> list[str]:
    """PCI entries ``(vendor, class)`` as 0000:3b:00.0, 0000:3c:00.0, ...; their addresses."""
    names = []
    for i, (vendor, klass) in enumerate(entries):
        name = f"0000:{0x3B + i:02x}:00.0"
        dev = root / "bus/pci/devices" / name
        dev.mkdir(parents=True)
        (dev / "vendor").write_text(vendor + "\n")
        (dev / "class").write_text(klass + "\n")
        names.append(name)
    return names


def read(path: Path) -> bytes:
    """A regular file's bytes (b"?" for anything else: a FIFO must not block the test)."""
    return path.read_bytes() if path.is_file() else b"?"


def ids(dev: Path) -> Optional[tuple[int, str]]:
    """(vendor, class) of an entry as the kernel writes them (``0x10de``, ``0x030200``), None
    when either is anything else."""
    if not dev.is_dir():
        return None
    vendor, klass = read(dev / "vendor").strip(), read(dev / "class").strip()
    if not re.fullmatch(rb"0[xX][0-9a-fA-F]{1,16}", vendor) or int(vendor, 16) > 0xFFFF:
        return None
    if not re.fullmatch(rb"0[xX][0-9a-fA-F]{6}", klass):
        return None
    return int(vendor, 16), klass.decode().lower()


@given(mutations=st.lists(MUTATION, min_size=1, max_size=3))
@budget(150)
def test_mutated_bus_gives_the_intact_gpus_or_cannot_tell(mutations: list[Any]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        names = bus(root, [NVIDIA, NVIDIA, OTHER, NVIDIA])
        for index, rel, mutation in mutations:
            path = root / "bus/pci/devices" / names[index]
            path = path / rel if rel else path
            try:
                apply_file(path, mutation)
            except OSError:
                continue
        found = pci.nvidia_devices(RootReader(folder))
        devices = root / "bus/pci/devices"
        entries = {p.name: ids(p) for p in devices.iterdir()} if devices.is_dir() else {}
        if None in entries.values():
            assert found is None, (mutations, found)
        else:
            want = sorted(
                n for n, i in entries.items() if i and i[0] == 0x10DE and i[1][:6] in CLASSES
            )
            assert found == want, (mutations, found)


def test_an_unreadable_entry_makes_the_probes_apply_not_unsupported(
    hma_env: Any, tmp_path: Path
) -> None:
    """Two GPUs on the bus, no driver, no expected count, and one entry that cannot be read:
    unknown (GPU_DRIVER_NOT_LOADED), as without the unreadable entry; never "unsupported"."""
    root = tmp_path / "sys"
    names = bus(root, [NVIDIA, NVIDIA, OTHER])
    apply_file(root / "bus/pci/devices" / names[2] / "vendor", ("shape", "loop"))
    hma_env.write(
        f'[paths]\nsysfs = "{root}"\n'
        f'[probes.gpu]\nlibrary = "{NO_LIBRARY}"\n'
        f'[probes.nvidia_smi]\ncommand = ["{NO_SMI}", "-q", "-x"]\n'
    )
    res = hma_env.hma("check", "gpu", "nvidia_smi", "--json")
    doc = json.loads(res.stdout)
    assert res.returncode == 3 and doc["severity"] == "unknown", res.stdout
    for probe in doc["probes"]:
        assert probe["status"] == "ran", probe
        assert [(f["code"], f["severity"]) for f in probe["findings"]] == [
            ("GPU_DRIVER_NOT_LOADED", "unknown")
        ]
