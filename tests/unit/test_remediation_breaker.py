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
        node("a", "HMA: X c", ("DRAIN",), "hma=unhealthy:X:none,d=1800000020.500", when=31),
        node("b", "HMA: X c", ("DRAIN",), "hma=unhealthy:X:none,d=1800000020.400", when=30),
        node("c", "admin", ("DRAIN",)),
        node("d", "HMA: X c", ("DRAIN",), parts=("cpu",)),
        node("e", "Action:Replace", ("FAIL",), "hma=unhealthy:X:replace"),
        node("f", "Action:Replace", ("FAIL",)),  # someone else's HyperPod replace
        node("g", "", (), "hma=unhealthy:X:none,h=breaker"),  # held, not drained
        node("h"),
    ]
    result = count(nodes, "h", "extra", 25.0, None)
    assert result.total == 7 and result.limit == 1
    assert result.held == ("e", "b", "a")  # e has no reason time: first; then by Slurm's time
    assert result.ranked == ("b", "a")  # e is held by its label alone: it never ranks
    assert result.blocks("h") and result.beyond("a") and not result.beyond("b")
    assert not result.beyond("e") and result.others("a") == 2


def test_simultaneous_same_second_orders_by_name() -> None:
    nodes = [
        node("n2", "HMA: X c", ("DRAIN",), when=10),
        node("n1", "HMA: X c", ("DRAIN",), when=10),
    ]
    result = count(nodes, "n2", "extra", 50.0, None)
    assert result.held == ("n1", "n2") and result.beyond("n2") and not result.beyond("n1")


def test_a_forged_drain_time_in_another_label_never_undoes_this_drain() -> None:
    """Issue 28: a second node drained after this one (Slurm's reason time) whose label claims an
    earlier ``d=`` (or an impossible one) is not ahead of it: this node stays within the limit,
    and only Slurm's own record orders the drains."""
    me = node("a", "HMA: X c", ("DRAIN",), "hma=unhealthy:X:none,d=1800000100.250", when=1800000100)
    for forged in ("1000000000.000", "1800000099.999", "nan", "-1", "1e300", "0.001"):
        other = node(
            "b", "HMA: X c", ("DRAIN",), f"hma=unhealthy:X:none,d={forged}", when=1800000160
        )
        for nodes in ([me, other], [other, me]):
            result = count(nodes, "a", "extra", 50.0, None)
            assert result.limit == 1 and result.held == ("a", "b"), forged
            assert not result.beyond("a") and result.beyond("b"), forged
            assert result.blocks("a") and result.blocks("b")


def test_a_forged_label_on_a_failed_node_never_undoes_this_drain() -> None:
    """A FAIL node that is someone else's (an older reason) counts as held once its label says
    ``unhealthy``, so it holds this node's next action; but the label is all that says it is
    hma's, so it never puts this node's drain beyond the limit."""
    me = node("a", "HMA: X c", ("DRAIN",), when=1800000100)
    other = node("f", "Action:Replace", ("FAIL",), "hma=unhealthy:X:replace", when=1700000000)
    result = count([me, other], "a", "extra", 50.0, None)
    assert set(result.held) == {"a", "f"} and result.blocks("a")
    assert not result.beyond("a")
