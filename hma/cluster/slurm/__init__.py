"""The Slurm client: scontrol/sinfo/squeue as argv lists with timeouts, and node state parsing.

Every call's cost on slurmctld is chosen (checked with ``sdiag``, docs/scale.md): this node's state
from ``sinfo -n NODE -O ...`` (a single-node query), its jobs from the local slurmd (``scontrol
listpids``), a job from ``squeue -j ID -O ...`` (a single-job query). Only the breaker and ``hma
fleet`` read the node table, with text filtered to the few nodes they need. ``NodeState`` turns
Slurm's base state + flags into the few facts remediation needs (drain vs draining vs drained,
fail/failing, down, reboot requested/issued, maintenance, not responding). A state it does not
recognise sets ``understood = False``: remediation then does nothing to the node and says so.
"""
