"""contrib/monitoring's files as Grafana and Prometheus read them, without either running
(tests/integration/test_monitoring_stack.py runs both)."""

from __future__ import annotations

import json
from itertools import combinations
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "contrib" / "monitoring" / "hma-dashboard.json"


def rectangle(panel: dict) -> tuple[int, int, int, int]:
    """(x0, y0, x1, y1) of a panel's gridPos: Grafana's grid is 24 columns wide."""
    pos = panel["gridPos"]
    return pos["x"], pos["y"], pos["x"] + pos["w"], pos["y"] + pos["h"]


def overlap(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_overlap_of_rectangles() -> None:
    assert overlap((0, 0, 2, 2), (1, 1, 3, 3))
    assert not overlap((0, 0, 2, 2), (2, 0, 4, 2))  # side by side
    assert not overlap((0, 0, 2, 2), (0, 2, 2, 4))  # one under the other


def test_no_two_dashboard_panels_overlap() -> None:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    assert len(panels) >= 20
    for panel in panels:
        x0, y0, x1, y1 = rectangle(panel)
        assert 0 <= x0 < x1 <= 24 and 0 <= y0 < y1, panel["title"]
    clashes = [
        (a["title"], b["title"])
        for a, b in combinations(panels, 2)
        if overlap(rectangle(a), rectangle(b))
    ]
    assert clashes == []
