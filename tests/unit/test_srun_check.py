"""``hma srun --auto-resume`` runs the hardware checks on the failed step's nodes before it
decides (hma.commands.srun_check): a fault only they find is resumed, healthy nodes are not."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from hma.commands import srun as ar
from hma.commands import srun_check
from tests.unit.test_autoresume import InPlace, client, only


def srun_stand_in(folder: Path, check_rc: int, step_rc: int = 1) -> list[str]:
    """An srun that records each call; the check step (``--request``) exits ``check_rc`` and
    leaves ``checked`` behind (what the agent's drain would show), the training step
    ``step_rc``."""
    code = (
        "import json, os, sys; p = sys.argv[1]; a = sys.argv[2:]; "
        "open(os.path.join(p, 'calls'), 'a').write(json.dumps(a) + '\\n'); "
        "c = '--request' in a; c and open(os.path.join(p, 'checked'), 'w').close(); "
        f"sys.exit({check_rc} if c else {step_rc})"
    )
    return [sys.executable, "-c", code, str(folder)]


def run(tmp_path: Path, check_rc: int, fault_found: bool, wait: str = "7") -> tuple[int, str, Any]:
    state = InPlace()
    answers = state.answers()
    healthy = only("sinfo-healthy.txt", "node1") + only("sinfo-healthy.txt", "node2")
    faulty = answers[("sinfo",)]
    checked = tmp_path / "checked"
    answers[("sinfo",)] = lambda _argv: faulty if fault_found and checked.exists() else healthy
    cl, _runner = client(answers)
    err = io.StringIO()
    old, sys.stderr = sys.stderr, err
    env = {"SLURM_JOB_ID": "1", "HMA_AUTO_RESUME_CHECK_WAIT": wait}
    try:
        rc = ar.main(
            ["--auto-resume=1", "--grace=0", "--replace-wait=5", "-N2", "train"],
            cl,
            ar.Log(None, err),
            env,
            srun_stand_in(tmp_path, check_rc),
        )
    finally:
        sys.stderr = old
    calls = [json.loads(line) for line in (tmp_path / "calls").read_text().splitlines()]
    return rc, err.getvalue(), calls


def test_the_check_line() -> None:
    assert srun_check.argv("5", ["node1", "node2"], 90, ["/usr/bin/hma"]) == [
        "srun",
        "--jobid=5",
        "--overlap",
        "--nodelist=node1,node2",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--time=2",
        "--kill-on-bad-exit=0",
        "/usr/bin/hma",
        "check",
        "--request",
        "--wait=90",
    ]


def test_a_fault_only_the_checks_find_is_resumed(tmp_path: Path) -> None:
    rc, err, calls = run(tmp_path, check_rc=2, fault_found=True)
    assert calls[1] == srun_check.argv("1", ["node1", "node2"], 7, srun_check.program())[1:]
    assert "running the hardware checks on node1,node2" in err
    assert "hardware checks found faults on node1,node2; deciding on what the agents marked" in err
    assert "hardware fault on node1" in err and "resuming (attempt 1 of 1)" in err
    assert "the job runs on node2,node4; running the step again" in err
    assert rc == 1  # the stand-in's step fails again: attempts used


def test_a_failure_on_nodes_that_pass_the_checks_is_not_resumed(tmp_path: Path) -> None:
    rc, err, calls = run(tmp_path, check_rc=0, fault_found=False)
    assert rc == 1 and len(calls) == 2  # the step, the checks: never run again
    assert "hardware checks passed on node1,node2" in err
    assert "not a hardware failure, not resumed; exit 1" in err


@pytest.mark.parametrize("check_rc", [3, 127])
def test_checks_that_cannot_run_leave_the_decision_to_what_is_marked(
    tmp_path: Path, check_rc: int
) -> None:
    rc, err, _calls = run(tmp_path, check_rc=check_rc, fault_found=False)
    assert f"could not run or give a verdict everywhere (exit {check_rc}" in err
    assert rc == 1 and "not a hardware failure, not resumed" in err


def test_check_wait_zero_runs_no_checks(tmp_path: Path) -> None:
    rc, err, calls = run(tmp_path, check_rc=2, fault_found=True, wait="0")
    assert len(calls) == 1 and "hardware checks" not in err
    assert rc == 1 and "not a hardware failure" in err


def test_srun_missing(tmp_path: Path) -> None:
    checked = srun_check.run("1", ["node1"], 1.0, [str(tmp_path / "no-srun")])
    assert checked.rc is None and "cannot run the hardware checks on node1" in checked.message
