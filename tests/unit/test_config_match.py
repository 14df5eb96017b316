"""Drop-ins for some nodes only (``[match]`` in hma.d/*.toml): host patterns and hardware."""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mutate import budget

from hma.config import files as configfile
from hma.config.match import HostPattern, Node, PatternError, read_hardware

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("pattern", "name", "expected"),
    [
        ("gpu-[001-128]", "gpu-007", True),
        ("gpu-[001-128]", "gpu-128", True),
        ("gpu-[001-128]", "gpu-129", False),
        ("gpu-[001-128]", "gpu-7", False),  # Slurm keeps the zero padding
        ("gpu-[1-4,10]", "gpu-10", True),
        ("gpu-[1-4,10]", "gpu-5", False),
        ("rack[1-2]-n[01-16]", "rack2-n16", True),
        ("rack[1-2]-n[01-16]", "rack3-n01", False),
        ("p5-*", "p5-st-a-17", True),
        ("p5-*", "trn2-1", False),
        ("node?", "node7", True),
        ("node?", "node17", False),
        ("n*[5-12]", "n10", True),  # every split is tried, as a shell does
        ("GPU-[1-2]", "gpu-2", True),
    ],
)
def test_host_patterns(pattern: str, name: str, expected: bool) -> None:
    assert HostPattern(pattern).matches(name) is expected


@pytest.mark.parametrize(
    ("pattern", "says"),
    [
        ("gpu-[1-", "'[' without ']'"),
        ("gpu-1]", "']' without '['"),
        ("gpu-[a-b]", "not a number"),
        ("gpu-[9-1]", "runs backwards"),
        ("gpu-[]", "not a number"),
        ("gpu 1", "not allowed in a host name"),
        ("", "empty"),
    ],
)
def test_bad_patterns_say_what_is_wrong(pattern: str, says: str) -> None:
    with pytest.raises(PatternError, match=r"bad host pattern") as exc:
        HostPattern(pattern)
    assert says in str(exc.value)


def pci(root: Path, address: str, vendor: str, device: str, klass: str) -> None:
    """A PCI function folder as sysfs shows it (bus/pci/devices/<address>/{vendor,device,class})."""
    folder = root / "bus/pci/devices" / address
    folder.mkdir(parents=True)
    for name, value in (("vendor", vendor), ("device", device), ("class", klass)):
        (folder / name).write_text(value + "\n")


def test_hardware_read_from_the_pci_bus(tmp_path: Path) -> None:
    cpu = tmp_path / "cpu"
    pci(cpu, "0000:00:00.0", "0x8086", "0x1237", "0x060000")
    pci(cpu, "0000:00:03.0", "0x1d0f", "0xec20", "0x020000")  # ENA: not EFA
    assert read_hardware(str(cpu)) == frozenset()
    p5 = tmp_path / "p5"
    pci(p5, "0000:53:00.0", "0x10de", "0x2330", "0x030200")  # H100 SXM, no driver needed
    pci(p5, "0000:54:00.0", "0x1d0f", "0xefa1", "0x020000")
    pci(p5, "0000:55:00.0", "0x10de", "0x22a3", "0x068000")  # NVSwitch: not a GPU
    assert read_hardware(str(p5)) == {"nvidia", "efa"}
    trn = tmp_path / "trn2"
    pci(trn, "0000:10:1c.0", "0x1d0f", "0x7364", "0x088000")
    assert read_hardware(str(trn)) == {"neuron"}
    loaded = tmp_path / "driver"
    (loaded / "bus/pci/devices").mkdir(parents=True)
    (loaded / "devices/virtual/neuron_device/neuron0").mkdir(parents=True)
    assert read_hardware(str(loaded)) == {"neuron"}
    with pytest.raises(OSError):
        read_hardware(str(tmp_path / "nothing"))


