"""hma: a node health monitoring agent for Slurm accelerator clusters."""

__version__ = "0.1.0"
