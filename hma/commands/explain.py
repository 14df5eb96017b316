"""``hma explain CODE`` and ``hma explain --list``: the finding catalogue for an operator."""

from __future__ import annotations

import sys
from typing import Optional

from hma.commands.term import columns, fit
from hma.contracts import catalogue


def main(code: Optional[str], list_all: bool) -> int:
    """Print one catalogue entry, or every code with ``list_all``; 2 for a missing or unknown
    code (with the nearest codes as a hint)."""
    cat = catalogue.load_builtin()
    if list_all:
        width = columns()  # a terminal: each line cut to it (the summary is free text)
        for entry in cat:
            line = f"{entry.code:<28} {entry.severity!s:<9} {entry.action!s:<8} {entry.summary}"
            print(fit(line, width))
        return 0
    if not code:
        print(
            "usage: hma explain CODE   (one finding code, e.g. GPU_XID_79)\n"
            "       hma explain --list (every code with its severity, action and summary)",
            file=sys.stderr,
        )
        return 2
    entry = cat.get(code.upper())
    if entry is None:
        close = catalogue.suggest(cat, code)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        print(
            f"hma explain: unknown code {code!r}{hint} (`hma explain --list` lists them)",
            file=sys.stderr,
        )
        return 2
    print(catalogue.explain(entry))
    return 0
