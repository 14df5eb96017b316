"""The ``[sources.postmortem]`` every test agent runs with: crash records under a test folder and
no journal, never this machine's pstore, kdump or previous boot (tests/conftest.py, the
integration helpers)."""

from __future__ import annotations

from pathlib import Path


def postmortem_section(folder: Path) -> str:
    """A ``[sources.postmortem]`` reading crash records under ``folder`` (pstore/,
    systemd-pstore/, crash/) and no journal."""
    return (
        f'\n[sources.postmortem]\npstore_dir = "{folder}/pstore"\n'
        f'systemd_pstore_dir = "{folder}/systemd-pstore"\nkdump_dir = "{folder}/crash"\n'
        "journal = false\n"
    )
