"""Basic system checks (file systems, memory, load, clocks)."""
