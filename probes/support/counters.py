"""Event counters read twice: their growth between the reads, and its rate against limits.

Shared by the check families that judge hardware counters (infiniband, efa, neuron), which may
not import each other. What a family's counters do at their maximum (saturate, wrap) and what a
changed boot id means are parameters, never guessed. Only ``sampled`` reads (through the probe's
own reader); the rest is pure.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Optional

from hma.contracts.model import Finding
from hma.contracts.options import Option
from hma.contracts.probe import ProbeContext

# counter name, value now, value before -> growth (None: unknown)
Growth = Callable[[str, Optional[int], Optional[int]], Optional[int]]

CRITICAL_FACTOR = Option(
    "float", 10.0, "A rate at this multiple of its limit is critical.", minimum=1
)
ONESHOT_SAMPLE = Option(
    "float",
    1.0,
    "Under `hma check`: seconds between the two samples for rates (0: not evaluated).",
    minimum=0,
)


def sampled(ctx: ProbeContext, read: Callable[[], dict[str, Any]], key: str) -> dict[str, Any]:
    """A snapshot from ``read`` (it sets ``ts``). Under `hma check`, where no previous run left
    one, a second snapshot taken ``oneshot_sample_s`` later (0: none) with the first one's
    ``key`` and ``ts`` as its ``baseline``."""
    snap = read()
    interval = float(ctx.options["oneshot_sample_s"])
    if ctx.previous is None and ctx.oneshot and interval > 0:
        time.sleep(interval)
        second = read()
        second["baseline"] = {"ts": snap["ts"], key: snap[key]}
        return second
    return snap


def growth(
    now: Optional[int],
    before: Optional[int],
    *,
    saturates_at: Optional[int] = None,
    wraps_at: Optional[int] = None,
) -> Optional[int]:
    """Growth of an event counter between two reads; None when it is unknown: a read missing,
    a counter at ``saturates_at`` (a saturating counter stops there and no longer counts), or a
    reset (the value went down), except that a fall from the upper half of a counter that wraps
    at ``wraps_at`` is one wrap."""
    if now is None or before is None:
        return None
    if saturates_at is not None and now >= saturates_at:
        return None
    if now >= before:
        return now - before
    if wraps_at is not None and before >= wraps_at // 2:
        return wraps_at - before + now
    return None


def rate_findings(
    codes: tuple[str, str],
    family: str,
    units: Mapping[str, Any],
    base: Mapping[str, Any],
    dt: float,
    opts: Mapping[str, Any],
    *,
    counters: Callable[[Mapping[str, Any]], Mapping[str, int]],
    grow: Growth,
) -> list[Finding]:
    """The counters of each port or adapter of ``units`` (name -> readings; ``counters`` picks
    its counter values, from its ``base`` readings too) whose growth (``grow``) over ``dt``
    seconds reaches their per-second limit in ``opts["rate_limits"]``: per unit (component
    "<family>:<name>"), one finding per code of ``codes`` (warning, critical: from
    ``opts["critical_factor"]`` times the limit) listing its counters. A unit ``base`` lacks
    has no rate."""
    limits: Mapping[str, float] = opts["rate_limits"]
    factor = float(opts["critical_factor"])
    warn, crit = codes
    out = []
    for name, info in sorted(units.items()):
        if not base.get(name):
            continue  # new since the baseline: no growth known
        now, before = counters(info), counters(base[name])
        high: dict[str, list[dict[str, Any]]] = {}
        for counter, limit in sorted(limits.items()):
            grown = grow(counter, now.get(counter), before.get(counter))
            if grown is None or grown / dt < limit:
                continue
            rate = grown / dt
            high.setdefault(crit if rate >= limit * factor else warn, []).append(
                {"counter": counter, "rate_per_s": round(rate, 3), "limit_per_s": limit}
            )
        for code, items in sorted(high.items()):
            what = ", ".join(f"{i['counter']} {i['rate_per_s']:g}/s" for i in items)
            out.append(
                Finding(
                    code,
                    f"{family}:{name}",
                    f"{name}: {what} over the limit",
                    {"counters": items, "interval_s": round(dt, 3)},
                )
            )
    return out


def rebooted(previous: Mapping[str, Any], snapshot: Mapping[str, Any], *, strict: bool) -> bool:
    """Whether ``snapshot`` was taken in another boot than ``previous`` (their ``boot_id``s):
    two known ids that differ; with ``strict``, also an id known on one side only."""
    was, now = previous.get("boot_id"), snapshot.get("boot_id")
    return was != now and (strict or bool(was and now))


def baseline(
    snapshot: Mapping[str, Any], ctx: ProbeContext, key: str, *, strict_boot: bool
) -> tuple[Optional[dict[str, Any]], float]:
    """The readings (``snapshot[key]``) that counters grew from, and their time: the first
    sample of a one-shot check (``snapshot["baseline"]``) or the previous run's snapshot; None
    when there is none, or it is of another boot (``rebooted`` with ``strict_boot``: counters
    restarted, and the next run has a baseline again)."""
    if isinstance(snapshot.get("baseline"), dict):
        base = snapshot["baseline"]
        return dict(base.get(key, {})), float(base.get("ts", 0.0))
    prev = ctx.previous
    if not isinstance(prev, dict) or rebooted(prev, snapshot, strict=strict_boot):
        return None, 0.0
    return dict(prev.get(key, {})), float(prev.get("ts", ctx.previous_ts) or ctx.previous_ts)
