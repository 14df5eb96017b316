"""Deep health checks: stages that stress and measure a node (and a group of nodes) on demand.

``hma deep-check`` runs the node stages here (hma.deepcheck.stages), records each stage as one
observation in the state store (hma.deepcheck.record), and ``hma deep-check run NODES`` drives
them across nodes from a login node through Slurm (hma.deepcheck.orchestrate).
docs/deep-check.md.
"""
