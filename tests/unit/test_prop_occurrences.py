"""Property (issue 28, part 7): ``[codes.X]`` counting (N within T) and observe mode over a damaged
``occurrences`` table. Rows hold garbage (not JSON, nesting deeper than the parser's stack, other
shapes, times that are strings, booleans, NaN, infinite, huge or in the future, components that
are not strings, keys that are not text, thousands of copies of one occurrence) next to valid
occurrences. The count then is the valid, distinct occurrences in the window and the new one:
a damaged row is dropped (its count starts again), a damaged item never counts, nothing raises,
and what is written back reads cleanly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from mutate import budget

from hma.contracts.catalogue import load_builtin
from hma.health import records
from hma.health.model import HealthModel
from hma.health.store import Store
from hma.probes.nvidia.xid import xid_finding

PCI, GPU3, OTHER = "0000:3b:00", "gpu:0000:3b:00", "gpu:0000:5d:00"
CODE = "GPU_XID_13"
NOW = 1_800_000_000.0
WITHIN = 3600.0
XID13 = {"after": 3, "within": "1h", "severity": "critical", "action": "reboot"}
ACT = load_builtin().with_overrides({CODE: XID13})
OBSERVE = load_builtin().with_overrides({CODE: {**XID13, "mode": "observe"}})

# valid: in the window, before NOW, another component (no merge with the new one)
VALID = st.builds(
    lambda age, source: [NOW - age, OTHER, source],
    st.floats(1.0, WITHIN - 1.0),
    st.sampled_from(["kernel_log", "nvml_events", "gpu"]),
)
FUTURE = st.builds(
    lambda ahead, source: [NOW + ahead, OTHER, source],
    st.floats(1.0, 1e12),
    st.sampled_from(["kernel_log", "gpu"]),
)  # readable, never counted
BAD_TIME = st.sampled_from(
    [float("nan"), float("inf"), float("-inf"), "1799999999", True, None, 10**400, [1]]
)
BAD_ITEM = st.one_of(
    st.builds(lambda t: [t, OTHER, "kernel_log"], BAD_TIME),
    st.sampled_from(
        [[NOW - 5, 7, "kernel_log"], [NOW - 5, OTHER, None], [NOW - 5, OTHER], [], {}, "x", 13]
    ),
    st.builds(lambda t: [t, OTHER, "gpu", "extra"], st.floats(1.0, 100.0).map(NOW.__sub__)),
)
NOT_A_LIST = st.sampled_from(
    ["", "not json", "null", "NaN", "{}", '"x"', "13", "[" * 100_000, "[[1, 2, 3]" + "]" * 5, 5]
)


def _text(items: list[Any]) -> str:
    return json.dumps(items)  # NaN and Infinity as Python's json writes and reads them


@st.composite
def rows(draw: Any) -> tuple[list[tuple[Any, Any, Any]], int, bool]:
    """Rows for the table, how many valid distinct occurrences of the counted key they hold in
    the window, and whether that key's row is readable at all."""
    valid = draw(st.lists(VALID, max_size=4, unique_by=lambda v: (v[0], v[2])))
    bad = draw(st.lists(BAD_ITEM, max_size=2))
    copies = draw(st.sampled_from([1, 1, 2, 5000]))  # one occurrence written thousands of times
    items = [*valid, *valid[:1] * (copies - 1), *draw(st.lists(FUTURE, max_size=3))]
    readable = not bad
    data: Any = _text(items + bad) if draw(st.booleans()) else _text(bad + items)
    if draw(st.integers(0, 5)) == 0:
        data, readable = draw(NOT_A_LIST), False
    table = [(GPU3, CODE, data)]
    others = draw(
        st.lists(
            st.tuples(
                st.sampled_from([GPU3, "node", 7, 1.5, b"\xff", ""]),
                st.sampled_from(["GPU_XID_79", "NO_SUCH_CODE", 13, b"x"]),
                st.one_of(NOT_A_LIST, st.lists(VALID, max_size=2).map(_text)),
            ),
            max_size=3,
        )
    )
    return table + others, len(valid) if readable else 0, readable


def _store(tmp_path: Path, table: list[tuple[Any, Any, Any]]) -> Store:
    path = tmp_path / "state.db"
    path.unlink(missing_ok=True)
    store = Store(str(path))
    with store.transaction() as conn:
        for scope, code, data in table:
            conn.execute("INSERT OR REPLACE INTO occurrences VALUES (?, ?, ?)", (scope, code, data))
    return store


def _xid(catalogue: Any) -> Any:
    (found,) = catalogue.resolve_all([xid_finding(13, PCI, {}, "kernel_log")])
    return found.with_(probe="kernel_log")


@budget(150)
@given(drawn=rows(), observe=st.booleans())
def test_a_damaged_occurrences_table_never_counts_what_it_cannot_read(
    tmp_path: Path, drawn: tuple[list[tuple[Any, Any, Any]], int, bool], observe: bool
) -> None:
    table, valid, readable = drawn
    catalogue = OBSERVE if observe else ACT
    store = _store(tmp_path, table)
    try:
        loaded, bad = records.load_occurrences(store)
        assert readable == ((GPU3, CODE) in loaded)
        assert all(isinstance(k, str) for key in loaded for k in key)
        model = HealthModel(catalogue, "b", (), loaded)
        model.tick(NOW)
        verdict = model.observe_event(_xid(catalogue), NOW)
        seen = valid + 1
        [fault] = [f for f in verdict.faults if f.code == CODE]
        assert fault.severity.name == ("CRITICAL" if seen >= 3 and not observe else "WARNING")
        assert len(verdict.draining) == (1 if seen >= 3 and not observe else 0)
        assert fault.would == ("reboot" if seen >= 3 and observe else "")
        assert f"{min(seen, 3)} of 3" in verdict.transitions[0].reason
        records.save_occurrences(store, sorted(model.changed_occurrences), model.occurrences())
        again, _bad = records.load_occurrences(store)
        assert again[(GPU3, CODE)] == model.occurrences()[(GPU3, CODE)]
        assert len(again[(GPU3, CODE)]) <= 3
        assert len(bad) >= (0 if readable else 1)
    finally:
        store.close()


def test_a_missing_or_reshaped_occurrences_table_starts_the_count_again(tmp_path: Path) -> None:
    for damage in (
        "DROP TABLE occurrences",
        "ALTER TABLE occurrences ADD COLUMN n INTEGER",
        "ALTER TABLE occurrences RENAME TO gone",
    ):
        path = tmp_path / "state.db"
        for old in tmp_path.iterdir():
            old.unlink()
        store = Store(str(path))
        records.save_occurrences(
            store, [(GPU3, CODE)], {(GPU3, CODE): [(NOW - 9, GPU3, "gpu"), (NOW - 5, OTHER, "gpu")]}
        )
        with store.transaction() as conn:
            conn.execute(damage)
        store.close()
        store = Store(str(path), memory=True)
        try:
            loaded, bad = records.load_occurrences(store)
            assert (loaded, bad) == ({}, [])
            verdict = HealthModel(ACT, "b", (), loaded).observe_event(_xid(ACT), NOW)
            assert verdict.draining == () and "1 of 3" in verdict.transitions[0].reason
            assert store.kv_get("state_damage")
        finally:
            store.close()
