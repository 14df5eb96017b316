"""The GPU reset the NVIDIA family hands to remediation (probes/nvidia/reset.py): its command,
timeout and messages, with a stand-in runner; loaded through entry point group hma.repairs."""

from __future__ import annotations

from typing import Any, Optional

import pytest

from hma.adapters.command import CommandResult, CommandRunner
from hma.probes.nvidia.reset import GpuReset
from hma.remediation import repair


class Canned(CommandRunner):
    """Serves one result and notes what was run."""

    def __init__(self, rc: Optional[int], out: str = "", err: str = "", **kw: Any) -> None:
        super().__init__()
        self.result = (rc, out, err, kw)
        self.ran: list[tuple[tuple[str, ...], float]] = []

    def run(self, argv: Any, timeout: float, env: Any = None, stdin: Any = None) -> CommandResult:
        self.ran.append((tuple(argv), timeout))
        rc, out, err, kw = self.result
        return CommandResult(tuple(argv), rc, out, err, 0.1, **kw)


@pytest.mark.parametrize(
    ("component", "why"),
    [
        ("gpu:0000:3b:00", ""),
        ("gpu:00000001:5d:00", ""),
        ("gpu:0", "'gpu:0' is not a GPU's PCI address"),
        ("node", "'node' is not a GPU's PCI address"),
    ],
)
def test_only_a_gpu_pci_address_can_be_reset(component: str, why: str) -> None:
    assert GpuReset(["nvidia-smi"], 120.0, Canned(0)).why_not(component) == why


@pytest.mark.parametrize(
    ("result", "ok", "detail"),
    [
        (
            (0, "GPU 00000000:3B:00.0 was successfully reset.\n", "", {}),
            True,
            "GPU 00000000:3B:00.0 was successfully reset.",
        ),
        ((0, "", "", {}), True, ""),
        (
            (3, "", "In use by another client", {}),
            False,
            "GPU reset of gpu:0000:3b:00 failed (exited 3): In use by another client",
        ),
        (
            (None, "", "", {"timed_out": True}),
            False,
            "GPU reset of gpu:0000:3b:00 failed (timed out after 120 s)",
        ),
        (
            (None, "", "", {"error": "No such file"}),
            False,
            "GPU reset of gpu:0000:3b:00 failed (exited None): No such file",
        ),
        ((0, "ok\x1b[31m", "", {}), True, "ok\\x1b[31m"),
    ],
)
def test_reset_runs_nvidia_smi_on_the_bus_id(
    result: tuple[Optional[int], str, str, dict[str, Any]], ok: bool, detail: str
) -> None:
    rc, out, err, kw = result
    runner = Canned(rc, out, err, **kw)
    assert GpuReset(["nvidia-smi"], 120.0, runner)("gpu:0000:3b:00") == (ok, detail)
    assert runner.ran == [(("nvidia-smi", "--gpu-reset", "-i", "00000000:3B:00.0"), 120.0)]


def test_the_reset_is_found_through_its_entry_point() -> None:
    reset = repair.gpu_reset(["/usr/bin/nvidia-smi"], 30.0)
    assert isinstance(reset, GpuReset)
    assert (reset.command, reset.timeout) == (("/usr/bin/nvidia-smi",), 30.0)
