"""Adapters: running commands, reading files under an injectable root, sd_notify, strict
reading, TOML, terminal text and log lines (docs/architecture.md lists the side effects that
live elsewhere)."""
