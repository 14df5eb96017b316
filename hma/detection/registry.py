"""Probe discovery: entry points (``hma.probes``) and executables in ``[agent] probes_dir``.

Built-in probes register through the same entry point group as third-party ones, so the core
never imports a probe module by name (the entry points are read by ``hma.adapters.entrypoints``).
A plugin that fails to load is reported, never fatal. The cluster backend that ``[cluster]
backend`` names is made here (``make_backend``), for remediation and the commands alike.
"""

from __future__ import annotations

import inspect
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Collection, Mapping, Optional

from hma.adapters import entrypoints
from hma.contracts.model import Finding, Severity
from hma.contracts.options import Option
from hma.contracts.probe import Probe, ProbeContext

if TYPE_CHECKING:  # the cluster contract is imported where a backend is made
    from hma.config.schema import Config
    from hma.contracts.cluster import Backend

GROUP = "hma.probes"
# what each plugin group holds (the groups are declared in hma.contracts)
KINDS = {
    "hma.probes": "probe",
    "hma.sources": "source",
    "hma.reporters": "reporter",
    "hma.backends": "backend",
}


@dataclass(frozen=True)
class Broken:
    """A plugin of entry point ``group`` that could not be loaded, with the reason."""

    name: str
    error: str
    group: str = GROUP

    @property
    def kind(self) -> str:
        """probe, source, reporter or backend."""
        return KINDS.get(self.group, self.group)

    @property
    def section(self) -> str:
        """The configuration table of the plugin: ``probes.NAME``, ``sources.NAME``,
        ``reporters.NAME``, or a backend's own ``NAME``."""
        return self.name if self.kind == "backend" else f"{self.kind}s.{self.name}"


def entry_point_names(group: str = GROUP, among: Optional[Collection[str]] = None) -> list[str]:
    """Names registered in an entry point group, without loading them (with ``among``: enough
    of them to tell which of ``among`` are registered)."""
    return sorted({ep.name for ep in entrypoints.entry_points(group, among)})


def discover(
    group: str = GROUP, base: Any = Probe, names: Optional[Collection[str]] = None
) -> tuple[dict[str, Any], list[Broken]]:
    """Load every class of an entry point group (probes by default; event sources, reporters
    and backends too), or only those in ``names``. An entry point that does not load, or names
    no concrete ``base`` subclass of its own name, is broken."""
    found: dict[str, Any] = {}
    broken: list[Broken] = []
    for ep in sorted(entrypoints.entry_points(group, names), key=lambda e: e.name):
        if names is not None and ep.name not in names:
            continue
        try:
            cls = ep.load()
            if not (isinstance(cls, type) and issubclass(cls, base)):
                raise TypeError(f"{ep.value} is not a {base.__module__}.{base.__name__} subclass")
            if inspect.isabstract(cls):
                missing = ", ".join(sorted(getattr(cls, "__abstractmethods__", ())))
                raise TypeError(f"{ep.value} is abstract: it does not implement {missing}")
            if getattr(cls, "name", None) != ep.name:
                raise TypeError(f"entry point {ep.name!r} names a class whose name differs")
        except Exception as exc:  # noqa: BLE001 - any plugin failure is reported, not fatal
            broken.append(Broken(ep.name, f"{type(exc).__name__}: {exc}", group))
            continue
        found[ep.name] = cls
    return found, broken


def make_backend(config: Config) -> Backend:
    """The backend ``[cluster] backend`` names (entry point group ``hma.backends``),
    configured from its own section; ``ConfigError`` when it cannot be loaded."""
    from hma.config.schema import ConfigError
    from hma.contracts.cluster import GROUP as BACKENDS
    from hma.contracts.cluster import Backend

    name = str(config.section("cluster")["backend"])
    classes, broken = discover(BACKENDS, Backend, [name])
    if name not in classes:
        why = next((b.error for b in broken if b.name == name), "not installed")
        raise ConfigError([f"cluster.backend: {name!r}: {why}"])
    backend: Backend = classes[name](
        config.section(name), str(config.section("recovery")["label_field"])
    )
    return backend


