"""efa_mesh: scheduling, localization rules, skip_when_busy, and a real fi_pingpong on loopback."""

from __future__ import annotations

import itertools
import json
import os
import shutil
from pathlib import Path
from typing import Any, Optional

import pytest
from trn_support import codes, gen_sysfs, make_ctx

from hma.contracts.model import Severity
from hma.contracts.probe import NodeFacts
from hma.probes.efa.mesh import (
    EfaMeshProbe,
    Mesh,
    allowed_cores,
    broken_threshold,
    evaluate_mesh,
    parse_latency,
    resolve_endpoints,
    screen_index,
    tournament_rounds,
)
from tests.slurmcluster import free_port_block

pytestmark = pytest.mark.timeout(60)

PROBE = EfaMeshProbe()


def _disjoint(rnd: list[tuple[int, int]]) -> bool:
    seen = [x for pair in rnd for x in pair]
    return len(seen) == len(set(seen))


@pytest.mark.parametrize("n", [2, 3, 8, 31, 32])
def test_screens_rotate_through_the_tournament(n: int) -> None:
    """Each screen covers every adapter (but one when n is odd); n-1 screens cover every path."""
    rounds, previous, seen = tournament_rounds(n), None, set()
    for _ in range(len(rounds)):
        index = screen_index(n, previous)
        covered = {x for pair in rounds[index] for x in pair}
        assert len(covered) >= n - n % 2
        seen |= set(rounds[index])
        previous = {"screen_round": index}
    assert seen == set(itertools.combinations(range(n), 2))
    assert screen_index(n, previous) == 0  # and round again
    assert screen_index(n, {"screen_round": "x"}) == 0


@pytest.mark.parametrize("n", [2, 3, 4, 7, 8, 16, 32])
def test_tournament_covers_every_pair_once(n: int) -> None:
    rounds = tournament_rounds(n)
    pairs = [p for rnd in rounds for p in rnd]
    assert sorted(pairs) == sorted(itertools.combinations(range(n), 2))
    assert all(_disjoint(r) for r in rounds)
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)


def test_broken_threshold() -> None:
    assert broken_threshold(1) == 2
    assert broken_threshold(2) == 2
    assert broken_threshold(7) == 6  # 8 adapters: failing with 6 of 7 peers
    assert broken_threshold(31) == 24


# --- evaluation of synthetic snapshots --------------------------------------------------------


def _snap(n: int, bad: Any, test: str = "tournament") -> dict[str, Any]:
    names = [f"a{i}" for i in range(n)]
    rounds = tournament_rounds(n) if test == "tournament" else tournament_rounds(n)[:1]
    pairs = []
    for a, b in (p for rnd in rounds for p in rnd):
        status = bad(names[a], names[b])
        pairs.append(
            {
                "a": names[a],
                "b": names[b],
                "status": status,
                "latency_us": 20.0 if status == "ok" else None,
                "error": "" if status == "ok" else "boom",
            }
        )
    snap: dict[str, Any] = {"adapters": names, "error": "", "screen": pairs}
    if test == "tournament":
        snap["tournament"] = pairs
    return snap


def test_all_ok_is_silent() -> None:
    assert evaluate_mesh(_snap(8, lambda a, b: "ok")) == []


def test_one_adapter_failing_with_its_peers_is_broken() -> None:
    snap = _snap(8, lambda a, b: "timeout" if "a3" in (a, b) else "ok")
    findings = evaluate_mesh(snap)
    assert codes(findings) == {("EFA_ADAPTER_BROKEN", "efa:a3")}
    details = findings[0].details
    assert details["statuses"]["a0"] == "timeout" and len(details["failed_peers"]) == 7
    assert "matrix" not in details  # the matrix is written once, in the probe's summary


def test_an_isolated_pair_is_a_path_warning() -> None:
    findings = evaluate_mesh(_snap(8, lambda a, b: "failed" if {a, b} == {"a2", "a5"} else "ok"))
    assert codes(findings) == {("EFA_PATH_FAILED", "efa:a2")}
    assert findings[0].details["peers"] == ["a5"]
    assert findings[0].details["statuses"] == {"a5": "failed"}


def test_evidence_does_not_grow_with_the_findings() -> None:
    """26 failing paths on 32 adapters: each finding holds its own pairs, not the matrix."""
    bad = {(f"a{i}", f"a{(i * 7 + 3) % 32}") for i in range(26)}
    snap = _snap(32, lambda a, b: "failed" if (a, b) in bad or (b, a) in bad else "ok")
    findings = evaluate_mesh(snap)
    assert len(findings) >= 13 and {f.code for f in findings} == {"EFA_PATH_FAILED"}
    assert all(len(json.dumps(f.details)) < 1000 for f in findings)


def test_every_pair_failing_is_node_level() -> None:
    findings = evaluate_mesh(_snap(4, lambda a, b: "failed"))
    assert codes(findings) == {("EFA_MESH_ALL_FAILED", "node")}


def test_two_broken_adapters() -> None:
    snap = _snap(8, lambda a, b: "failed" if {a, b} & {"a1", "a6"} else "ok")
    assert codes(evaluate_mesh(snap)) == {
        ("EFA_ADAPTER_BROKEN", "efa:a1"),
        ("EFA_ADAPTER_BROKEN", "efa:a6"),
    }


