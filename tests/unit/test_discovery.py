"""``Discovery``: what a probe found below a sysfs folder, kept until something says it changed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hma.adapters.files import ReadError, RootReader
from hma.contracts.probe import ProbeContext
from hma.probes.support.discovery import Discovery


def _ctx(root: Path, events: int = 0, boot: str = "b1") -> ProbeContext:
    reader = RootReader(str(root))
    return ProbeContext(
        {},
        reader,
        reader,
        None,
        boot_id=boot,
        device_events=events,  # type: ignore[arg-type]
    )


class Finder:
    """A ``find`` that counts its calls and lists the folder as it is now."""

    def __init__(self, root: Path) -> None:
        self.root, self.calls = root, 0

    def __call__(self) -> list[str]:
        self.calls += 1
        return sorted(p.name for p in (self.root / "class" / "x").iterdir())


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "class" / "x" / "dev0").mkdir(parents=True)
    return tmp_path


def test_kept_until_the_listing_a_device_event_or_the_boot_changes(root: Path) -> None:
    found, find = Discovery[list[str]]("class/x"), Finder(root)

    def get(ctx: ProbeContext, extra: tuple[Any, ...] = ()) -> list[str]:
        try:
            return found.get(ctx, extra, find, lambda _r: True)
        finally:
            found.done()

    assert get(_ctx(root)) == ["dev0"] and get(_ctx(root)) == ["dev0"] and find.calls == 1
    (root / "class" / "x" / "dev1").mkdir()
    assert get(_ctx(root)) == ["dev0", "dev1"] and find.calls == 2
    assert get(_ctx(root, events=1)) == ["dev0", "dev1"] and find.calls == 3
    assert get(_ctx(root, events=1, boot="b2")) and find.calls == 4
    assert get(_ctx(root, events=1, boot="b2"), extra=("other options",)) and find.calls == 5
    assert get(_ctx(root, events=1, boot="b2"), extra=("other options",)) and find.calls == 5


def test_one_run_shares_one_result_until_done(root: Path) -> None:
    found, find = Discovery[list[str]]("class/x"), Finder(root)
    ctx = _ctx(root)
    assert found.get(ctx, (), find, lambda _r: False) == ["dev0"]
    (root / "class" / "x" / "dev1").mkdir()
    assert found.get(ctx, (), find, lambda _r: False) == ["dev0"] and find.calls == 1
    found.done()
    assert found.get(ctx, (), find, lambda _r: False) == ["dev0", "dev1"] and find.calls == 2
    found.done()  # refused by keep: found again every run
    assert found.get(ctx, (), find, lambda _r: False) and find.calls == 3


def test_an_unlistable_folder_is_a_read_error(root: Path) -> None:
    (root / "class" / "x").rename(root / "class" / "old")
    (root / "class" / "x").write_text("not a folder")
    with pytest.raises(ReadError):
        Discovery[list[str]]("class/x").get(_ctx(root), (), Finder(root), lambda _r: True)
