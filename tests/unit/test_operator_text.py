"""What an operator reads: one escaping (``hma.adapters.text``) for every text another party
wrote, by Unicode category, on every command's output path (issue 28, part 4)."""

from __future__ import annotations

import json
import re
import unicodedata
from pathlib import Path
from typing import Any, Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mutate import budget
from test_slurm_hostile_text import Slurm, client, node
from test_topology import Recorder, _Stream
from test_topology import node as topo_node

from hma import assembly, cli
from hma.adapters.text import plain, printable, refused
from hma.commands import check, fleet, logscan, reset, status
from hma.commands import topology as topology_command
from hma.contracts import maintenance
from hma.contracts.catalogue import load_builtin
from hma.contracts.model import Finding, ProbeRun, RunStatus
from hma.probes.kernel_log.rules import RuleSet
from hma.topology import domain

# ESC sequences, a bidi override, and the format controls an escaping by hand list let through:
# zero-width space/joiner, word joiner, invisible plus, BOM, soft hyphen, tag characters, and a
# private-use and an unassigned code point
HOSTILE = (
    "\x1b]0;pwned\x07\x1b[2J\u202e\u200b\u200d\u2060\u2064\ufeff\u00ad"
    "\U000e0041\U000e007f\ue000\u0378"
)
ESCAPED = (
    "\\x1b]0;pwned\\x07\\x1b[2J\\u202e\\u200b\\u200d\\u2060\\u2064\\ufeff\\xad"
    "\\U000e0041\\U000e007f\\ue000\\u0378"
)
REFUSED_CATEGORIES = {"Cc", "Cf", "Cs", "Zl", "Zp"}
SETTINGS = budget(300)
# any character (hypothesis draws no lone surrogates itself), with the classes spelled out
SPECIAL = "\ud800\udfff\u2028\u2029\u200b\u2064\ufeff\u00ad\U000e0041\ue000\u0378\x1b\x85\n\r\t"
TEXT = st.text(st.one_of(st.characters(exclude_categories=()), st.sampled_from(SPECIAL)))
STATUS = Path(__file__).resolve().parent.parent / "fixtures" / "status" / "hostile.json"


def safe(text: str) -> bool:
    """No character of a refused category, newlines aside."""
    return not any(unicodedata.category(ch) in REFUSED_CATEGORIES for ch in text if ch != "\n")


_ESCAPE = re.compile(r"\\(x[0-9a-f]{2}|u[0-9a-f]{4}|U[0-9a-f]{8}|[tnr])")
_NAMED = {"t": "\t", "n": "\n", "r": "\r"}


def read_back(text: str) -> str:
    """The escapes ``printable`` writes, read back (as Python reads them in a string)."""
    return _ESCAPE.sub(lambda m: _NAMED.get(m.group(1)) or chr(int(m.group(1)[1:], 16)), text)


@SETTINGS
@given(TEXT)
def test_printable_output_holds_no_control_format_or_separator(text: str) -> None:
    out = printable(text)
    assert safe(out) and "\n" not in out
    kept = printable(text, newlines=True)
    assert safe(kept) and kept.count("\n") == text.count("\n")
    assert not any(refused(ch) for ch in kept.replace("\n", ""))
    assert plain(out) and plain(text) == (out == text)


@SETTINGS
@given(TEXT.filter(lambda t: "\\" not in t))
def test_printable_reads_back_as_repr_escapes_do(text: str) -> None:
    assert read_back(printable(text)) == text == read_back(printable(text, newlines=True))


def test_format_controls_are_escaped_as_repr_writes_them() -> None:
    assert printable(HOSTILE) == ESCAPED
    for ch in HOSTILE[-10:]:
        assert printable(ch) == repr(ch)[1:-1], hex(ord(ch))
    assert printable("été 日本 a\u00a0b") == "été 日本 a\u00a0b"  # letters and spaces kept


def test_the_predicates_are_the_escaping_s_rule() -> None:
    assert not plain("hma\u200bnode") and not domain.problem("") and plain("rack 12 été")
    assert domain.problem("blk\u200b1") == "control characters"
    assert domain.problem("blk\U000e0041") == "control characters"
    reason = maintenance.clean_reason(f"bios\u200b update\ufeff{HOSTILE}")
    assert reason == "bios  update  ]0;pwned  [2J"