def write_tree(folder: Path, sysfs: Path) -> Path:
    """/etc/hma for a mixed cluster: one main file, drop-ins for GPU, Trainium and CPU nodes."""
    (folder / "hma.d").mkdir(parents=True)
    main = folder / "hma.toml"
    main.write_text(f'[paths]\nsysfs = "{sysfs}"\n[probes.system]\ninterval = 60.0\n')
    (folder / "hma.d/10-gpu.toml").write_text(
        '[match]\nhosts = ["gpu-[001-128]", "p5-*"]\nhardware = ["nvidia"]\n'
        "[probes.system]\ninterval = 11.0\n"
    )
    (folder / "hma.d/20-trn.toml").write_text(
        '[match]\nhardware = ["neuron"]\n[probes.system]\ninterval = 22.0\n'
    )
    (folder / "hma.d/30-cpu.toml").write_text(
        '[match]\nhardware = ["!nvidia", "!neuron"]\n[probes.system]\ninterval = 33.0\n'
    )
    (folder / "hma.d/90-all.toml").write_text("[agent]\nhistory_days = 7.0\n")
    return main


def interval(main: Path, node: Node) -> tuple[float, list[str], list[str]]:
    layers, errors, notes = configfile.read_layers_noted(main, node)
    raw, _files = configfile.merged(layers)
    assert raw["agent"]["history_days"] == 7.0  # a drop-in without [match] applies everywhere
    return raw["probes"]["system"]["interval"], errors, notes


def test_one_etc_hma_for_gpu_trainium_and_cpu_nodes(tmp_path: Path) -> None:
    gpu_sys, trn_sys, cpu_sys = tmp_path / "gpu", tmp_path / "trn", tmp_path / "cpu"
    pci(gpu_sys, "0000:53:00.0", "0x10de", "0x2330", "0x030200")
    pci(trn_sys, "0000:10:1c.0", "0x1d0f", "0x7164", "0x088000")
    pci(cpu_sys, "0000:00:00.0", "0x8086", "0x1237", "0x060000")
    main = write_tree(tmp_path / "etc", gpu_sys)

    value, errors, notes = interval(main, Node(("gpu-007",), str(gpu_sys)))
    assert (value, errors) == (11.0, [])
    assert any(
        n.endswith("10-gpu.toml: applied (host gpu-007 matches gpu-[001-128]; nvidia present)")
        for n in notes
    )
    value, _errors, notes = interval(main, Node(("trn2-004",), str(trn_sys)))
    assert value == 22.0
    assert any(
        n.endswith(
            "10-gpu.toml: not applied (host trn2-004 matches none of " "gpu-[001-128], p5-*)"
        )
        for n in notes
    )
    value, _errors, notes = interval(main, Node(("login-1",), str(cpu_sys)))
    assert value == 33.0
    # a GPU node whose name the pattern misses gets neither the GPU nor the CPU drop-in
    value, _errors, notes = interval(main, Node(("gpu-200",), str(gpu_sys)))
    assert value == 60.0
    assert any(n.endswith("30-cpu.toml: not applied (nvidia present)") for n in notes)


def test_bad_match_tables_are_errors_and_their_file_is_left_out(tmp_path: Path) -> None:
    main = write_tree(tmp_path / "etc", tmp_path)
    (tmp_path / "etc/hma.d/40-bad.toml").write_text(
        '[match]\nhosts = ["gpu-[1-"]\n[probes.system]\ninterval = 44.0\n'
    )
    (tmp_path / "etc/hma.d/50-typo.toml").write_text('[match]\nhardwre = ["nvidia"]\n')
    (tmp_path / "etc/hma.d/60-kind.toml").write_text('[match]\nhardware = ["gpu"]\n')
    (tmp_path / "etc/hma.d/70-empty.toml").write_text("[match]\n")
    main.write_text(main.read_text() + '[match]\nhosts = ["x"]\n')
    layers, errors, _notes = configfile.read_layers_noted(main, Node(("gpu-001",), "/sys"))
    assert all(not name.endswith(("40-bad.toml", "50-typo.toml")) for name, _ in layers)
    text = "\n".join(errors)
    assert "40-bad.toml: match.hosts: bad host pattern 'gpu-[1-': '[' without ']'" in text
    assert "50-typo.toml: match.hardwre: unknown key (one of: hosts, hardware, product)" in text
    assert "60-kind.toml: match.hardware: 'gpu' is not one of nvidia, neuron, efa" in text
    assert "70-empty.toml: match: names nothing to match" in text
    assert f"{main}: [match] belongs in a drop-in" in text


