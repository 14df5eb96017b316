"""The node's domain: where it comes from, and its token in the node's Slurm field.

The domain is published as the word ``hma-domain=<domain>`` in the node's label field (Extra, or
Comment with ``[recovery] label_field = "comment"``), next to the ``hma=`` label and apart from
it: it stays while the node is healthy. The agent writes it only when the field read by its
heartbeat says something else, so it costs no controller request in the steady state.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from hma.adapters.text import plain
from hma.contracts import label
from hma.topology.options import MAX_DOMAIN

TOKEN = "hma-domain="
# Probes whose summary may carry the GPUs' domain, in order of trust.
SOURCES = (("gpu", "nvml"), ("nvidia_smi", "nvidia-smi"))


def resolve(configured: Optional[str], summaries: Mapping[str, Any]) -> tuple[str, str]:
    """(domain, source): ``[topology] domain`` first, then the ``gpu`` probe's summary, then
    ``nvidia_smi``'s; ("", "") when none knows it."""
    if configured:
        return str(configured), "config"
    for probe, source in SOURCES:
        summary = summaries.get(probe)
        if isinstance(summary, Mapping) and isinstance(summary.get("domain"), str):
            return str(summary["domain"]), source
    return "", ""


def of(text: str) -> str:
    """The domain a field's text publishes ("" when none)."""
    token = label.find_token(text, TOKEN)
    return token[len(TOKEN) :] if token else ""


def problem(domain: str) -> Optional[str]:
    """Why a published domain cannot be used (another node wrote it), or None: longer than
    ``MAX_DOMAIN`` characters, or holding characters the terminal escaping refuses
    (``hma.adapters.text.plain``: controls, format controls, line breaks)."""
    if len(domain) > MAX_DOMAIN:
        return f"longer than {MAX_DOMAIN} characters"
    if not plain(domain):
        return "control characters"
    return None


def edit(text: str, domain: str) -> str:
    """``text`` publishing ``domain`` (the token removed when ""), every other word kept."""
    return label.edit_token(text, TOKEN, TOKEN + domain if domain else None)


def update_for(text: str, domain: str) -> Optional[str]:
    """The field's new text when it does not publish ``domain`` yet, else None (nothing to do).
    An unknown domain ("") never removes a published one: a GPU that cannot be read does not
    take the node out of its domain."""
    if not domain or of(text) == domain:
        return None
    return edit(text, domain)


def publish(backend: Any, node: Any, domain: str) -> Optional[str]:
    """Write ``domain`` into the node's label field through ``backend`` (a remediation
    ``Backend``: its ``label_field`` and ``label``) when the field last read (``node``, a
    ``NodeState``) does not publish it; returns the field's new text, None when nothing was
    written."""
    new = update_for(node.field(backend.label_field), domain)
    if new is not None:
        backend.label(node.name, new)
    return new
