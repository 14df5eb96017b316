"""The hook runner: a reboot or replace in mode ``command`` runs the configured hook
(``[recovery] reboot_command``/``replace_command``) with the node, the action, the findings,
the spare and the evidence bundle in its environment and a findings file; and the commands of
an evidence bundle (``output_of``). The only module of remediation that runs a command (an
import contract in setup.cfg keeps it so)."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Callable, Mapping, Optional, Sequence

from hma.adapters.command import CommandRunner
from hma.adapters.text import printable
from hma.contracts.cluster import BackendError
from hma.health.model import Verdict
from hma.remediation.options import Recovery
from hma.remediation.planner import Episode


def run_hook(
    rec: Recovery,
    kind: str,
    node: str,
    action: tuple[str, str],
    ep: Optional[Episode],
    known: tuple[Optional[Verdict], str],
    spare: Callable[[], str],
    backend_env: Mapping[str, str],
    evidence: str,
) -> None:
    """Run the ``kind`` hook for ``node``; ``action``: the outbox row's (reason, key),
    ``known``: the engine's verdict and the node's domain, ``spare``: the spare taken for a
    replace, ``backend_env``: what the backend adds to the environment, ``evidence``: the
    bundle gathered before it ("" none; ``HMA_EVIDENCE``). Raises ``BackendError`` when the
    hook fails (retried)."""
    reason, key = action
    verdict, domain = known
    findings = [f.to_json() for f in (verdict.draining if verdict is not None else ())]
    taken = spare() if kind == "replace" else ""  # once: the file and the environment agree
    fd, path = tempfile.mkstemp(prefix="hma-findings-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(
                {
                    "node": node,
                    "action": kind,
                    "reason": reason,
                    "jobs": list(ep.jobs) if ep else [],
                    "findings": findings,
                    "domain": domain,
                    "spare": taken,
                    "evidence": evidence,
                },
                fh,
            )
        env = {**os.environ, **backend_env}
        env.update(
            HMA_NODE=node,
            HMA_ACTION=kind,
            HMA_REASON=reason,
            HMA_ACTION_ID=key,
            HMA_FINDINGS_FILE=path,
            HMA_DOMAIN=domain,
            HMA_SPARE=taken,
            HMA_EVIDENCE=evidence,
        )
        argv = list(rec.command(kind))
        result = CommandRunner().run(argv, rec.command_timeout, env=env)
    finally:
        os.unlink(path)
    if not result.ok:
        # the hook's own words, cut before they are escaped (status and journald show them)
        err = printable((result.stderr.strip() or result.stdout.strip() or result.error)[-300:])
        what = (
            f"timed out after {rec.command_timeout:g} s"
            if result.timed_out
            else f"exited {result.rc}"
        )
        raise BackendError(f"{kind} hook {what}" + (f": {err}" if err else ""))


def output_of(
    argv: Sequence[str], timeout: float, cap: int, env: Mapping[str, str]
) -> tuple[str, str]:
    """(stdout, why it is not whole: "" when it ran to exit 0) of ``argv`` within ``timeout``
    seconds, stdout cut at ``cap`` bytes (an evidence bundle's piece); ``env``: what the
    backend adds to the environment."""
    result = CommandRunner(output_cap=cap).run(list(argv), timeout, env={**os.environ, **env})
    if result.timed_out:
        why = f"timed out after {timeout:.1f} s"
    elif result.error:
        why = result.error
    elif result.rc != 0:
        why = f"exited {result.rc}: {printable(result.stderr.strip()[-200:])}"
    else:
        why = result.cut_message()
    return result.stdout, why
