"""Configuration keys of remediation: ``[recovery]`` (what to do) and ``[cluster]`` (which
backend acts; the backend declares its own section, such as ``[slurm]``, and the ``[recovery]``
keys whose choices are its own: ``Backend.recovery``).

Added to the schema by ``hma.assembly``; documented in docs/remediation.md.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Collection, Mapping, Optional, Sequence

from hma.contracts.options import Option, positive

RECOVERY: dict[str, Option] = {
    "policy": Option(
        "choice",
        "automatic",
        "automatic: label, drain, then reboot/replace; none: label only (no drain, no recovery).",
        choices=("automatic", "none"),
    ),
    "dry_run": Option(
        "bool", False, "Decide everything and report it as 'would ...', change nothing in Slurm."
    ),
    "reboot_command": Option(
        "argv", None, "Cluster API hook for reboot_mode = command (exit 0 = accepted)."
    ),
    "replace_command": Option(
        "argv", None, "Cluster API hook for replace_mode = command (exit 0 = accepted)."
    ),
    "command_timeout": Option(
        "float", 120.0, "Seconds a reboot/replace hook may run.", check=positive
    ),
    "drain_timeout": Option(
        "float",
        3600.0,
        "Seconds a drain may wait for jobs before the node is set DOWN and acted on.",
        check=positive,
    ),
    "max_reboots": Option(
        "int", 2, "Reboots for the same fault within reboot_window before replace.", minimum=0
    ),
    "reboot_window": Option(
        "float", 7 * 86400.0, "Window (s) in which reboots of a fault are counted.", check=positive
    ),
    "min_reboot_interval": Option(
        "float", 1800.0, "At most one reboot per node in this many seconds.", minimum=0
    ),
    "max_drained_percent": Option(
        "float",
        10.0,
        "Circuit breaker: hold actions while this share of the partitions' nodes is held by hma.",
        check=positive,
        maximum=100,
    ),
    "max_drained_nodes": Option(
        "int",
        None,
        "Circuit breaker: also hold at this many hma-held nodes (unset: no cap).",
        minimum=1,
    ),
    "adopt_slurm_drains": Option(
        "bool", False, "Take over Slurm's own hardware drains (Kill task failed, gres count)."
    ),
    "resume_after": Option(
        "float",
        120.0,
        "Seconds of healthy verdicts (one probe cycle) before an owned drain is resumed.",
        minimum=0,
    ),
    "gpu_reset": Option(
        "bool",
        True,
        "Try a GPU reset before a reboot where NVIDIA's Xid catalogue says a reset can clear the "
        "fault (catalogue reset_gpu), on a drained node, for the GPU concerned only.",
    ),
    "gpu_reset_command": Option(
        "argv",
        ["nvidia-smi"],
        "nvidia-smi command for the GPU reset (run with --gpu-reset -i <PCI bus id>).",
    ),
    "gpu_reset_timeout": Option(
        "float", 120.0, "Seconds a GPU reset may run (then it failed).", check=positive
    ),
    "gpu_reset_verify": Option(
        "float",
        300.0,
        "Seconds after a GPU reset within which the gpu probe must read the GPU healthy; "
        "otherwise the node is rebooted.",
        check=positive,
    ),
    "max_remediations": Option(
        "int",
        3,
        "Repeat offenders: more remediations (drain, GPU reset, reboot, replace; one per "
        "episode) than this within remediation_window keep the node drained for a human until "
        "hma reset.",
        minimum=1,
    ),
    "remediation_window": Option(
        "float",
        7 * 86400.0,
        "Window (s) in which a node's remediations are counted (max_remediations).",
        check=positive,
    ),
    "evidence": Option(
        "bool",
        True,
        "Gather an evidence bundle before a reboot, GPU reset or replace (HMA_EVIDENCE).",
    ),
    "evidence_dir": Option(
        "path", "", "Folder of the evidence bundles (empty: <state_dir>/evidence)."
    ),
    "evidence_keep": Option("int", 5, "Evidence bundles kept (the oldest go first).", minimum=1),
    "evidence_max_bytes": Option(
        "int", 1024**3, "Bytes of all evidence bundles together at most.", minimum=1024**2
    ),
    "evidence_piece_bytes": Option(
        "int", 256 * 1024**2, "Bytes of one piece of a bundle at most (cut).", minimum=65536
    ),
    "evidence_min_free_bytes": Option(
        "int", 512 * 1024**2, "No bundle when the disk has less free than this.", minimum=0
    ),
    "evidence_timeout": Option(
        "float",
        300.0,
        "Seconds a whole bundle may take; its commands share them (the node's record and the"
        " kernel log first, the bug report with what is left). The repair waits at most this.",
        check=positive,
    ),
    "evidence_bug_report": Option(
        "strlist",
        ["nvidia-bug-report.sh"],
        "NVIDIA's bug report (run with --output-file where the program exists; [] none).",
    ),
    "evidence_kernel_log": Option(
        "strlist",
        ["journalctl", "-k", "-b", "0", "--no-pager", "-o", "short-monotonic", "-n", "200000"],
        "The kernel log since boot, on stdout ([] none).",
    ),
    "retry_min": Option("float", 2.0, "First retry delay (s) of a failed action.", check=positive),
    "retry_max": Option("float", 300.0, "Longest retry delay (s).", check=positive),
    "recheck_interval": Option(
        "float", 15.0, "Seconds between re-evaluations (breaker, drain progress).", check=positive
    ),
}


@dataclass(frozen=True)
class Recovery:
    """The ``[recovery]`` keys the engine, the actions and the breaker read, typed (``RECOVERY``
    and the backends' ``recovery`` declare and document them; the planner's are
    ``planner.Policy``); ``scheduler_codes``: the catalogue's codes of drains the scheduler made
    itself (``scheduler = true``)."""

    policy: str
    dry_run: bool
    label_field: str
    reboot_mode: str
    replace_mode: str
    reboot_command: tuple[str, ...]
    replace_command: tuple[str, ...]
    command_timeout: float
    reboot_window: float
    min_reboot_interval: float
    max_drained_percent: float
    max_drained_nodes: Optional[int]
    adopt_slurm_drains: bool
    retry_min: float
    retry_max: float
    recheck_interval: float
    gpu_reset_command: tuple[str, ...]
    gpu_reset_timeout: float
    max_remediations: int
    remediation_window: float
    scheduler_codes: frozenset[str] = frozenset()

    @classmethod
    def of(
        cls, section: Mapping[str, Any], scheduler_codes: frozenset[str] = frozenset()
    ) -> Recovery:
        """From the section's (validated) values."""
        max_nodes = section["max_drained_nodes"]
        return cls(
            policy=str(section["policy"]),
            dry_run=bool(section["dry_run"]),
            label_field=str(section["label_field"]),
            reboot_mode=str(section["reboot_mode"]),
            replace_mode=str(section["replace_mode"]),
            reboot_command=tuple(str(a) for a in section["reboot_command"] or ()),
            replace_command=tuple(str(a) for a in section["replace_command"] or ()),
            command_timeout=float(section["command_timeout"]),
            reboot_window=float(section["reboot_window"]),
            min_reboot_interval=float(section["min_reboot_interval"]),
            max_drained_percent=float(section["max_drained_percent"]),
            max_drained_nodes=int(max_nodes) if max_nodes is not None else None,
            adopt_slurm_drains=bool(section["adopt_slurm_drains"]),
            retry_min=float(section["retry_min"]),
            retry_max=float(section["retry_max"]),
            recheck_interval=float(section["recheck_interval"]),
            gpu_reset_command=tuple(str(a) for a in section["gpu_reset_command"] or ()),
            gpu_reset_timeout=float(section["gpu_reset_timeout"]),
            max_remediations=int(section["max_remediations"]),
            remediation_window=float(section["remediation_window"]),
            scheduler_codes=scheduler_codes,
        )

    def mode(self, kind: str) -> str:
        """``reboot_mode`` of a reboot, ``replace_mode`` of a replace, "" of other actions."""
        return {"reboot": self.reboot_mode, "replace": self.replace_mode}.get(kind, "")

    def command(self, kind: str) -> tuple[str, ...]:
        """The hook of a reboot or replace (``reboot_command``/``replace_command``)."""
        return self.reboot_command if kind == "reboot" else self.replace_command


