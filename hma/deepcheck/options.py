"""``[deep_check]``: which stages run, their bounds and the limits they are judged against.

Registered in ``hma.assembly.FEATURE_SECTIONS``; documented in docs/deep-check.md.
"""

from __future__ import annotations

from typing import Any, Optional

from hma.contracts.options import Option, positive

NODE_STAGES = ("stress", "accelerators", "dcgm", "efa", "neuron")
STAGES = (*NODE_STAGES, "connectivity")


def _limits(value: Any) -> Optional[str]:
    """A table of instance type -> positive number."""
    for key, item in value.items():
        if isinstance(item, bool) or not isinstance(item, (int, float)) or item <= 0:
            return f"{key}: expected a positive number, got {item!r}"
    return None


def _stage_limits(value: Any) -> Optional[str]:
    """Seconds per stage: known stage names, positive numbers."""
    unknown = sorted(set(value) - set(STAGES))
    if unknown:
        return f"unknown stage(s) {', '.join(unknown)}; stages: {', '.join(STAGES)}"
    return _limits(value)


DEEP_CHECK: dict[str, Option] = {
    "stages": Option(
        "strlist", list(NODE_STAGES), "Node stages `hma deep-check` runs.", choices=NODE_STAGES
    ),
    "after_recovery": Option(
        "strlist",
        [],
        "Stages that must pass before a node hma rebooted or that came back replaced is resumed.",
        choices=STAGES,
    ),
    "stress_seconds": Option(
        "float", 60.0, "Seconds stress-ng runs its CPU, memory and disk stressors.", check=positive
    ),
    "stress_memory": Option("str", "10%", "stress-ng --vm-bytes (memory stressed, with verify)."),
    "stress_disk_bytes": Option("str", "1G", "stress-ng --hdd-bytes (file written and read)."),
    "stress_dir": Option("path", "/var/tmp", "Folder of stress-ng's temporary files."),
    "stress_command": Option("argv", ["stress-ng"], "stress-ng command."),
    "dcgm_level": Option(
        "int", 2, "dcgmi diag run level (1-4; 4 takes 45-90 min).", minimum=1, maximum=4
    ),
    "dcgmi_command": Option("argv", ["dcgmi"], "dcgmi command."),
    "fi_pingpong_command": Option("argv", ["fi_pingpong"], "fi_pingpong command."),
    "efa_provider": Option("str", "efa", "libfabric provider of the EFA loopback test."),
    "efa_adapters": Option(
        "table",
        {},
        'Adapters to loop back: name = { address = "...", netns = "..." }; unset: every '
        "EFA device in sysfs (infiniband class).",
    ),
    "efa_max_latency_us": Option(
        "table", {}, "Loopback latency limit (us) per instance type.", check=_limits
    ),
    "efa_min_bandwidth_mbps": Option(
        "table", {}, "Loopback bandwidth minimum (MB/s) per instance type.", check=_limits
    ),
    "nccom_command": Option("argv", ["nccom-test"], "Neuron nccom-test command."),
    "neuron_hw_check_command": Option(
        "argv", ["neuron-hw-check"], "Neuron hardware check command (exit 0 = healthy)."
    ),
    "all_reduce_command": Option(
        "argv",
        ["all_reduce_perf", "-b", "8", "-e", "8G", "-f", "2", "-g", "1"],
        "nccl-tests all_reduce_perf as srun runs it across the nodes (one task per node).",
    ),
    "busbw_min_gbps": Option(
        "table",
        {},
        "Minimum all-reduce bus bandwidth (GB/s) per instance type, over the built-in table.",
        check=_limits,
    ),
    "timeouts": Option(
        "table",
        {},
        "Seconds per stage, e.g. { dcgm = 5400 }, over the defaults (docs/deep-check.md).",
        check=_stage_limits,
    ),
    "busy_wait": Option(
        "float", 600.0, "Seconds `run` waits for a busy node before skipping it.", check=positive
    ),
    "partition": Option("str", None, "Partition of the deep-check jobs; unset: the default."),
    "srun_command": Option("argv", ["srun"], "srun command (`hma deep-check run`)."),
    "node_command": Option(
        "argv",
        ["hma", "deep-check", "--json"],
        "What each node job runs (`run` adds --stages, or --connectivity-result).",
    ),
    "collective": Option(
        "choice",
        "auto",
        "Collective of the connectivity stage: nccl (all_reduce_command), nccom (nccom_command "
        "allr), auto: nccom on trn*/inf* instance types, else nccl.",
        choices=("auto", "nccl", "nccom"),
    ),
}
