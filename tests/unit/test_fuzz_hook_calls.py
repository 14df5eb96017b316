"""Fuzz of the cluster API hooks (issue 28, part 7): the number of hook calls after each fault.

With ``reboot_mode = replace_mode = "command"`` (docs/remediation.md), a generated sequence of
events (a fault raised, seen again in the same boot, the node back from a reboot healthy or with
the fault again, a restart of the agent on the same state store) is applied to the engine, and
the hook calls are counted against a small model: one drain per episode, one reboot per episode
and boot while the fault's reboots in the window stay below ``max_reboots``, then one replace per
episode. Every call carries its own ``HMA_ACTION_ID``. A hook that fails, hangs or prints escape
sequences is retried with backoff and its output reaches the status escaped.
"""

from __future__ import annotations

import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mutate import budget

from hma.remediation.engine import Remediator
from tests.faults import fault
from tests.unit.test_remediation_engine import FakeSlurm, make, run, writes

pytestmark = pytest.mark.timeout(120)

MAX_REBOOTS = 2
EVENTS = ("raise", "repeat", "reboot_healthy", "reboot_faulty", "restart")
UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def hook(tmp: Path, body: str = "exit 0") -> tuple[list[str], Path]:
    """A hook that logs ``HMA_ACTION HMA_ACTION_ID`` per call, then runs ``body``."""
    log = tmp / "hook.log"
    script = tmp / "hook"
    script.write_text(f'#!/bin/sh\necho "$HMA_ACTION $HMA_ACTION_ID" >> {log}\n{body}\n')
    script.chmod(0o755)
    return [str(script)], log


def calls(log: Path) -> list[tuple[str, str]]:
    if not log.exists():
        return []
    return [tuple(line.split(" ", 1)) for line in log.read_text().splitlines()]  # type: ignore[misc]


def agent(tmp: Path, fake: FakeSlurm, command: list[str], **more: Any) -> Remediator:
    return make(
        tmp,
        fake,
        reboot_mode="command",
        reboot_command=command,
        replace_mode="command",
        replace_command=command,
        max_reboots=MAX_REBOOTS,
        max_remediations=1000,
        max_drained_percent=100.0,
        **more,
    )


@dataclass
class Model:
    """What the hooks must have been asked: drains, reboots and replaces so far."""

    open: bool = False
    rebooted: bool = False  # the open episode's reboot was asked in this boot
    replaced: bool = False  # the open episode's replace was asked
    reboots: int = 0  # the fault's reboots in the window (all episodes)
    want: dict[str, int] = field(default_factory=lambda: {"drain": 0, "reboot": 0, "replace": 0})

    def act(self) -> None:
        if self.rebooted or self.replaced:
            return
        if self.reboots < MAX_REBOOTS:
            self.reboots += 1
            self.rebooted = True
            self.want["reboot"] += 1
        else:
            self.replaced = True
            self.want["replace"] += 1

    def fault(self) -> None:
        if not self.open:
            self.open = True
            self.want["drain"] += 1
        self.act()

    def new_boot(self, faulty: bool) -> None:
        self.rebooted = False
        if faulty:
            self.fault()
        elif self.open:
            self.open = self.replaced = False  # healthy in the new boot: resumed


@given(st.lists(st.sampled_from(EVENTS), min_size=1, max_size=7))
@budget(80)
def test_hooks_are_called_once_per_step_over_any_fault_sequence(events: list[str]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        command, log = hook(tmp)
        fake = FakeSlurm("n1")
        rem = agent(tmp, fake, command)
        model, boot, n = Model(), 1, 0
        for event in ("raise", *events):
            n += 1
            seen = fault(last=time.time() + n)  # Xid 79: reboot, cleared by a reboot
            if event == "restart":
                rem.close()
                rem = agent(tmp, fake, command)
                rem.refresh()  # the facts thread's first read (the engine runs unthreaded)
                continue
            if event in ("raise", "repeat"):
                model.fault()
                run(rem, (seen,), boot=f"b{boot}")
            else:
                boot += 1
                model.new_boot(event == "reboot_faulty")
                run(rem, (seen,) if event == "reboot_faulty" else (), boot=f"b{boot}")
            got = calls(log)
            have = {
                "drain": writes(fake).count("DRAIN"),
                "reboot": sum(1 for k, _ in got if k == "reboot"),
                "replace": sum(1 for k, _ in got if k == "replace"),
            }
            assert have == model.want, (event, events, rem.status()["actions"])
            ids = [i for _k, i in got]
            assert len(ids) == len(set(ids)), ids  # each call its own action
        rem.close()


@pytest.mark.parametrize(
    "body",
    [
        "printf '\\033[2J\\033]0;x\\007\\342\\200\\256' >&2; exit 255",
        "exec sleep 600",
        "head -c 200000 /dev/zero | tr '\\0' 'e' >&2; exit 1",
    ],
)
def test_a_failing_hook_is_retried_until_it_accepts_and_never_doubled(
    tmp_path: Path, body: str
) -> None:
    command, log = hook(tmp_path, f"[ -e {tmp_path}/ok ] && exit 0\n{body}")
    fake = FakeSlurm("n1")
    rem = agent(tmp_path, fake, command, command_timeout=0.5, retry_min=0.05, retry_max=0.1)
    run(rem, (fault(),))
    row = next(r for r in rem.status()["actions"] if r["kind"] == "reboot")
    assert row["state"] == "failed" and row["attempts"] >= 1
    assert not UNSAFE.search(row["last_error"]) and len(row["last_error"]) <= 400
    (tmp_path / "ok").touch()
    time.sleep(0.15)
    rem.flush(5)
    row = next(r for r in rem.status()["actions"] if r["kind"] == "reboot")
    assert row["state"] == "done"
    got = calls(log)
    assert {i for _k, i in got} == {row["key"]}  # retries carry the same id
    assert got[-1][0] == "reboot" and writes(fake).count("DRAIN") == 1
