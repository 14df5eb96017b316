"""The layout change (issue 19) changed no output: `hma check`, `hma status`, `hma run` and the
other commands in tests/golden.py print, over the committed fixtures, what the tree before it
printed (tests/fixtures/golden/layout, written by commit 7977b9b). One test per golden file."""

from __future__ import annotations

import difflib
import importlib.util
import sys
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests import golden  # noqa: E402

pytestmark = pytest.mark.timeout(300)  # the first test runs every command (about 15 s)

STORED = dict(golden.stored())
# written by the daemon run with the Prometheus reporter on (its metrics, its log)
NEEDS_PROMETHEUS = ("daemon-log.txt", "daemon-prometheus.prom")


@pytest.fixture(scope="module")
def produced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Every output of this tree (sys.executable), produced once for the module."""
    yield golden.produce(sys.executable, tmp_path_factory.mktemp("golden"))


def test_goldens_are_committed() -> None:
    assert len(STORED) > 40, f"no goldens in {golden.GOLDEN_DIR}"


@pytest.mark.parametrize("name", sorted(STORED))
def test_output_matches_golden(produced: dict[str, str], name: str) -> None:
    if name not in produced and name.startswith("check-gpu-nvml"):
        pytest.skip("no C compiler (cc) to build the stand-in NVML library")
    if name in NEEDS_PROMETHEUS and importlib.util.find_spec("prometheus_client") is None:
        pytest.skip("the daemon's Prometheus reporter needs prometheus-client (not in test-min)")
    assert name in produced, f"{name}: no longer produced by tests/golden.py"
    want, got = STORED[name], produced[name]
    if got != want:
        diff = difflib.unified_diff(
            want.splitlines(keepends=True),
            got.splitlines(keepends=True),
            f"golden/layout/{name} (7977b9b)",
            f"{name} (this tree)",
        )
        pytest.fail("output differs from the golden:\n" + "".join(diff), pytrace=False)


def test_every_output_has_a_golden(produced: dict[str, str]) -> None:
    assert sorted(set(produced) - set(STORED)) == []
