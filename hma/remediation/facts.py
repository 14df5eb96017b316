"""The node facts: what the engine knows of its node (``Known``), and the thread that keeps it
fresh (``Facts``): the node's state and jobs, read from the cluster backend for probes and
decisions, and the node's NVLink domain, published in its label field when it changes; a blind
label left by a run on an invalid configuration is lifted (hma.remediation.blind)."""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional, Protocol

from hma.contracts.cluster import Backend, BackendError, NodeState, RequeuesJobs
from hma.contracts.probe import NodeFacts
from hma.health.model import Verdict
from hma.remediation import blind
from hma.remediation.requeue import AutoResume
from hma.topology import domain as topology_domain

log = logging.getLogger("hma.remediation")


@dataclass(frozen=True)
class Known:
    """What the engine knows of its node at one moment. Replaced whole under ``Shared``'s
    lock, never changed: any thread reads it without the lock (the Applier's ``EngineView``)."""

    node_name: Optional[str] = None
    node: Optional[NodeState] = None  # as last read (by the facts thread or an action)
    jobs: tuple[tuple[str, str], ...] = ()  # (job id, user)
    facts_ok: bool = False  # the last read of the node's state and jobs worked
    facts_error: str = ""
    verdict: Optional[Verdict] = None
    boot_id: str = ""
    boot_since: float = 0.0  # when the engine first heard of the current boot id
    booted: float = 0.0  # when the current boot started (``boot_time``; 0: unknown)
    domain: str = ""  # this node's NVLink domain (hma.topology.domain), published in its label


def node_facts(known: Known, configured: bool) -> NodeFacts:
    """What probes may know of the node from what the engine knows of it (``configured``: the
    backend can be used here); the node's state and jobs only while its last read worked."""
    node = known.node if known.facts_ok else None
    return NodeFacts(
        node_name=known.node_name or "",
        job_running=(bool(known.jobs) if known.facts_ok else None),
        job_ids=tuple(j for j, _u in known.jobs),
        slurm_configured=configured,
        job_users=tuple(sorted({u for _j, u in known.jobs})),
        slurm_state=node.label_text if node is not None else "",
        slurm_reason=node.reason if node is not None else "",
    )


def read_once(backend: Backend) -> tuple[NodeFacts, str]:
    """One read of the node's facts (its state, one single-node query, and its jobs), as the
    facts thread makes it but writing nothing (for one-shot commands): (the facts, why they
    could not be read, "" when they were). Nothing is read where the backend cannot be used."""
    known = Known(node_name=backend.node_name_configured())
    if not backend.enabled:
        return node_facts(known, False), ""
    try:
        name = known.node_name or backend.find_node_name()
        if name is None:
            raise BackendError(backend.no_node)
        node = backend.node(name)
        jobs = backend.jobs(name)
    except BackendError as exc:
        return node_facts(known, True), str(exc)
    jobs_seen = tuple((j.id, j.user) for j in jobs)
    return node_facts(
        replace(known, node_name=name, node=node, jobs=jobs_seen, facts_ok=True), True
    ), ""


class EngineView(Protocol):
    """What the Applier reads of the engine's state (a snapshot it never changes)."""

    @property
    def node_name(self) -> Optional[str]:
        """This node's name in the cluster (None: not known yet)."""

    @property
    def boot_id(self) -> str:
        """The current boot's id."""

    @property
    def verdict(self) -> Optional[Verdict]:
        """The latest verdict."""

    @property
    def domain(self) -> str:
        """This node's NVLink domain ("" unknown)."""


class Shared:
    """The engine's ``Known``, replaced whole under a lock (read it as ``now``)."""

    def __init__(self, known: Known) -> None:
        self._lock = threading.Lock()
        self.now = known

    def set(self, **changes: Any) -> None:
        """Replace what the engine knows with ``changes`` applied."""
        with self._lock:
            self.now = replace(self.now, **changes)

    def swap(self, change: Callable[[Known], Known]) -> Known:
        """Replace what the engine knows with ``change`` of it; returns what it was."""
        with self._lock:
            old = self.now
            self.now = change(old)
            return old


