"""Circuit breaker counting and ordering."""

from __future__ import annotations

from hma.cluster.slurm.parse import SlurmNodeState as NodeState
from hma.remediation.breaker import count, limit_for


def node(
    name: str,
    reason: str = "",
    flags: tuple[str, ...] = (),
    extra: str = "",
    when: float = 0.0,
    parts: tuple[str, ...] = ("gpu",),
) -> NodeState:
    return NodeState(name, "idle", frozenset(flags), reason, when, "", (("extra", extra),), parts)


def test_limits() -> None:
    assert limit_for(4, 25.0, None) == 1
    assert limit_for(4, 10.0, None) == 1  # never below one node
    assert limit_for(100, 10.0, None) == 10
    assert limit_for(100, 10.0, 3) == 3
    assert limit_for(0, 10.0, None) == 1


def test_count_in_my_partitions_only_and_order() -> None:
    nodes = [
        node("a", "HMA: X c", ("DRAIN",), "hma=unhealthy:X:none,d=20.5", when=30),
        node("b", "HMA: X c", ("DRAIN",), "hma=unhealthy:X:none,d=20.4", when=30),
        node("c", "admin", ("DRAIN",)),
        node("d", "HMA: X c", ("DRAIN",), parts=("cpu",)),
        node("e", "Action:Replace", ("FAIL",), "hma=unhealthy:X:replace"),
        node("f", "Action:Replace", ("FAIL",)),  # someone else's HyperPod replace
        node("g", "", (), "hma=unhealthy:X:none,h=breaker"),  # held, not drained
        node("h"),
    ]
    result = count(nodes, "h", "extra", 25.0, None)
    assert result.total == 7 and result.limit == 1
    assert result.held == ("e", "b", "a")  # e has no drain time: first; then by d
    assert result.blocks("h") and result.beyond("a") and not result.beyond("e")
    assert result.others("a") == 2


def test_simultaneous_same_second_orders_by_name() -> None:
    nodes = [
        node("n2", "HMA: X c", ("DRAIN",), when=10),
        node("n1", "HMA: X c", ("DRAIN",), when=10),
    ]
    result = count(nodes, "n2", "extra", 50.0, None)
    assert result.held == ("n1", "n2") and result.beyond("n2") and not result.beyond("n1")
