#!/usr/bin/env python3
"""Reboot and replace hook for `hma watch` (docs/watch.md) on AWS: a reboot is
``aws ec2 reboot-instances``, a replace ``aws sagemaker batch-replace-cluster-nodes`` (a
HyperPod cluster; with ``replace_mode = "hyperpod"`` hma asks HyperPod itself and needs no hook).
In the controller's hma.toml::

    [recovery]
    reboot_command = ["/usr/share/doc/hma/examples/watch-aws-reboot.py"]
    replace_command = ["/usr/share/doc/hma/examples/watch-aws-reboot.py"]
    command_timeout = 120

The node's instance id comes from a JSON file (``HMA_INSTANCE_MAP``, default
/etc/hma/instances.json: ``{"node1": "i-0123456789abcdef0", ...}``); the HyperPod cluster's
name from ``HMA_HYPERPOD_CLUSTER``. ``HMA_ACTION_ID`` is the same on every retry: an action this
hook already carried out is not sent again. Every call is an argv list with a timeout; the exit
status is 0 only when AWS accepted the call.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

TIMEOUT_S = 60
WORD = re.compile(r"[A-Za-z0-9._-]{1,128}")


def main() -> int:
    """Reboot or replace ``HMA_NODE`` (see the module doc)."""
    node, action, key = (os.environ.get(k, "") for k in ("HMA_NODE", "HMA_ACTION", "HMA_ACTION_ID"))
    if not (WORD.fullmatch(node) and WORD.fullmatch(key)) or action not in ("reboot", "replace"):
        print("HMA_NODE, HMA_ACTION or HMA_ACTION_ID unusable", file=sys.stderr)
        return 2
    done = Path(os.environ.get("HMA_HOOK_DONE_DIR", "/var/lib/hma/watch/hooks")) / key
    if done.exists():
        print(f"{key} already carried out")
        return 0
    mapping = json.loads(
        Path(os.environ.get("HMA_INSTANCE_MAP", "/etc/hma/instances.json")).read_text()
    )
    instance = str(mapping.get(node, ""))
    if not re.fullmatch(r"i-[0-9a-f]{8,17}", instance):
        print(f"no instance id for {node}", file=sys.stderr)
        return 2
    if action == "reboot":
        argv = ["aws", "ec2", "reboot-instances", "--instance-ids", instance]
    else:
        cluster = os.environ.get("HMA_HYPERPOD_CLUSTER", "")
        argv = ["aws", "sagemaker", "batch-replace-cluster-nodes", "--cluster-name", cluster,
                "--node-ids", instance]  # fmt: skip
    try:
        subprocess.run(argv, check=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"{argv[1]} {argv[2]} failed: {exc}", file=sys.stderr)
        return 1
    done.parent.mkdir(parents=True, exist_ok=True)
    done.touch()
    return 0


if __name__ == "__main__":
    sys.exit(main())
