"""The rules' literal prefilter (hma.probes.kernel_log.rules.Prefilter): one pass over a block
per rare byte that gates several needles (or per needle without one), the same needles found as
one search per needle would find, per block (``hma logscan``) and per message (the kernel_log
source) alike (issue 31, part 5)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from mutate import budget

from hma.probes.kernel_log.rules import RARE, Prefilter, RuleSet

RULES = RuleSet.load(None)
NEEDLES = RULES.prefilter.needles


class CountingBytes(bytes):
    """A block that counts the searches that start a pass (a ``find`` from the block's start)."""

    passes = 0

    def find(self, sub, *args):  # type: ignore[no-untyped-def,override]
        if not args:
            CountingBytes.passes += 1
        return super().find(sub, *args)


def naive(block: bytes, needles: tuple[str, ...]) -> dict[int, set[str]]:
    """Line end -> needles, one search of each line for each needle."""
    out: dict[int, set[str]] = {}
    start = 0
    while start < len(block):
        end = block.index(b"\n", start)
        line = block[start:end].decode("utf-8", "replace")
        held = {n for n in needles if n in line}
        if held:
            out[end] = held
        start = end + 1
    return out


def test_the_built_in_needles_take_fewer_passes_than_needles() -> None:
    block = CountingBytes(b"[    1.000000] eth0: renamed from veth1\n" * 1000)
    CountingBytes.passes = 0
    assert RULES.prefilter.lines(block) == {}
    gated = [n for n in NEEDLES if any(c in n for c in RARE)]
    assert len(gated) >= 10  # the ; ' W K # ... needles share their bytes' passes
    assert CountingBytes.passes <= len(NEEDLES) - len(gated) + len(set(RARE))
    assert CountingBytes.passes < len(NEEDLES) - 5


def test_a_gated_needle_is_found_at_the_start_of_a_block_and_twice_in_a_line() -> None:
    pre = Prefilter(["Device not ready; aborting", "controller is down; will reset", "plain"])
    block = (
        b"Device not ready; aborting\n"
        b"x; y; Device not ready; aborting controller is down; will reset plain\n"
        b"; only the gate\n"
    )
    found = pre.lines(block)
    assert {k: set(v) for k, v in found.items()} == naive(block, pre.needles)
    assert all(len(v) == len(set(v)) for v in found.values())  # each needle once per line
    assert pre.found("nvme nvme0: Device not ready; aborting reset, CSTS=0x1") == [
        "Device not ready; aborting"
    ]
    assert pre.found("; neither") == []


PIECES = st.sampled_from([*NEEDLES, ";", "'", "#", "W", "K", "x", " ", "é", "\t", "Fatal", ": "])
LINE = st.lists(PIECES, max_size=8).map("".join)


@given(st.lists(LINE, min_size=1, max_size=30))
@budget(200)
def test_the_prefilter_finds_what_one_search_per_needle_finds(lines: list[str]) -> None:
    block = "".join(f"{line}\n" for line in lines).encode()
    found = RULES.prefilter.lines(block)
    assert {k: set(v) for k, v in found.items()} == naive(block, NEEDLES)
    for line in lines:
        assert set(RULES.prefilter.found(line)) == {n for n in NEEDLES if n in line}
