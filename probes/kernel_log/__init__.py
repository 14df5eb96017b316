"""The kernel log: the event source, its line parsing and its rules (as data)."""