def _status(text: str) -> str:
    doc = json.loads(STATUS.read_text("utf-8"))
    hostile = "\x1b]0;pwned\x07\x1b[2J\u202e"

    def swap(value: Any) -> Any:
        if isinstance(value, str):
            return value.replace(hostile, text)
        if isinstance(value, list):
            return [swap(v) for v in value]
        if isinstance(value, dict):
            return {k: swap(v) for k, v in value.items()}
        return value

    return status.render(swap(doc), now=float(doc["generated"]))


def _fleet(text: str) -> str:
    reason = f"HMA: GPU_XID_79{text} gpu:0{text} : reboot issued"
    doc = fleet.collect(client(Slurm([node("node1", Reason=reason)])), "extra", 10.0, None)
    return fleet.render_text(doc)


def _check(text: str) -> str:
    found = Finding("GPU_XID_79", f"gpu:0{text}", f"fell off\n{text}", probe="gpu")
    runs = [
        ProbeRun("gpu", RunStatus.RAN, 0.0, 0.01, (found,)),
        ProbeRun("efa", RunStatus.FAILED, 0.0, 0.01, error=f"fi_info: {text}"),
    ]
    return check.render_text(check.document(f"node1{text}", runs, (found,)))


def _logscan(text: str, tmp: Path) -> str:
    line = f"[ 5.000001] NVRM: Xid (PCI:0000:01:00): 79, pid=1, name={text}python, fell off"
    log = tmp / "dmesg"
    log.write_text(f"{line}\n", encoding="utf-8")
    hits, errors = logscan.scan([str(log)], RuleSet.load(None))
    return logscan.render_text(logscan.document(hits, errors, load_builtin()))


def _topology(text: str, tmp: Path) -> str:
    nodes = [topo_node(f"node1{text}", f"blk{text}"), topo_node("node2", "d")]
    out, err = _Stream(), _Stream()
    topo = {"spares_per_domain": 0, "domain_size": None, "reconfigure": False}
    topology_command.run(Recorder(nodes), topo, tmp / "t.conf", "tree", True, out, err)
    return out.text + err.text


def _reset(text: str, tmp: Path) -> str:
    config = tmp / "hma.toml"
    config.write_text(f'[agent]\nstate_dir = "{tmp}/state"\nrun_dir = "{tmp}/run"\n')
    setup = assembly.load(str(config))
    return "\n".join(
        reset.problem(code, component, why, setup)
        for code, component, why in (
            (f"GPU_XID_79{text}", None, "new GPU"),
            ("GPU_XID_79", f"gpu:0{text}", "new GPU"),
            (None, None, f"new GPU{text}"),
        )
    )


RENDERERS: dict[str, Callable[[str, Path], str]] = {
    "status": lambda t, _p: _status(t),
    "fleet": lambda t, _p: _fleet(t),
    "check": lambda t, _p: _check(t),
    "logscan": _logscan,
    "topology": _topology,
    "reset": _reset,
}


@pytest.mark.parametrize("command", sorted(RENDERERS))
def test_every_output_path_escapes_hostile_text(command: str, tmp_path: Path) -> None:
    text = RENDERERS[command](HOSTILE, tmp_path)
    assert safe(text), ascii(text)
    assert not any(refused(ch) for ch in text.replace("\n", "")), ascii(text)
    if command != "reset":  # a reason hma refuses is not quoted back
        assert ESCAPED in text, ascii(text)


def _cli(capsys: Any, *argv: str) -> tuple[int, str]:
    rc = cli.main(list(argv))
    out = capsys.readouterr()
    return rc, out.out + out.err


@pytest.mark.parametrize(
    "argv",
    [
        ["ack", f"GPU_XID_79{HOSTILE}"],
        ["ack", "HMA_STATE_RESET", f"node{HOSTILE}"],
        ["explain", f"GPU_XID_79{HOSTILE}"],
        ["reset", f"GPU_XID_79{HOSTILE}", "--reason", "new GPU"],
        ["maintenance", "on", "--reason", f"bios{HOSTILE}", "--json"],
    ],
)
def test_commands_echo_their_arguments_escaped(hma_env: Any, capsys: Any, argv: list[str]) -> None:
    hma_env.write("[reporters.journald]\nenabled = false\n")
    rc, text = _cli(capsys, *argv, "--config", str(hma_env.config))
    assert rc in (0, 1, 2, 3), text
    assert safe(text) and not any(refused(ch) for ch in text.replace("\n", "")), ascii(text)
