"""``system`` probe: filesystems, physical memory, required processes, EDAC memory ECC, CPUs.

Everything is read under the injectable sysfs/procfs roots, so tests run on fixture trees. Lines
split at ``\n`` and fields at ASCII blanks only (hma.probes.support.mounts): ``str.split()`` and
``splitlines()`` also split at Unicode spaces and line separators, which a mount point (a user's
FUSE mount) may hold.
"""

from __future__ import annotations

import math
import os
from typing import Any, ClassVar, Mapping, Optional

import psutil

from hma.adapters.files import ReadError, running_processes
from hma.adapters.logs import debug_logger
from hma.adapters.strict import ParseError, parse_uint
from hma.adapters.text import printable
from hma.contracts.model import Finding, named_component
from hma.contracts.options import Option
from hma.contracts.probe import Probe, ProbeContext, unknown
from hma.probes.support import mounts

NODE = "node"
GIB = 1 << 30
MAX_CPU = 1 << 22  # the kernel's NR_CPUS limit is 8192; anything near this is garbage
MEMINFO_KEYS = ("MemTotal", "MemAvailable")


class SystemProbe(Probe):
    """Basic host checks every node needs."""

    name = "system"
    description = "filesystems, memory, processes, EDAC ECC, CPUs"
    default_interval = 60.0
    default_timeout = 20.0
    options: ClassVar[Mapping[str, Option]] = {
        "filesystems": Option(
            "pathlist",
            ["/", "/tmp"],
            "Absolute paths that must exist on a filesystem mounted read-write.",
        ),
        "min_free_percent": Option(
            "float", 5.0, "Critical below this % free space.", minimum=0, maximum=100
        ),
        "min_free_inodes_percent": Option(
            "float", 5.0, "Critical below this % free inodes.", minimum=0, maximum=100
        ),
        "expected_memory_gib": Option(
            "float",
            None,
            "Installed memory in GiB; MemTotal below it (less tolerance) is critical.",
        ),
        "memory_tolerance_percent": Option(
            "float", 3.0, "Slack for MemTotal against expected_memory_gib.", minimum=0, maximum=100
        ),
        "min_available_percent": Option(
            "float",
            2.0,
            "Warning (never drains) when MemAvailable is below this %.",
            minimum=0,
            maximum=100,
        ),
        "processes": Option(
            "strlist", None, "Process names that must run; unset: slurmd where Slurm is configured."
        ),
        "slurm_conf": Option(
            "path", "/etc/slurm/slurm.conf", "Presence means Slurm is configured."
        ),
        "edac_ce_per_run": Option(
            "int",
            100,
            "Warning when corrected host ECC errors grow by more than this per run.",
            minimum=1,
        ),
        "expected_cpus": Option(
            "int", None, "Online CPUs expected; unset: all present CPUs.", minimum=1
        ),
    }

    def collect(self, ctx: ProbeContext) -> Any:
        opts = ctx.options
        snap: dict[str, Any] = {"errors": {}}
        snap["mounts"] = _guard(snap, "mounts", lambda: _mounts(ctx))
        snap["filesystems"] = {p: _fs(p) for p in opts["filesystems"]}
        snap["meminfo"] = _guard(snap, "meminfo", lambda: _meminfo(ctx))
        wanted = opts["processes"]
        if wanted is None:
            slurm = ctx.facts.slurm_configured or os.path.exists(opts["slurm_conf"])
            wanted = ["slurmd"] if slurm else []
        snap["processes_wanted"] = list(wanted)
        snap["processes"] = _guard(
            snap, "processes", lambda: sorted(running_processes(ctx.procfs, wanted))
        )
        snap["edac"] = _guard(snap, "edac", lambda: _edac(ctx))
        snap["cpus"] = _guard(snap, "cpus", lambda: _cpus(ctx))
        return snap

    def evaluate(self, snapshot: Any, ctx: ProbeContext) -> list[Finding]:
        opts = ctx.options
        out: list[Finding] = []
        errors: dict[str, str] = snapshot.get("errors", {})
        for what, error in sorted(errors.items()):
            out.append(
                unknown("SYS_READ_FAILED", NODE, f"cannot read {what}: {error}", source=what)
            )
        out += _eval_fs(snapshot, opts)
        out += _eval_memory(snapshot.get("meminfo"), opts)
        running = set(snapshot.get("processes") or [])
        if "processes" not in errors:
            for proc in snapshot.get("processes_wanted", []):
                if proc not in running:
                    out.append(
                        Finding(
                            "SYS_PROCESS_MISSING",
                            NODE,
                            f"required process {proc} is not running",
                            {"process": proc},
                        )
                    )
        out += _eval_edac(snapshot.get("edac"), _prev(ctx, "edac"), opts)
        out += _eval_cpus(snapshot.get("cpus"), opts)
        return out

    def expectations(self, snapshot: Any) -> dict[str, Any]:
        """MemTotal (GiB, rounded down to 0.1) as ``expected_memory_gib``, the online CPUs as
        ``expected_cpus``, and as ``filesystems`` the configured paths that exist and every file
        system mounted read-write now (``recorded_mounts``)."""
        if not isinstance(snapshot, dict):
            return {}
        out: dict[str, Any] = {}
        mem = snapshot.get("meminfo")
        if isinstance(mem, dict) and isinstance(mem.get("MemTotal"), int):
            out["expected_memory_gib"] = math.floor(mem["MemTotal"] * 10 / GIB) / 10
        cpus = snapshot.get("cpus")
        if isinstance(cpus, dict) and isinstance(cpus.get("online"), int):
            out["expected_cpus"] = cpus["online"]
        fs = snapshot.get("filesystems") or {}
        paths = [p for p, info in fs.items() if info.get("exists")]
        if isinstance(snapshot.get("mounts"), list):
            paths += recorded_mounts(snapshot["mounts"])
        if paths:
            out["filesystems"] = list(dict.fromkeys(paths))
        return out


