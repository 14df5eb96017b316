"""Carrying out the watcher's reboots and replaces: through the agents' hook runner
(``hma.remediation.hooks``: the same ``HMA_*`` environment, the same action id on every retry)
where ``[recovery] reboot_command``/``replace_command`` is set, through HyperPod's
``Action:Reboot``/``Action:Replace`` reasons where the mode is ``hyperpod``; the remediation
recorded in the node's ``hmah=`` memory as the agents record theirs; an evidence bundle before
each new action (``Bundles``)."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Optional

from hma.adapters.text import printable
from hma.contracts.cluster import BackendError, NodeState
from hma.remediation import evidence, hooks
from hma.remediation.options import Recovery
from hma.watch import decide
from hma.watch.state import Action, State

if TYPE_CHECKING:
    from hma.cluster.slurm.backend import SlurmBackend

log = logging.getLogger("hma.watch")


def method(rec: Recovery, kind: str) -> str:
    """How a ``kind`` is carried out: ``hyperpod``, ``command`` (its hook is set), or "" (the
    watcher has no way: the decision is reported, held ``unsupported``)."""
    if rec.mode(kind) == "hyperpod":
        return "hyperpod"
    return "command" if rec.command(kind) else ""


def reason(item: decide.Decision) -> str:
    """The action's reason (``HMA_REASON``): ``HMA: <CODE> node: <why>``."""
    return f"HMA: {item.code} node: {item.why}"


class Bundles:
    """The evidence bundles of one pass (``[recovery] evidence``, hma.remediation.evidence),
    gathered on the controller: the node's record and the decision, and, for a node stuck
    COMPLETING (its slurmd answers), its kernel log through ``remote`` + the node's name. All
    the bundles of a pass share ``budget`` seconds (the claim's lease outlives the pass)."""

    def __init__(
        self,
        settings: Optional[evidence.Settings],
        remote: tuple[str, ...],
        budget: float,
        env: Callable[[], dict[str, str]],
    ) -> None:
        self.settings = settings
        self.remote = remote
        self.deadline = time.monotonic() + budget
        self.env = env

    def gather(self, item: decide.Decision, node: NodeState) -> str:
        """The bundle before ``item`` on ``node``: its path, "" when off or none was made."""
        if self.settings is None:
            return ""
        left = self.deadline - time.monotonic()
        if left < 0.1:
            log.warning("no evidence bundle for %s: the pass's time for bundles is spent",
                        printable(node.name))  # fmt: skip
            return ""
        answers = item.code == decide.COMPLETING and bool(self.remote)
        settings = replace(
            self.settings,
            timeout=min(self.settings.timeout, left),
            bug_report=(),  # nvidia-bug-report.sh would write its file on the node
            kernel_log=self.settings.kernel_log if answers else (),
        )
        state = {"decision": item.to_json(), "node": {"state": node.label_text}}
        remote = (*self.remote, node.name) if answers else ()
        return evidence.bundle(
            node.name, settings.folder, settings, item.kind, state, remote, self.env()
        )


class Actor:
    """Carries out decisions; ``save``: writes the state (before a hook runs and after);
    ``bundles``: the evidence before each new action (none when None)."""

    def __init__(
        self,
        backend: SlurmBackend,
        rec: Recovery,
        state: State,
        save: Callable[[], None],
        clock: Callable[[], float],
        bundles: Optional[Bundles] = None,
    ) -> None:
        self.backend = backend
        self.rec = rec
        self.state = state
        self.save = save
        self.clock = clock
        self.bundles = bundles

    def act(self, item: decide.Decision, node: NodeState) -> Action:
        """Run ``item`` on ``node``; the action's record, state ``issued`` or ``retry``. A new
        action gathers its evidence first (a retry keeps the bundle it had)."""
        now = self.clock()
        act = item.action
        if act is None or act.kind != item.kind:
            act = Action(item.kind, f"watch-{item.kind}-{node.name}-{int(now)}", item.code, now)
            act.evidence = self.bundles.gather(item, node) if self.bundles is not None else ""
        act.state = "running"
        act.attempts += 1
        self.state.actions[node.name] = act
        self.save()  # a restart from here on finds it: never run twice (docs/watch.md)
        if item.count:
            self._record(node, item.code, now)
        try:
            self._run(item, node.name, act)
        except BackendError as exc:
            delay = min(self.rec.retry_max, self.rec.retry_min * 2 ** (act.attempts - 1))
            act.state, act.next_try, act.error = "retry", self.clock() + delay, str(exc)
        else:
            act.state, act.error = "issued", ""
        self.save()
        return act

    def _run(self, item: decide.Decision, node: str, act: Action) -> None:
        """The hook, or HyperPod's reason (``BackendError`` when it fails)."""
        how = method(self.rec, item.kind)
        if how == "hyperpod" and item.kind == "reboot":
            self.backend.reboot(node, reason(item), "hyperpod")
        elif how == "hyperpod":
            self.backend.replace(node, reason(item), "hyperpod")
        else:
            known = (None, "")
            hooks.run_hook(
                self.rec,
                item.kind,
                node,
                (reason(item), act.id),
                None,
                known,
                _no_spare,
                self.backend.env(),
                act.evidence,
            )

    def _record(self, node: NodeState, code: str, now: float) -> None:
        """The remediation in the node's ``hmah=`` memory (a failure is logged: the action
        goes on, the watcher's own state remembers it)."""
        text = node.field(self.rec.label_field)
        new = decide.recorded(text, code, now)
        if new == text:
            return
        try:
            self.backend.label(node.name, new)
        except BackendError as exc:
            log.warning("%s: hmah= not recorded: %s", printable(node.name), printable(str(exc)))


def _no_spare() -> str:
    """The watcher takes no spare: a replace hook is told none."""
    return ""
