"""The catalogue is complete and has no dead entries; catalogue files are well formed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hma.contracts.catalogue import FAMILIES, CatalogueError, load_builtin, parse_entry

ROOT = Path(__file__).resolve().parents[2]
FAMILY = "|".join(FAMILIES)
LITERAL = re.compile(r"""["'`]((?:""" + FAMILY + r""")_[A-Z0-9_]+)["'`]""")
# Upper-case names with a code prefix that are not finding codes: environment variables, journal
# field names and prefixes used to build codes.
NOT_CODES = re.compile(
    r"^(HMA_(CONFIG|NODE|ACTION|REASON|ACTION_ID|FINDINGS_FILE|EVIDENCE|UPDATE_GOLDEN|STUCK_SECONDS"
    r"|CODE|COMPONENT|SEVERITY|PROBE|KIND|DETAILS|TS|MODE|WOULD|NVML_.*|SMI_.*|TEST_.*|JOURNAL_.*)"
    r"|HMA_AUTO_RESUME_(GRACE|REPLACE_WAIT|CHECK_WAIT)"
    r"|SLURM_(JOB_ID|RESTART_COUNT|JOB_NODELIST|NODELIST|JOB_NUM_NODES|NNODES|TIME_FORMAT)"
    r"|GPU_XID_|GPU_SXID_|SITE_|SLURM_CONF)$"
)


def emitted_literals() -> dict[str, str]:
    """Code-like literals in the program (not the catalogue itself), with one place each."""
    found: dict[str, str] = {}
    sources = [
        *ROOT.glob("hma/**/*.py"),
        *ROOT.glob("probes/**/*.py"),
        *ROOT.glob("probes/**/*.toml"),
    ]
    for path in sources:
        for match in LITERAL.finditer(path.read_text()):
            code = match.group(1)
            if not NOT_CODES.match(code):
                found.setdefault(code, str(path.relative_to(ROOT)))
    return found


def test_every_emitted_code_is_catalogued() -> None:
    cat = load_builtin()
    missing = {c: where for c, where in emitted_literals().items() if c not in cat}
    assert missing == {}


def test_every_catalogued_code_is_emitted() -> None:
    emitted = set(emitted_literals())
    # GPU_XID_<n> and GPU_SXID_<n> codes are built from the number by hma.probes.nvidia.xid and
    # hma.probes.nvidia.sxid (PREFIX + n).
    generated = re.compile(r"^GPU_S?XID_\d+$")
    unused = [
        e.code for e in load_builtin() if e.code not in emitted and not generated.match(e.code)
    ]
    assert unused == []


def test_agent_codes_never_drain() -> None:
    for entry in load_builtin():
        if entry.family == "HMA":
            assert not entry.drains, entry.code


def test_scheduler_codes_are_the_schedulers_drains() -> None:
    """``scheduler = true`` marks the drains the scheduler made (what remediation adopts)."""
    assert sorted(e.code for e in load_builtin() if e.scheduler) == [
        "SLURM_GRES_COUNT_LOW",
        "SLURM_KILL_TASK_FAILED",
        "SLURM_NODE_RESOURCES_LOW",
    ]


@pytest.mark.parametrize(
    "code, raw, problem",
    [
        ("BAD", {}, "UPPER_SNAKE"),
        (
            "SYS_X",
            {
                "summary": "s",
                "remedy": "r",
                "severity": "x",
                "action": "none",
                "clears": "observation",
            },
            "unknown severity",
        ),
        (
            "SYS_X",
            {"summary": "s", "remedy": "r", "severity": "ok", "action": "none", "clears": "window"},
            "window_s",
        ),
        (
            "HMA_X",
            {
                "summary": "s",
                "remedy": "r",
                "severity": "ok",
                "action": "none",
                "clears": "observation",
                "drains": True,
            },
            "never drain",
        ),
        (
            "SLURM_X",
            {
                "summary": "s",
                "remedy": "r",
                "severity": "critical",
                "action": "reboot",
                "clears": "reboot",
                "drains": False,
                "scheduler": True,
            },
            "scheduler: only for codes that drain",
        ),
        ("SYS_X", {"summary": "s"}, "missing"),
        (
            "SYS_X",
            {
                "summary": "s",
                "remedy": "r",
                "severity": "ok",
                "action": "none",
                "clears": "observation",
                "colour": "red",
            },
            "unknown field",
        ),
    ],
)
def test_malformed_entries(code: str, raw: dict, problem: str) -> None:
    with pytest.raises(CatalogueError, match=problem):
        parse_entry(code, raw)
