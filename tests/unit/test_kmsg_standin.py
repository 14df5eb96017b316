"""The /dev/kmsg stand-in of the demo: writes as /dev/kmsg takes them, records as it gives them."""

from __future__ import annotations

import os
import select
from pathlib import Path

import pytest

from hma.commands import inject
from hma.probes.kernel_log.lines import parse_record
from tests.standin.kmsg import KmsgStandIn

pytestmark = pytest.mark.timeout(20)


def read_lines(fd: int, count: int) -> list[bytes]:
    buf = b""
    while buf.count(b"\n") < count:
        assert select.select([fd], [], [], 5)[0], f"no record within 5 s (got {buf!r})"
        buf += os.read(fd, 65536)
    return buf.splitlines()


def test_injected_xid_comes_out_as_a_user_facility_record(tmp_path: Path) -> None:
    kmsg = KmsgStandIn(tmp_path / "dev-kmsg", tmp_path / "kmsg", first_seq=41)
    reader = os.open(tmp_path / "kmsg", os.O_RDONLY | os.O_NONBLOCK)
    try:
        line = inject.inject_xid("0000:5d:00.0", 79, str(tmp_path / "dev-kmsg"))
        with open(tmp_path / "dev-kmsg", "wb", buffering=0) as fh:
            fh.write(b"no priority prefix\n")
        first, second = (parse_record(raw) for raw in read_lines(reader, 2))
        assert first is not None and second is not None
        assert (first.seq, first.facility, first.level) == (42, 1, 4)
        assert first.message == line and first.message.startswith("NVRM: Xid (PCI:0000:5d:00): 79")
        assert (second.seq, second.facility, second.level) == (43, 1, 4)
        assert second.message == "no priority prefix"
        assert second.ts_usec >= first.ts_usec
    finally:
        os.close(reader)
        kmsg.close()
