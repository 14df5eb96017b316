"""Bisection with stand-ins that report chosen bandwidths per node: only slow nodes are blamed."""

from __future__ import annotations

from typing import Optional, Sequence

import pytest

from hma.deepcheck import connectivity as conn

NODES = [f"n{i}" for i in range(7)]


def fabric(speeds: dict[str, Optional[float]], calls: list[list[str]]) -> conn.Measure:
    """A collective runs at its slowest member (None: that member's tool gives no reading)."""

    def measure(nodes: Sequence[str]) -> Optional[float]:
        calls.append(list(nodes))
        values = [speeds.get(n, 300.0) for n in nodes]
        return None if None in values else min(v for v in values if v is not None)

    return measure


def test_healthy_group_is_one_job() -> None:
    calls: list[list[str]] = []
    out = conn.judge(NODES, 200.0, fabric({}, calls))
    assert out.verdict == "pass" and calls == [NODES] and out.findings() == []


@pytest.mark.parametrize("slow", ["n0", "n3", "n6"])
def test_one_slow_node_is_the_only_one_blamed(slow: str) -> None:
    calls: list[list[str]] = []
    out = conn.judge(NODES, 200.0, fabric({slow: 120.0}, calls))
    assert out.blamed == [slow] and out.verdict == "fail"
    (finding,) = out.findings()
    assert finding.code == "DEEP_BUSBW_LOW" and finding.details["node"] == slow
    assert finding.details["group_gbps"] == 120.0
    assert len(calls) <= 1 + len(NODES) // 2 + 3


def test_two_slow_nodes_in_different_pairs() -> None:
    out = conn.judge(NODES, 200.0, fabric({"n1": 90.0, "n4": 150.0}, []))
    assert sorted(out.blamed) == ["n1", "n4"]


def test_no_good_node_blames_nobody() -> None:
    out = conn.judge(["a", "b"], 200.0, fabric({"a": 10.0, "b": 10.0}, []))
    assert out.blamed == [] and out.unjudged == ["a", "b"] and out.verdict == "unknown"


def test_no_reading_is_unknown_never_blame() -> None:
    out = conn.judge(NODES, 200.0, fabric({"n2": None}, []))
    assert out.verdict == "unknown" and out.blamed == [] and out.unjudged == NODES


def test_minimum_configured_over_builtin() -> None:
    assert conn.minimum("p5.48xlarge", {}) == 200.0
    assert conn.minimum("p5.48xlarge", {"p5.48xlarge": 350}) == 350.0
    assert conn.minimum("m7i.large", {}) is None and conn.minimum(None, {}) is None


def test_odd_node_out_and_no_passing_pair_still_finds_the_slow_one() -> None:
    # pairs: (a, b) fails because b is slow; c is the odd one: a and c pass together
    out = conn.judge(["a", "b", "c"], 200.0, fabric({"b": 50.0}, []))
    assert out.blamed == ["b"] and out.unjudged == []
