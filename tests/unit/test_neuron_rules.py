"""The Neuron kernel-log rules (hma/rules/neuron.toml) match the documented NEURON_HW_ERR lines."""

from __future__ import annotations

import re
from importlib import resources
from typing import Optional

import pytest

from hma import tomlcompat
from hma.catalogue import load_builtin

RULES = tomlcompat.loads(
    resources.files("hma.rules").joinpath("neuron.toml").read_text(encoding="utf-8")
)["rule"]


def match(line: str) -> Optional[tuple[str, str, str]]:
    """(code, component, message) of the first matching rule, as the rule format defines."""
    for rule in RULES:
        m = re.search(rule["pattern"], line)
        if m:
            groups = {k: v for k, v in m.groupdict().items() if v is not None}
            try:
                component = rule["component"].format(**groups)
            except KeyError:
                component = rule["fallback"]
            return rule["code"], component, rule["message"].format_map(_Blank(groups))
    return None


class _Blank(dict):
    def __missing__(self, key: str) -> str:
        return "?"


def test_rule_codes_are_catalogued() -> None:
    cat = load_builtin()
    assert all(rule["code"] in cat for rule in RULES)
    assert RULES[-1]["code"] == "NEURON_HW_ERR_OTHER"


@pytest.mark.parametrize(
    "line,code,component",
    [
        (
            "[ 5312.123] NEURON_HW_ERR=SRAM_UNCORRECTABLE_ERROR instance-id=i-0592464924bd45322 "
            "hostname=ip-172-31-61-252 nd-id=3 nc-id=0 serial-num=19fcda00f5ff6eb9 "
            "action=TERMINATE_INSTANCE",
            "NEURON_HW_ERR_SRAM",
            "neuron:3",
        ),
        (
            "kernel: NEURON_HW_ERR=NC_UNCORRECTABLE_ERROR affecting neuron devices",
            "NEURON_HW_ERR_NC",
            "node",
        ),
        (
            "neuron0: NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR device=0 nd-id=11",
            "NEURON_HW_ERR_HBM",
            "neuron:11",
        ),
        ("NEURON_HW_ERR=DMA_ERROR nd-id=0 nc-id=1", "NEURON_HW_ERR_DMA", "neuron:0"),
        ("NEURON_HW_ERR=HBM_REPAIRABLE_ERROR nd-id=7", "NEURON_HW_ERR_OTHER", "neuron:7"),
    ],
)
def test_documented_lines(line: str, code: str, component: str) -> None:
    got = match(line)
    assert got is not None and got[:2] == (code, component)


def test_other_lines_do_not_match() -> None:
    assert match("neuron: loading out-of-tree module taints kernel.") is None
    assert match("NEURON_HW_ERRORS are fine") is None
    assert match("NEURON_HW_ERR=SRAM_UNCORRECTABLE_ERRORS") == (
        "NEURON_HW_ERR_OTHER",
        "node",
        "Neuron hardware error SRAM_UNCORRECTABLE_ERRORS (kernel log)",
    )
