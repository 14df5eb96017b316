"""The health check's run log (hma.reporters.runlog): one block per run, the newest runs kept
within their bounds, what others wrote escaped, never written through a symlink."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mutate import budget

from hma.adapters.text import printable
from hma.reporters import runlog

LINES = st.lists(
    st.one_of(
        st.text(max_size=40),
        st.sampled_from(["=== forged head", "\x1b]0;title\x07", "a\u202eb", "\x00", "tab\there"]),
    ),
    max_size=6,
)


def block(index: int, lines: list[str]) -> str:
    log = runlog.RunLog(None, 1_800_000_000.0 + index)
    for line in lines:
        log.add(line)
    return log.block(index % 4, now=1_800_000_000.5 + index)


@budget(150)
@given(st.lists(LINES, min_size=1, max_size=25), st.integers(1, 8), st.integers(50, 3000))
def test_the_log_keeps_the_newest_runs_within_its_bounds(
    runs: list[list[str]], keep: int, limit: int
) -> None:
    text, made = "", []
    for index, lines in enumerate(runs):
        made.append(block(index, lines))
        text = runlog.kept(runlog.blocks(text), made[-1], runs=keep, size=limit)
    got = runlog.blocks(text)
    assert got and got[-1] == made[-1]  # the newest run, always
    assert got == made[len(made) - len(got) :]  # then the ones before it, in order
    assert len(got) <= keep
    assert len(text.encode("utf-8")) <= max(limit, len(made[-1].encode("utf-8")))
    if len(made) <= keep and len("".join(made).encode("utf-8")) <= limit:
        assert got == made  # nothing is dropped that fits
    for line in text.splitlines():
        assert line.startswith((runlog.HEAD, "  "))  # only a run's head starts a block
        assert printable(line) == line  # escaped: no control, bidi or NUL character


def test_a_run_is_cut_at_its_own_bound() -> None:
    log = runlog.RunLog(None, 0.0)
    for _ in range(10_000):
        log.add("x" * 99)
    text = log.block(0, now=1.0)
    assert len(text) <= runlog.MAX_RUN_BYTES + 200
    assert text.rstrip().endswith(f"not kept (a run keeps {runlog.MAX_RUN_BYTES} bytes)")


def test_capture_copies_printed_lines(capsys: pytest.CaptureFixture) -> None:
    log = runlog.RunLog(None, 0.0)
    with log.capture():
        print("one\ntwo", end="")
        print(" and a half")
        print("three", file=sys.stderr)
    assert capsys.readouterr().out == "one\ntwo and a half\n"
    assert log.lines == ["  one", "  two and a half", "  three"]


def test_write_adds_a_block_and_makes_the_folder(tmp_path: Path) -> None:
    folder = tmp_path / "state"
    for index in range(3):
        assert runlog.write(folder, block(index, [f"run {index}"])) == ""
    got = runlog.blocks((folder / runlog.FILENAME).read_text())
    assert [b.splitlines()[1] for b in got] == ["  run 0", "  run 1", "  run 2"]
    assert os.stat(folder).st_mode & 0o777 == 0o700
    assert sorted(os.listdir(folder)) == [runlog.FILENAME]  # no temp file left


def test_a_huge_log_is_read_from_its_tail(tmp_path: Path) -> None:
    path = tmp_path / runlog.FILENAME
    path.write_text("garbage line\n" * 200_000)  # 2.6 MB without a head
    assert runlog.write(tmp_path, block(0, ["new"])) == ""
    assert path.read_text() == block(0, ["new"])


def test_never_through_a_symlink_nor_into_a_fifo(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("keep\n")
    folder = tmp_path / "state"
    folder.mkdir()
    (folder / runlog.FILENAME).symlink_to(target)
    assert "is a symlink" in runlog.write(folder, block(0, ["x"]))
    assert target.read_text() == "keep\n" and (folder / runlog.FILENAME).is_symlink()
    linked = tmp_path / "linked"
    linked.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir()
    assert "not followed" in runlog.write(linked, block(0, ["x"]))
    assert os.listdir(tmp_path / "elsewhere") == []
    fifo_folder = tmp_path / "fifo"
    fifo_folder.mkdir()
    os.mkfifo(fifo_folder / runlog.FILENAME)
    assert "not a regular file" in runlog.write(fifo_folder, block(0, ["x"]))
