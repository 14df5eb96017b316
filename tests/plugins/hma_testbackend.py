"""A second cluster backend for tests, registered like any third-party plugin (see the dist-info
folder): nodes kept in memory, every write logged."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar, Collection, Mapping, Optional, Sequence

from hma.contracts.cluster import (
    Backend,
    BackendError,
    Job,
    JobInfo,
    NodeState,
    Reboots,
    Replaces,
    RequeuesJobs,
    SetsDown,
)
from hma.contracts.options import Option


class CoreBackend(Backend):
    """Nodes ``[memory] nodes`` in one partition; ``calls`` logs every write. The core only: no
    capability (``MemoryBackend`` adds them)."""

    name = "memory"
    options: ClassVar[Mapping[str, Option]] = {
        "nodes": Option("strlist", ["m1", "m2", "m3", "m4"], "Nodes of the cluster."),
        "me": Option("str", "m1", "This node's name."),
    }

    def __init__(self, options: Mapping[str, Any], label_field: str) -> None:
        super().__init__(options, label_field)
        self.state = {n: NodeState(n, "idle", partitions=("all",)) for n in options["nodes"]}
        self.calls: list[tuple[str, ...]] = []
        self.unreachable = False

    def _get(self, name: str) -> NodeState:
        if self.unreachable:
            raise BackendError("cluster API unreachable")
        return self.state[name]

    def _set(self, name: str, **changes: Any) -> None:
        self.state[name] = replace(self._get(name), **changes)

    def node_name_configured(self) -> Optional[str]:
        return None  # found through find_node_name

    def find_node_name(self) -> Optional[str]:
        return str(self.config["me"]) if self.config["me"] in self.state else None

    def node(self, name: str) -> NodeState:
        return self._get(name)

    def jobs(self, name: str) -> Sequence[Job]:
        return []

    def peers(self, node: NodeState) -> tuple[list[NodeState], int]:
        return [n for n in self.state.values() if n.out_of_service], len(self.state)

    def env(self) -> dict[str, str]:
        return {"PATH": "/usr/bin:/bin"}

    def label(self, name: str, text: str) -> None:
        self.calls.append(("label", name, text))
        self.state[name] = self._get(name).with_field(self.label_field, text)

    def drain(self, name: str, reason: str, label: Optional[str] = None) -> None:
        self.calls.append(("drain", name, reason))
        node = self._get(name)
        if label is not None:
            node = node.with_field(self.label_field, label)
        self.state[name] = replace(node, flags=node.flags | {"DRAIN"}, reason=reason)

    def resume(self, name: str, label: Optional[str] = None) -> None:
        self.calls.append(("resume", name))
        node = self._get(name)
        if label is not None:
            node = node.with_field(self.label_field, label)
        self.state[name] = replace(node, flags=node.flags - {"DRAIN", "FAIL"}, reason="")


class MemoryBackend(CoreBackend, Reboots, Replaces, SetsDown, RequeuesJobs):
    """``CoreBackend`` with every capability but spares, registered as ``memory``."""

    def down(self, name: str, reason: str) -> None:
        self.calls.append(("down", name, reason))
        self._set(name, base="down", reason=reason)

    def reboot(self, name: str, reason: str, mode: str) -> None:
        self.calls.append(("reboot", name, mode))
        self._set(name, flags=self._get(name).flags | {"REBOOT_REQUESTED"})

    def rebooting(self, node: NodeState, mode: str) -> str:
        return "reboot already requested" if node.reboot_pending else ""

    def replace(self, name: str, reason: str, mode: str, domain: Sequence[str] = ()) -> None:
        self.calls.append(("replace", name, mode))

    def replacing(self, node: NodeState, mode: str) -> str:
        return ""

    def job_infos(self, ids: Collection[str]) -> list[JobInfo]:
        return []

    def update_job(self, job_id: str, **fields: str) -> None:
        self.calls.append(("update_job", job_id))
