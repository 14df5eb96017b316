"""Cluster backends (Slurm built in): the only code that talks to the scheduler."""
