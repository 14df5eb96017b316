"""Deep-check readers and judges over real captured outputs, failures, timeouts and garbage."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from hma.adapters.command import CommandResult
from hma.contracts.model import Finding, RunStatus, Severity
from hma.deepcheck import parse, record, stages

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "deepcheck"
DCGM = (FIX / "dcgmi-diag-sm-stress-fail.json").read_text()
NCCL = (FIX / "all_reduce_perf-2x8-h100.txt").read_text()
NCCOM = (FIX / "nccom-test-allr.txt").read_text()


def done(stdout: str = "", rc: int = 0, stderr: str = "", **kw: object) -> CommandResult:
    return CommandResult(("tool",), rc, stdout, stderr, 0.1, **kw)  # type: ignore[arg-type]


def resolved(result: stages.StageResult) -> stages.StageResult:
    """Severity from the catalogue, as run_stages does."""
    from hma.contracts.catalogue import load_builtin

    cat = load_builtin()
    result.findings = [cat.resolve(f) for f in result.findings]
    result.verdict = stages.verdict_of(result.findings)
    return result


def test_dcgm_real_failure_maps_dcgm_verdict_per_gpu() -> None:
    res = resolved(stages.judge_dcgm(done(DCGM, rc=226), 3))
    fails = [f for f in res.findings if f.code == "DEEP_DCGM_FAIL"]
    assert {f.component for f in fails} == {"gpu:0", "gpu:1", "gpu:2", "gpu:3"}
    assert all(f.details["test"] == "sm_stress" for f in fails)
    assert "did not exceed desired stress level" in fails[0].details["messages"][0]
    assert res.verdict == "fail"
    # SKIP (memory on GPU 0, ECC off) is neither a pass nor a fault
    assert not [f for f in res.findings if f.details.get("test") == "memory"]
    assert res.details["results"]["skip"] > 0


def test_dcgm_all_pass_is_pass() -> None:
    text = DCGM.replace('"FAIL"', '"PASS"').replace('"SKIP"', '"PASS"')
    res = resolved(stages.judge_dcgm(done(text), 1))
    assert (res.verdict, res.findings) == ("pass", [])


def test_dcgm_warn_is_a_warning() -> None:
    res = resolved(stages.judge_dcgm(done(DCGM.replace('"FAIL"', '"WARN"')), 2))
    assert res.verdict == "warn"
    assert {f.code for f in res.findings} == {"DEEP_DCGM_WARN"}


@pytest.mark.parametrize(
    "result, why",
    [
        (done(DCGM[: len(DCGM) // 2]), "not JSON"),
        (done("Error: unable to connect to host engine", rc=255), "not JSON"),
        (done('{"DCGM GPU Diagnostic": {"test_categories": []}}'), "no test results"),
        (done(DCGM.replace('"FAIL"', '"MAYBE"')), "unknown status"),
        (done(DCGM.replace('"gpu_ids": "0"', '"gpu_ids": "zero"')), "bad gpu_ids"),
        (done("", rc=None, timed_out=True), "timed out"),
        (CommandResult(("dcgmi",), None, "", "", 0.0, error="dcgmi: Permission denied"), "denied"),
    ],
)
def test_dcgm_garbage_and_timeouts_are_unknown(result: CommandResult, why: str) -> None:
    res = resolved(stages.judge_dcgm(result, 2))
    assert res.verdict == "unknown"
    assert [f.code for f in res.findings] == ["DEEP_STAGE_UNKNOWN"]
    assert res.findings[0].severity is Severity.UNKNOWN
    assert why in res.message
    assert res.run_status is RunStatus.FAILED  # not a good observation


def test_busbw_reads_the_largest_size() -> None:
    table = parse.busbw(NCCL)
    assert (table["busbw_gbps"], table["size"], table["wrong"]) == (338.82, 8589934592, 0)
    assert table["avg_busbw_gbps"] == pytest.approx(70.742)
    assert parse.busbw(NCCOM)["busbw_gbps"] == pytest.approx(40.69)


def test_busbw_counts_wrong_results_and_refuses_garbage() -> None:
    lines = NCCL.splitlines()
    lines[-5] = lines[-5][:-1] + "3"  # in-place #wrong of one row
    assert parse.busbw("\n".join(lines))["wrong"] == 1
    for text in ("", "# nThread 1\n", NCCL.split("#  Rank  0")[0] + "size busbw\n"):
        with pytest.raises(ValueError):
            parse.busbw(text)


def test_stress_verification_failure_is_a_fault() -> None:
    err = "stress-ng: fail:  [123] vm: detected memory error, 0x12 != 0x13 at 0x7f00\n"
    res = resolved(stages.judge_stress(done("", rc=2, stderr=err), ""))
    assert res.verdict == "fail"
    assert res.findings[0].code == "DEEP_STRESS_FAILED"
    assert "detected memory error" in res.findings[0].details["failures"][0]


@pytest.mark.parametrize("rc", [1, 3, 4])
def test_stress_other_exit_codes_are_unknown(rc: int) -> None:
    assert stages.judge_stress(done("", rc=rc), "").verdict == "unknown"


def test_stress_missing_metrics_is_unknown() -> None:
    yaml = "---\nmetrics:\n    - stressor: cpu\n      bogo-ops: 10\n...\n"
    res = stages.judge_stress(done(""), yaml)
    assert res.verdict == "unknown" and "vm, hdd" in res.message
    assert stages.judge_stress(done(""), "metrics:\n  garbage\n").verdict == "unknown"


def test_neuron_nccom_and_hw_check() -> None:
    ok = resolved(stages.judge_neuron(done(NCCOM), done("")))
    assert ok.verdict == "pass" and ok.details["nccom-test"]["busbw_gbps"] == pytest.approx(40.69)
    bad = resolved(stages.judge_neuron(done(NCCOM), done("", rc=1, stderr="device 3: fail")))
    assert [f.code for f in bad.findings] == ["DEEP_NEURON_HW_CHECK_FAILED"]
    garbage = resolved(stages.judge_neuron(done("Segmentation fault"), None))
    assert garbage.verdict == "unknown" and garbage.details["hardware check"] == "not installed"


def test_efa_judge_thresholds_per_instance_type() -> None:
    opts = {"efa_max_latency_us": {"p5.48xlarge": 30.0}, "efa_min_bandwidth_mbps": {}}
    results = {
        "a": {"status": "ok", "latency_us": 12.0, "bandwidth_mbps": 900.0},
        "b": {"status": "ok", "latency_us": 45.0, "bandwidth_mbps": 900.0},
        "c": {"status": "failed", "rc": 1, "error": "fi_getinfo(): -61"},
        "d": {"status": "timeout"},
    }
    res = resolved(stages.judge_efa(results, "p5.48xlarge", opts))
    codes = {f.component: f.code for f in res.findings}
    assert codes == {
        "efa:b": "DEEP_EFA_LOOPBACK_SLOW",
        "efa:c": "DEEP_EFA_LOOPBACK_FAILED",
        "efa:d": "DEEP_STAGE_UNKNOWN",
    }
    other_type = resolved(stages.judge_efa({"b": results["b"]}, "trn1.32xlarge", opts))
    assert other_type.verdict == "pass"  # no limit known for this type: not judged


def test_payload_round_trip_and_malformed_entries() -> None:
    res = stages.StageResult(
        "dcgm", "fail", "x", [Finding("DEEP_DCGM_FAIL", "gpu:0", "m", {"t": 1})], started=5.0
    )
    skipped = stages.skipped("efa", "no adapters")
    payload = record.to_payload([res, skipped])
    assert [r["probe"] for r in payload["runs"]] == ["deep_check.dcgm"]
    payload["runs"] += [{"probe": "deep_check.x"}, {"probe": "gpu", "status": "ran"}]
    (run,) = record.from_payload(payload)
    assert run.probe == "deep_check.dcgm" and run.status is RunStatus.RAN
    assert run.findings[0].code == "DEEP_DCGM_FAIL" and run.findings[0].probe == run.probe


def test_config_refuses_unknown_stages_and_bad_limits(tmp_path: Path) -> None:
    from hma import assembly
    from hma.config.files import ConfigError

    cfg = tmp_path / "hma.toml"
    cfg.write_text(
        '[deep_check]\nstages = ["stress", "fuzz"]\ntimeouts = { dcgn = 5 }\n'
        'busbw_min_gbps = { "p5.48xlarge" = -1 }\ndcgm_level = 5\n'
    )
    with pytest.raises(ConfigError) as exc:
        assembly.load(str(cfg))
    text = "\n".join(exc.value.errors)
    for key in ("stages", "timeouts: unknown stage(s) dcgn", "busbw_min_gbps", "dcgm_level"):
        assert f"deep_check.{key}" in text


@pytest.mark.skipif(os.geteuid() != 0, reason="install_hma.sh checks for root first")
def test_install_script_wants_stages_after_deep_check() -> None:
    script = Path(__file__).resolve().parents[2] / "packaging" / "lifecycle" / "install_hma.sh"
    proc = subprocess.run(
        ["bash", str(script), "--deep-check"],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert proc.returncode == 1 and "--deep-check needs a comma-separated list" in proc.stderr