class Facts:
    """The facts thread of one engine. ``seed``: told each node state read (after a wiped
    disk); ``busy``: an episode is open; ``first``: told when the node's name was first
    learnt; ``dry_run``: publish nothing."""

    def __init__(
        self,
        backend: Backend,
        known: Shared,
        autoresume: AutoResume,
        seed: Callable[[NodeState], None],
        busy: Callable[[], bool],
        first: Callable[[], None],
        dry_run: bool,
    ) -> None:
        self.backend = backend
        self.known = known
        self.autoresume = autoresume
        self.seed = seed
        self.busy = busy
        self.first = first
        self.dry_run = dry_run
        self.reread = threading.Event()  # an action was applied: read the node's state again

    def loop(self, stop: threading.Event) -> None:
        """Jobs (local slurmd) every ``facts_interval``; the node's state from the controller
        every ``heartbeat`` (jittered) while nothing happens, every ``facts_interval`` while
        something does and once after each action applied (so a resume shows at once), backing
        off up to ``heartbeat`` while the controller cannot be reached."""
        due = 0.0  # monotonic time of the next node-state read
        failures = 0
        while not stop.is_set():
            now = time.monotonic()
            fast, heartbeat = self.backend.facts_interval, self.backend.heartbeat
            if now >= due or self._busy() or self.reread.is_set():
                self.reread.clear()
                ok = self.refresh()
                failures = 0 if ok else failures + 1
                if ok:
                    wait = heartbeat * random.uniform(0.9, 1.1)  # noqa: S311
                else:
                    wait = min(fast * 2**failures, heartbeat)
                due = now + wait
            else:
                self.refresh_jobs()
            self._publish_domain()
            stop.wait(min(fast, max(0.0, due - time.monotonic())))

    def _busy(self) -> bool:
        """Something is happening: an episode, an open action or a job auto-resume watches."""
        return self.busy() or bool(self.autoresume.watch)

    def _publish_domain(self) -> None:
        """Publish the node's domain when the field last read says another (no request
        otherwise; a failed write is tried again on the next pass)."""
        known = self.known.now
        node = known.node
        if node is None or not known.facts_ok or self.dry_run:
            return
        try:
            new = topology_domain.publish(self.backend, node, known.domain)
        except BackendError as exc:
            log.warning("cannot publish the domain of %s: %s", node.name, exc)
            return
        if new is not None:
            written = node.with_field(self.backend.label_field, new)
            self.known.swap(lambda k: replace(k, node=written) if k.node is node else k)

    def refresh(self) -> bool:
        """Read the node's state (one single-node query) and jobs; returns whether it worked."""
        try:
            name = self.known.now.node_name or self.backend.find_node_name()
            if name is None:
                raise BackendError(self.backend.no_node)
            node = self._lift_blind(self.backend.node(name))
        except BackendError as exc:
            return self._failed(exc)
        self.seed(node)  # before a plan can see the node
        old = self.known.swap(lambda k: replace(k, node_name=name, node=node))
        ok = self.refresh_jobs()
        if old.node_name is None:
            self.first()
        return ok

    def _lift_blind(self, node: NodeState) -> NodeState:
        """``node`` without the blind label a run on an invalid configuration left: this engine
        runs on a valid one (one write, only when there is a label to lift)."""
        text = blind.lifted(node, self.backend.label_field)
        if text is None or self.dry_run:
            return node
        self.backend.label(node.name, text)
        log.info("lifted the blind label of %s: the configuration loads again", node.name)
        return node.with_field(self.backend.label_field, text)

    def _failed(self, exc: BackendError) -> bool:
        self.known.set(facts_ok=False, facts_error=str(exc))
        return False

    def refresh_jobs(self) -> bool:
        """Read the node's jobs (no controller query in the steady state with Slurm)."""
        name = self.known.now.node_name
        if name is None:
            return False
        try:
            jobs = self.backend.jobs(name)
        except BackendError as exc:
            return self._failed(exc)
        client = self.backend if isinstance(self.backend, RequeuesJobs) else None
        self.autoresume.observe(client, jobs)  # before the jobs are used by _plan
        self.known.swap(
            lambda k: replace(
                k,
                jobs=tuple((j.id, j.user) for j in jobs),
                facts_ok=k.node is not None,
                facts_error="",
            )
        )
        return True
