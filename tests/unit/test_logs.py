"""Log lines with a level journald understands (hma.adapters.logs), and the daemon's level."""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Any

import pytest

from hma.adapters import logs


@pytest.fixture
def restore_logging() -> Any:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def _lines(journal: bool, monkeypatch: pytest.MonkeyPatch, level: str = "info") -> list[str]:
    with tempfile.TemporaryFile("w+") as stream:
        st = os.fstat(stream.fileno())
        other = f"{st.st_dev}:{st.st_ino + 1}"
        monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}" if journal else other)
        logs.configure(level, stream)
        log = logging.getLogger("hma.test")
        log.debug("read /sys/x")
        log.info("started")
        log.error("reload refused:\n%s", "a.b: bad")
        logging.getLogger().handlers[-1].flush()
        stream.seek(0)
        return stream.read().splitlines()


def test_journald_stream_gets_a_level_prefix_on_every_line(
    monkeypatch: pytest.MonkeyPatch, restore_logging: Any
) -> None:
    assert _lines(True, monkeypatch) == [
        "<6>hma: INFO started",
        "<3>hma: ERROR reload refused:",
        "<3>a.b: bad",
    ]


def test_other_streams_are_plain_and_debug_is_a_level(
    monkeypatch: pytest.MonkeyPatch, restore_logging: Any
) -> None:
    assert _lines(False, monkeypatch, "debug") == [
        "hma: DEBUG read /sys/x",
        "hma: INFO started",
        "hma: ERROR reload refused:",
        "a.b: bad",
    ]


def test_log_level_is_checked_by_config_check(hma_env: Any) -> None:
    hma_env.write('log_level = "loud"\n')
    res = hma_env.hma("config", "check")
    assert res.returncode == 2 and "agent.log_level" in res.stderr, res.stderr
    hma_env.write('log_level = "debug"\n')
    assert hma_env.hma("config", "check").returncode == 0