def test_product_matches_the_dmi_product_name_read_once(tmp_path: Path) -> None:
    """``product`` (what `hma genconf` writes) selects a node class by its DMI product name,
    which a failed GPU or adapter never changes; compared stripped and without case."""
    sysfs = tmp_path / "sys"
    (sysfs / "class/dmi/id").mkdir(parents=True)
    (sysfs / "bus/pci/devices").mkdir(parents=True)
    (tmp_path / "nodmi/bus/pci/devices").mkdir(parents=True)
    (sysfs / "class/dmi/id/product_name").write_text("PowerEdge XE9680 \n")
    main = write_tree(tmp_path / "etc", sysfs)
    (tmp_path / "etc/hma.d/40-class.toml").write_text(
        '[match]\nproduct = ["poweredge xe9680", "other"]\n[probes.system]\ninterval = 44.0\n'
    )
    (tmp_path / "etc/hma.d/50-other.toml").write_text(
        '[match]\nproduct = ["p5.48xlarge"]\n[probes.system]\ninterval = 55.0\n'
    )
    value, errors, notes = interval(main, Node(("n1",), str(sysfs)))
    assert value == 44.0 and errors == []
    assert any(n.endswith("40-class.toml: applied (product 'PowerEdge XE9680')") for n in notes)
    assert any(
        "50-other.toml: not applied (product 'PowerEdge XE9680' is none of" in n for n in notes
    )
    # no DMI product name (a node without DMI): no product drop-in applies
    value, errors, notes = interval(main, Node(("n1",), str(tmp_path / "nodmi")))
    assert value == 33.0 and errors == []  # the CPU drop-in still applies
    assert any("40-class.toml: not applied (product None" in n for n in notes)
    (tmp_path / "etc/hma.d/60-bad.toml").write_text('[match]\nproduct = ["a\\nb"]\n')
    _layers, errors, _notes = configfile.read_layers_noted(main, Node(("n1",), str(sysfs)))
    assert errors == [
        f"{tmp_path}/etc/hma.d/60-bad.toml: match.product: must not contain control character "
        "'\\n', got str 'a\\nb'"
    ]


