"""A /dev/kmsg stand-in made of two FIFOs and a thread (what the kernel does between them).

/dev/kmsg takes writes as ``<N>text`` (one write, one record) and gives readers records
``PRI,SEQ,TS_USEC,-;text``. Here writes go to the FIFO ``inbox`` (``hma inject xid --kmsg
INBOX``) and records come out of the FIFO ``records`` (the kernel_log source's ``path``, backend
``kmsg``). As the kernel does for writes from user space, a record without a facility gets the
user facility (PRI = 8 + level) and the sequence numbers only grow. Both FIFOs are held open for
reading and writing by this process, so neither side ever sees an end of file while the agent or
the writer restarts.
"""

from __future__ import annotations

import os
import select
import threading
import time
from pathlib import Path
from typing import Optional

from hma.probes.kernel_log import lines


class KmsgStandIn:
    """Relay ``inbox`` (writes) -> ``records`` (reads) until :meth:`close`."""

    def __init__(self, inbox: Path, records: Path, first_seq: int = 1000) -> None:
        self.inbox = inbox
        self.records = records
        self.seq = first_seq
        for path in (inbox, records):
            os.mkfifo(path, 0o600)
        self._in = os.open(inbox, os.O_RDWR | os.O_NONBLOCK)
        self._out = os.open(records, os.O_RDWR)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = threading.Thread(
            target=self._relay, name="kmsg-stand-in", daemon=True
        )
        self._thread.start()

    def record(self, raw: bytes) -> bytes:
        """The record a write of ``raw`` becomes (and the next sequence number is taken)."""
        self.seq += 1
        rec = lines.written_record(raw, self.seq, int(time.monotonic() * 1e6))
        pri = (rec.facility << 3) | rec.level
        return b"%d,%d,%d,-;%s\n" % (pri, rec.seq, rec.ts_usec, rec.message.encode())

    def _relay(self) -> None:
        poller = select.poll()
        poller.register(self._in, select.POLLIN)
        buf = b""
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            try:
                chunk = os.read(self._in, 65536)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                return  # closed
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                if line:
                    os.write(self._out, self.record(line))

    def close(self) -> None:
        """Stop the relay and close both FIFOs (the caller removes the files)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        for fd in (self._in, self._out):
            try:
                os.close(fd)
            except OSError:
                pass
