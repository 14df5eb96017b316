"""What a ``--json`` command prints: always one JSON document, also when it can only say what
is missing (no daemon, no Slurm, a broken configuration); the exit code stays 3 then."""

from __future__ import annotations

import json
from typing import Any


def dump(doc: Any) -> None:
    """Print ``doc`` as the command's JSON document."""
    print(json.dumps(doc, indent=2, allow_nan=False))


def problem(command: str, text: str, **fields: Any) -> dict[str, Any]:
    """The document of a command that could not measure: ``severity`` unknown and ``problem``
    saying what is missing (docs/cli.md)."""
    return {"command": command, "severity": "unknown", "problem": text, **fields}
