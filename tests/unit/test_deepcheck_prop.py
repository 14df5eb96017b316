"""Property tests: the deep-check readers over mutated real outputs never raise, and what they
cannot read is unknown, never a fault (docs/unknown.md)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from mutate import budget, garbage_text

from hma.adapters.command import CommandResult
from hma.deepcheck import parse, stages

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "deepcheck"
DCGM = (FIX / "dcgmi-diag-sm-stress-fail.json").read_text()
NCCL = (FIX / "all_reduce_perf-2x8-h100.txt").read_text()
STATUS = '"status": "PASS"'


def done(text: str) -> CommandResult:
    return CommandResult(("tool",), 0, text, "", 0.1)


@budget(200)
@given(cut=st.integers(0, len(DCGM)), junk=garbage_text())
def test_dcgm_cut_or_spliced_is_unknown_or_judged(cut: int, junk: str) -> None:
    text = DCGM[:cut] + junk
    res = stages.judge_dcgm(done(text), 2)
    codes = {f.code for f in res.findings}
    try:
        json.loads(text)
    except ValueError:
        assert codes == {"DEEP_STAGE_UNKNOWN"}  # not JSON: never a fault
    else:
        assert codes <= {"DEEP_STAGE_UNKNOWN", "DEEP_DCGM_FAIL", "DEEP_DCGM_WARN"}


@budget(200)
@given(index=st.integers(0, DCGM.count(STATUS) - 1), value=garbage_text())
def test_dcgm_status_word_must_be_dcgms_own(index: int, value: str) -> None:
    pos = [m.start() for m in re.finditer(re.escape(STATUS), DCGM)][index]
    text = DCGM[:pos] + '"status": ' + json.dumps(value) + DCGM[pos + len(STATUS) :]
    res = stages.judge_dcgm(done(text), 2)
    if value.strip().lower() in parse.DCGM_VERDICTS:
        return
    assert [f.code for f in res.findings] == ["DEEP_STAGE_UNKNOWN"]


@budget(200)
@given(line=st.integers(0, NCCL.count("\n")), junk=garbage_text())
def test_busbw_reader_raises_value_error_only(line: int, junk: str) -> None:
    lines = NCCL.splitlines()
    lines[min(line, len(lines) - 1)] = junk
    try:
        table = parse.busbw("\n".join(lines))
    except ValueError:
        return
    assert table["busbw_gbps"] >= 0 and table["size"] > 0
