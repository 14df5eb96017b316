"""Property: a component named after text that others chose (a mount point, a device name) is
within the component grammar (hma.contracts.model: COMPONENT_MAX characters, no blank, refused
character or separator), so the node label carries it as it is and a drain reason names it in
one word; two names give two components (issue 32)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from mutate import budget

from hma.adapters.text import printable
from hma.contracts import label as lab
from hma.contracts.model import (
    COMPONENT_MAX,
    COMPONENT_SEPARATORS,
    Action,
    Clears,
    Severity,
    named_component,
)
from hma.health.model import Fault
from hma.remediation import planner

NAME = st.one_of(
    st.text(max_size=300),
    st.text(st.sampled_from("/ab \t\n,+=\"'\\\u2028\u202e\u3000é\x00"), max_size=200),
)


@given(NAME)
@budget(300)
def test_any_name_gives_a_component_within_the_grammar(name: str) -> None:
    comp = named_component("fs", name)
    assert comp.startswith("fs:") and len(comp) <= COMPONENT_MAX
    assert printable(comp) == comp
    assert not any(ch.isspace() for ch in comp)
    assert not set(comp) & (COMPONENT_SEPARATORS - {"\\"})  # a backslash starts an escape
    token = lab.Label("unhealthy", "SYS_FS_READONLY", "reboot", component=comp).token()
    read = lab.parse_strict(token)
    assert read is not None and read.component == comp


@given(NAME, NAME)
@budget(200)
def test_two_names_are_two_components(a: str, b: str) -> None:
    if a != b:
        assert named_component("fs", a) != named_component("fs", b)


def test_a_mount_point_is_escaped_as_mountinfo_writes_it() -> None:
    assert named_component("fs", "/my data") == "fs:/my\\040data"
    assert named_component("fs", "/a,b=c") == "fs:/a\\054b\\075c"
    assert named_component("fs", "/x\\040") == "fs:/x\\134040"  # the escape itself is escaped
    assert named_component("fs", "/\u202eevil") == "fs:/\\342\\200\\256evil"
    long = named_component("fs", "/" + "x" * 300)
    assert len(long) == COMPONENT_MAX and long != named_component("fs", "/" + "x" * 301)


def test_the_drain_reason_names_the_mount_in_one_word() -> None:
    comp = named_component("fs", "/scratch space")
    fault = Fault(
        "SYS_FS_READONLY",
        comp,
        Severity.CRITICAL,
        Action.REBOOT,
        "ro",
        {},
        "system",
        1.0,
        2.0,
        2,
        True,
        Clears.OBSERVATION,
        True,
    )
    reason = planner.reason_for(fault)
    assert reason == "HMA: SYS_FS_READONLY fs:/scratch\\040space"
    assert reason.split(" ")[2] == comp
