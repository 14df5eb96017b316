"""The repair steps of the outbox: the GPU reset, and the reboot or replace, through the
backend's capability or the configured hook (``hooks``), with the spare taken for a replace
(``spares``). Each returns a typed outcome (``transitions``); ``actions.Applier`` dispatches to
them.

Remediation knows what a GPU reset is for (the first rung of the repair ladder), not how one is
done: a hardware family registers it in entry point group ``hma.repairs`` (the NVIDIA family's
``gpu_reset``, a factory taking the ``[recovery]`` command and timeout), loaded through
``hma.adapters.entrypoints`` when the first reset is carried out.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Callable, Optional, Protocol, Sequence

from hma.adapters import entrypoints
from hma.contracts.cluster import Backend, NodeState, Reboots, Replaces
from hma.remediation import hooks
from hma.remediation.facts import EngineView
from hma.remediation.labels import Labels
from hma.remediation.options import Recovery
from hma.remediation.outbox import Outbox, Row
from hma.remediation.planner import Acted, Episode, Reboot
from hma.remediation.spares import Spares, unsupported
from hma.remediation.transitions import (
    ActedOn,
    Done,
    Held,
    Outcome,
    ResetRan,
    ResetRefused,
    Skipped,
)

GROUP = "hma.repairs"


class GpuResetter(Protocol):
    """Resets one GPU."""

    def why_not(self, component: str) -> str:
        """Why ``component`` cannot be reset ("" it can)."""

    def __call__(self, component: str) -> tuple[bool, str]:
        """Reset ``component``: (whether it worked, its output or why it failed)."""


def gpu_reset(command: Sequence[str], timeout: float) -> GpuResetter:
    """The installed GPU reset, running ``command`` within ``timeout`` seconds."""
    factory = entrypoints.load(GROUP, "gpu_reset")
    resetter: GpuResetter = factory(tuple(command), timeout)
    return resetter


# Reboot/replace modes the engine carries out itself (the hook; leaving the node drained for a
# human); every other mode is the backend's to read (its ``Reboots``/``Replaces``).
ENGINE_MODES = ("command", "drain_only")


class Repairer:
    """The repair steps of one engine. ``guard``: the breaker's check before acting on a node
    (``Applier``'s); ``record``: records a remediation of the open episode (False: recorded
    already in this episode and boot); ``gpu_reset``:
    makes the GPU reset (asked when the first is due); ``evidence``: gathers the bundle before a
    repair of ``kind`` on the node (hma.remediation.evidence; its path, "" none)."""

    def __init__(
        self,
        backend: Backend,
        outbox: Outbox,
        labels: Labels,
        recovery: Recovery,
        clock: Callable[[], float],
        view: Callable[[], EngineView],
        observed: Callable[[NodeState], None],
        spares: Spares,
        gpu_reset: Callable[[], GpuResetter],
        guard: Callable[[NodeState, str], Optional[Outcome]],
        record: Callable[[str], bool],
        evidence: Callable[[str, str], str],
    ) -> None:
        self.backend = backend
        self.outbox = outbox
        self.labels = labels
        self.rec = recovery
        self.clock = clock
        self.view = view
        self.observed = observed
        self.spares = spares
        self._make_reset = gpu_reset
        self._reset: Optional[GpuResetter] = None
        self.guard = guard
        self.record = record
        self.evidence = evidence
        self._bundles: dict[str, str] = {}  # outbox row key -> its bundle (once per action)

    def _backend_step(self, kind: str) -> Optional[Callable[[str, str, str], None]]:
        """The backend's own reboot or replace, None when it has not that capability."""
        if kind == "reboot":
            return self.backend.reboot if isinstance(self.backend, Reboots) else None
        return self.backend.replace if isinstance(self.backend, Replaces) else None

    def _in_effect(self, kind: str, node: NodeState, mode: str) -> str:
        """Why the backend's reboot or replace in ``mode`` is in effect already ("" not)."""
        if kind == "reboot" and isinstance(self.backend, Reboots):
            return self.backend.rebooting(node, mode)
        if kind == "replace" and isinstance(self.backend, Replaces):
            return self.backend.replacing(node, mode)
        return ""

    def act(self, node: NodeState, row: Row) -> Outcome:
        """A reboot or replace (``row.kind``)."""
        kind, mode = row.kind, self.rec.mode(row.kind)
        boot_now = self.view().boot_id
        ep = self.outbox.episode()
        by_backend = mode not in ENGINE_MODES
        # Already in effect? (a restart after kill -9 must not act twice)
        if row.payload.get("boot_id") and boot_now and row.payload["boot_id"] != boot_now:
            return Done("the node rebooted since")
        done = self._in_effect(kind, node, mode) if by_backend else ""
        if done:
            self.record(kind)
            counted = self._count_reboot(ep) if kind == "reboot" else None
            return Done(done) if counted is None else ActedOn(counted, done)
        if not (node.owned and node.out_of_service):
            return Skipped(f"not owned: reason is {node.reason!r}")
        step = self._backend_step(kind) if by_backend else None
        if by_backend and step is None:
            self.labels.write(node, held="unsupported")
            return Held(unsupported(self.backend, f"{kind} a node ({kind}_mode = {mode})"))
        acted = Acted(kind, boot_now, self.clock())
        if kind == "replace":
            self.spares.take(node.name, ep)
        if kind == "replace" and mode == "drain_only":
            self.record(kind)
            self.labels.write(node)
            return ActedOn(acted, "left drained for a human (replace_mode = drain_only)")
        held = self.guard(node, f"{kind} of")
        if held is None and kind == "reboot":
            held = self._rate_holds(node)
        if held is not None:
            return held
        self.record(kind)
        self.labels.write(node)
        bundle = self._evidence(kind, node.name, row)
        if step is None:  # mode "command" (drain_only is done above)
            self._hook(kind, node.name, row, ep, bundle)
        else:
            step(node.name, row.reason, mode)
        acted = replace(acted, at=self.clock())
        if kind == "reboot":
            acted = self._count_reboot(ep) or acted
            self.observed(replace(node, flags=node.flags | {"REBOOT_REQUESTED"}))
        return ActedOn(acted, f"{kind} via {mode}")

    def _rate_holds(self, node: NodeState) -> Optional[Outcome]:
        """A reboot within ``min_reboot_interval`` of the last one is held (None: go on)."""
        last = self.outbox.last_reboot()
        interval = self.rec.min_reboot_interval
        since = self.clock() - last
        if last and since < interval:
            self.labels.write(node, held="rate")
            return Held(
                f"rate: last reboot {since:.0f} s ago, min_reboot_interval {interval:.0f} s"
            )
        return None

    def _evidence(self, kind: str, node: str, row: Row) -> str:
        """The evidence bundle of the action ``row`` (gathered at its first attempt; a retry
        reuses it while it exists)."""
        known = self._bundles.get(row.key, "")
        if not known or not os.path.isdir(known):
            self._bundles = {row.key: self.evidence(kind, node)}  # only the action at hand
        return self._bundles[row.key]

    def _hook(self, kind: str, node: str, row: Row, ep: Optional[Episode], bundle: str) -> None:
        """The configured hook of a reboot or replace in mode ``command``."""
        known = self.view()
        hooks.run_hook(
            self.rec,
            kind,
            node,
            (row.reason, row.key),
            ep,
            (known.verdict, known.domain),
            lambda: self.spares.take(node, ep),
            self.backend.env(),
            bundle,
        )

    def reset_gpu(self, node: NodeState, row: Row) -> Outcome:
        """The GPU reset of the episode's GPU (the hardware family's, from ``hma.repairs``):
        only on a drained node hma owns, past the breaker. Refused (a process holds the GPU)
        or failed, the episode records it and the planner goes on to the reboot."""
        ep = self.outbox.episode()
        gpu = str(row.payload.get("gpu") or "")
        reset = ep.gpu_reset if ep is not None else None
        if ep is None or reset is None or reset.component != gpu:
            return Skipped("no GPU reset is asked for any more")
        if reset.ok is not None:
            return Done("carried out already")  # a restart after kill -9: not twice
        why = ""
        if not (node.owned and node.out_of_service):
            why = f"not owned: reason is {node.reason!r}"
        elif node.busy:
            why = f"jobs still on the node ({node.label_text})"
        else:
            why = self._resetter().why_not(gpu)
        if why:
            return ResetRefused(why, f"GPU reset not done: {why}; the next rung follows")
        held = self.guard(node, "GPU reset on")
        if held is not None:
            return held
        first = self.record("reset_gpu")
        if not first and row.state == "attempting":  # the agent stopped during this reset
            at, boot = self.clock(), self.view().boot_id
            why = "the agent restarted during the GPU reset (outcome unknown)"
            return ResetRan(gpu, at, boot, False, why, f"{why}; the next rung follows")
        self.labels.write(node)
        self._evidence("reset_gpu", node.name, row)
        ok, out = self._resetter()(gpu)
        at, boot = self.clock(), self.view().boot_id
        if not ok:
            return ResetRan(gpu, at, boot, False, out, f"{out}; the next rung follows")
        return ResetRan(
            gpu, at, boot, True, out, f"GPU reset of {gpu}: {out}" if out else f"GPU reset of {gpu}"
        )

    def _resetter(self) -> GpuResetter:
        """The GPU reset, made when first needed."""
        if self._reset is None:
            self._reset = self._make_reset()
        return self._reset

    def _count_reboot(self, ep: Optional[Episode]) -> Optional[Acted]:
        """Count one reboot of the episode's fault (once per episode and boot); the episode's
        reboot when it was counted now, None otherwise."""
        if ep is None:
            return None
        with self.outbox.lock:
            now, boot = self.clock(), self.view().boot_id
            rows = [r for r in self.outbox.reboots() if now - r.ts <= self.rec.reboot_window]
            if any(r.episode == ep.id and r.boot_id == boot for r in rows):
                return None
            rows.append(Reboot(ep.code, ep.component, now, ep.id, boot))
            self.outbox.save_reboots(rows, last_reboot=now)
            return Acted("reboot", boot, now)