def broken_finding(item: Broken) -> Finding:
    """The finding that reports a plugin that failed to load."""
    return Finding(
        "HMA_PLUGIN_BROKEN",
        f"{item.kind}:{item.name}",
        f"{item.kind} plugin {item.name!r} failed to load: {item.error}",
        {"error": item.error},
    )


# --- executable probes (Nagios plugin protocol) --------------------------------------------------

NAGIOS_CODES = {
    0: Severity.OK,
    1: Severity.WARNING,
    2: Severity.CRITICAL,
    3: Severity.UNKNOWN,
}
_SITE_CODE = {
    Severity.WARNING: "SITE_PROBE_WARNING",
    Severity.CRITICAL: "SITE_PROBE_CRITICAL",
    Severity.UNKNOWN: "SITE_PROBE_UNKNOWN",
}


MAX_LINKS = 40  # symlinks followed for one path, as the kernel does


def _untrusted(path: str, st: os.stat_result) -> Optional[str]:
    if st.st_uid != 0:
        return f"{path} is owned by uid {st.st_uid}, not root"
    if not stat.S_ISLNK(st.st_mode) and st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def unsafe_reason(path: Path, depth: int = 0) -> Optional[str]:
    """Why an executable probe must not run, as OpenSSH's StrictModes judges a path: every
    directory from / down, every symlink on the way (and every component of what it points to)
    and the file itself must be owned by root, and none but a symlink writable by group or
    others; the same for the interpreter its ``#!`` line names (and that one's, as the kernel
    follows them). Otherwise someone but root could choose which program hma runs as root."""
    reason = _unsafe_file(path)
    if reason is None:
        interpreter = _interpreter(path)
        if isinstance(interpreter, str) and interpreter.startswith("refused: "):
            return f"{path}: {interpreter[len('refused: ') :]}"
        if interpreter is not None:
            if depth >= MAX_INTERPRETERS:
                return f"{path}: more than {MAX_INTERPRETERS} nested #! interpreters"
            reason = unsafe_reason(Path(interpreter), depth + 1)
            if reason is not None:
                reason = f"interpreter of {path}: {reason}"
    return reason


MAX_INTERPRETERS = 4  # nested #! interpreters the kernel follows (BINPRM_MAX_RECURSION)


