"""What shows whether the event sources run (issue 28): the supervisor's states, the kernel-log
source's backend and why it cannot run, its blind finding on a node with accelerators, and the
states in status.json, ``hma status`` and the metrics."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Optional

import pytest

from hma.adapters.command import CommandRunner
from hma.adapters.files import RootReader
from hma.commands import status as status_cmd
from hma.contracts.model import Finding, ProbeRun
from hma.contracts.source import STATES, MemoryKV, SourceContext
from hma.detection import sources
from hma.detection.sources import SourceState, SourceSupervisor
from hma.probes.kernel_log import source as kernel_log
from hma.probes.kernel_log.source import NO_KERNEL_RECORDS, KernelLogSource
from hma.reporters import prometheus
from tests.unit.test_kernel_log_journal import ENTRIES, FakeJournal

NOW = 1_800_000_000.0


class Source:
    """A source that runs ``body(ctx)`` (then waits for the stop), or does not apply."""

    def __init__(self, body: Callable[[Any], None], reason: str = "") -> None:
        self.body, self.reason = body, reason

    def applies(self, ctx: Any) -> str:
        return self.reason

    def blind_finding(self, ctx: Any, reason: str) -> Optional[Finding]:
        return Finding("HMA_KERNEL_LOG_BLIND", "source:src", reason, {})

    def run(self, ctx: Any, emit: Any) -> None:
        self.body(ctx)
        ctx.stop.wait(30)


def supervise(source: Any) -> tuple[SourceSupervisor, list[ProbeRun]]:
    reports: list[ProbeRun] = []
    sup = SourceSupervisor(lambda: NOW, lambda prefix: MemoryKV(), reports.append, lambda f: None)
    setup = SimpleNamespace(
        sources={"src": source},
        config=SimpleNamespace(sources={"src": {"enabled": True}}),
        source_context=lambda name, boot, kv: SimpleNamespace(stop=None),
    )
    sup.start(setup, "b")  # type: ignore[arg-type]
    return sup, reports


def until(sup: SourceSupervisor, check: Callable[[SourceState], bool]) -> SourceState:
    deadline = time.monotonic() + 20
    while True:
        [state] = sup.states()
        if check(state):
            return state
        assert time.monotonic() < deadline, state
        time.sleep(0.01)


def wait_for(check: Callable[[], bool]) -> None:
    """Wait until ``check()`` holds (the report follows the state change on the source's
    thread)."""
    deadline = time.monotonic() + 20
    while not check():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_source_that_does_not_apply_is_shown_with_why_and_its_blind_finding() -> None:
    sup, reports = supervise(Source(lambda ctx: None, reason="no kmsg"))
    state = until(sup, lambda s: s.state != "starting")
    sup.stop()
    assert (state.state, state.reason, state.backend) == ("not-applicable", "no kmsg", "")
    wait_for(lambda: bool(reports))
    assert [f.code for f in reports[0].findings] == ["HMA_KERNEL_LOG_BLIND"]


def test_a_running_source_says_what_it_reads_and_when_it_reads_nothing() -> None:
    told = threading.Event()

    def body(ctx: Any) -> None:
        ctx.started("journal", "the journal is empty", True)
        told.wait(20)
        ctx.started("journal", "backend = journal")

    sup, reports = supervise(Source(body))
    try:
        state = until(sup, lambda s: s.state == "blind")
        assert (state.backend, state.reason) == ("journal", "the journal is empty")
        wait_for(
            lambda: bool(reports)
            and [f.code for f in reports[-1].findings] == ["HMA_KERNEL_LOG_BLIND"]
        )
        told.set()
        state = until(sup, lambda s: s.state == "running" and s.backend == "journal")
        assert state.reason == "backend = journal"
        # reads again: the blind finding clears
        wait_for(lambda: bool(reports) and reports[-1].findings == ())
    finally:
        sup.stop()


def test_a_source_that_keeps_failing_is_restarting_then_failed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sources, "BACKOFF_MIN_S", 0.01)

    def body(ctx: Any) -> None:
        raise OSError("kmsg went away")

    sup, _reports = supervise(Source(body))
    try:
        state = until(sup, lambda s: s.state in ("restarting", "failed"))
        assert "OSError: kmsg went away" in state.reason
        state = until(sup, lambda s: s.state == "failed")
        assert state.failures >= sources.FAILED_AFTER
    finally:
        sup.stop()


# --- the kernel-log source --------------------------------------------------------------------


def context(tmp_path: Path, sysfs: Optional[Path] = None, **options: Any) -> SourceContext:
    opts = {k: o.default for k, o in KernelLogSource.options.items()}
    opts.update(path=str(tmp_path / "no-kmsg"), rules_dir=str(tmp_path / "none"), **options)
    root = RootReader(str(sysfs or tmp_path / "sys"))
    return SourceContext(opts, root, RootReader("/proc"), CommandRunner(), "b1", MemoryKV())


def test_applies_says_why_in_the_backend_chosen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = KernelLogSource()
    kmsg = source.applies(context(tmp_path, backend="kmsg"))
    assert kmsg is not None and kmsg.startswith("backend = kmsg, but ")
    assert "No such file" in kmsg and "systemd-python" not in kmsg
    # auto falls back to journald where systemd-python loads (a stand-in module here: the
    # compatibility venvs have none)
    monkeypatch.setattr(kernel_log, "_journal_module", lambda: object())
    assert source.applies(context(tmp_path, backend="auto")) is None
    monkeypatch.setattr(kernel_log, "_journal_module", lambda: None)
    journal = source.applies(context(tmp_path, backend="journal"))
    assert journal is not None and journal.startswith("backend = journal, but journald support")
    both = source.applies(context(tmp_path, backend="auto"))
    assert both is not None and "cannot be read" in both and "systemd-python" in both


def run_journal(ctx: SourceContext, fake: FakeJournal, told: list[tuple[Any, ...]]) -> None:
    ctx.started = lambda *args: told.append(args)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kernel_log, "_journal_module", lambda: fake)
        KernelLogSource().run(ctx, lambda finding: None)


def test_a_journal_without_kernel_records_is_told_blind_until_one_arrives(tmp_path: Path) -> None:
    ctx = context(tmp_path, backend="auto")
    fake = FakeJournal([], ctx.stop, stop_when_read=False)
    told: list[tuple[Any, ...]] = []
    runner = threading.Thread(target=run_journal, args=(ctx, fake, told))
    runner.start()
    try:
        assert fake.idle.wait(10)
        why = f"{tmp_path}/no-kmsg cannot be read: No such file or directory"
        assert told == [("journal", f"{why}; {NO_KERNEL_RECORDS}", True)]
        fake.append(ENTRIES[0])
        deadline = time.monotonic() + 10
        while len(told) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert told[1] == ("journal", why)
    finally:
        ctx.stop.set()
        runner.join(10)
    assert not runner.is_alive()


def test_a_journal_with_kernel_records_is_told_running(tmp_path: Path) -> None:
    ctx = context(tmp_path, backend="journal")
    told: list[tuple[Any, ...]] = []
    run_journal(ctx, FakeJournal(list(ENTRIES), ctx.stop), told)
    assert told == [("journal", "backend = journal")]


def gpu_root(tmp_path: Path) -> Path:
    dev = tmp_path / "gpu-sys" / "bus" / "pci" / "devices" / "0000:3b:00.0"
    dev.mkdir(parents=True)
    (dev / "vendor").write_text("0x10de\n")
    (dev / "class").write_text("0x030200\n")
    other = dev.parent / "0000:00:1f.0"  # an Intel bridge: not an accelerator
    other.mkdir()
    (other / "vendor").write_text("0x8086\n")
    (other / "class").write_text("0x060100\n")
    neuron = tmp_path / "gpu-sys" / "devices" / "virtual" / "neuron_device" / "neuron0"
    neuron.mkdir(parents=True)
    return tmp_path / "gpu-sys"


def test_the_blind_finding_is_raised_only_on_a_node_with_accelerators(tmp_path: Path) -> None:
    source = KernelLogSource()
    assert source.blind_finding(context(tmp_path), "no kmsg") is None
    finding = source.blind_finding(context(tmp_path, sysfs=gpu_root(tmp_path)), "no kmsg")
    assert finding is not None
    assert (finding.code, finding.component) == ("HMA_KERNEL_LOG_BLIND", "source:kernel_log")
    assert finding.details["devices"] == ["1 NVIDIA GPU(s)", "1 Neuron device(s)"]
    assert "no kmsg" in finding.message


# --- where they are shown --------------------------------------------------------------------

DOC_SOURCES = [
    SourceState("kernel_log", "blind", NOW - 60, "journal", NO_KERNEL_RECORDS).to_json(),
    SourceState("nvml_events", "failed", NOW - 5, "nvml", "NVMLError: gone", 3).to_json(),
]


def test_the_metric_is_one_hot_per_source() -> None:
    rows = prometheus.samples({"sources": DOC_SOURCES})["hma_source_state"]
    assert len(rows) == 2 * len(STATES)
    on = sorted((labels["source"], labels["state"]) for labels, value in rows if value == 1.0)
    assert on == [("kernel_log", "blind"), ("nvml_events", "failed")]


def test_hma_status_shows_each_source_its_backend_and_why() -> None:
    doc = {"node": "n1", "severity": "ok", "probes": [], "faults": [], "sources": DOC_SOURCES}
    text = status_cmd.render(doc, now=NOW)
    assert "Event sources (2):" in text
    [blind] = [line for line in text.splitlines() if line.startswith("  kernel_log")]
    assert "blind" in blind and "journal" in blind and "no kernel record" in blind
    [failed] = [line for line in text.splitlines() if line.startswith("  nvml_events")]
    assert "failed" in failed and "NVMLError: gone" in failed
    assert "Event sources" not in status_cmd.render({**doc, "sources": None}, now=NOW)
