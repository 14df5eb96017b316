"""Reading the configuration files, without validation.

Light on imports on purpose: `hma status` and other quick paths read one or two ``[agent]`` keys
through here before (or without) loading the full schema in ``hma.config.schema``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

from hma.adapters import tomlcompat

if TYPE_CHECKING:  # imported when a drop-in has a [match] table: `hma status` stays light
    from hma.config import match

DEFAULT_PATH = "/etc/hma/hma.toml"
# Defaults of the [agent] paths that are read before validation (hma.config.schema declares them
# too, from these constants).
STATE_DIR = "/var/lib/hma"
RUN_DIR = "/run/hma"
PROBES_DIR = "/etc/hma/probes.d"
EARLY_DEFAULTS = {"state_dir": STATE_DIR, "run_dir": RUN_DIR, "probes_dir": PROBES_DIR}
MATCH = "match"  # the table of a drop-in for some nodes only (hma.config.match)


class ConfigError(Exception):
    """Configuration problems, each ``key.path: problem``."""

    def __init__(self, errors: Sequence[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = list(errors)


def config_path(explicit: Optional[str] = None) -> Path:
    """The main file: ``--config``, else ``$HMA_CONFIG``, else /etc/hma/hma.toml."""
    return Path(explicit or os.environ.get("HMA_CONFIG") or DEFAULT_PATH)


def read_raw(path: Path) -> tuple[dict[str, Any], list[str], list[str]]:
    """Merge the main file and ``<dir>/hma.d/*.toml`` (name order); returns (raw, files, errors).

    A missing main file is not an error (every key has a default); an explicitly named one that
    cannot be read is. A file that cannot be read or parsed is left out of the merge and named
    in the errors; the others are still merged.
    """
    layers, errors = read_layers(path)
    raw, files = merged(layers)
    return raw, files, errors


def merged(layers: Sequence[tuple[str, Mapping[str, Any]]]) -> tuple[dict[str, Any], list[str]]:
    """The layers merged key by key, later ones winning; and the names of the files merged."""
    out: dict[str, Any] = {}
    for _name, data in layers:
        _merge(out, data)
    return out, [name for name, _data in layers]


def read_layers(path: Path) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
    """Each readable file (main, then the drop-ins in name order that apply to this node) with
    its parsed TOML; and errors."""
    layers, errors, _notes = read_layers_noted(path)
    return layers, errors


def read_layers_noted(
    path: Path, node: Optional[match.Node] = None
) -> tuple[list[tuple[str, dict[str, Any]]], list[str], list[str]]:
    """``read_layers``, and a note per drop-in with a ``[match]`` table: whether it applies to
    ``node`` (default: this host, its hardware under the main file's ``[paths] sysfs``) and why.
    A drop-in whose ``[match]`` is invalid or cannot be judged is left out, named in the errors.
    """
    errors: list[str] = []
    notes: list[str] = []
    layers: list[tuple[str, dict[str, Any]]] = []
    candidates = [path, *_dropins(path.parent / "hma.d", errors)]
    for candidate in candidates:
        try:
            text = candidate.read_text(encoding="utf-8")
        except FileNotFoundError:
            if candidate != path or "HMA_CONFIG" in os.environ or str(path) != DEFAULT_PATH:
                errors.append(f"{candidate}: file not found")
            continue
        except (OSError, UnicodeDecodeError) as exc:
            errors.append(f"{candidate}: cannot read: {exc}")
            continue
        try:
            data = tomlcompat.loads(text)
        except tomlcompat.TOMLDecodeError as exc:
            errors.append(f"{candidate}: invalid TOML: {exc}")
            continue
        if MATCH not in data:
            layers.append((str(candidate), data))
            continue
        from hma.config import match

        table = data.pop(MATCH)
        if candidate == path:
            errors.append(f"{candidate}: [match] belongs in a drop-in (hma.d/*.toml), not here")
            layers.append((str(candidate), data))
            continue
        found = match.problems(table)
        if not found:
            node = node or match.Node.here(_sysfs(layers, path))
            try:
                applies, why = match.decide(table, node)
            except OSError as exc:
                found = [f"match.hardware: cannot list the PCI devices: {exc}"]
        if found:
            errors += [f"{candidate}: {line}" for line in found]
            continue
        notes.append(f"{candidate}: {'applied' if applies else 'not applied'} ({why})")
        if applies:
            layers.append((str(candidate), data))
    return layers, errors, notes


def _sysfs(layers: Sequence[tuple[str, Mapping[str, Any]]], main: Path) -> str:
    """``[paths] sysfs`` of the main file ``main`` when it is an absolute path, else /sys:
    drop-ins that match on hardware are judged against it."""
    paths = layers[0][1].get("paths") if layers and layers[0][0] == str(main) else None
    value = paths.get("sysfs") if isinstance(paths, dict) else None
    return value if isinstance(value, str) and value.startswith("/") else "/sys"


def _dropins(folder: Path, errors: list[str]) -> list[Path]:
    """The ``*.toml`` files of ``folder`` in name order; one it cannot list is an error."""
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        errors.append(f"{folder}: cannot read: {exc}")
        return []
    return [folder / name for name in sorted(names) if name.endswith(".toml")]


def origins(layers: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[str, str]:
    """Dotted key path (``probes.system.interval``, and every table above it) -> the last file
    that set it, which is where the merged value comes from."""
    found: dict[str, str] = {}
    for name, data in layers:
        stack: list[tuple[str, Mapping[str, Any]]] = [("", data)]
        while stack:
            prefix, table = stack.pop()
            for key, value in table.items():
                dotted = f"{prefix}{key}"
                found[dotted] = name
                if isinstance(value, dict):
                    stack.append((dotted + ".", value))
    return found


def empty_files(files: Sequence[str]) -> list[str]:
    """Files among ``files`` that hold nothing but white space now (a half-written file, say)."""
    out = []
    for name in files:
        try:
            blank = not Path(name).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            continue  # unreadable: reading the configuration reports it
        if blank:
            out.append(name)
    return out


def early_agent_path(explicit: Optional[str], key: str) -> tuple[str, list[str]]:
    """One ``[agent]`` path read before full validation (it decides what to load, or lets
    ``hma status`` work with a config broken elsewhere): (value or default, problems met)."""
    raw, _files, errors = read_raw(config_path(explicit))
    return agent_path(raw, key, errors)


def agent_path(
    raw: Mapping[str, Any], key: str, errors: Sequence[str] = ()
) -> tuple[str, list[str]]:
    """``early_agent_path`` over a configuration already read and merged (``errors``: the
    reading's, passed on)."""
    default = EARLY_DEFAULTS[key]
    errors = list(errors)
    agent = raw.get("agent")
    value = agent.get(key) if isinstance(agent, dict) else None
    if value is None:
        return default, errors
    if not isinstance(value, str) or not value.startswith("/"):
        return default, [*errors, f"agent.{key}: must be an absolute path, got {value!r}"]
    return value, errors


def _merge(into: dict[str, Any], new: Mapping[str, Any]) -> None:
    """Merge ``new`` into ``into``; tables are copied, so the merge never changes a layer."""
    for key, value in new.items():
        if isinstance(value, dict):
            if not isinstance(into.get(key), dict):
                into[key] = {}
            _merge(into[key], value)
        else:
            into[key] = value
