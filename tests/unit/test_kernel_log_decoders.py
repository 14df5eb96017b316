"""Decoders registered by entry point, and de-duplication with catch-all codes told apart."""

from __future__ import annotations

import pytest

from hma.contracts.model import Finding, Severity
from hma.probes.kernel_log import decoders
from hma.probes.kernel_log.dedup import Dedup
from hma.probes.kernel_log.rules import compile_rule


def test_the_xid_decoder_is_registered_by_the_nvidia_family() -> None:
    decoder = decoders.load("xid")
    assert type(decoder).__module__ == "hma.probes.nvidia.xid"
    assert decoders.load("xid") is decoder  # one instance per process
    assert decoder.code in decoder.codes()


def test_an_unregistered_kind_is_a_lookup_error() -> None:
    with pytest.raises(LookupError):
        decoders.load("no-such-decoder")


@pytest.mark.parametrize(
    ("kind", "problem"),
    [
        ("no-such-decoder", "registered decoder (hma.kernel_log.decoders), not 'no-such-decoder'"),
        ("", "kind must be 'code' or a registered decoder"),
        (3, "kind must be 'code' or a registered decoder"),
    ],
)
def test_a_rule_of_an_unknown_kind_is_refused(kind: object, problem: str) -> None:
    with pytest.raises(ValueError, match="r1: ") as exc:
        compile_rule({"name": "r1", "kind": kind, "pattern": "x", "code": "C"}, "site.toml")
    assert problem in str(exc.value)


def test_a_decoder_rule_takes_its_pattern_and_code_from_the_decoder() -> None:
    rule = compile_rule({"name": "x", "kind": "xid"}, "t.toml")
    assert rule.decoder is decoders.load("xid")
    assert (rule.pattern.pattern, rule.code) == (rule.decoder.pattern, rule.decoder.code)
    assert compile_rule({"name": "c", "pattern": "x", "code": "C"}, "t.toml").decoder is None


@pytest.mark.parametrize(
    ("pci", "component"),
    [
        ("0000:3b:00", "gpu:0000:3b:00"),
        ("0000:3B:00.0", "gpu:0000:3b:00"),
        ("3b:00.0", "gpu:0000:3b:00"),
        ("nonsense", "node"),
        ("zz:yy:xx", "node"),
    ],
)
def test_component_of(pci: str, component: str) -> None:
    assert decoders.component_of(pci) == component


def _f(code: str, n: int, severity: Severity = Severity.CRITICAL) -> Finding:
    return Finding(code, "gpu:0000:01:00", "m", {"n": n}, severity)


@pytest.mark.parametrize(
    ("tell_apart", "second", "admitted"),
    [
        ({}, _f("C", 2), False),  # same (component, code, severity): a repeat
        ({"C": "n"}, _f("C", 2), True),  # a catch-all code: another number is another fault
        ({"C": "n"}, _f("C", 1), False),
        ({"OTHER": "n"}, _f("C", 2), False),  # only the named codes are told apart
        ({}, _f("C", 1, Severity.WARNING), True),  # another severity is another event
        ({}, _f("D", 1), True),
    ],
)
def test_dedup_tells_catch_all_codes_apart(
    tell_apart: dict[str, str], second: Finding, admitted: bool
) -> None:
    dedup = Dedup(10.0, tell_apart)
    assert dedup.admit(_f("C", 1), 0.0) is not None
    assert (dedup.admit(second, 1.0) is not None) is admitted


def test_dedup_forget_reopens_a_cleared_fault() -> None:
    dedup = Dedup(10.0)
    assert dedup.admit(_f("C", 1), 0.0) is not None
    dedup.forget("gpu:0000:01:00", "C")
    first = dedup.admit(_f("C", 1), 1.0)
    assert first is not None and first.details["count"] == 1
