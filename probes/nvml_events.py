"""NVML Xid event source (written after merging main: see the next commit)."""
