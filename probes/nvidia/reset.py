"""The GPU reset remediation asks for: ``nvidia-smi --gpu-reset -i <PCI bus id>`` of one GPU.

Registered in entry point group ``hma.repairs`` as ``gpu_reset``, so that remediation runs it
without knowing nvidia-smi: it gives the ``[recovery]`` command and timeout, asks ``why_not`` of
a component before anything else, and calls the reset on a drained node past the breaker.
"""

from __future__ import annotations

import re
from typing import Optional, Sequence

from hma.adapters.command import CommandRunner
from hma.adapters.text import printable

# A GPU component as hma names it (``gpu:<domain>:<bus>:<device>``, hex).
_GPU = re.compile(r"gpu:([0-9a-f]{4,8}):([0-9a-f]{2}):([0-9a-f]{2})")
# Characters of the tool's output kept in the outcome (before escaping).
OUTPUT = 300


def pci_bus_id(component: str) -> Optional[str]:
    """The PCI bus id nvidia-smi names a GPU by (``00000000:3B:00.0``) of a GPU component
    (``gpu:0000:3b:00``); None when ``component`` is not one."""
    m = _GPU.fullmatch(component)
    if m is None:
        return None
    return f"{m.group(1).zfill(8)}:{m.group(2)}:{m.group(3)}.0".upper()


class GpuReset:
    """Resets one GPU with ``command`` (``[recovery] gpu_reset_command``) within ``timeout``
    seconds (``gpu_reset_timeout``)."""

    def __init__(
        self, command: Sequence[str], timeout: float, runner: Optional[CommandRunner] = None
    ) -> None:
        self.command = tuple(command)
        self.timeout = timeout
        self.runner = runner or CommandRunner()

    def why_not(self, component: str) -> str:
        """Why ``component`` cannot be reset ("" it can)."""
        return "" if pci_bus_id(component) else f"{component!r} is not a GPU's PCI address"

    def __call__(self, component: str) -> tuple[bool, str]:
        """Reset the GPU ``component``: (whether it worked, its output or why it failed)."""
        argv = [*self.command, "--gpu-reset", "-i", str(pci_bus_id(component))]
        result = self.runner.run(argv, self.timeout)
        # cut before escaping, so that an escape is never cut in half
        out = printable((result.stdout.strip() + " " + result.stderr.strip()).strip()[:OUTPUT])
        if not result.ok:
            what = (
                f"timed out after {self.timeout:g} s" if result.timed_out else f"exited {result.rc}"
            )
            why = out or printable(result.error)
            return False, f"GPU reset of {component} failed ({what})" + (f": {why}" if why else "")
        return True, out
