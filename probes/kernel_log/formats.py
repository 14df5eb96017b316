"""Kernel formats that quote users: the one reader of kernel messages whose fields a user writes.

The kernel copies user-chosen text into some of its own records: a task's ``comm`` (15 bytes of
anything but NUL, which every process sets for itself with ``prctl(PR_SET_NAME)``), a file name
(255 bytes of anything but ``/`` and NUL), an audit record's quoted fields. Such a record is a
kernel record all the same (it comes through /dev/kmsg and ``_TRANSPORT=kernel``), so "kernel
records only" does not keep that text out. Every format in :data:`FORMATS` is matched from the
start of the message (after the record's prefix and time stamp); a message of one of them goes
only to the rules that name its format (``formats = [...]`` in a rule file, docs/kernel-log.md),
never to any other rule, so no rule reads a user's span as evidence of another fault. Its user
fields (the groups ``comm``, ``file``, ``fields`` of each pattern) are data: a rule of that format
may carry them in its finding's details (its own named groups); they decide neither code,
severity nor component.

/dev/kmsg prints a byte below 0x20 or above 0x7e as ``\\xNN`` (four characters), so one 15-byte
``comm`` is at most 60 characters of a message (:data:`COMM`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

# a task name as a message carries it: 15 bytes, each \xNN-escaped at worst by /dev/kmsg
COMM = r"(?P<comm>.{0,60}?)"
_COMM_GREEDY = r"(?P<comm>.{0,60})"
_HEX = r"[0-9a-f]+"


@dataclass(frozen=True)
class Format:
    """One kernel format with user fields: ``pattern`` matches the whole message from its start
    (its named groups ``comm``, ``file``, ``fields`` are the user's spans); ``needle`` is a
    literal every such message holds (a cheap test before the expression)."""

    name: str
    needle: str
    pattern: re.Pattern[str]
    source: str  # the kernel file and format string


def _f(name: str, needle: str, pattern: str, source: str) -> Format:
    assert needle in pattern.replace("\\", ""), name  # the needle is a literal of the pattern
    return Format(name, needle, re.compile(pattern, re.DOTALL), source)


FORMATS: tuple[Format, ...] = (
    _f(
        "segfault",
        "]: segfault at ",
        rf"^{COMM}\[(?P<pid>\d+)\]: segfault at {_HEX} ip {_HEX} sp {_HEX} error {_HEX}"
        r"(?P<file>.*)$",
        'arch/x86/mm/fault.c show_signal_msg(): "%s[%d]: segfault at %lx ip %px sp %px error %lx"'
        ' then " in %s[%lx+%lx]" and " likely on CPU %d (core %d, socket %d)"',
    ),
    _f(
        "trap",
        " ip:",
        rf"^(?:traps: )?{COMM}\[(?P<pid>\d+)\] (?:trap [\w -]+?|general protection(?: fault)?)"
        rf" ip:{_HEX} sp:{_HEX} error:{_HEX}(?P<file>.*)$",
        'arch/x86/kernel/traps.c show_signal(), gp: "%s[%d] trap %s ip:%lx sp:%lx error:%lx in'
        ' ...", "%s[%d] general protection fault ip:%lx sp:%lx error:%lx in ..."',
    ),
    _f(
        "fatal-signal",
        ": potentially unexpected fatal signal ",
        rf"^{COMM}/(?P<pid>\d+): potentially unexpected fatal signal \d+\.?$",
        'kernel/signal.c print_fatal_signal() (to 4.x): "%s/%d: potentially unexpected fatal'
        ' signal %d."',
    ),
    _f(
        "hung-task",
        " blocked for more than ",
        rf"^INFO: task {_COMM_GREEDY}:(?P<pid>\d+) blocked for more than \d+ seconds\.?$",
        'kernel/hung_task.c check_hung_task(): "INFO: task %s:%d blocked for more than %ld'
        ' seconds."',
    ),
    _f(
        "soft-lockup",
        "BUG: soft lockup - CPU#",
        rf"^(?:watchdog: )?BUG: soft lockup - CPU#\d+ stuck for \d+s! \[{_COMM_GREEDY}:"
        r"(?P<pid>\d+)\]$",
        'kernel/watchdog.c watchdog_timer_fn(): "BUG: soft lockup - CPU#%d stuck for %us!'
        ' [%s:%d]"',
    ),
    _f(
        "task-state",
        "task:",
        rf"^task:{COMM} +state:(?P<fields>.*)$",
        'kernel/sched/core.c sched_show_task() (hung tasks, RCU stalls, sysrq): "task:%-15.15s'
        ' state:%c ..."',
    ),
    _f(
        "task-state-old",
        " 0x",
        rf"^{COMM} [A-Za-z](?:  running task   )? +\d+ +\d+ +\d+ 0x[0-9a-f]+$",
        'kernel/sched/core.c sched_show_task() (to 5.9): "%-15.15s %c" then "%5lu %5d %6d'
        ' 0x%08lx"',
    ),
    _f(
        "dump-stack",
        " Comm: ",
        r"^CPU: \d+ (?:UID: \d+ )?PID: \d+ Comm: (?P<fields>.*)$",
        'lib/dump_stack.c dump_stack_print_info(): "CPU: %d PID: %d Comm: %.20s %s%s %s %.*s"'
        ' (6.11+: "CPU: %d UID: %u PID: %d Comm: ...")',
    ),
    _f(
        "oom-kill",
        "Killed process ",
        r"^(?:(?:Out of memory|Memory cgroup out of memory): )?Killed process (?P<pid>\d+) "
        r"\((?P<comm>.*)$",
        'mm/oom_kill.c __oom_kill_process(): "%s: Killed process %d (%s) total-vm:%lukB, ..."',
    ),
    _f(
        "oom-kill-old",
        ": Kill process ",
        r"^(?:Out of memory|Memory cgroup out of memory): Kill process (?P<pid>\d+) "
        r"\((?P<comm>.*)$",
        'mm/oom_kill.c oom_kill_process() (to 4.x): "%s: Kill process %d (%s) score %u or'
        ' sacrifice child"',
    ),
    _f(
        "oom-summary",
        "oom-kill:",
        r"^oom-kill:(?P<fields>.*)$",
        'mm/oom_kill.c dump_oom_summary(): "oom-kill:constraint=%s,...,task_memcg=%s,task=%s,'
        'pid=%d,uid=%d" (cgroup names and the comm)',
    ),
    _f(
        "oom-invoked",
        " invoked oom-killer: ",
        rf"^{COMM} invoked oom-killer: (?P<fields>.*)$",
        'mm/oom_kill.c dump_header(): "%s invoked oom-killer: gfp_mask=%#x(%pGg), order=%d, ..."',
    ),
    _f(
        "oom-reaper",
        "oom_reaper: reaped process ",
        r"^oom_reaper: reaped process (?P<pid>\d+) \((?P<comm>.*)$",
        'mm/oom_kill.c oom_reap_task_mm(): "oom_reaper: reaped process %d (%s), now anon-rss:..."',
    ),
    _f(
        "stack-depth",
        " used greatest stack depth: ",
        rf"^{COMM} \((?P<pid>\d+)\) used greatest stack depth: \d+ bytes left$",
        'kernel/exit.c check_stack_usage(): "%s (%d) used greatest stack depth: %lu bytes left"',
    ),
    _f(
        "exec-stack",
        "started with executable stack",
        r"^process '(?P<file>.*)' started with executable stack$",
        "fs/exec.c setup_arg_pages(): \"process '%s' started with executable stack\" (a path)",
    ),
    _f(
        "audit",
        "audit",
        r"^audit: (?:type=\d+ )?audit\(\d+\.\d+:\d+\): (?P<fields>.*)$",
        'kernel/audit.c: "audit: type=%d audit(%llu.%03lu:%u): ..." (comm="...", exe="...",'
        " name=, path=: the task's and the file's names)",
    ),
    _f(
        "memory-failure-kill",
        "Memory failure: ",
        rf"^Memory failure: 0x{_HEX}: (?:Sending SIGBUS to|Killing|forcibly killing) "
        rf"{COMM}:(?P<pid>\d+) (?:due to|because of) (?P<fields>.*)$",
        'mm/memory-failure.c kill_proc(): "Memory failure: %#lx: Sending SIGBUS to %s:%d due to'
        ' hardware memory corruption" (4.18: "... Killing %s:%d due to ..."), kill_procs():'
        ' "%#lx: forcibly killing %s:%d because of failure to unmap corrupted page"',
    ),
    _f(
        "xid",
        "NVRM: Xid",
        r"^NVRM: Xid \([^)]{1,40}\)[^:]{0,40}?: \d{1,6}, pid=(?P<pid>'?<unknown>'?|\d+), "
        r"name=(?P<comm>.*)$",
        'NVIDIA driver: "NVRM: Xid (PCI:%04x:%02x:%02x): %d, pid=%d, name=%s, %s" (the process'
        " name is the task's comm)",
    ),
)


def classify(message: str) -> Optional[Format]:
    """The format with user fields that ``message`` is printed in, or None (the kernel's own
    text only, as far as hma knows its formats)."""
    for fmt in FORMATS:
        if fmt.needle in message and fmt.pattern.match(message) is not None:
            return fmt
    return None


def names() -> frozenset[str]:
    """The names a rule's ``formats`` may give."""
    return frozenset(f.name for f in FORMATS)