def _interpreter(path: Path) -> Optional[str]:
    """The program the ``#!`` line of ``path`` runs (``/usr/bin/env NAME``: NAME found on the
    agent's PATH), None without one, or ``refused: why`` when it cannot be judged."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(256)
    except OSError as exc:
        return f"refused: {exc.strerror}"
    if not head.startswith(b"#!"):
        return None
    line = head[2:].split(b"\n", 1)[0]
    try:
        words = line.decode("ascii").split()
    except UnicodeDecodeError:
        return "refused: the #! line is not ASCII"
    if not words or not words[0].startswith("/"):
        return "refused: the #! line names no absolute interpreter"
    if os.path.basename(words[0]) != "env":
        return words[0]
    # env's own checks first (it must be root's too), then the program it would find
    reason = _unsafe_file(Path(words[0]))
    if reason is not None:
        return f"refused: {reason}"
    names = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
    if not names:
        return "refused: #!/usr/bin/env names no program"
    if "/" in names[0]:  # env runs a name with a slash as it is, not from PATH
        return names[0] if names[0].startswith("/") else "refused: #! env names a relative path"
    found = shutil.which(names[0], path=os.environ.get("PATH", os.defpath))
    if found is None or not found.startswith("/"):
        return f"refused: {names[0]} (#! through env) is not on PATH as an absolute path"
    return found


def _unsafe_file(path: Path) -> Optional[str]:
    """``unsafe_reason`` for the file alone (its interpreter not looked at)."""
    # ".." is resolved on the way, after the links before it (abspath would drop it lexically)
    pending = [part for part in os.path.join(os.getcwd(), path).split("/") if part]
    current = "/"
    try:
        reason = _untrusted(current, os.lstat(current))
        links = 0
        while pending and reason is None:
            name = pending.pop(0)
            if name == ".":
                continue
            if name == "..":  # an ancestor of a checked, symlink-free path: checked already
                current = os.path.dirname(current)
                continue
            candidate = os.path.join(current, name)
            st = os.lstat(candidate)
            reason = _untrusted(candidate, st)
            if reason is None and stat.S_ISLNK(st.st_mode):
                links += 1
                if links > MAX_LINKS:
                    return f"{path}: too many levels of symbolic links"
                target = os.readlink(candidate)
                pending[:0] = [part for part in target.split("/") if part]
                if target.startswith("/"):
                    current = "/"
                continue
            if reason is None and pending and not stat.S_ISDIR(st.st_mode):
                return f"{candidate} is not a directory"
            current = candidate
        if reason is None and not stat.S_ISREG(os.lstat(current).st_mode):
            reason = f"{current} is not a regular file"
    except OSError as exc:
        return f"{exc.filename or path}: {exc.strerror}"
    return reason


def exec_probe_class(path: Path) -> type[Probe]:
    """A probe class that runs one executable file of probes_dir."""
    probe_name = path.name.split(".")[0]

    class ExecProbe(Probe):
        name = probe_name
        description = f"executable probe {path}"
        options: ClassVar[Mapping[str, Option]] = {
            "args": Option("strlist", [], "Arguments passed to the executable."),
        }
        default_interval = 300.0
        default_timeout = 30.0

        def collect(self, ctx: ProbeContext) -> Any:
            reason = unsafe_reason(path)
            if reason:
                return {"refused": reason}
            result = ctx.runner.run(
                [str(path), *ctx.options.get("args", [])],
                # below the probe timeout, so the kill is ours and the result still arrives
                timeout=float(ctx.options["timeout"]) * 0.8,
            )
            return {
                "rc": result.rc,
                "stdout": result.stdout,
                "timed_out": result.timed_out,
                "truncated": result.truncated,
                "error": result.error,
            }

        def evaluate(self, snapshot: Any, ctx: ProbeContext) -> list[Finding]:
            return evaluate_exec(self.name, str(path), snapshot)

    ExecProbe.__name__ = f"ExecProbe[{probe_name}]"
    return ExecProbe


def evaluate_exec(name: str, path: str, snap: Mapping[str, Any]) -> list[Finding]:
    """Nagios protocol: exit 0/1/2/3, first line of stdout is the message."""
    component = f"site:{name}"
    if "refused" in snap:
        return [
            Finding(
                "HMA_PROBE_REFUSED",
                f"probe:{name}",
                f"refused to run {path}: {snap['refused']}",
                {"path": path, "reason": snap["refused"]},
            )
        ]
    lines = (snap.get("stdout") or "").splitlines()
    message = lines[0].strip()[:400] if lines else ""
    details = {"path": path, "rc": snap.get("rc"), "output": "\n".join(lines[:20])[:4000]}
    if snap.get("truncated"):
        details["truncated"] = True
    if snap.get("error") or snap.get("timed_out"):
        why = snap.get("error") or "timed out (killed with its process group)"
        return [
            Finding("SITE_PROBE_UNKNOWN", component, f"{name}: {why}", details, Severity.UNKNOWN)
        ]
    rc = snap.get("rc")
    severity = NAGIOS_CODES.get(rc, Severity.UNKNOWN) if isinstance(rc, int) else Severity.UNKNOWN
    if severity is Severity.OK:
        return []
    if snap.get("rc") not in NAGIOS_CODES:
        message = f"exit status {snap.get('rc')} is not a Nagios code; {message}".rstrip("; ")
    return [Finding(_SITE_CODE[severity], component, message or f"{name}: {severity}", details)]


def exec_probes(folder: str) -> dict[str, type[Probe]]:
    """Probe classes for the executable files of ``folder`` (hidden and backup files skipped)."""
    out: dict[str, type[Probe]] = {}
    try:
        entries = sorted(Path(folder).iterdir())
    except OSError:
        return out
    for path in entries:
        if path.name.startswith(".") or path.name.endswith(("~", ".dpkg-old", ".rpmsave")):
            continue
        if path.is_file() and os.access(path, os.X_OK):
            cls = exec_probe_class(path)
            out.setdefault(cls.name, cls)
    return out