def recovery_options(declared: Sequence[Mapping[str, Option]]) -> dict[str, Option]:
    """``[recovery]``: ``RECOVERY`` with the keys the backends declare (``Backend.recovery``, in
    the order given) after ``dry_run``. A key two backends declare takes the first one's default
    and text, and the choices of both."""
    keys: dict[str, Option] = {}
    for options in declared:
        for key, opt in options.items():
            known = keys.get(key)
            keys[key] = (
                opt
                if known is None
                else replace(known, choices=tuple(dict.fromkeys((*known.choices, *opt.choices))))
            )
    order = list(RECOVERY)
    at = order.index("dry_run") + 1
    return {
        **{key: RECOVERY[key] for key in order[:at]},
        **keys,
        **{key: RECOVERY[key] for key in order[at:]},
    }


def problems(recovery: Mapping[str, Any]) -> list[str]:
    """Cross-key errors that single options cannot check (a mode no backend declares is
    unset)."""
    out = []
    if recovery.get("reboot_mode") == "command" and not recovery["reboot_command"]:
        out.append("recovery.reboot_command: required when reboot_mode = 'command'")
    if recovery.get("replace_mode") == "command" and not recovery["replace_command"]:
        out.append("recovery.replace_command: required when replace_mode = 'command'")
    if recovery["gpu_reset"] and not recovery["gpu_reset_command"]:
        out.append("recovery.gpu_reset_command: required when gpu_reset = true")
    if recovery["retry_max"] < recovery["retry_min"]:
        out.append("recovery.retry_max: must be >= retry_min")
    return out


def cluster_options(backends: Collection[str], default: str) -> dict[str, Option]:
    """``[cluster]``: which of the installed ``backends`` acts on the cluster (``default``, the
    built-in one, unless the file says)."""
    return {
        "backend": Option(
            "choice",
            default,
            "Cluster backend (entry point group hma.backends); its own section configures it.",
            choices=tuple(sorted({default, *backends})),
        ),
    }
