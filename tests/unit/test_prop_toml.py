"""The one TOML writer (``hma.adapters.tomlcompat.dumps``, what `hma genconf` writes): any text
in keys and values, TOML's metacharacters and control characters included, reads back as written.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mutate import budget

from hma.adapters import tomlcompat

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
HOSTILE = st.sampled_from(['"', "\\", "\n", "\r", "#", "[", "]", "=", "'''", '"""', "\x7f", "\x00"])
SCALARS = st.one_of(
    TEXT,
    st.lists(HOSTILE, max_size=4).map("".join),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
)
VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=4))
TABLES = st.recursive(
    st.dictionaries(TEXT, VALUES, max_size=4),
    lambda inner: st.dictionaries(TEXT, st.one_of(VALUES, inner), max_size=3),
    max_leaves=12,
)


@budget(150)
@given(data=TABLES)
def test_what_is_written_reads_back_the_same(data: dict) -> None:
    assert tomlcompat.loads(tomlcompat.dumps(data, "a header\nof two lines")) == data


def test_a_mount_point_and_a_model_name_of_metacharacters() -> None:
    data = {
        "match": {"product": ['XE9680 "rev" [2] = # x']},
        "probes": {"system": {"filesystems": ["/", '/data "q" #]= \\ x', "/bad\nline"]}},
    }
    text = tomlcompat.dumps(data)
    assert '"/bad\\nline"' in text and tomlcompat.loads(text) == data


@pytest.mark.parametrize("value", [float("nan"), float("inf"), object(), [{"a": 1}], "\ud800"])
def test_what_toml_cannot_hold_is_refused(value: object) -> None:
    with pytest.raises(ValueError):
        tomlcompat.dumps({"key": value})
