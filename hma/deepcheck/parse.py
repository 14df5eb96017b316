"""Readers of the deep-check tools' outputs. Each raises ``ValueError`` naming what it could not
read: a stage turns that into an unknown verdict, never a fault."""

from __future__ import annotations

import json
import math
import re
from typing import Any, Optional

DCGM_VERDICTS = {"pass": "pass", "fail": "fail", "warn": "warn", "warning": "warn", "skip": "skip"}
_NUMBER = re.compile(r"^-?\d+(\.\d+)?(e[-+]?\d+)?$", re.IGNORECASE | re.ASCII)
# Physical bounds of a reading; beyond them the output is garbage, not a measurement.
MAX_BUSBW_GBPS = 1e5  # 100 TB/s: over 50 times one NVLink 5 GPU (1.8 TB/s)
MAX_PINGPONG_MBPS = 1e6  # 1 TB/s: 20 times a 400 Gbps EFA adapter
MAX_PINGPONG_LATENCY_US = 60e6  # a minute per transfer (the stage times out long before)


def number(text: str, what: str, high: float, positive: bool = False) -> float:
    """``text`` as a finite decimal in ``[0, high]`` (``(0, high]`` when ``positive``), else
    ``ValueError`` naming ``what``: nan, inf and out-of-range readings are not measurements."""
    value = float(text) if _NUMBER.match(text.strip()) else math.nan
    if not (math.isfinite(value) and 0 <= value <= high) or (positive and value == 0):
        raise ValueError(f"{what} is not a reading: {text.strip()[:40]!r}")
    return value


def stress_metrics(text: str) -> dict[str, dict[str, str]]:
    """stress-ng ``--yaml`` file: ``{stressor: {key: value}}`` of its ``metrics:`` list.

    Only the flat two-level shape stress-ng writes is read (no YAML library needed)."""
    out: dict[str, dict[str, str]] = {}
    in_metrics, current = False, None
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip() or line.strip() in ("---", "..."):
            continue
        if not line.startswith(" "):
            in_metrics, current = line == "metrics:", None
            continue
        if not in_metrics:
            continue
        item = line.strip()
        if item.startswith("- "):
            item = item[2:]
            key, _, value = item.partition(":")
            if key.strip() != "stressor" or not value.strip():
                raise ValueError(f"metrics entry without a stressor: {raw.strip()[:80]!r}")
            current = value.strip()
            out[current] = {}
            continue
        key, sep, value = item.partition(":")
        if not sep or current is None:
            raise ValueError(f"unreadable metrics line: {raw.strip()[:80]!r}")
        out[current][key.strip()] = value.strip()
    if not out:
        raise ValueError("no metrics in stress-ng's YAML output")
    return out


def dcgm_results(text: str) -> list[dict[str, Any]]:
    """``dcgmi diag -j``: one ``{category, test, gpus, verdict, messages}`` per result entry.

    ``verdict`` is DCGM's own (pass, fail, warn, skip); anything else is refused."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"dcgmi output is not JSON: {exc}") from None
    root = None
    if isinstance(doc, dict):
        root = doc.get("DCGM GPU Diagnostic") or doc.get("DCGM Diagnostic")
    if not isinstance(root, dict) or not isinstance(root.get("test_categories"), list):
        raise ValueError("dcgmi output has no 'DCGM GPU Diagnostic'.test_categories")
    out = []
    for category in root["test_categories"]:
        for test in _list(category, "tests"):
            for result in _list(test, "results"):
                status = str(result.get("status", "")).strip().lower()
                if status not in DCGM_VERDICTS:
                    raise ValueError(f"test {test.get('name')!r}: unknown status {status!r}")
                ids = result.get("gpu_ids", result.get("gpu_id", ""))
                gpus = [g.strip() for g in str(ids).split(",") if g.strip()]
                if not all(g.isascii() and g.isdigit() for g in gpus):
                    raise ValueError(f"test {test.get('name')!r}: bad gpu_ids {ids!r}")
                out.append(
                    {
                        "category": str(category.get("category", "")),
                        "test": str(test.get("name", "")),
                        "gpus": gpus,
                        "verdict": DCGM_VERDICTS[status],
                        "messages": [_message(w) for w in result.get("warnings") or []],
                    }
                )
    if not out:
        raise ValueError("dcgmi output lists no test results")
    return out


def _list(node: Any, key: str) -> list[dict[str, Any]]:
    value = node.get(key) if isinstance(node, dict) else None
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ValueError(f"dcgmi output: {key!r} is not a list of objects")
    return value


def _message(warning: Any) -> str:
    """A DCGM warning: a string (format 1.3) or ``{"warning": ..., "error_id": N}``."""
    if isinstance(warning, dict):
        return str(warning.get("warning", ""))[:300]
    return str(warning)[:300]


def busbw(text: str) -> dict[str, Any]:
    """The bus bandwidth of an nccl-tests ``*_perf`` or ``nccom-test`` table.

    ``{"busbw_gbps": busbw of the largest size, "size": bytes, "avg_busbw_gbps": the tool's
    average line or None, "wrong": rows with a non-zero #wrong}``. The largest size is what is
    judged: small sizes measure latency."""
    header: Optional[list[str]] = None
    rows: list[list[str]] = []
    avg: Optional[float] = None
    for raw in text.splitlines():
        line = raw.strip().lstrip("#").strip()
        low = line.lower()
        if low.startswith("avg bus bandwidth"):
            value = low.split(":", 1)[-1].strip().removesuffix("gb/s").strip()
            try:
                avg = number(value, "average busbw", MAX_BUSBW_GBPS)
            except ValueError:
                avg = None
        elif "busbw" in low and header is None:
            header = low.split()
        elif header is not None and not raw.lstrip().startswith("#"):
            cols = line.split()
            if cols and cols[0].isdigit():
                rows.append(cols)
    if header is None:
        raise ValueError("no bandwidth table (no busbw column) in the output")
    if not rows:
        raise ValueError("the bandwidth table has no rows")
    col = next(i for i, name in enumerate(header) if name.startswith("busbw"))
    last = max(rows, key=lambda r: int(r[0]))
    if col >= len(last):
        raise ValueError(f"unreadable busbw in row {' '.join(last)[:80]!r}")
    bw = number(last[col], "busbw", MAX_BUSBW_GBPS)
    wrong_cols = [i for i, name in enumerate(header) if name == "#wrong"]
    wrong = sum(1 for r in rows for i in wrong_cols if i < len(r) and r[i] not in ("0", "N/A"))
    return {"busbw_gbps": bw, "size": int(last[0]), "avg_busbw_gbps": avg, "wrong": wrong}


def pingpong(text: str) -> dict[str, float]:
    """The first result row of fi_pingpong's table: ``{"latency_us", "bandwidth_mbps"}``.

    Latency must be positive; bandwidth may be 0 (fi_pingpong prints ``0.00`` MB/sec for small
    messages over a slow provider). Both finite and within physical bounds, else ``ValueError``."""
    lines = [line.split() for line in text.splitlines() if line.strip()]
    for i, cols in enumerate(lines):
        if "usec/xfer" in cols and "MB/sec" in cols and i + 1 < len(lines):
            row = lines[i + 1]
            lat, bw = cols.index("usec/xfer"), cols.index("MB/sec")
            if max(lat, bw) >= len(row):
                break
            return {
                "latency_us": number(row[lat], "latency", MAX_PINGPONG_LATENCY_US, positive=True),
                "bandwidth_mbps": number(row[bw], "bandwidth", MAX_PINGPONG_MBPS),
            }
    raise ValueError("no result row in fi_pingpong's output")
