"""The probe context's wire format for worker processes: every field crosses, in one place."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest

from hma.adapters.command import CommandRunner
from hma.adapters.files import RootReader
from hma.contracts.model import RunStatus
from hma.contracts.probe import NodeFacts, ProbeContext
from hma.detection.runner import ProcessSlot, run_probe

PLUGINS = Path(__file__).resolve().parent.parent / "plugins"
NOT_SENT = {"clock"}  # a function: the worker uses time.time


def full_context() -> ProbeContext:
    """A context whose every field (and every node fact) differs from its default."""
    facts = NodeFacts(
        node_name="node7",
        job_running=True,
        job_ids=("41", "42"),
        slurm_configured=True,
        job_users=("alice", "bob"),
        slurm_state="draining@",
        slurm_reason="HMA: GPU_XID_79 gpu:0000:3b:00",
    )
    ctx = ProbeContext(
        options={"library": "/opt/libnvidia-ml.so.1", "expected_gpus": 8, "ids": [1, 2]},
        sysfs=RootReader("/tmp/sysroot"),
        procfs=RootReader("/tmp/procroot"),
        runner=CommandRunner(4096),
        instance_type="p5.48xlarge",
        facts=facts,
        previous={"kept": {"0000:3b:00": 16}, "gpus": [{"index": 0}]},
        previous_ts=1700000000.5,
        oneshot=True,
        boot_id="11111111-2222-3333-4444-555555555555",
        device_events=3,
        clock=lambda: 5.0,
    )
    # the same required fields, every other field at its default
    blank = ProbeContext(ctx.options, ctx.sysfs, ctx.procfs, ctx.runner)
    for obj, default in ((facts, NodeFacts()), (ctx, blank)):
        for name in (f.name for f in dataclasses.fields(obj)):
            if name not in ("options", "sysfs", "procfs", "runner"):
                assert getattr(obj, name) != getattr(default, name), f"set {name} here"
    return ctx


def comparable(ctx: ProbeContext) -> dict[str, Any]:
    """Every field of the context as plain values (readers by root, runner by output cap)."""
    out = {
        f: getattr(ctx, f) for f in (x.name for x in dataclasses.fields(ctx)) if f not in NOT_SENT
    }
    out.update(
        sysfs=ctx.sysfs.root,
        procfs=ctx.procfs.root,
        runner=ctx.runner.output_cap,
        facts=dataclasses.asdict(ctx.facts),
    )
    return out


def test_every_field_round_trips_through_json() -> None:
    ctx = full_context()
    back = ProbeContext.from_wire(json.loads(json.dumps(ctx.to_wire(), allow_nan=False)))
    assert comparable(back) == comparable(ctx)
    assert back.facts == ctx.facts  # tuples again, not lists
    assert back.clock is time.time


def test_previous_keys_trim_only_a_mapping() -> None:
    ctx = full_context()
    assert ctx.to_wire(("kept", "absent"))["previous"] == {"kept": {"0000:3b:00": 16}}
    assert ctx.to_wire(())["previous"] == {}
    listed = dataclasses.replace(ctx, previous=[1, 2])
    assert listed.to_wire(("kept",))["previous"] == [1, 2]


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda w: w.pop("options"), KeyError),
        (lambda w: w["facts"].update(unknown_fact=1), TypeError),
        (lambda w: w.update(device_events="many"), ValueError),
        (lambda w: w.update(output_cap=None), TypeError),
        (lambda w: w.update(facts=["node7"]), ValueError),
    ],
)
def test_a_bad_request_raises_what_the_worker_reports(change: Any, error: type) -> None:
    wire = full_context().to_wire()
    change(wire)
    with pytest.raises(error):
        ProbeContext.from_wire(wire)


@pytest.mark.timeout(60)
def test_a_worker_process_sees_the_whole_context(monkeypatch: Any) -> None:
    """Through the real worker: it rebuilt every field the agent sent, and got only the keys
    of the previous snapshot its probe declares."""
    monkeypatch.syspath_prepend(str(PLUGINS))  # the worker finds the plugin through sys.path
    from hma_testprobes import ContextProcessProbe

    ctx = full_context()
    slot = ProcessSlot(ContextProcessProbe())
    try:
        run = run_probe(slot, ctx, 30.0, time.time())
    finally:
        slot.close()
    assert run.status is RunStatus.RAN, run.error
    assert run.snapshot == json.loads(json.dumps(ctx.to_wire(("kept",))))
    assert run.snapshot["previous"] == {"kept": {"0000:3b:00": 16}}
    assert run.snapshot["facts"]["job_users"] == ["alice", "bob"]
