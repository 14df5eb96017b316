"""Kernel-log rules shipped with hma, as data: one TOML file per domain (``[[rule]]`` tables).

Each rule has ``code`` (a catalogue code), ``pattern`` (a Python regular expression searched in
the message text), ``component`` (a template filled from the pattern's named groups; ``fallback``
when a group did not match) and ``message``. Rules of a file are tried in order; the first that
matches wins. The kernel_log event source loads them (sites add theirs in /etc/hma/rules.d).
"""
