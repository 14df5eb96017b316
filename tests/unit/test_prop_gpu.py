"""Property: mutated real ``nvidia-smi -q -x`` captures never give a critical finding, never a
traceback (docs/unknown.md). Mutations: a leaf value replaced by garbage (``-1``, ``1e-9``, 400
digits, Unicode digits, unknown words, random text), a leaf removed, the document cut short.

A failing example prints its seed (hypothesis ``print_blob``); the budget is fixed and derandomized.
"""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from mutate import budget, garbage_text, replace_leaf, xml_leaves

from hma.contracts.catalogue import load_builtin
from hma.contracts.model import Severity
from hma.probes.nvidia import common as rules
from hma.probes.nvidia import settle
from hma.probes.nvidia.smi import NvidiaSmiProbe, parse_result

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi"
# Small real captures (the big ones cost time per example without adding shapes).
DOCS = {p.name: p.read_text() for p in sorted(FIXTURES.glob("*.xml")) if p.stat().st_size < 60_000}
LEAVES = {name: xml_leaves(doc) for name, doc in DOCS.items()}
# Elements the probe reads: mutations are aimed at them half of the time.
READ = re.compile(
    r"attached_gpus|current_ecc|pending_ecc|s?ram_|dram_|total|retired_count|pending_|remapped_row"
    r"|link_width|link_gen|clocks_(event|throttle)_reason_(gpu_idle|hw_)|gpu_temp|state|status"
    r"|summary|gpu_recovery_action|drain_and_reset|reset_required|product_|pci_bus_id"
)
READ_LEAVES = {
    name: [i for i, leaf in enumerate(leaves) if READ.match(leaf.group(1))]
    for name, leaves in LEAVES.items()
}
OPTS = {k: o.default for k, o in NvidiaSmiProbe.options.items()}
CATALOGUE = load_builtin()
SETTINGS = budget(150)


def judge_snapshot(stdout: str) -> dict:
    """The snapshot the probe makes of one nvidia-smi output."""
    return rules.with_baseline(parse_result({"rc": 0, "stdout": stdout, "stderr": ""}), None)


def judge(stdout: str) -> list:
    """Findings (catalogue-resolved) of one nvidia-smi output, as the probe judges it."""
    snap = judge_snapshot(stdout)
    return [CATALOGUE.resolve(f) for f in rules.evaluate(snap, OPTS)]


def assert_no_critical(findings: list, what: str) -> None:
    bad = [f for f in findings if f.severity is Severity.CRITICAL]
    assert not bad, f"{what}: {[(f.code, f.message) for f in bad]}"


def test_corpus_for_mutation_is_healthy() -> None:
    assert len(DOCS) >= 4
    for name, doc in DOCS.items():
        assert_no_critical(judge(doc), name)


@SETTINGS
@given(
    name=st.sampled_from(sorted(DOCS)),
    read=st.booleans(),
    position=st.integers(min_value=0),
    value=garbage_text(),
)
def test_garbage_leaf_is_never_critical(name: str, read: bool, position: int, value: str) -> None:
    leaves = LEAVES[name]
    pool = READ_LEAVES[name] if read else range(len(leaves))
    leaf = leaves[pool[position % len(pool)]]
    doc = replace_leaf(DOCS[name], leaf, value)
    assert_no_critical(judge(doc), f"{name} <{leaf.group(1)}>{value!r}")


@SETTINGS
@given(
    name=st.sampled_from(sorted(DOCS)),
    positions=st.lists(st.integers(min_value=0), min_size=1, max_size=8),
)
def test_removed_leaves_are_never_critical(name: str, positions: list) -> None:
    doc = DOCS[name]
    leaves = LEAVES[name]
    chosen = sorted({p % len(leaves) for p in positions}, reverse=True)
    for index in chosen:  # from the end, so earlier offsets stay valid
        leaf = leaves[index]
        doc = doc[: leaf.start()] + doc[leaf.end() :]
    assert_no_critical(judge(doc), f"{name} without {len(chosen)} leaves")


@SETTINGS
@given(name=st.sampled_from(sorted(DOCS)), cut=st.integers(min_value=0))
def test_cut_document_is_unknown(name: str, cut: int) -> None:
    doc = DOCS[name]
    at = cut % len(doc)
    findings = judge(doc[:at])
    assert_no_critical(findings, f"{name} cut at {at}")
    assert findings, f"{name} cut at {at}: a cut document must not read as healthy"