def test_hardware_that_cannot_be_read_is_an_error_not_a_guess(tmp_path: Path) -> None:
    main = write_tree(tmp_path / "etc", tmp_path / "no-sysfs-here")
    _layers, errors, _notes = configfile.read_layers_noted(main)
    assert any("20-trn.toml: match.hardware: cannot list the PCI devices" in e for e in errors)


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare"
)
def test_config_check_names_what_applied_on_a_real_host_name(tmp_path: Path) -> None:
    """The real command line in a UTS namespace whose host name is gpu-007 (the machine's own
    name is untouched)."""
    gpu_sys = tmp_path / "gpu"
    pci(gpu_sys, "0000:53:00.0", "0x10de", "0x2330", "0x030200")
    main = write_tree(tmp_path / "etc", gpu_sys)
    env = {**os.environ, "HMA_CONFIG": str(main)}
    script = "import socket, sys; socket.sethostname(sys.argv[1]); from hma.cli import main; "
    script += "sys.exit(main(['config', 'check']))"
    for host, applied in (("gpu-007", "10-gpu.toml"), ("cn-1", "")):
        out = subprocess.run(
            ["unshare", "--uts", sys.executable, "-c", script, host],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert lines[-1].startswith("configuration OK (")
        if applied:
            assert f"{applied}: applied (host {host} matches gpu-[001-128]; nvidia present)" in (
                out.stdout
            )
            assert applied in lines[-1]
        else:
            assert f"10-gpu.toml: not applied (host {host} matches none of" in out.stdout
            assert "10-gpu.toml" not in lines[-1]


# --- linear matching (issue 28, part 3) ---------------------------------------------------------

WILD = st.text(alphabet="ab-*?", max_size=10)
NAMES = st.text(alphabet="ab-", max_size=12)


@budget(400)
@given(pattern=WILD.filter(str.strip), name=NAMES)
def test_wildcards_agree_with_fnmatchcase(pattern: str, name: str) -> None:
    assert HostPattern(pattern).matches(name) == fnmatch.fnmatchcase(name, pattern)


@budget(300)
@given(
    before=st.text(alphabet="a1*?", max_size=4),
    low=st.integers(0, 30),
    size=st.integers(0, 12),
    width=st.integers(1, 3),
    after=st.text(alphabet="a1*?", max_size=4),
    name=st.text(alphabet="a0123", max_size=8),
)
def test_a_range_is_the_numbers_it_names_spliced_in(
    before: str, low: int, size: int, width: int, after: str, name: str
) -> None:
    """``x[007-012]y`` covers a name exactly when one of x007y ... x012y (as shell wildcards)
    does: the range's numbers with their zero padding."""
    text = f"{before}[{low:0{width}d}-{low + size}]{after}"
    spelled = [f"{before}{v:0{width}d}{after}" for v in range(low, low + size + 1)]
    expected = any(fnmatch.fnmatchcase(name, p) for p in spelled)
    assert HostPattern(text).matches(name) == expected


PATHOLOGICAL = "*a" * 15 + "b"  # 31 characters: every split of 63 a's tried, as the old matcher did
LONG_HOST = "a" * 63


def test_a_pathological_wildcard_pattern_finishes() -> None:
    """The old matcher tried every split: C(63, 15) of them for this pair. In a subprocess with a
    limit, so that a regression fails instead of hanging the suite."""
    script = (
        "import sys; from hma.config.match import HostPattern; "
        "print(HostPattern(sys.argv[1]).matches(sys.argv[2]), "
        "HostPattern(sys.argv[1]).matches(sys.argv[2] + 'b'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, PATHOLOGICAL, LONG_HOST],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (out.returncode, out.stdout) == (0, "False True\n"), out.stderr


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare"
)
def test_config_check_with_a_pathological_pattern_finishes(tmp_path: Path) -> None:
    main = write_tree(tmp_path / "etc", tmp_path / "no-sysfs")
    (tmp_path / "etc/hma.d/10-gpu.toml").write_text(
        f'[match]\nhosts = ["{PATHOLOGICAL}"]\n[probes.system]\ninterval = 11.0\n'
    )
    (tmp_path / "etc/hma.d/20-trn.toml").unlink()
    (tmp_path / "etc/hma.d/30-cpu.toml").unlink()
    script = "import socket, sys; socket.sethostname(sys.argv[1]); from hma.cli import main; "
    script += "sys.exit(main(['config', 'check']))"
    out = subprocess.run(
        ["unshare", "--uts", sys.executable, "-c", script, LONG_HOST],
        env={**os.environ, "HMA_CONFIG": str(main)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "10-gpu.toml: not applied (host " in out.stdout


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("gpu-[1-" + "9" * 5000 + "]", "a number of 5000 digits"),
        ("gpu-[" + "0" * 19 + "]", "a number of 19 digits"),
        ("gpu-[1-99999999]", "covers 99999999 numbers (at most 65536)"),
        ("gpu-[0-65536]", "covers 65537 numbers"),
    ],
)
def test_numbers_too_long_and_ranges_too_wide_are_configuration_errors(
    tmp_path: Path, pattern: str, expected: str
) -> None:
    with pytest.raises(PatternError) as caught:
        HostPattern(pattern)
    assert expected in str(caught.value)
    assert len(str(caught.value)) < 300  # the pattern is cut in the message
    main = write_tree(tmp_path / "etc", tmp_path / "no-sysfs")
    (tmp_path / "etc/hma.d/10-gpu.toml").write_text(f'[match]\nhosts = ["{pattern}"]\n')
    _layers, errors, _notes = configfile.read_layers_noted(main)
    assert any("10-gpu.toml" in e and expected in e for e in errors), errors


def test_the_widest_range_and_longest_number_still_match() -> None:
    assert HostPattern("gpu-[0-65535]").matches("gpu-65535")
    assert HostPattern("n[" + "9" * 18 + "]").matches("n" + "9" * 18)
    assert not HostPattern("n[1-9]").matches("n" + "1" * 400)
