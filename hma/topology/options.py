"""Configuration keys of ``[topology]`` (registered in ``hma.assembly.FEATURE_SECTIONS``)."""

from __future__ import annotations

from typing import Any, Optional

from hma.contracts.options import Option

# Characters a domain name may hold: it is a word of the node's Extra field and part of a block
# name in topology.conf.
DOMAIN_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
MAX_DOMAIN = 80


def domain_problem(value: Any) -> Optional[str]:
    """Why ``value`` cannot be a domain name, or None."""
    text = str(value)
    if not text or len(text) > MAX_DOMAIN or not set(text) <= DOMAIN_CHARS:
        return f"1 to {MAX_DOMAIN} characters of A-Z a-z 0-9 . _ -"
    return None


TOPOLOGY: dict[str, Option] = {
    "domain": Option(
        "str",
        None,
        "This node's NVLink/NeuronLink domain when only an outside source knows it (Trn2 "
        "UltraServer, a lifecycle script); unset: the GPUs' fabric (NVML, then nvidia-smi).",
        check=domain_problem,
    ),
    "spares_per_domain": Option(
        "int",
        0,
        "Nodes of each domain kept out of service as spares (drained, reason hma-spare); a "
        "replaced node's place is taken by a healthy spare of its domain.",
        minimum=0,
    ),
    "domain_size": Option(
        "int",
        None,
        "Nodes per domain (18 for GB200 NVL72); unset: the largest domain seen. BlockSizes is "
        "this minus spares_per_domain.",
        minimum=1,
    ),
    "format": Option(
        "choice",
        "block",
        "File hma topology writes: block (topology.conf, Slurm 23.11+), yaml (topology.yaml, "
        "25.05+) or tree (topology.conf SwitchName= lines, 22.05).",
        choices=("block", "yaml", "tree"),
    ),
    "file": Option(
        "path",
        None,
        "File hma topology writes; unset: topology.conf (topology.yaml) next to slurm.conf.",
    ),
    "reconfigure": Option(
        "bool", True, "Run scontrol reconfigure after hma topology changed the file."
    ),
}
