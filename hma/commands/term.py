"""Output that fits the terminal: ``--help`` always within 80 columns (narrower when the
terminal is), tables cut with an ellipsis where stdout is a terminal narrower than the text."""

from __future__ import annotations

import shutil
import sys
from typing import Optional

HELP_COLUMNS = 80
ELLIPSIS = "..."


def columns() -> Optional[int]:
    """The width of the terminal stdout is; None when stdout is not a terminal (a pipe or a
    file gets whole lines)."""
    try:
        if not sys.stdout.isatty():
            return None
    except (AttributeError, ValueError):
        return None
    return shutil.get_terminal_size().columns


def help_columns() -> int:
    """Width of help text: 80 columns, or the terminal's when narrower."""
    return max(40, min(HELP_COLUMNS, shutil.get_terminal_size((HELP_COLUMNS, 24)).columns))


def fit(line: str, width: Optional[int]) -> str:
    """``line`` cut to ``width`` characters, ending in an ellipsis when cut (None: whole)."""
    if width is None or len(line) <= width:
        return line
    return line[: max(0, width - len(ELLIPSIS))] + ELLIPSIS


def wrap(line: str, width: int, indent: str) -> list[str]:
    """``line`` wrapped to ``width``, continuation lines indented by ``indent``."""
    import textwrap  # only help text wraps: `hma status` does without it

    return textwrap.wrap(line, width, subsequent_indent=indent, break_on_hyphens=False) or [""]