# File systems of the kernel and of containers, not storage a node is held to: pseudo file
# systems, memory-backed ones (tmpfs: /run, /dev/shm), read-only images (squashfs: snaps) and
# container layers (overlay), automount points (autofs).
PSEUDO_FS = frozenset(
    "autofs binfmt_misc bpf cgroup cgroup2 configfs debugfs devpts devtmpfs efivarfs fusectl "
    "hugetlbfs mqueue nsfs overlay proc pstore ramfs rpc_pipefs securityfs squashfs sysfs "
    "tmpfs tracefs".split()
)
VIRTUAL_ROOTS = ("/proc", "/sys", "/dev", "/run")


def recorded_mounts(mounts: list[list[str]]) -> list[str]:
    """Mount points (rows of ``_mounts``) of storage mounted read-write: not a ``PSEUDO_FS``, not
    below ``VIRTUAL_ROOTS``, ``ro`` in neither the file system's nor the mount's options."""
    out = []
    for row in mounts:
        point, fstype = row[0], row[1]
        options = {o for opts in row[2:] for o in opts.split(",")}
        below = any(point == t or point.startswith(t + "/") for t in VIRTUAL_ROOTS)
        if fstype not in PSEUDO_FS and not below and "ro" not in options:
            out.append(point)
    return sorted(set(out))


def _guard(snap: dict[str, Any], key: str, fn: Any) -> Any:
    try:
        return fn()
    except (ReadError, OSError, ValueError) as exc:
        snap["errors"][key] = str(exc)
        return None


def _prev(ctx: ProbeContext, key: str) -> Any:
    return ctx.previous.get(key) if isinstance(ctx.previous, dict) else None


def _mounts(ctx: ProbeContext) -> list[list[str]]:
    """Rows ``[mountpoint, fstype, filesystem options, mount options]``.

    From ``self/mountinfo``, the filesystem's own (superblock) options: a disk remounted
    read-only after I/O errors shows ``ro`` there, while the read-only bind mounts of the agent's
    own sandbox (systemd ``ProtectSystem=strict``) only set the per-mount flag. ``mounts`` (no
    such distinction) is the fallback.
    """
    rows = [[m.point, m.fstype, m.super_options, m.options] for m in mounts.mountinfo(ctx.procfs)]
    if rows:
        return rows
    for line in ctx.procfs.text("mounts", limit=mounts.LIMIT).split("\n"):
        parts = mounts.fields(line)
        if len(parts) >= 4:
            rows.append([mounts.unescape(parts[1]), parts[2], parts[3]])
    return rows


