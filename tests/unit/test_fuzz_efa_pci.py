"""Fuzz of the EFA probe's PCI and ENA readers (issue 28, part 7), beside the adapter-file suite
of test_efa_probe: the PCI functions (``bus/pci/devices/<bdf>/{vendor,device,driver}``), an RDMA
device's ``device`` link and the ENA interfaces (``class/net/<if>/{flags,carrier,operstate,
device,device/driver}``) get garbage, huge, negative or non-UTF-8 values, symlink loops, a folder
or file in a file's or link's place, a link to something that is no PCI function, or EACCES. None
of it is a fault: what cannot be read is unknown; only a catalogued signal (the adapter
positively gone, another vendor's device, a strict ``carrier`` 0 on an interface that is up) may
be critical.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mutate import apply_file, budget
from trn_support import gen_sysfs, make_ctx

from hma.adapters.files import ReadError, RootReader
from hma.adapters.strict import ParseError, parse_uint
from hma.contracts.catalogue import load_builtin
from hma.contracts.model import Severity
from hma.probes.efa.adapters import IB, EfaProbe

pytestmark = pytest.mark.timeout(60)

N = 2
CATALOGUE = load_builtin()
# What is mutated: (where, relative path under the function/interface/device, the shapes).
TARGETS = (
    ("pci", ""),
    ("pci", "vendor"),
    ("pci", "device"),
    ("pci", "driver"),
    ("ib", "device"),
    ("net", ""),
    ("net", "flags"),
    ("net", "carrier"),
    ("net", "operstate"),
    ("net", "device"),
    ("net", "device/driver"),
    ("top", "bus/pci/devices"),
    ("top", "class/net"),
)
OPS = ("write", "missing", "folder", "file", "loop", "dangling", "elsewhere", "eacces")
NUMBERS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.sampled_from(["0x1d0f", "0xefa1", "0xec20", "0x1003", "0x1002", "0", "1", "up", "down"]),
    st.sampled_from(["", " ", "\u00a01", "1_0", "9" * 400, "0x" + "f" * 20, "-0x1", "nan"]),
)
CONTENT = st.one_of(
    st.binary(max_size=32),
    NUMBERS.map(lambda n: (n + "\n").encode()),
    st.just(b"1" * 70000),  # past the reader's limit
)
MUTATION = st.tuples(st.integers(0, N - 1), st.sampled_from(TARGETS), st.sampled_from(OPS), CONTENT)


class Refusing(RootReader):
    """A sysfs reader whose reads of some paths fail with EACCES (as a root-only file read by a
    confined agent, or an LSM's refusal: root here cannot make a file unreadable to itself)."""

    def __init__(self, root: str, refused: set[str]) -> None:
        super().__init__(root)
        self.refused = refused

    def _check(self, rel: str) -> None:
        path = os.path.realpath(self.path(rel))
        if any(path == r or path.startswith(r + "/") for r in self.refused):
            raise ReadError(f"{path}: {os.strerror(errno.EACCES)}")

    def data(self, rel: str, limit: int = 65536, *, prefix: bool = False) -> bytes:
        self._check(rel)
        return super().data(rel, limit, prefix=prefix)

    def listdir(self, rel: str) -> list[str]:
        self._check(rel)
        return super().listdir(rel)


@pytest.fixture(scope="module")
def small_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return gen_sysfs.build(tmp_path_factory.mktemp("efa") / "sys", "p5.48xlarge", efa_adapters=N)


def place(root: Path, names: list[str], index: int, where: str, rel: str) -> Path:
    """The path a mutation replaces."""
    if where == "pci":
        bdf = os.path.basename(os.path.realpath(root / IB / names[index] / "device"))
        return (
            root / "bus" / "pci" / "devices" / bdf / rel
            if rel
            else (root / "bus" / "pci" / "devices" / bdf)
        )
    if where == "ib":
        return root / IB / names[index] / rel
    if where == "net":
        return root / "class" / "net" / "ens5" / rel if rel else root / "class" / "net" / "ens5"
    return root / rel


def mutate(root: Path, path: Path, op: str, content: bytes, refused: set[str]) -> bool:
    """Apply one mutation; False when an earlier one left no place for it."""
    try:
        if op == "eacces":
            if not os.path.lexists(path):
                return False
            refused.add(os.path.realpath(path))
        elif op == "write":
            apply_file(path, ("bytes", content))
        elif op == "elsewhere":  # a link to a folder that looks like a PCI function, but is none
            fake = root / "devices" / "virtual" / "notpci"
            fake.mkdir(parents=True, exist_ok=True)
            (fake / "vendor").write_text("0x1d0f\n")
            (fake / "device").write_text("0xefa1\n")
            apply_file(path, ("shape", "missing"))
            os.symlink(fake, path)
        else:
            apply_file(path, ("shape", op))
            if op == "folder":  # a folder where a link was, holding the files sysfs has
                (path / "vendor").write_text("0x1d0f\n")
                (path / "device").write_text("0xefa1\n")
    except OSError:
        return False
    return True


def signalled(where: str, rel: str, op: str, content: bytes) -> set[str]:
    """Critical codes the mutation itself is a catalogued signal for."""
    if (where, rel, op) == ("ib", "device", "missing"):
        return {"EFA_ADAPTER_COUNT", "EFA_PCI_UNBOUND"}  # soft RoCE shape: the adapter is gone
    text = ("0" if op == "file" else content.decode("ascii", "replace")).strip(" \t\n")
    if (where, rel, op) == ("pci", "vendor", "write") and text.startswith("0x"):
        try:
            if parse_uint(text, limit=0xFFFF) != 0x1D0F:
                return {"EFA_ADAPTER_COUNT"}  # another vendor's device
        except ParseError:
            pass
    if (where, rel) == ("net", "carrier") and op in ("write", "file") and text == "0":
        return {"EFA_ENA_LINK_DOWN"}
    return set()


@budget(80)
@given(mutations=st.lists(MUTATION, min_size=1, max_size=3))
def test_mutated_pci_and_ena_files_give_no_unsignalled_critical(
    small_tree: Path, tmp_path: Path, mutations: list
) -> None:
    with tempfile.TemporaryDirectory(dir=tmp_path) as tmp:
        root = Path(tmp) / "sys"
        shutil.copytree(small_tree, root, symlinks=True)
        names = gen_sysfs.efa_names(root)
        probe = EfaProbe()
        ctx = make_ctx(EfaProbe, root, "p5.48xlarge", expected_adapters=N)
        first = probe.collect(ctx)
        assert probe.evaluate(first, ctx) == []
        allowed: set[str] = set()
        refused: set[str] = set()
        for index, (where, rel), op, content in mutations:
            path = place(root, names, index, where, rel)
            if mutate(root, path, op, content, refused):
                allowed |= signalled(where, rel, op, content)
        ctx = make_ctx(EfaProbe, root, "p5.48xlarge", previous=first, expected_adapters=N)
        ctx.sysfs = Refusing(str(root), refused)
        ctx.device_events = 1  # a hardware change: discover again
        ctx.clock = lambda: first["ts"] + 1.0
        snap = probe.collect(ctx) if probe.applies(ctx) is None else {"adapters": {}}
        for finding in probe.evaluate(snap, ctx):
            if CATALOGUE.resolve(finding).severity is Severity.CRITICAL:
                assert finding.code in allowed, (mutations, finding)


@pytest.mark.parametrize("op", ["folder", "elsewhere"])
def test_a_device_link_to_no_pci_function_is_unknown(tmp_path: Path, op: str) -> None:
    """An RDMA device whose ``device`` is not a link to a PCI function (a folder, a link to a
    virtual device) cannot name its function: unknown, never an unbound EFA function."""
    root = gen_sysfs.build(tmp_path / "sys", "p5.48xlarge", efa_adapters=N)
    name = gen_sysfs.efa_names(root)[0]
    assert mutate(root, root / IB / name / "device", op, b"", set())
    ctx = make_ctx(EfaProbe, root, "p5.48xlarge", expected_adapters=N)
    probe = EfaProbe()
    found = [CATALOGUE.resolve(f) for f in probe.evaluate(probe.collect(ctx), ctx)]
    assert {(f.code, f.severity) for f in found} == {("EFA_READ_FAILED", Severity.UNKNOWN)}
