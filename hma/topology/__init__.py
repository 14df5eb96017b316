"""NVLink (or NeuronLink) domains: which domain a node is in, how it is published in Slurm, the
topology file written from them on the controller (``hma topology``), and spare nodes per domain.
See docs/topology.md."""
