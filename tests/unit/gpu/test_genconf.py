"""``hma genconf`` round trip: record a node (the 8-GPU NVML stand-in over the real binding, a
generated p5-like sysfs tree with 32 EFA adapters and an mlx5 InfiniBand port, a procfs with
meminfo and a mount table), check the file, then break a part and see the node judged critical.

Lives with the GPU tests for their stand-in fixtures (tests/unit/gpu/conftest.py).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from hma.adapters import tomlcompat
from hma.cli import main

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
sys.path.insert(0, str(FIXTURES))

import gen_sysfs  # noqa: E402

GIB_KB = 1 << 20
PRODUCT = 'PowerEdge "XE9680" [rev = 2] # a'  # TOML metacharacters in the DMI product name
MODEL = 'NVIDIA "H100" [SXM5] = 80GB # \\ HBM3'  # and in the GPU model


class Node:
    """A node's roots and main configuration file."""

    def __init__(self, tmp: Path, nvml_lib: Path) -> None:
        self.sys = gen_sysfs.build(tmp / "sys", "p5.48xlarge")
        # a product no instance table knows: without genconf nothing says what to expect
        (self.sys / "class/dmi/id/product_name").write_text(PRODUCT + "\n")
        cpu = self.sys / "devices/system/cpu"
        cpu.mkdir(parents=True)
        (cpu / "online").write_text("0-95\n")
        (cpu / "present").write_text("0-95\n")
        self.proc = tmp / "proc"
        (self.proc / "self").mkdir(parents=True)
        self.memory(2048 * GIB_KB)
        self.scratch = tmp / "scratch"
        self.quoted = tmp / 'data "q" #]= x'
        self.newline = tmp / "bad\nline"
        for folder in (self.scratch, self.quoted, self.newline):
            folder.mkdir()
        rows = [
            ("/", "ext4", "rw,relatime"),
            (str(self.scratch), "xfs", "rw"),
            (str(self.quoted), "nfs4", "rw,vers=4.2"),
            (str(self.newline), "ext4", "rw"),
            (str(tmp), "ext4", "ro"),  # read-only now: not recorded
            ("/proc", "proc", "rw"),
            ("/run", "tmpfs", "rw"),
            ("/sys/fs/cgroup", "cgroup2", "rw"),
        ]
        lines = [
            f"{20 + i} 1 8:{i} / {_escaped(point)} rw,relatime shared:1 - {fstype} /dev/x {opts}"
            for i, (point, fstype, opts) in enumerate(rows)
        ]
        (self.proc / "self/mountinfo").write_text("\n".join(lines) + "\n")
        self.etc = tmp / "etc"
        self.etc.mkdir()
        self.main = self.etc / "hma.toml"
        self.main.write_text(
            tomlcompat.dumps(
                {
                    "paths": {"sysfs": str(self.sys), "procfs": str(self.proc)},
                    "slurm": {"enabled": False},
                    "probes": {
                        "gpu": {"library": str(nvml_lib)},
                        "nvidia_smi": {"enabled": False},
                        "efa_mesh": {"enabled": False},
                        "slurm": {"enabled": False},
                        "system": {"processes": [], "min_free_percent": 0.0},
                    },
                    "reporters": {"journald": {"enabled": False}},
                }
            )
        )
        self.dropin = self.etc / "hma.d" / "50-genconf.toml"

    def memory(self, kib: int) -> None:
        (self.proc / "meminfo").write_text(f"MemTotal: {kib} kB\nMemAvailable: {kib // 2} kB\n")

    def hma(self, capsys: Any, *argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(["--config", str(self.main), *argv])
        out, err = capsys.readouterr()
        return code, out, err

    def check(self, capsys: Any) -> tuple[int, set[tuple[str, str]]]:
        code, out, _err = self.hma(capsys, "check", "--json")
        doc = json.loads(out)
        critical = {
            (f["code"], f["component"])
            for p in doc["probes"]
            for f in p["findings"]
            if f["severity"] == "critical"
        }
        return code, critical


def _escaped(path: str) -> str:
    """A mount point as mountinfo writes it (space, tab, newline, backslash octal-escaped)."""
    for char, code in (("\\", "\\134"), (" ", "\\040"), ("\t", "\\011"), ("\n", "\\012")):
        path = path.replace(char, code)
    return path


@pytest.fixture
def node(scenario: Any, nvml_lib: Path, tmp_path: Path) -> Node:
    for index in scenario.devices:
        scenario.drop(index, "fabric")  # no NVSwitch fabric: no fabric manager to look for
        scenario.dev(index, name=MODEL)
    return Node(tmp_path, nvml_lib)


def test_genconf_records_the_node_and_every_later_deviation_is_judged(
    node: Node, scenario: Any, capsys: Any
) -> None:
    code, _critical = node.check(capsys)
    assert code != 2  # without the drop-in: nothing expected, a missing part goes unjudged

    code, out, err = node.hma(capsys, "genconf")
    assert code == 0, err
    assert out.strip() == f"wrote {node.dropin}"
    assert node.dropin.stat().st_mode & 0o777 == 0o644
    data = tomlcompat.loads(node.dropin.read_text())
    assert data["match"] == {"product": [PRODUCT]}
    probes = data["probes"]
    assert probes["gpu"] == {
        "expected_gpus": 8,
        "expected_model": MODEL,
        "expected_pcie_width": 16,
        "expected_pcie_gen": 5,
    }
    assert probes["infiniband"] == {"expected_ports": ["mlx5_0/1"], "expected_rate_gbps": 400.0}
    assert probes["efa"] == {"expected_adapters": 32}
    system = probes["system"]
    assert system["expected_memory_gib"] == 2048.0 and system["expected_cpus"] == 96
    assert system["filesystems"][:2] == ["/", "/tmp"]
    assert str(node.scratch) in system["filesystems"]
    assert str(node.quoted) in system["filesystems"]  # read back to the same text
    assert str(node.newline) not in system["filesystems"]  # no option can hold it
    assert "left out" in err and "bad\\nline" in err

    code, out, err = node.hma(capsys, "config", "check")
    assert code == 0, err
    assert f"{node.dropin}: applied (product {PRODUCT!r})" in out
    assert node.check(capsys) == (0, set())  # the node as recorded is healthy

    scenario.devices.pop(7)  # a GPU gone
    scenario.write()
    code, critical = node.check(capsys)
    assert (code, critical) == (2, {("GPU_COUNT_MISMATCH", "node")})
    scenario.devices[7] = dict(scenario.devices[6], bus_id="00000000:DB:00.0")
    scenario.write()
    assert node.check(capsys) == (0, set())

    state = node.sys / "class/infiniband/mlx5_0/ports/1/state"
    state.write_text("1: DOWN\n")  # the compute port down
    assert node.check(capsys) == (2, {("IB_PORT_DOWN", "ib:mlx5_0/1")})
    state.write_text("4: ACTIVE\n")

    last = gen_sysfs.efa_names(node.sys)[-1]
    pci = (node.sys / "class/infiniband" / last).resolve().parent.parent.name
    (node.sys / "class/infiniband" / last).unlink()  # an adapter gone, its function left
    code, critical = node.check(capsys)
    assert (code, critical) == (
        2,
        {("EFA_ADAPTER_COUNT", "node"), ("EFA_PCI_UNBOUND", f"pci:{pci}")},
    )


def test_a_missing_driver_and_lost_memory_are_critical_once_recorded(
    node: Node, scenario: Any, capsys: Any
) -> None:
    scenario.set("err.nvmlInitWithFlags", 12)  # no driver (NVML_ERROR_LIBRARY_NOT_FOUND)
    assert node.check(capsys) == (3, set())  # unknown: nothing says this node has GPUs
    scenario.extra.clear()
    scenario.write()
    assert node.hma(capsys, "genconf")[0] == 0
    node.memory(1900 * GIB_KB)  # a DIMM's worth gone
    scenario.set("err.nvmlInitWithFlags", 12)
    code, critical = node.check(capsys)
    assert code == 2
    assert critical == {("SYS_MEMORY_MISSING", "node"), ("GPU_DRIVER_NOT_LOADED", "node")}


def test_genconf_never_overwrites_or_writes_through_a_link(node: Node, capsys: Any) -> None:
    node.dropin.parent.mkdir()
    node.dropin.write_text("# mine\n")
    code, _out, err = node.hma(capsys, "genconf")
    assert code == 73 and "exists; --force replaces it" in err
    assert node.dropin.read_text() == "# mine\n"
    assert node.hma(capsys, "genconf", "--force")[0] == 0
    assert "expected_gpus = 8" in node.dropin.read_text()

    target = node.etc / "elsewhere.toml"
    target.write_text("# not hma's\n")
    link = node.dropin.parent / "60-link.toml"
    link.symlink_to(target)
    code, _out, err = node.hma(capsys, "genconf", "--output", str(link), "--force")
    assert code == 73 and "is a symbolic link" in err
    assert target.read_text() == "# not hma's\n" and link.is_symlink()
    assert sorted(os.listdir(node.dropin.parent)) == ["50-genconf.toml", "60-link.toml"]

    code, out, _err = node.hma(capsys, "genconf", "--output", "-")
    assert code == 0 and tomlcompat.loads(out)["probes"]["efa"] == {"expected_adapters": 32}


def test_bad_input_is_one_line_and_its_exit_code(tmp_path: Path, capsys: Any) -> None:
    config = tmp_path / "hma.toml"
    config.write_text("[probes.system]\nno_such_key = 1\n")
    assert main(["--config", str(config), "genconf", "--output", "-"]) == 78
    assert "probes.system.no_such_key" in capsys.readouterr().err
    config.write_text('[paths]\nsysfs = "/nonexistent"\nprocfs = "/nonexistent"\n')
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code = main(["--config", str(config), "genconf", "--output", str(blocker / "x.toml")])
    err = capsys.readouterr().err
    assert code == 73 and err.strip().splitlines()[-1].startswith("hma genconf: cannot write ")
    assert "Traceback" not in err
