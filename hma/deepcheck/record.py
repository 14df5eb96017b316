"""Deep-check results into the state store, as probe runs named ``deep_check.STAGE``.

Each stage that ran is one observation: its findings raise at once (``fail_after = 1``) and a
later run of the same stage that passes clears them, through the health model like any probe
run, so ``hma status``, journald and Prometheus show them. A running daemon gets them as a
request (SIGUSR1, as ``hma ack``); without one they are applied to the state store directly.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from hma.contracts.model import Finding, ProbeRun, RunStatus

PROBE_PREFIX = "deep_check."
REQUEST_KIND = "deep_check"


def finding_json(finding: Finding) -> dict[str, Any]:
    """A finding as a request carries it (severity and action come from the catalogue)."""
    return {
        "code": finding.code,
        "component": finding.component,
        "message": finding.message,
        "details": dict(finding.details),
    }


def finding_from_json(item: Mapping[str, Any], probe: str, ts: float) -> Finding:
    """The finding of ``finding_json``; ``KeyError``/``TypeError``/``ValueError`` when malformed."""
    return Finding(
        str(item["code"]),
        str(item["component"]),
        str(item["message"]),
        dict(item.get("details") or {}),
        probe=probe,
        ts=ts,
    )


def to_payload(results: Sequence[Any]) -> dict[str, Any]:
    """The request payload of stage results (skipped stages are not observations)."""
    runs = []
    for r in results:
        if r.verdict == "skipped":
            continue
        runs.append(
            {
                "probe": PROBE_PREFIX + r.stage,
                "status": r.run_status.value,
                "started": r.started,
                "duration_s": r.duration_s,
                "findings": [finding_json(f) for f in r.findings],
            }
        )
    return {"runs": runs}


def from_payload(payload: Mapping[str, Any]) -> list[ProbeRun]:
    """Probe runs of a ``deep_check`` request; malformed entries are left out."""
    out = []
    for run in payload.get("runs", []):
        try:
            probe = str(run["probe"])
            if not probe.startswith(PROBE_PREFIX):
                continue
            started = float(run["started"])
            findings = tuple(finding_from_json(f, probe, started) for f in run["findings"])
            out.append(
                ProbeRun(
                    probe,
                    RunStatus(run["status"]),
                    float(run["started"]),
                    float(run["duration_s"]),
                    findings,
                )
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
    return out


def record(setup: Any, results: Sequence[Any], who: str, now: float) -> str:
    """Hand the results to the running daemon, else apply them to the state store; returns
    what was done, in words. Raises ``hma.health.store.StateError`` when the store cannot be
    opened."""
    from hma.health.pipeline import command_pipeline, open_store
    from hma.health.requests import request_daemon

    payload = to_payload(results)
    store = open_store(setup)
    try:
        pid = request_daemon(setup, store, REQUEST_KIND, payload, who, now)
        if pid is not None:
            return f"results handed to the agent (pid {pid})"
        pipeline = command_pipeline(setup, store, "hma")
        pipeline.start(now)
        for run in from_payload(payload):
            pipeline.observe_run(run, now)
        return "results written to the state store (no agent running)"
    finally:
        store.close()
