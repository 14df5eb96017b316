"""What the commands share: who runs them, the root check, exit codes, the JSON document of a
``--json`` command, configuration errors, the state store and the way to the scheduler (the
configured backend, and the Slurm client for what only Slurm has).

Light to import (``hma status`` uses it): what a helper needs beyond the standard library is
imported when it is called.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

if TYPE_CHECKING:
    from hma.cluster.slurm.client import SlurmClient
    from hma.config.files import ConfigError
    from hma.contracts.cluster import Backend
    from hma.detection.setup import Setup
    from hma.health.store import Store

EX_NOPERM = 77  # sysexits: not root
EX_CANTCREAT = 73  # sysexits: the state store cannot be opened (as for `hma run`)


def operator() -> str:
    """Who runs the command (the sudo caller when there is one)."""
    import getpass

    return os.environ.get("SUDO_USER") or getpass.getuser()


def needs_root(command: str) -> bool:
    """True, once "<command>: needs root ..." is on stderr, when this process is not root's (the
    command exits ``EX_NOPERM``): it changes the agent's state store."""
    if os.geteuid() == 0:
        return False
    print(
        f"{command}: needs root (it changes the agent's state store); run it with sudo",
        file=sys.stderr,
    )
    return True


def with_store(
    setup: Setup,
    command: str,
    body: Callable[[Store], int],
    json_command: str = "",
    failed: int = EX_CANTCREAT,
) -> int:
    """``body``'s exit code on the opened state store (closed after). When the store cannot be
    opened or used (a read-only or immutable folder, a full disk, a lock held), one line on
    stderr, "<command>: cannot open the state store: <why>" or "<command>: state store unusable:
    <why>", with ``json_command`` (``--json``) the document that says so, and ``failed``."""
    import sqlite3

    from hma.adapters.text import printable
    from hma.health.pipeline import open_store
    from hma.health.store import StateError

    try:
        store = open_store(setup)
    except StateError as exc:
        why = f"cannot open the state store: {exc}"
    else:
        try:
            return body(store)
        except (StateError, sqlite3.Error) as exc:
            why = f"state store unusable: {type(exc).__name__}: {exc}"
        finally:
            store.close()
    print(f"{command}: {printable(why)}", file=sys.stderr)
    if json_command:
        dump(problem(json_command, why))
    return failed


def dump(doc: Any) -> None:
    """Print ``doc`` as the command's JSON document: a ``--json`` command always prints one,
    also when it can only say what is missing (no daemon, no Slurm, a broken configuration)."""
    import json

    print(json.dumps(doc, indent=2, allow_nan=False))


def problem(command: str, text: str, **fields: Any) -> dict[str, Any]:
    """The document of a command that could not measure: ``severity`` unknown and ``problem``
    saying what is missing (docs/cli.md); the exit code stays 3 then."""
    return {"command": command, "severity": "unknown", "problem": text, **fields}


def config_failed(exc: ConfigError, code: int, json_command: str = "") -> int:
    """Print the configuration's errors and return ``code``; with ``json_command`` (``--json``)
    also the document that says so."""
    for line in exc.errors:
        print(line, file=sys.stderr)
    if json_command:
        dump(problem(json_command, "invalid configuration: " + "; ".join(exc.errors)))
    return code


def boot_id_in(raw: Mapping[str, Any]) -> Optional[str]:
    """This boot's id as the daemon reads it, from a configuration already read and merged:
    under ``[paths] procfs`` when it sets one other than /proc ("" when unreadable there), else
    None (statusfile.read uses /proc)."""
    from hma.reporters import statusfile

    paths = raw.get("paths")
    procfs = paths.get("procfs") if isinstance(paths, dict) else None
    if not isinstance(procfs, str) or not procfs.startswith("/") or procfs.rstrip("/") == "/proc":
        return None
    return statusfile.boot_id(procfs)


def scheduler(setup: Setup) -> Backend:
    """The scheduler as every command reaches it: the backend ``[cluster] backend`` names, made
    as remediation makes it (``ConfigError`` when it cannot be loaded)."""
    from hma.detection.registry import make_backend

    return make_backend(setup.config)


def slurm_client(setup: Setup) -> SlurmClient:
    """The Slurm client of the configured backend, for what only Slurm has (the node list, host
    lists, jobs, reconfigure); ``ConfigError`` when ``[cluster] backend`` is not Slurm's (the
    command exits with its code for an invalid configuration)."""
    from hma.cluster.slurm.backend import SlurmBackend
    from hma.config.files import ConfigError

    backend = scheduler(setup)
    if not isinstance(backend, SlurmBackend):
        name = setup.config.section("cluster")["backend"]
        raise ConfigError(
            [f"cluster.backend: {name!r} is not Slurm: this command needs the Slurm backend"]
        )
    return backend.client
