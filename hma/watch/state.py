"""The watcher's state: what it saw since when, the actions it took, its last pass. One JSON file
under ``[watch] state_dir``, written atomically (a temporary file, a rename, fsync) after every
pass and before every action, so that a restart in the middle of an action finds it."""

from __future__ import annotations

import json
import logging
import os
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from hma.reporters.statusfile import write_text

log = logging.getLogger("hma.watch")

FILENAME = "state.json"
VERSION = 1
# An action's states: ``running`` (written before its hook runs), ``issued`` (the hook or the
# cluster took it), ``retry`` (the hook failed: tried again at ``next_try`` with the same id)
STATES = ("running", "issued", "retry")


@dataclass
class Action:
    """One action the watcher took on a node (kept until the node answers again)."""

    kind: str  # reboot, replace
    id: str  # HMA_ACTION_ID: the same on every retry
    code: str
    started: float
    state: str = "running"
    attempts: int = 0
    next_try: float = 0.0
    error: str = ""
    evidence: str = ""  # the bundle gathered before it (HMA_EVIDENCE on every retry)

    @classmethod
    def from_json(cls, doc: Any) -> Optional[Action]:
        """The action of a state file's entry; None when it is not one."""
        try:
            act = cls(
                str(doc["kind"]),
                str(doc["id"]),
                str(doc["code"]),
                float(doc["started"]),
                str(doc.get("state", "issued")),
                int(doc.get("attempts", 0)),
                float(doc.get("next_try", 0.0)),
                str(doc.get("error", "")),
                str(doc.get("evidence", "")),
            )
        except (KeyError, TypeError, ValueError):
            return None
        return act if act.kind in ("reboot", "replace") and act.state in STATES else None


@dataclass
class State:
    """The whole state file (``holder``: this watcher's id in the claim, kept across restarts)."""

    holder: str = field(default_factory=lambda: uuid.uuid4().hex)
    seen: dict[str, dict[str, float]] = field(default_factory=dict)
    actions: dict[str, Action] = field(default_factory=dict)
    last: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The file's document."""
        return {
            "version": VERSION,
            "holder": self.holder,
            "seen": self.seen,
            "actions": {node: asdict(act) for node, act in sorted(self.actions.items())},
            "last": self.last,
        }


def path_in(folder: str) -> Path:
    """The state file in ``folder``."""
    return Path(folder) / FILENAME


def load(folder: str) -> State:
    """The state in ``folder``; a fresh one when there is none. A file that does not read is
    moved aside (``.bad``) and logged: the watcher starts afresh, never on half a state."""
    path = path_in(folder)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return State()
    except (OSError, ValueError) as exc:
        return _aside(path, str(exc))
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        return _aside(path, "not a watcher state of this version")
    return _of(doc)


def _of(doc: dict[str, Any]) -> State:
    """The state of a file's document (entries that are not what the watcher writes skipped)."""
    seen = _table(doc, "seen")
    actions = _table(doc, "actions")
    state = State(holder=str(doc.get("holder") or uuid.uuid4().hex))
    for node, conds in seen.items():
        if isinstance(conds, dict):
            kept = {k: float(v) for k, v in conds.items() if isinstance(v, (int, float))}
            state.seen[str(node)] = kept
    for node, item in actions.items():
        act = Action.from_json(item) if isinstance(item, dict) else None
        if act is not None:
            state.actions[str(node)] = act
    state.last = _table(doc, "last")
    return state


def _table(doc: dict[str, Any], key: str) -> dict[str, Any]:
    """``doc[key]`` when it is a table, else an empty one."""
    value = doc.get(key)
    return value if isinstance(value, dict) else {}


def load_quiet(folder: str) -> Optional[State]:
    """The state in ``folder`` for a reader (``hma fleet``): None when there is none or it does
    not read; nothing is moved or logged."""
    try:
        doc = json.loads(path_in(folder).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        return None
    return _of(doc)


def _aside(path: Path, why: str) -> State:
    log.error("watcher state %s unreadable (%s): moved aside, starting afresh", path, why)
    try:
        os.replace(path, path.with_suffix(".bad"))
    except OSError:
        pass
    return State()


def save(folder: str, state: State) -> None:
    """Write the state atomically (the folder is made when missing)."""
    os.makedirs(folder, mode=0o750, exist_ok=True)
    write_text(path_in(folder), json.dumps(state.to_json(), indent=1, sort_keys=True) + "\n")