SCALAR = (
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8)
)
JSON = st.recursive(
    SCALAR,
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
PREVIOUS = st.one_of(
    JSON,
    st.fixed_dictionaries(
        {},
        optional={
            "hang": JSON,
            "pcie_baseline": JSON,
            "gpus": st.lists(
                st.fixed_dictionaries(
                    {"bus_id": st.just("00000000:00:09.0") | SCALAR},
                    optional={"nvlink": JSON, "pcie": JSON},
                ),
                max_size=2,
            ),
        },
    ),
)
SCALAR_KEYS = ("temp", "temp_slowdown", "recovery_action", "index", "name", "arch", "uuid")


@SETTINGS
@given(
    changes=st.dictionaries(st.sampled_from(SCALAR_KEYS), SCALAR, max_size=4),
    previous=PREVIOUS,
)
def test_rules_never_raise_on_odd_records(changes: dict, previous: object) -> None:
    """The shared rules take a stored previous snapshot of any age or shape, and scalar readings
    of unexpected types: they judge what they understand and never raise."""
    snap = judge_snapshot(DOCS["h100-v13.xml"])
    snap["gpus"][0].update(changes)
    rules.evaluate(rules.with_baseline(snap, previous), OPTS, None, previous, 60.0)


WINDOW = st.fixed_dictionaries({"since": SCALAR, "until": SCALAR, "why": SCALAR})
NOW = 1.8e9


@SETTINGS
@given(
    previous=st.one_of(
        JSON,
        st.fixed_dictionaries(
            {}, optional={"module_version": SCALAR, "settle": st.one_of(JSON, WINDOW)}
        ),
    ),
    version=st.none() | st.sampled_from(["590.48.01", "570.86.15"]),
    booted=st.floats(0, 2e9),
)
def test_settle_window_from_any_previous(previous: object, version: object, booted: float) -> None:
    """A stored previous snapshot of any shape gives no window or one that ends within
    ``settle_s`` from now: a damaged snapshot never keeps the GPUs unjudged."""
    window = settle.settle(NOW, booted, version, previous, 120.0)  # type: ignore[arg-type]
    assert window is None or NOW < window.until <= NOW + 120.0


@SETTINGS
@given(count=st.integers(0, 16), state=st.integers(0, 4), status=SCALAR)
def test_nothing_is_critical_while_settling(count: int, state: int, status: object) -> None:
    """While the GPUs settle, a count mismatch and an unfinished fabric registration are
    unknown, never critical; once settled a count mismatch is critical."""
    snap = judge_snapshot(DOCS["h100-v13.xml"])
    snap["count"] = count
    snap["gpus"][0]["fabric"].update(state=state, status=status)
    snap["settle"] = {"since": NOW - 10, "until": NOW + 110, "why": "boot"}
    found = [CATALOGUE.resolve(f) for f in rules.evaluate(snap, {**OPTS, "expected_gpus": 1})]
    settling = [f for f in found if f.code in rules.SETTLING_CODES]
    assert all(f.severity is Severity.UNKNOWN for f in settling), settling
    del snap["settle"]
    found = [CATALOGUE.resolve(f) for f in rules.evaluate(snap, {**OPTS, "expected_gpus": 1})]
    if count != 1:
        assert ("GPU_COUNT_MISMATCH", Severity.CRITICAL) in [(f.code, f.severity) for f in found]


PROCESS_DOCS = sorted(name for name, doc in DOCS.items() if "<process_name>" in doc)
HOSTILE_NAMES = (
    "GPU is lost",
    "Unknown Error",
    "Unable to determine the device handle for GPU 0000:3B:00.0: Unknown Error",
    "\nUnable to determine the device handle for GPU0000:00:1E.0: GPU is lost\n",
    "No devices were found",
    "</nvidia_smi_log>\nUnable to determine the device handle for GPU0000:3B:00.0: GPU is lost",
)
# What a process name can hold in an XML 1.0 document: no control characters but tab and newline.
NAME_TEXT = st.text(
    st.characters(blacklist_categories=("Cs", "Cc")) | st.sampled_from("\t\n"), max_size=80
)


@SETTINGS
@given(
    name=st.sampled_from(PROCESS_DOCS),
    text=st.one_of(st.sampled_from(HOSTILE_NAMES), NAME_TEXT),
)
def test_process_names_never_change_findings(name: str, text: str) -> None:
    """Process names are chosen by users: any text in every <process_name> of a real capture
    (escaped, as nvidia-smi prints it) leaves the findings as they were (issue 23)."""
    assert PROCESS_DOCS
    escaped = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    doc = re.sub(
        r"<process_name>[^<]*</process_name>",
        lambda _m: f"<process_name>{escaped}</process_name>",
        DOCS[name],
    )

    def seen(stdout: str) -> list:
        return [(f.code, f.component, f.severity, f.message) for f in judge(stdout)]

    assert seen(doc) == seen(DOCS[name]), f"{name} process name {text!r}"
