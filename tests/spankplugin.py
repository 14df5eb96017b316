"""Build the SPANK plugin contrib/spank/hma_auto_resume.so, and the srun stand-in that drives it
(tests/standin/spank/harness.c), for the unit and integration tests.

Both go through the plugin's own Makefile (the one the packages use) against the Slurm headers
of ``include`` (a folder holding ``slurm/spank.h``: /usr/include with libslurm-dev).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "contrib" / "spank"
HARNESS = ROOT / "tests" / "standin" / "spank" / "harness.c"
INCLUDE = "/usr/include"


def why_not(include: str = INCLUDE) -> Optional[str]:
    """None when the plugin can be built here, else why not."""
    for tool in ("cc", "make"):
        if shutil.which(tool) is None:
            return f"no {tool} on PATH (scripts/bootstrap installs gcc and make)"
    if not (Path(include) / "slurm" / "spank.h").is_file():
        return f"no {include}/slurm/spank.h (apt-get install libslurm-dev; scripts/bootstrap does)"
    return None


def _run(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {proc.stdout}{proc.stderr}")


def build_plugin(out: Path, include: str = INCLUDE) -> Path:
    """``make -C contrib/spank OUT=out``; the .so's path."""
    out.mkdir(parents=True, exist_ok=True)
    _run(["make", "-s", "-C", str(SOURCE), f"OUT={out}", f"SLURM_INCLUDE={include}"])
    return out / "hma_auto_resume.so"


def build_harness(out: Path, include: str = INCLUDE) -> Path:
    """The srun stand-in (exports the SPANK calls for the dlopened plugin); its path."""
    out.mkdir(parents=True, exist_ok=True)
    exe = out / "srun-harness"
    _run(["cc", "-std=c99", "-Wall", "-Werror", f"-I{include}", "-rdynamic", "-o", str(exe),
          str(HARNESS), "-ldl"])  # fmt: skip
    return exe
