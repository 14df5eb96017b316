"""Property: the label readers over any text in a node's Extra/Comment (arbitrary Unicode, huge
or non-finite numbers, duplicated fields, separators) give a typed label or None (unreadable),
never an exception, and every value they return is within its form and bounds (issue 28). What
the writer writes, whatever text it is given, reads back strictly. ``hma fleet`` renders any
such field, in text and in ``--json``."""

from __future__ import annotations

import json
import math
import re
from typing import Optional

from hypothesis import given
from hypothesis import strategies as st
from mutate import budget
from test_slurm_hostile_text import Slurm, client, node

from hma.commands import fleet
from hma.contracts import label as lab

NOW = 1_800_000_000.0
SEPARATORS = st.sampled_from([" ", "  ", "\t", "\n", "\x1f", "\x85", "\u2028", "\u3000", ","])
NUMBER = st.one_of(
    st.integers(-(10**30), 10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.floats(min_value=lab.MIN_TIME - 10, max_value=NOW + 2 * lab.SKEW).map(lambda f: f"{f:.3f}"),
    st.sampled_from(["nan", "inf", "-inf", "1e300", "9" * 400, "0x10", "1_800_000_000", " 1", ""]),
    st.sampled_from(["١٨٠٠٠٠٠٠٠٠", "1800000000\x1b", "1800000000.", "+1800000000", "-0"]),
)
VALUE = st.one_of(
    NUMBER, st.text(max_size=40), st.sampled_from(["17+18", "gpu:0000:3b:00", "+", "breaker"])
)
TIME = st.one_of(
    st.integers(min_value=int(NOW - 2 * lab.SKEW), max_value=int(NOW + 2 * lab.SKEW)).map(str),
    st.floats(min_value=lab.MIN_TIME - 10, max_value=NOW + 2 * lab.SKEW).map(lambda f: f"{f:.3f}"),
    st.integers(min_value=int(lab.MIN_TIME) - 10, max_value=int(NOW + 2 * lab.SKEW)).map(str),
)
AS_WRITTEN = {  # values in the form hma writes them (mixed with any VALUE below)
    "c": st.sampled_from(["gpu:0000:3b:00", "efa:rdmap16s27", "node"]),
    "t": TIME,
    "d": TIME,
    "r": st.integers(0, 12000).map(str),
    "j": st.lists(st.integers(1, 10**9).map(str), min_size=1, max_size=10).map("+".join),
    "h": st.sampled_from(["breaker", "not_owned", "Breaker", "held!"]),
}
FIELD = st.one_of(
    st.sampled_from(sorted(AS_WRITTEN)).flatmap(
        lambda key: st.one_of(AS_WRITTEN[key], VALUE).map(lambda v: f"{key}={v}")
    ),
    st.builds(
        lambda key, sep, value: key + sep + value,
        st.sampled_from(["c", "t", "r", "j", "h", "d", "x", "", "tt", "T"]),
        st.sampled_from(["=", "", "=="]),
        VALUE,
    ),
)
HEAD = st.one_of(
    st.sampled_from(["unhealthy:GPU_XID_79:reboot", "recovered:X:none", "unhealthy:A_1:replace"]),
    st.sampled_from(["a:b:c", "::", "unhealthy:X", "x:Y:z:w", "unhealthy:X\u202e:none"]),
    st.text(max_size=24),
)
TOKEN = st.one_of(
    st.builds(
        lambda head, fields: "hma=" + head + "".join(f",{k}={v}" for k, v in fields.items()),
        st.sampled_from(["unhealthy:GPU_XID_79:reboot", "recovered:X:none", "a:B:c"]),
        st.fixed_dictionaries({}, optional=AS_WRITTEN),
    ),
    st.builds(
        lambda head, fields: "hma=" + head + "".join("," + f for f in fields),
        HEAD,
        st.lists(FIELD, max_size=10),
    ),
)
CODE = st.sampled_from(["GPU_XID_79", "X", "SYS_FS_READONLY", "a", ""])
ENTRY = st.one_of(
    st.builds(lambda ts, code: f"{ts}:{code}", st.one_of(TIME, NUMBER), CODE),
    st.builds(lambda ts: f"H{ts}", st.one_of(TIME, NUMBER)),
    st.text(max_size=16),
)
HISTORY = st.builds(
    lambda parts: "hmah=" + ",".join(parts),
    st.one_of(
        st.lists(
            st.builds(lambda ts, code: f"{ts.split('.')[0]}:{code}", TIME, CODE.filter(bool)),
            min_size=1,
            max_size=9,
        ),
        st.lists(ENTRY, max_size=10),
    ),
)
MAINT = st.builds(lambda v: f"hma-maint={v}", NUMBER)  # the maintenance word, for fleet
FIELD_TEXT = st.builds(
    lambda words, seps: "".join(w + s for w, s in zip(words, seps)),
    st.lists(st.one_of(TOKEN, HISTORY, MAINT, st.text(max_size=30)), max_size=5),
    st.lists(SEPARATORS, min_size=5, max_size=5),
)


def field_ok(text: str, limit: int) -> bool:
    return (
        0 < len(text) <= limit
        and text.isprintable()
        and not any(c in ",+=" or c.isspace() for c in text)
    )


def check_label(found: Optional[lab.Label], now: Optional[float], strict: bool) -> None:
    """``found`` is None or a label whose every value is within bounds."""
    if found is None:
        return
    for part in (found.state, found.code, found.action):
        assert 0 < len(part) <= 64 and part.isprintable() and ":" not in part and "," not in part
    if strict:
        assert found.state in lab.STATES and found.action in lab.ACTIONS
    for ts in (found.since, found.drained):
        assert math.isfinite(ts) and lab.dated(ts, now)
    assert 0 <= found.reboots <= 9999
    assert found.component == "" or field_ok(found.component, 128)
    assert len(found.jobs) <= lab.MAX_JOBS and all(field_ok(j, 32) for j in found.jobs)
    assert found.held == "" or (found.held.isascii() and found.held.replace("_", "").isalpha())


def check_history(found: Optional[lab.History], now: Optional[float]) -> None:
    if found is None:
        return
    assert (found.entries or found.held) and len(found.entries) <= lab.MAX_HISTORY
    for ts, code in found.entries:
        assert ts and lab.dated(ts, now) and code.isascii() and code[:1].isupper()
    assert lab.dated(found.held, now)
    assert 0 <= found.within(NOW, 7 * 86400) <= len(found.entries)


@given(TOKEN)
@budget(300)
def test_any_token_reads_as_a_bounded_label_or_unreadable(token: str) -> None:
    for now in (None, NOW):
        check_label(lab.parse(token, now), now, strict=False)
        check_label(lab.parse_strict(token, now), now, strict=True)


@given(st.one_of(FIELD_TEXT, st.text()))
@budget(300)
def test_any_field_text_reads_as_bounded_or_unreadable(text: str) -> None:
    for now in (None, NOW):
        check_label(lab.find(text, now), now, strict=False)
        check_history(lab.find_history(text, now), now)


@given(HISTORY)
@budget(200)
def test_any_history_token_reads_as_bounded_or_none(token: str) -> None:
    for now in (None, NOW):
        check_history(lab.parse_history(token, now), now)


@given(
    st.sampled_from(lab.STATES),
    st.from_regex(r"[A-Z][A-Z0-9_]{0,20}", fullmatch=True),
    st.sampled_from(lab.ACTIONS),
    st.text(max_size=200),
    st.lists(st.text(max_size=40), max_size=12),
    st.sampled_from(["", "breaker", "not_owned"]),
    st.floats(min_value=lab.MIN_TIME, max_value=NOW),
)
@budget(150)
def test_what_the_writer_writes_reads_back_strictly(
    state: str, code: str, action: str, component: str, jobs: list[str], held: str, ts: float
) -> None:
    written = lab.Label(state, code, action, component, ts, 2, tuple(jobs), held, round(ts, 3))
    back = lab.parse_strict(written.token(), NOW)
    assert back is not None and (back.state, back.code, back.action) == (state, code, action)
    check_label(back, NOW, strict=True)


@given(st.lists(FIELD_TEXT, min_size=1, max_size=4))
@budget(60)
def test_fleet_renders_every_node_whatever_its_field_holds(texts: list[str]) -> None:
    nodes = [node(f"node{i}", Extra=text.replace("\n", " ")) for i, text in enumerate(texts)]
    doc = fleet.collect(client(Slurm(nodes)), "extra", 10.0, None)
    assert {r["node"] for r in doc["nodes"]} == {n["NodeList"] for n in nodes}  # all HMA-drained
    text = fleet.render_text(doc)
    assert all(n["NodeList"] in text for n in nodes)
    json.dumps(doc, allow_nan=False)


@given(
    st.one_of(
        st.builds(lambda t, c: f"hmap={t}:{c}", NUMBER, VALUE),
        st.builds(
            lambda t, c: f"hmap={t}:{c}",
            TIME,
            st.from_regex(r"[A-Z][A-Z0-9_]{0,70}", fullmatch=True),
        ),
        st.text(max_size=80).map(lambda t: "hmap=" + t),
    )
)
@budget(200)
def test_any_postmortem_token_reads_as_bounded_or_none(token: str) -> None:
    for now in (None, NOW):
        post = lab.parse_postmortem(token, now)
        if post is None:
            continue
        assert lab.dated(post.ts, now) and post.ts > 0
        assert re.fullmatch(r"[A-Z][A-Z0-9_]{0,63}", post.cause)
        assert lab.parse_postmortem(post.token(), now) == post  # reads back as written
