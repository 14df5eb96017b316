"""``hma config show [--json]``: the merged configuration, every key with its value and where it
came from: the main file, a drop-in (by path) or the default (docs/cli.md).

The configuration is loaded as ``hma run`` loads it (every installed probe, event source and
reporter), so an invalid one is its errors and exit 2, as with ``hma config check``. Values and
file names were written by others (the admin, a configuration tool): the text output escapes
them (hma.adapters.text.printable); ``--json`` is plain JSON.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping, Optional

from hma.adapters.text import printable
from hma.commands import common
from hma.config import files
from hma.config.files import ConfigError
from hma.config.schema import Config, toml_value

DEFAULT = "default"


def tables(config: Config) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Each table of the merged configuration with its values, in the order of ``hma config
    defaults``: the sections, then probes, event sources, reporters and codes, by name."""
    yield from config.sections.items()
    for group in ("probes", "sources", "reporters", "codes"):
        for name, values in sorted(getattr(config, group).items()):
            yield f"{group}.{name}", values


def origin(key: str, where: Mapping[str, str], main: str) -> dict[str, str]:
    """Where the value of dotted ``key`` came from: ``{"from": "file" | "drop-in", "path": ...}``
    (the last file that set it) or ``{"from": "default"}``."""
    path = where.get(key)
    if path is None:
        return {"from": DEFAULT}
    return {"from": "file" if path == main else "drop-in", "path": path}


def document(config: Config, where: Mapping[str, str], main: str, notes: list[str]) -> dict:
    """The ``--json`` document: the files merged, the drop-ins' ``[match]`` notes, and each
    dotted key's value with its origin."""
    values = {
        f"{table}.{key}": {"value": value, **origin(f"{table}.{key}", where, main)}
        for table, items in tables(config)
        for key, value in items.items()
    }
    kinds = [{"path": f, "kind": "file" if f == main else "drop-in"} for f in config.files]
    return {"command": "config", "files": kinds, "notes": notes, "values": values}


def render(config: Config, where: Mapping[str, str], main: str, notes: list[str]) -> str:
    """The text output: TOML with a comment after each value saying where it came from."""
    used = ", ".join(config.files) or "no file (all defaults)"
    lines = [f"# hma configuration: {used}", *(f"# {note}" for note in notes)]
    for table, items in tables(config):
        lines += ["", f"[{table}]"]
        for key, value in items.items():
            came = origin(f"{table}.{key}", where, main)
            said = came["from"] if "path" not in came else f"{came['from']} {came['path']}"
            lines.append(f"{key} = {toml_value(value)}  # {said}")
    return "\n".join(printable(line) for line in lines) + "\n"


def main(config_file: Optional[str], as_json: bool) -> int:
    """``hma config show``: 0 with the configuration printed; 2 (its errors on stderr, with
    ``--json`` the document saying so) when it is invalid."""
    from hma import assembly

    path = files.config_path(config_file)
    layers, _errors, notes = files.read_layers_noted(path)
    try:
        config = assembly.load(config_file).config
    except ConfigError as exc:
        return common.config_failed(exc, 2, "config" if as_json else "")
    where = files.origins(layers)
    if as_json:
        common.dump(document(config, where, str(path), notes))
    else:
        print(render(config, where, str(path), notes), end="")
    return 0
