"""The shared event-counter logic (hma.probes.support.counters) the infiniband, efa and neuron
probes judge their counters with."""

from __future__ import annotations

from typing import Any, Optional

import pytest

from hma.adapters.files import ReadError, RootReader, reason
from hma.contracts.model import Severity
from hma.contracts.probe import ProbeContext
from hma.probes.support.counters import baseline, growth, rate_findings, rebooted, sampled
from hma.probes.support.findings import read_failures

U64 = 1 << 64
OPTS = {"rate_limits": {"a": 1.0, "b": 10.0}, "critical_factor": 10.0}
CODES = ("X_WARN", "X_CRIT")


@pytest.mark.parametrize(
    "now, before, kw, want",
    [
        (15, 10, {}, 5),
        (10, 10, {}, 0),
        (5, 1000, {}, None),  # reset to a lower value
        (5, 1000, {"wraps_at": U64}, None),  # a reset, not a wrap: it fell from the lower half
        (5, U64 - 10, {"wraps_at": U64}, 15),  # one wrap
        (5, U64 - 10, {}, None),  # a counter that does not wrap went down: a reset
        (5, None, {}, None),  # no previous sample
        (None, 5, {}, None),  # no reading now
        (255, 254, {"saturates_at": 255}, None),  # saturated: no longer counts
        (254, 3, {"saturates_at": 255}, 251),
        (200, 300, {"saturates_at": 255}, None),
    ],
)
def test_growth(now: Optional[int], before: Optional[int], kw: Any, want: Optional[int]) -> None:
    assert growth(now, before, **kw) == want


def _grow(_counter: str, now: Optional[int], before: Optional[int]) -> Optional[int]:
    return growth(now, before)


def _rates(now: dict[str, int], before: dict[str, int], grow: Any = _grow) -> list[Any]:
    """Findings of one unit "dev0/1" whose readings are ``{"c": counters}``, over 20 s."""
    units, base = {"dev0/1": {"c": now}}, {"dev0/1": {"c": before}}
    return rate_findings(
        CODES, "x", units, base, 20.0, OPTS, counters=lambda info: info["c"], grow=grow
    )


def test_rates_split_by_severity_one_finding_per_code() -> None:
    found = _rates({"a": 70, "b": 2000, "c": 9999}, {"a": 10, "b": 0, "c": 0})
    assert [f.code for f in found] == ["X_CRIT", "X_WARN"]
    crit, warn = found
    assert crit.details == {
        "counters": [{"counter": "b", "rate_per_s": 100.0, "limit_per_s": 10.0}],
        "interval_s": 20.0,
    }
    assert warn.details["counters"] == [{"counter": "a", "rate_per_s": 3.0, "limit_per_s": 1.0}]
    assert warn.component == "x:dev0/1" and warn.message == "dev0/1: a 3/s over the limit"


@pytest.mark.parametrize(
    "now, before",
    [
        ({"a": 19}, {"a": 0}),  # under the limit (0.95/s)
        ({"a": 5}, {"a": 1000}),  # a reset
        ({"a": 1000}, {}),  # no previous sample
        ({}, {"a": 0}),  # not read now
    ],
)
def test_no_rate_without_known_growth_over_the_limit(
    now: dict[str, int], before: dict[str, int]
) -> None:
    assert _rates(now, before) == []


def test_a_unit_the_baseline_lacks_has_no_rate() -> None:
    units = {"new": {"c": {"a": 10**6}}}
    found = rate_findings(CODES, "x", units, {}, 1.0, OPTS, counters=lambda i: i["c"], grow=_grow)
    assert found == []


def test_rate_uses_the_family_growth() -> None:
    """The growth function decides: here a saturated counter is never a rate."""

    def saturating(_counter: str, now: Optional[int], before: Optional[int]) -> Optional[int]:
        return growth(now, before, saturates_at=255)

    assert _rates({"a": 255}, {"a": 0}, saturating) == []
    assert [f.code for f in _rates({"a": 254}, {"a": 0}, saturating)] == ["X_CRIT"]


