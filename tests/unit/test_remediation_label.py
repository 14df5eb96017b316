"""The hma= label token: format, parsing, in-place edits."""

from __future__ import annotations

from hma.contracts import label as lab


def test_token_round_trip() -> None:
    item = lab.Label(
        "unhealthy",
        "GPU_XID_79",
        "reboot",
        "gpu:0000:3b:00",
        1764410040.7,
        2,
        ("17", "18"),
        "breaker",
        1764410041.123,
    )
    token = item.token()
    assert token == (
        "hma=unhealthy:GPU_XID_79:reboot,c=gpu:0000:3b:00,t=1764410040,r=2,j=17+18,h=breaker,"
        "d=1764410041.123"
    )
    back = lab.parse(token)
    assert back is not None
    assert (back.code, back.component, back.reboots, back.jobs, back.held) == (
        "GPU_XID_79",
        "gpu:0000:3b:00",
        2,
        ("17", "18"),
        "breaker",
    )
    assert back.drained == 1764410041.123


def test_minimal_token_and_garbage() -> None:
    assert lab.parse("hma=unhealthy:GPU_XID_79:reboot") == lab.Label(
        "unhealthy", "GPU_XID_79", "reboot"
    )
    for bad in ("hma=", "hma=a:b", "hma=a:b:c,r=x", "other=1", "hma=::"):
        assert lab.parse(bad) is None


def test_edit_keeps_the_rest_of_the_field() -> None:
    item = lab.Label("unhealthy", "EFA_LINK_DOWN", "reboot", "efa:rdmap16s27")
    assert lab.edit("", item) == item.token()
    assert lab.edit("rack=12 owner=ml", item) == f"rack=12 owner=ml {item.token()}"
    old = "rack=12 hma=unhealthy:GPU_XID_79:reboot owner=ml"
    assert lab.edit(old, item) == f"rack=12 {item.token()} owner=ml"
    assert lab.edit(old, None) == "rack=12 owner=ml"
    assert lab.edit("hma=unhealthy:GPU_XID_79:reboot", None) == ""
    assert lab.edit("a  b", None) == "a  b"  # spacing of others is theirs


def test_jobs_capped_and_separators_cleaned() -> None:
    item = lab.Label("unhealthy", "X_Y", "none", "a b,c", jobs=tuple(str(i) for i in range(20)))
    token = item.token()
    assert " " not in token and "c=abc" in token
    parsed = lab.parse(token)
    assert parsed is not None and len(parsed.jobs) == lab.MAX_JOBS
    assert lab.find(f"x=1 {token} y=2") == parsed
