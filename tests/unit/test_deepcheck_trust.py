"""Deep checks pass only on complete, well-formed, in-range results; a tool that cannot run is
unknown, never a fault and never a pass (issue 23)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mutate import budget, garbage_text

from hma.adapters.command import CommandResult
from hma.contracts.catalogue import load_builtin
from hma.contracts.model import RunStatus, Severity
from hma.deepcheck import parse, record, stages
from hma.deepcheck.node import document

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "deepcheck"
DCGM = (FIX / "dcgmi-diag-sm-stress-fail.json").read_text()
NCCOM = (FIX / "nccom-test-allr.txt").read_text()
# fi_pingpong (Debian libfabric-bin 1.17, tcp provider, -I 5 -S 64) on the development VM: a
# slow provider prints 0.00 MB/sec for small messages.
PINGPONG_HEAD = "bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec\n"
PINGPONG = (
    PINGPONG_HEAD + "64      5       =5       640         0.16s      0.00   15774.80       0.00\n"
)
# The same fi_pingpong client when libfabric has no such provider (exit 61), and after its
# adapter lost its address (exit 101: the exchange did not happen, a real failure).
NO_PROVIDER = "fi_getinfo(): util/pingpong.c:1489, ret=-61 (No data available)\n"
UNREACHABLE = "[error] util/pingpong.c:408 : failed to connect: Network is unreachable\n"
NO_LIBRARY = (
    "fi_pingpong: error while loading shared libraries: libfabric.so.1: cannot open shared "
    "object file: No such file or directory\n"
)
EFA_OPTS = {"efa_max_latency_us": {}, "efa_min_bandwidth_mbps": {}}
STRESS_YAML = "---\nmetrics:\n" + "".join(
    f"    - stressor: {s}\n      bogo-ops: {{{s}}}\n      wall-clock-time: 2.0\n"
    for s in stages.STRESSORS
)
VERDICTS = {"pass", "warn", "fail", "unknown"}


def done(stdout: str = "", rc: Optional[int] = 0, stderr: str = "") -> CommandResult:
    return CommandResult(("tool",), rc, stdout, stderr, 0.1)


def resolved(result: stages.StageResult) -> stages.StageResult:
    """Severity from the catalogue, as run_stages does."""
    cat = load_builtin()
    result.findings = [cat.resolve(f) for f in result.findings]
    result.verdict = stages.verdict_of(result.findings)
    return result


def efa(client: CommandResult) -> stages.StageResult:
    return resolved(stages.judge_efa({"a": stages.loopback_outcome(client)}, None, EFA_OPTS))


def dcgm_doc(edit: Any) -> str:
    """The real DCGM document with ``edit(result)`` applied to each result entry."""
    doc = json.loads(DCGM)
    for category in doc["DCGM GPU Diagnostic"]["test_categories"]:
        for test in category["tests"]:
            for result in test["results"]:
                edit(test["name"], result)
    return json.dumps(doc)


def assert_unknown(res: stages.StageResult) -> None:
    assert res.verdict == "unknown", res.message
    assert {f.code for f in res.findings} == {"DEEP_STAGE_UNKNOWN"}
    assert res.run_status is RunStatus.FAILED  # clears nothing
    json.dumps(document("n1", [res]), allow_nan=False)


# --- fi_pingpong readings --------------------------------------------------------------------


def test_real_pingpong_reading_passes() -> None:
    assert parse.pingpong(PINGPONG) == {"latency_us": 15774.8, "bandwidth_mbps": 0.0}
    res = efa(done(PINGPONG))
    assert (res.verdict, res.findings) == ("pass", [])


@pytest.mark.parametrize(
    "latency, bandwidth",
    [
        ("nan", "900.5"),
        ("12.5", "nan"),
        ("inf", "900.5"),
        ("12.5", "inf"),
        ("-inf", "900.5"),
        ("-12.5", "900.5"),
        ("12.5", "-900.5"),
        ("0.00", "900.5"),
        ("1e30", "900.5"),
        ("12.5", "1e30"),
        ("12.5", "1e999"),
    ],
)
def test_pingpong_non_readings_are_unknown(latency: str, bandwidth: str) -> None:
    text = PINGPONG_HEAD + f"64 5 =5 640 0.16s {bandwidth} {latency} 0.00\n"
    with pytest.raises(ValueError, match="not a reading"):
        parse.pingpong(text)
    assert_unknown(efa(done(text)))


# --- tools that could not run ----------------------------------------------------------------


@pytest.mark.parametrize(
    "rc, stderr",
    [
        (-11, ""),
        (139, "Segmentation fault (core dumped)"),
        (127, "fi_pingpong: not found"),
        (126, "fi_pingpong: Permission denied"),
        (61, NO_PROVIDER),
        (127, NO_LIBRARY),
    ],
)
def test_pingpong_that_cannot_run_is_unknown(rc: int, stderr: str) -> None:
    res = efa(done("", rc=rc, stderr=stderr))
    assert_unknown(res)
    assert res.details["adapters"]["a"]["status"] == "error"


def test_pingpong_that_ran_and_failed_is_a_fault() -> None:
    res = efa(done("", rc=101, stderr=UNREACHABLE))
    assert [f.code for f in res.findings] == ["DEEP_EFA_LOOPBACK_FAILED"]
    assert res.verdict == "fail" and "unreachable" in res.findings[0].message


@pytest.mark.parametrize("rc", [-11, 139, 127, 126, -9, 137])
def test_crashed_tools_are_unknown_in_every_stage(rc: int) -> None:
    yaml = STRESS_YAML.format(cpu=10, vm=10, hdd=10)
    for res in (
        stages.judge_dcgm(done(DCGM, rc=rc), 2),
        stages.judge_neuron(done(NCCOM), done("", rc=rc)),
        stages.judge_neuron(done(NCCOM, rc=rc), None),
        stages.judge_stress(done("", rc=rc, stderr="stress-ng: fail: [1] vm: x"), yaml),
    ):
        assert_unknown(resolved(res))
        (why,) = [f.message for f in res.findings]
        assert "killed by signal" in why or f"exited {rc}" in why


# --- DCGM --------------------------------------------------------------------------------------


@pytest.mark.parametrize("ids", [None, "", " , "])
def test_dcgm_fail_without_gpu_ids_is_unknown(ids: Optional[str]) -> None:
    def edit(name: str, result: dict[str, Any]) -> None:
        if result["status"] == "FAIL":
            result.pop("gpu_ids")
            if ids is not None:
                result["gpu_ids"] = ids

    res = resolved(stages.judge_dcgm(done(dcgm_doc(edit)), 2))
    assert_unknown(res)
    assert "sm_stress fail names no GPU" in res.message


def test_dcgm_all_skip_is_unknown() -> None:
    def edit(name: str, result: dict[str, Any]) -> None:
        result["status"] = "SKIP"

    res = resolved(stages.judge_dcgm(done(dcgm_doc(edit)), 2))
    assert_unknown(res)
    assert "every test skipped on GPU 0, 1, 2, 3" in res.message


def test_dcgm_gpu_never_tested_is_unknown_and_a_failure_still_counts() -> None:
    def edit(name: str, result: dict[str, Any]) -> None:
        if result["status"] != "FAIL":
            result["status"] = "SKIP" if result.get("gpu_ids") != "1" else "PASS"

    res = resolved(stages.judge_dcgm(done(dcgm_doc(edit)), 2))
    assert res.verdict == "fail"  # sm_stress FAILed on every GPU: tested, and a fault
    assert {f.code for f in res.findings} == {"DEEP_DCGM_FAIL"}

    def untested(name: str, result: dict[str, Any]) -> None:
        result["status"] = "PASS" if name == "pcie" else "SKIP"
        if name == "pcie":
            result["gpu_ids"] = "0,1,2"

    res = resolved(stages.judge_dcgm(done(dcgm_doc(untested)), 2))
    assert_unknown(res)
    assert "every test skipped on GPU 3" in res.message


# --- stress-ng ---------------------------------------------------------------------------------


@pytest.mark.parametrize("hdd", ["0", "0.0", "-5", "nan", "inf", ""])
def test_stress_disk_that_did_no_work_is_unknown(hdd: str) -> None:
    res = resolved(stages.judge_stress(done(""), STRESS_YAML.format(cpu=812, vm=40, hdd=hdd)))
    assert_unknown(res)
    assert "hdd did no work" in res.message


def test_stress_that_did_the_work_passes() -> None:
    res = resolved(stages.judge_stress(done(""), STRESS_YAML.format(cpu=812, vm=40, hdd=8192)))
    assert (res.verdict, res.findings) == ("pass", [])


# --- recording: unknown clears nothing ---------------------------------------------------------


def test_a_stage_with_an_unknown_part_is_not_a_complete_observation() -> None:
    res = efa(done("", rc=101, stderr=UNREACHABLE))
    both = resolved(
        stages.judge_efa(
            {"a": stages.loopback_outcome(done("", rc=-11)), "b": res.details["adapters"]["a"]},
            None,
            EFA_OPTS,
        )
    )
    assert both.verdict == "fail"
    assert both.run_status is RunStatus.FAILED  # b's fault raised, a's earlier fault kept
    (run,) = record.to_payload([both])["runs"]
    assert run["status"] == "failed"
    assert {f["code"] for f in run["findings"]} == {
        "DEEP_STAGE_UNKNOWN",
        "DEEP_EFA_LOOPBACK_FAILED",
    }


def test_busbw_non_readings_are_refused() -> None:
    head = "#  size count type redop root time algbw busbw #wrong\n"
    for value in ("nan", "inf", "-3.5", "1e999", "1e9"):
        with pytest.raises(ValueError, match="not a reading"):
            parse.busbw(head + f"1024 256 float sum -1 10.0 1.0 {value} 0\n")
    assert parse.busbw(head + "1024 256 float sum -1 10.0 1.0 0.00 0\n")["busbw_gbps"] == 0.0


# --- property: any text is a well-formed pass, a fault with evidence, or unknown ---------------


def check(res: stages.StageResult) -> None:
    """The invariant every judged stage keeps."""
    res = resolved(res)
    assert res.verdict in VERDICTS
    json.dumps(document("n1", [res]), allow_nan=False)  # no NaN/Infinity, never raises
    if res.verdict == "pass":
        assert res.findings == [] and res.run_status is RunStatus.RAN
    if res.verdict == "fail":
        critical = [f for f in res.findings if f.severity is Severity.CRITICAL]
        assert critical and all(f.details for f in critical)
    if res.verdict == "unknown":
        assert res.run_status is RunStatus.FAILED


RCS = st.sampled_from([0, 0, 0, 1, 2, 61, 101, 126, 127, 139, 226, 255, -6, -11])
TEXT = st.one_of(garbage_text(), st.text(max_size=200))
READING = st.one_of(
    garbage_text(),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.floats(min_value=0, max_value=1e7).map(lambda v: f"{v:.2f}"),
)


@budget(300)
@given(rc=RCS, text=TEXT, stderr=TEXT, lat=READING, bw=READING, table=st.booleans())
def test_pingpong_any_text(rc: int, text: str, stderr: str, lat: str, bw: str, table: bool) -> None:
    out = PINGPONG_HEAD + f"64 5 =5 640 0.16s {bw} {lat} 0.00\n" + text if table else text
    outcome = stages.loopback_outcome(done(out, rc=rc, stderr=stderr))
    res = stages.judge_efa({"a": outcome}, None, EFA_OPTS)
    check(res)
    if outcome["status"] == "ok":
        assert rc == 0
        assert 0 < outcome["latency_us"] <= parse.MAX_PINGPONG_LATENCY_US
        assert 0 <= outcome["bandwidth_mbps"] <= parse.MAX_PINGPONG_MBPS
    if outcome["status"] == "failed":
        assert rc not in (126, 127, 139, -6, -11)


@budget(200)
@given(rc=RCS, text=TEXT, status=st.sampled_from(["PASS", "FAIL", "SKIP", "WARN"]), ids=TEXT)
def test_dcgm_any_text(rc: int, text: str, status: str, ids: str) -> None:
    check(stages.judge_dcgm(done(text, rc=rc), 2))
    doc = {
        "DCGM GPU Diagnostic": {
            "test_categories": [
                {
                    "category": "Stress",
                    "tests": [{"name": "t", "results": [{"gpu_ids": ids, "status": status}]}],
                }
            ]
        }
    }
    res = resolved(stages.judge_dcgm(done(json.dumps(doc), rc=rc), 2))
    check(res)
    if res.verdict == "pass":
        assert status == "PASS" and ids.strip()


@budget(200)
@given(rc=RCS, cpu=READING, vm=READING, hdd=READING, stderr=TEXT)
def test_stress_any_metrics(rc: int, cpu: str, vm: str, hdd: str, stderr: str) -> None:
    res = resolved(
        stages.judge_stress(
            done("", rc=rc, stderr=stderr), STRESS_YAML.format(cpu=cpu, vm=vm, hdd=hdd)
        )
    )
    check(res)
    if res.verdict == "pass":
        assert all(math.isfinite(float(v)) and float(v) > 0 for v in (cpu, vm, hdd))


@budget(200)
@given(rc=RCS, text=TEXT, hw_rc=RCS)
def test_neuron_any_text(rc: int, text: str, hw_rc: int) -> None:
    res = resolved(stages.judge_neuron(done(text, rc=rc), done("", rc=hw_rc)))
    check(res)
    if {rc, hw_rc} <= {126, 127, 139, -6, -11}:
        assert res.verdict == "unknown"