def _fs(path: str) -> dict[str, Any]:
    if not os.path.isdir(path):
        return {"exists": False}
    st = os.statvfs(path)
    out = {
        "exists": True,
        "free_percent": round(100.0 - psutil.disk_usage(path).percent, 2),
        "inodes_total": st.f_files,
        "inodes_free_percent": round(100.0 * st.f_favail / st.f_files, 2) if st.f_files else None,
        "mount_readonly": bool(st.f_flag & os.ST_RDONLY),  # the flags, not a write permission
    }
    log = debug_logger("hma.read")
    if log is not None:
        log.debug("statvfs %s: %s", printable(path), out)
    return out


def _meminfo(ctx: ProbeContext) -> dict[str, int]:
    """MemTotal and MemAvailable in bytes; a key written twice, or not as a size, is unknown."""
    out = {}
    for line in ctx.procfs.text("meminfo").split("\n"):
        key, _, rest = line.partition(":")
        fields = mounts.fields(rest)
        if key in MEMINFO_KEYS:  # strict: "<digits>" or "<digits> kB", else unknown
            if key in out:
                raise ParseError(f"meminfo {key}: written twice")
            if len(fields) not in (1, 2) or fields[1:] not in ([], ["kB"]):
                raise ParseError(f"meminfo {key}: not a size: {rest[:40]!r}")
            out[key] = parse_uint(fields[0], hex_ok=False) * (1024 if fields[1:] else 1)
    if "MemTotal" not in out:
        raise ValueError("meminfo has no MemTotal")
    return out


def _edac(ctx: ProbeContext) -> dict[str, dict[str, int]]:
    base = "devices/system/edac/mc"
    out = {}
    for mc in ctx.sysfs.listdir(base):
        if mc.startswith("mc") and mc[2:].isdigit():
            out[mc] = {
                "ce_count": ctx.sysfs.counter(f"{base}/{mc}/ce_count"),
                "ue_count": ctx.sysfs.counter(f"{base}/{mc}/ue_count"),
            }
    return out


def parse_cpulist(text: str) -> int:
    """Number of CPUs in a kernel cpulist such as ``0-3,8-11``, each counted once.

    The kernel writes ascending ranges that neither overlap nor repeat; anything else (``0-3,2``,
    ``8,0-3``, ``7-3``, an empty part) is malformed: ParseError, never a count.
    """
    total, after = 0, -1
    for part in text.split(","):  # the kernel never writes an empty list or part
        lo, dash, hi = part.partition("-")
        first = parse_uint(lo, limit=MAX_CPU, hex_ok=False)
        last = parse_uint(hi, limit=MAX_CPU, hex_ok=False) if dash else first
        if last < first:
            raise ParseError(f"descending CPU range {part[:40]!r}")
        if first <= after:
            raise ParseError(f"CPU range out of order or overlapping: {text[:40]!r}")
        total, after = total + last - first + 1, last
    return total


def _cpus(ctx: ProbeContext) -> dict[str, int]:
    base = "devices/system/cpu"
    return {
        "online": parse_cpulist(ctx.sysfs.text(f"{base}/online")),
        "present": parse_cpulist(ctx.sysfs.text(f"{base}/present")),
    }


def _mount_of(path: str, table: list[list[str]]) -> Optional[list[str]]:
    best = None
    for row in table:
        mp = row[0]
        if (path == mp or path.startswith(mp.rstrip("/") + "/")) and (
            best is None or len(mp) > len(best[0])
        ):
            best = row
    return best


