"""Shared test helpers: isolated configs, running the real `hma` command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
PLUGINS = ROOT / "tests" / "plugins"


class Env:
    """An isolated agent installation: config, state and run folders under tmp_path."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.config = base / "hma.toml"
        self.state = base / "state"
        self.run = base / "run"
        self.probes_d = base / "probes.d"
        self.probes_d.mkdir()
        os.chmod(self.probes_d, 0o755)
        os.chmod(base, 0o755)
        self.write("")

    def write(self, extra: str) -> None:
        """(Re)write hma.toml: the folders, then ``extra`` TOML."""
        self.config.write_text(
            f'[agent]\nstate_dir = "{self.state}"\nrun_dir = "{self.run}"\n'
            f'probes_dir = "{self.probes_d}"\nnode_name = "testnode"\n' + extra
        )

    def env(self, plugins: bool = False) -> dict[str, str]:
        """Environment for running hma against this installation."""
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
        env["HMA_CONFIG"] = str(self.config)
        if plugins:
            env["PYTHONPATH"] = str(PLUGINS) + os.pathsep + env.get("PYTHONPATH", "")
        return env

    def hma(
        self,
        *args: str,
        timeout: float = 60,
        plugins: bool = False,
        env: Optional[dict[str, str]] = None,
    ) -> subprocess.CompletedProcess:
        """Run the real command line."""
        return subprocess.run(
            [sys.executable, "-m", "hma", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env or self.env(plugins),
            check=False,
        )

    def status(self) -> dict[str, Any]:
        """The daemon's status.json."""
        return json.loads((self.run / "status.json").read_text())

    def exec_probe(self, name: str, body: str, mode: int = 0o755) -> Path:
        """Write an executable probe script into probes.d."""
        path = self.probes_d / name
        path.write_text("#!/bin/sh\n" + body + "\n")
        os.chmod(path, mode)
        return path


@pytest.fixture
def hma_env(tmp_path: Path) -> Env:
    """An isolated agent installation."""
    return Env(tmp_path)