def test_skipped_and_error_pairs_are_unknown() -> None:
    snap = _snap(4, lambda a, b: "skipped" if a == "a0" else "ok")
    findings = evaluate_mesh(snap)
    assert codes(findings) == {("EFA_MESH_ERROR", "node")}
    assert findings[0].severity is Severity.UNKNOWN
    assert evaluate_mesh({"error": "locked"})[0].code == "EFA_MESH_ERROR"


def test_summary_has_matrix() -> None:
    summary = PROBE.summary(_snap(4, lambda a, b: "ok"))
    assert summary is not None and summary["test"] == "tournament"
    assert summary["matrix"]["a0"]["a3"] == "ok"


def test_parse_latency() -> None:
    out = (
        "bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec\n"
        "64      10      =10      1.2k        0.04s      0.03    1997.35       0.00\n"
    )
    assert parse_latency(out) == 1997.35
    assert parse_latency("garbage") is None


# --- options ----------------------------------------------------------------------------------


def test_busy_node_is_skipped(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "trn1.32xlarge", neuron_devices=1)
    busy = NodeFacts(job_running=True, job_ids=("42",), slurm_configured=True)
    assert "42" in (PROBE.applies(make_ctx(EfaMeshProbe, root, facts=busy)) or "")
    ctx = make_ctx(EfaMeshProbe, root, facts=busy, skip_when_busy=False)
    assert PROBE.applies(ctx) is None
    unknown = NodeFacts(job_running=None, slurm_configured=True)
    assert PROBE.applies(make_ctx(EfaMeshProbe, root, facts=unknown)) is not None
    ctx = make_ctx(EfaMeshProbe, root, facts=unknown, run_when_unknown=True)
    assert PROBE.applies(ctx) is None
    no_slurm = NodeFacts(job_running=None, slurm_configured=False)
    assert PROBE.applies(make_ctx(EfaMeshProbe, root, facts=no_slurm)) is None


def test_adapters_from_sysfs_use_the_efa_domains(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "trn1.32xlarge", neuron_devices=1)
    ctx = make_ctx(EfaMeshProbe, root)
    eps = resolve_endpoints(ctx)
    assert len(eps) == 8 and eps[0].domain == f"{eps[0].name}-rdm"
    mesh = Mesh(ctx, eps, deadline=0)
    server = mesh.argv(eps[0], 47600, None)
    client = mesh.argv(eps[1], 47600, eps[0])
    assert server[:5] == ["fi_pingpong", "-p", "efa", "-e", "rdm"]
    assert server[-2:] == ["-B", "47600"] and client[-3:] == ["-P", "47600", "127.0.0.1"]
    assert ["-d", f"{eps[1].name}-rdm"] == client[client.index("-d") : client.index("-d") + 2]
    assert mesh.env["FI_EFA_ENABLE_SHM_TRANSFER"] == "0"


def test_one_adapter_is_unsupported(tmp_path: Path) -> None:
    ctx = make_ctx(EfaMeshProbe, tmp_path, adapters={"x": {"address": "127.0.0.1"}})
    assert "at least 2" in (PROBE.applies(ctx) or "")


def test_option_checks() -> None:
    opts = EfaMeshProbe.options
    assert opts["adapters"].validate({"a": {"address": "1.2.3.4", "netns": "x"}}) is None
    assert "unknown key" in (opts["adapters"].validate({"a": {"port": "1"}}) or "")
    assert opts["env"].validate({"X": 1}) is not None
    assert opts["domain_format"].validate("{nope}") is not None


# --- real fi_pingpong over loopback (no namespaces: all adapters on 127.0.0.1) ----------------


@pytest.mark.skipif(shutil.which("fi_pingpong") is None, reason="fi_pingpong not installed")
def test_real_fi_pingpong_on_loopback(tmp_path: Path) -> None:
    adapters = {f"lo{i}": {"address": "127.0.0.1"} for i in range(3)}
    ctx = make_ctx(
        EfaMeshProbe,
        tmp_path,
        adapters=adapters,
        provider="tcp",
        domain_format="",
        iterations=5,
        size=64,
        pair_timeout=10.0,
        base_port=free_port_block(3),
        full_interval=0.0,
        lock_file=str(tmp_path / "lock"),
    )
    assert PROBE.applies(ctx) is None
    snap = PROBE.collect(ctx)
    assert [p["status"] for p in snap["tournament"]] == ["ok"] * 3, snap["tournament"]
    assert all(p["latency_us"] > 0 for p in snap["tournament"])
    assert PROBE.evaluate(snap, ctx) == []
    # a second run while the lock is held reports it instead of overlapping
    from hma.probes.efa.mesh import _locked

    with _locked(str(tmp_path / "lock")):
        held = PROBE.collect(ctx)
    assert codes(PROBE.evaluate(held, ctx)) == {("EFA_MESH_ERROR", "node")}


@pytest.mark.parametrize(
    "cpu_max,expect",
    [("50000 100000\n", 1), ("max 100000\n", None), ("150000 100000\n", 2), (None, None)],
)
def test_allowed_cores_follow_affinity_and_cgroup_quota(
    tmp_path: Path, cpu_max: Optional[str], expect: Optional[int]
) -> None:
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text("0::/system.slice/hma.service\n")
    if cpu_max is not None:
        group = tmp_path / "sys/fs/cgroup/system.slice/hma.service"
        group.mkdir(parents=True)
        (group / "cpu.max").write_text(cpu_max)
    affinity = len(os.sched_getaffinity(0))
    want = affinity if expect is None else min(affinity, expect)
    assert allowed_cores(str(tmp_path)) == want
