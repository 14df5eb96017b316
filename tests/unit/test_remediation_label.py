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


NOW = 1_800_000_000.0


def test_numbers_out_of_range_make_the_label_unreadable() -> None:
    """``t=``, ``d=`` and ``r=`` that are not finite, negative, huge, or before a sane epoch
    (issue 28): the label is unreadable (None), for both readers, never a traceback."""
    head = "hma=unhealthy:GPU_XID_79:none"
    bad = (
        ["t=nan", "t=inf", "t=-inf", "t=1e300", "t=-5", "t=1" + "0" * 400, "t=17e8", "t=12"]
        + ["d=nan", "d=inf", "d=1e300", "d=-1764410041.250", "d=9" * 13, "d=20.5", "d=0x10"]
        + ["r=-1", "r=1e3", "r=" + "9" * 5000, "r=nan", "t=1_800_000_000", "t= 1800000000"]
        + ["t=4102444801", "d=99999999999.5"]
    )
    for item in bad:
        token = f"{head},{item}"
        assert lab.parse(token) is None, item
        assert lab.parse_strict(token) is None, item
        assert lab.find(f"rack=1 {token}") is None, item
    good = lab.parse(f"{head},t=1764410040,d=1764410041.250,r=3")
    assert good is not None and (good.since, good.drained, good.reboots) == (
        1764410040.0,
        1764410041.25,
        3,
    )


def test_times_beyond_the_skew_are_refused_when_the_reader_has_a_clock() -> None:
    head = "hma=unhealthy:GPU_XID_79:none"
    assert lab.parse(f"{head},t={NOW + 3600:.0f}", now=NOW) is None
    assert lab.parse(f"{head},d={NOW + 3600:.3f}", now=NOW) is None
    assert lab.parse(f"{head},t={NOW + 3600:.0f}") is not None  # no clock: bounds only
    assert lab.parse(f"{head},t={NOW + 10:.0f}", now=NOW) is not None  # within the skew


def test_strict_reader_refuses_control_bidi_and_tag_characters() -> None:
    """``j=`` (and ``c=``) holding a control, bidi, zero-width or tag character is unreadable in
    both readers (issue 28), and the writer never writes one."""
    for ch in (
        "\x1b",
        "\x07",
        "\x7f",
        "\x85",
        "\u202e",
        "\u2066",
        "\u200b",
        "\ufeff",
        "\U000e0041",
    ):
        for field in (f"j=17{ch}+18", f"c=gpu{ch}0"):
            token = f"hma=unhealthy:GPU_XID_79:none,{field}"
            assert lab.parse_strict(token) is None, (field, ch)
            assert lab.parse(token) is None, (field, ch)
        written = lab.Label("unhealthy", "X", "none", f"gpu{ch}0", jobs=(f"1{ch}7",)).token()
        assert lab.parse_strict(written) is not None and ch not in written
    assert lab.parse_strict("hma=unhealthy:GPU_XID_79:none,j=17+18_3,c=gpu:0000:3b:00")


def test_history_refuses_entries_and_holds_in_the_future() -> None:
    """``hmah=`` entries or a hold dated beyond the skew into the future are refused and never
    counted inside the window (issue 28)."""
    future = f"{NOW + 86400:.0f}"
    for token in (
        f"hmah={future}:GPU_XID_79",
        f"hmah={NOW - 60:.0f}:X,{future}:Y",
        f"hmah=H{future}",
    ):
        assert lab.parse_history(token, now=NOW) is None, token
        assert lab.find_history(f"rack=1 {token}", now=NOW) is None, token
    for token in ("hmah=0:X", "hmah=12:X", "hmah=H5"):  # before any sane epoch
        assert lab.parse_history(token) is None, token
    mirror = lab.History(((NOW - 60, "X"), (NOW + 86400, "Y")))
    assert mirror.within(NOW, 3600) == 1  # a future entry is never counted
    ok = lab.parse_history(f"hmah={NOW - 60:.0f}:X,{NOW + 5:.0f}:Y", now=NOW)
    assert ok is not None and ok.within(NOW, 3600) == 2
