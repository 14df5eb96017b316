"""Configuration keys of ``[watch]`` (registered in ``hma.assembly.FEATURE_SECTIONS``) and their
typed form."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from hma.contracts.options import Option, positive

WATCH: dict[str, Option] = {
    "interval": Option(
        "float", 30.0, "Seconds between two reads of the node table (one read each).", minimum=1
    ),
    "down_after": Option(
        "float",
        600.0,
        "Seconds a node must be not responding (DOWN*, NOT_RESPONDING) before it is rebooted "
        "out of band, whatever its reason says.",
        check=positive,
    ),
    "reboot_deadline": Option(
        "float",
        None,
        "Seconds a node may stay REBOOT_ISSUED, or not back after a reboot the watcher asked "
        "for, before it is replaced; unset: slurm.conf's ResumeTimeout (600 when Slurm has none).",
        check=positive,
    ),
    "completing_after": Option(
        "float", 1800.0, "Seconds a node may stay COMPLETING before it is reported.", check=positive
    ),
    "completing_action": Option(
        "choice",
        "report",
        "What a node stuck COMPLETING gets: report (an alert, nothing else) or reboot.",
        choices=("report", "reboot"),
    ),
    "hold_reserved": Option(
        "bool",
        False,
        "Also hold actions on nodes in any reservation (maintenance reservations always hold).",
    ),
    "state_dir": Option(
        "path", "/var/lib/hma/watch", "Folder of the watcher's state (state.json, atomic writes)."
    ),
    "claim_file": Option(
        "path",
        None,
        "The claim of the one acting watcher; on storage every controller shares (the "
        "StateSaveLocation's file system) where slurmctld has a backup. Unset: in state_dir.",
    ),
    "evidence_remote": Option(
        "strlist",
        [],
        "Argv prefix that runs a command on a node that still answers (the node's name is "
        'appended), e.g. ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]: a node '
        "stuck COMPLETING gets its kernel log in the evidence bundle. Empty: the bundle holds "
        "what the controller knows (the node's record, the decision).",
    ),
    "controller_names": Option(
        "strlist",
        None,
        "Names scontrol ping may give this host's slurmctld (SlurmctldHost); unset: the host "
        "name, its short form and FQDN.",
    ),
}


@dataclass(frozen=True)
class Watch:
    """The ``[watch]`` values, typed (``reboot_deadline`` None: Slurm's ResumeTimeout)."""

    interval: float
    down_after: float
    reboot_deadline: Optional[float]
    completing_after: float
    completing_action: str
    hold_reserved: bool
    state_dir: str
    claim_file: str
    controller_names: tuple[str, ...]
    evidence_remote: tuple[str, ...] = ()

    @classmethod
    def of(cls, section: Mapping[str, Any]) -> Watch:
        """From the section's (validated) values."""
        deadline = section["reboot_deadline"]
        state_dir = str(section["state_dir"])
        return cls(
            interval=float(section["interval"]),
            down_after=float(section["down_after"]),
            reboot_deadline=float(deadline) if deadline is not None else None,
            completing_after=float(section["completing_after"]),
            completing_action=str(section["completing_action"]),
            hold_reserved=bool(section["hold_reserved"]),
            state_dir=state_dir,
            claim_file=str(section["claim_file"] or f"{state_dir}/claim.json"),
            controller_names=tuple(str(n) for n in section["controller_names"] or ()),
            evidence_remote=tuple(str(a) for a in section["evidence_remote"] or ()),
        )