@pytest.mark.parametrize(
    "was, now, strict, want",
    [
        ("b1", "b1", True, False),
        ("b1", "b2", True, True),
        ("b1", "b2", False, True),
        ("b1", "", True, True),  # an id known on one side only
        ("b1", "", False, False),
        (None, None, True, False),
    ],
)
def test_rebooted(was: Optional[str], now: Optional[str], strict: bool, want: bool) -> None:
    assert rebooted({"boot_id": was}, {"boot_id": now}, strict=strict) is want


def _ctx(
    previous: Any, previous_ts: float = 0.0, oneshot: bool = False, interval: float = 0.0
) -> ProbeContext:
    reader = RootReader("/nonexistent")
    opts = {"oneshot_sample_s": interval}
    return ProbeContext(
        opts,
        reader,
        reader,
        None,  # type: ignore[arg-type]  # no commands here
        previous=previous,
        previous_ts=previous_ts,
        oneshot=oneshot,
    )


@pytest.mark.parametrize(
    "previous, oneshot, interval, reads",
    [
        (None, True, 0.01, 2),  # `hma check`: a second sample, the first as its baseline
        (None, True, 0.0, 1),  # sampling turned off
        (None, False, 0.01, 1),  # the daemon: the previous run is the baseline
        ({"ts": 1.0}, True, 0.01, 1),
    ],
)
def test_sampled(previous: Any, oneshot: bool, interval: float, reads: int) -> None:
    taken: list[dict[str, Any]] = []

    def read() -> dict[str, Any]:
        taken.append({"ts": float(len(taken)), "ports": {"p": len(taken)}})
        return taken[-1]

    snap = sampled(_ctx(previous, oneshot=oneshot, interval=interval), read, "ports")
    assert len(taken) == reads and snap is taken[-1]
    if reads == 2:
        assert snap["baseline"] == {"ts": 0.0, "ports": {"p": 0}}
    else:
        assert "baseline" not in snap


def test_baseline_sources() -> None:
    oneshot = {"boot_id": "b", "baseline": {"ts": 5.0, "ports": {"p": 1}}}
    assert baseline(oneshot, _ctx({"ports": {"q": 2}}), "ports", strict_boot=True) == (
        {"p": 1},
        5.0,
    )
    snap = {"boot_id": "b"}
    prev = {"boot_id": "b", "ts": 7.0, "ports": {"q": 2}}
    assert baseline(snap, _ctx(prev), "ports", strict_boot=True) == ({"q": 2}, 7.0)
    assert baseline(snap, _ctx({"boot_id": "b", "ports": {}}, 3.0), "ports", strict_boot=True) == (
        {},
        3.0,
    )
    assert baseline(snap, _ctx(None), "ports", strict_boot=True) == (None, 0.0)
    assert baseline(snap, _ctx({**prev, "boot_id": "a"}), "ports", strict_boot=False)[0] is None
    unknown_boot = {"ts": 7.0, "ports": {"q": 2}}
    assert baseline(snap, _ctx(unknown_boot), "ports", strict_boot=True)[0] is None
    assert baseline(snap, _ctx(unknown_boot), "ports", strict_boot=False)[0] == {"q": 2}


def test_read_failure_record() -> None:
    reader = RootReader("/sys")
    exc = ReadError("/sys/class/x/state: not '<number>: <state>': 'junk'")
    assert reason(exc) == "'junk'"
    assert reason(ValueError("no path")) == "no path"
    assert reader.failure("class/x/state", exc, port="x/1") == {
        "path": "/sys/class/x/state",
        "error": "'junk'",
        "port": "x/1",
    }
    (finding,) = read_failures(
        "X_READ_FAILED", [reader.failure("class/x/state", exc, port="x/1")], lambda e: e["port"]
    )
    assert (finding.code, finding.component, finding.severity) == (
        "X_READ_FAILED",
        "x/1",
        Severity.UNKNOWN,
    )
    assert finding.message == "cannot read /sys/class/x/state: 'junk'"
    assert finding.details == {"path": "/sys/class/x/state", "error": "'junk'"}
