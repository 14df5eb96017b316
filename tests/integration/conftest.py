"""Integration test setup: the Slurm 24.11 root (tests/slurmchroot.py) is built, or found in its
cache, once after collection when a collected test needs it, so that its first build (about
45 s) is not charged to one test's timeout; the summary says whether it was built and how long
that took."""

from __future__ import annotations

import pytest

from tests import slurmchroot


@pytest.hookimpl(trylast=True)  # after -k/-m deselection
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """Build the 24.11 root when a selected test runs on Slurm 24.11 and it can be built here
    (a failure is remembered: those tests then fail with its message)."""
    if not any("slurm24.11" in item.nodeid for item in items) or slurmchroot.why_not():
        return
    try:
        slurmchroot.image()
    except RuntimeError:
        pass  # kept in slurmchroot.BUILD_ERROR; each 24.11 cluster fails with it


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:  # type: ignore[no-untyped-def]
    """Say how the Slurm 24.11 root was obtained (the first build's time, for the CI budget)."""
    line = slurmchroot.describe()
    if line:
        terminalreporter.write_sep("-", "Slurm 24.11 root")
        terminalreporter.write_line(line)
