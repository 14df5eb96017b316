"""The node as slurmd sees it."""