def _eval_fs(snap: Mapping[str, Any], opts: Mapping[str, Any]) -> list[Finding]:
    out = []
    table = snap.get("mounts")
    for path, fs in (snap.get("filesystems") or {}).items():
        mount = _mount_of(path, table) if table and fs.get("exists") else None
        # the broken thing: the mount the path is on, the path itself where that is not known
        comp = named_component("fs", mount[0] if mount is not None else path)
        if not fs.get("exists"):
            out.append(Finding("SYS_FS_MISSING", comp, f"{path} does not exist", {"path": path}))
            continue
        out += _eval_readonly(path, fs, mount, comp)
        if fs["free_percent"] < opts["min_free_percent"]:
            out.append(
                Finding(
                    "SYS_FS_FULL",
                    comp,
                    f"{path} has {fs['free_percent']:.1f}% free (< {opts['min_free_percent']:g}%)",
                    {"path": path, "free_percent": fs["free_percent"]},
                )
            )
        inodes = fs.get("inodes_free_percent")
        if inodes is not None and inodes < opts["min_free_inodes_percent"]:
            out.append(
                Finding(
                    "SYS_FS_INODES",
                    comp,
                    f"{path} has {inodes:.1f}% free inodes",
                    {"path": path, "inodes_free_percent": inodes},
                )
            )
    return out


def _eval_readonly(
    path: str, fs: Mapping[str, Any], mount: Optional[list[str]], comp: str
) -> list[Finding]:
    """Read-only is a mount flag, never a write permission (a non-root user cannot write ``/``).

    The filesystem's own options decide (``ro`` in mountinfo's superblock options, or in
    ``mounts`` when only that is readable); the agent's sandbox only sets the per-mount flag.
    Without a mount table the statvfs flag cannot tell the two apart: unknown."""
    if mount is not None:
        if "ro" not in mount[2].split(","):
            return []
        return [
            Finding(
                "SYS_FS_READONLY",
                comp,
                f"{path} is mounted read-only ({mount[0]})",
                {"path": path, "mount": mount[0], "fstype": mount[1], "options": mount[2]},
            )
        ]
    if fs.get("mount_readonly"):
        return [
            unknown(
                "SYS_FS_READONLY",
                comp,
                f"{path} is on a read-only mount; without the mount table hma cannot tell "
                "whether the filesystem itself is read-only",
                path=path,
            )
        ]
    return []


def _eval_memory(mem: Optional[Mapping[str, int]], opts: Mapping[str, Any]) -> list[Finding]:
    if not mem:
        return []
    out = []
    total = mem["MemTotal"]
    expected = opts["expected_memory_gib"]
    if expected:
        floor = expected * GIB * (1 - opts["memory_tolerance_percent"] / 100.0)
        if total < floor:
            out.append(
                Finding(
                    "SYS_MEMORY_MISSING",
                    NODE,
                    f"MemTotal {total / GIB:.1f} GiB is below the expected {expected:g} GiB",
                    {"mem_total_bytes": total, "expected_gib": expected},
                )
            )
    available = mem.get("MemAvailable")
    if (
        available is not None
        and total
        and 100.0 * available / total < opts["min_available_percent"]
    ):
        out.append(
            Finding(
                "SYS_MEMORY_LOW",
                NODE,
                f"only {100.0 * available / total:.1f}% of memory available",
                {"mem_available_bytes": available, "mem_total_bytes": total},
            )
        )
    return out


def _eval_edac(edac: Any, previous: Any, opts: Mapping[str, Any]) -> list[Finding]:
    out = []
    for mc, counts in sorted((edac or {}).items()):
        comp = f"node:edac/{mc}"
        if counts["ue_count"] > 0:
            out.append(
                Finding(
                    "SYS_MEM_ECC_UE",
                    comp,
                    f"{counts['ue_count']} uncorrectable host memory errors on {mc}",
                    dict(counts),
                )
            )
        before = (previous or {}).get(mc)
        if before is not None:
            grown = counts["ce_count"] - before["ce_count"]
            if grown > opts["edac_ce_per_run"]:
                out.append(
                    Finding(
                        "SYS_MEM_ECC_CE",
                        comp,
                        f"{grown} corrected host memory errors on {mc} since the last run",
                        {**counts, "grown": grown},
                    )
                )
    return out


def _eval_cpus(cpus: Optional[Mapping[str, int]], opts: Mapping[str, Any]) -> list[Finding]:
    if not cpus:
        return []
    expected = opts["expected_cpus"] or cpus["present"]
    if cpus["online"] < expected:
        return [
            Finding(
                "SYS_CPU_OFFLINE",
                NODE,
                f"{cpus['online']} CPUs online, {expected} expected",
                {**cpus, "expected": expected},
            )
        ]
    return []
