"""efa_mesh with the real fi_pingpong over tcp between network namespaces (8 simulated adapters)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from netns_fabric import Fabric, sweep, usable  # noqa: E402
from trn_support import codes, make_ctx  # noqa: E402

from hma.probes.efa.mesh import EfaMeshProbe, tournament_rounds  # noqa: E402

REASON = usable()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(REASON is not None, reason=REASON or ""),
]

PROBE = EfaMeshProbe()
BASE_PORT = 47700
N = 8


@pytest.fixture(scope="module", autouse=True)
def _sweep() -> None:
    sweep()


def mesh_ctx(fabric: Fabric, tmp_path: Path, **options: Any):  # type: ignore[no-untyped-def]
    """Test configuration: provider tcp between namespaces; everything else as in production."""
    values: dict[str, Any] = {
        "adapters": fabric.adapters(),
        "provider": "tcp",
        "domain_format": "",
        "iterations": 5,
        "size": 64,
        "pair_timeout": 3.0,
        "base_port": BASE_PORT,
        "lock_file": str(tmp_path / "mesh.lock"),
        "timeout": 120.0,
    }
    values.update(options)
    return make_ctx(EfaMeshProbe, tmp_path, **values)


def run(ctx):  # type: ignore[no-untyped-def]
    assert PROBE.applies(ctx) is None
    snap = PROBE.collect(ctx)
    return snap, PROBE.evaluate(snap, ctx)


@pytest.mark.timeout(90)
def test_all_healthy(tmp_path: Path) -> None:
    with Fabric(N, subnet=1) as fabric:
        snap, findings = run(mesh_ctx(fabric, tmp_path, full_interval=0.0))
    assert findings == []
    assert len(snap["screen"]) == N // 2 and len(snap["tournament"]) == N * (N - 1) // 2
    assert {p["status"] for p in snap["tournament"]} == {"ok"}
    summary = PROBE.summary(snap)
    assert summary is not None and len(summary["latency_us"]) == 28


@pytest.mark.timeout(90)
def test_screen_only_when_healthy_and_tournament_not_due(tmp_path: Path) -> None:
    with Fabric(N, subnet=2) as fabric:
        ctx = mesh_ctx(fabric, tmp_path)
        ctx.previous = {"last_full_ts": ctx.clock()}
        snap, findings = run(ctx)
    assert findings == [] and "tournament" not in snap
    assert [p["status"] for p in snap["screen"]] == ["ok"] * (N // 2)  # every adapter once


@pytest.mark.timeout(120)
def test_one_adapter_link_cut_is_localized(tmp_path: Path) -> None:
    with Fabric(N, subnet=3) as fabric:
        fabric.cut_adapter(4)
        ctx = mesh_ctx(fabric, tmp_path)
        ctx.previous = {"last_full_ts": ctx.clock()}  # the tournament runs because the screen fails
        snap, findings = run(ctx)
        leftovers = [fabric.pids(i) for i in range(N)]
    assert snap["full_reason"] == "screen failed"
    assert codes(findings) == {("EFA_ADAPTER_BROKEN", "efa:a04")}
    assert findings[0].details["failed_peers"] == [f"a{i:02d}" for i in range(N) if i != 4]
    failed = {(p["a"], p["b"]) for p in snap["tournament"] if p["status"] != "ok"}
    assert all("a04" in pair for pair in failed) and len(failed) == N - 1
    assert leftovers == [[] for _ in range(N)]  # every server and client was killed


@pytest.mark.timeout(90)
def test_one_pair_cut_is_a_path_warning(tmp_path: Path) -> None:
    with Fabric(N, subnet=4) as fabric:
        fabric.cut_pair(2, 3)
        ctx = mesh_ctx(fabric, tmp_path)
        rounds = tournament_rounds(N)
        # the screen whose round holds the pair fails, and the tournament localizes
        ctx.previous = {"screen_round": next(i for i, r in enumerate(rounds) if (2, 3) in r) - 1}
        snap, findings = run(ctx)
    assert snap["full_reason"] == "screen failed"
    assert codes(findings) == {("EFA_PATH_FAILED", "efa:a02")}
    assert findings[0].details["peers"] == ["a03"]
    bad = [p for p in snap["tournament"] if p["status"] != "ok"]
    assert [(p["a"], p["b"]) for p in bad] == [("a02", "a03")]


@pytest.mark.timeout(120)
def test_a_peer_that_hangs_takes_the_timeout_path(tmp_path: Path) -> None:
    with Fabric(N, subnet=5) as fabric:
        # a00 is the server in all its pairs: its control ports answer nothing
        listener = fabric.hang_peer(0, range(BASE_PORT, BASE_PORT + N))
        ctx = mesh_ctx(fabric, tmp_path)
        ctx.previous = {"last_full_ts": ctx.clock()}
        snap, findings = run(ctx)
        in_hung_ns = fabric.pids(0)
        others = [fabric.pids(i) for i in range(1, N)]
    hung = [p for p in snap["tournament"] if "a00" in (p["a"], p["b"])]
    assert {p["status"] for p in hung} == {"timeout"}
    assert codes(findings) == {("EFA_ADAPTER_BROKEN", "efa:a00")}
    assert set(in_hung_ns) <= {listener.pid}  # only our listener: every fi_pingpong was killed
    assert others == [[] for _ in range(1, N)]
