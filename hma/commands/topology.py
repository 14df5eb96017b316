"""``hma topology``: the controller's topology file from the nodes' NVLink domains.

Reads every node's published domain in one ``sinfo`` query, keeps ``[topology]
spares_per_domain`` healthy spares per domain (drained with the reason ``hma-spare``), renders
the file (hma.topology.conf) and writes it atomically only when it changed, then runs ``scontrol
reconfigure``. ``--check`` prints the difference and changes nothing (exit 1 when the file or the
spares would change). A file that does not read back as one Slurm accepts (``conf.problems``) is
never written: the run changes nothing and exits 4. See docs/topology.md.
"""

from __future__ import annotations

import difflib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

from hma.adapters.text import printable
from hma.cluster.slurm.parse import SlurmError
from hma.commands import common
from hma.contracts.cluster import NodeState
from hma.reporters.statusfile import write_text
from hma.topology import conf, domain, spares

if TYPE_CHECKING:
    from hma.cluster.slurm.client import SlurmClient

EX_CHANGES = 1  # --check: something would change
EX_CONFIG = 2
EX_SLURM = 3
EX_REFUSED = 4  # the rendered file would not be one Slurm accepts: nothing changed
FILENAMES = {"block": "topology.conf", "tree": "topology.conf", "yaml": "topology.yaml"}


def target(topo: Mapping[str, Any], slurm: Mapping[str, Any], fmt: str) -> Path:
    """The file to write: ``[topology] file``, else next to slurm.conf (``[slurm] conf``,
    $SLURM_CONF, /etc/slurm/slurm.conf)."""
    if topo.get("file"):
        return Path(str(topo["file"]))
    slurm_conf = slurm.get("conf") or os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
    return Path(str(slurm_conf)).parent / FILENAMES[fmt]


def render(
    nodes: Sequence[NodeState], fmt: str, domain_size: Optional[int], per_domain: int
) -> tuple[str, list[str], int]:
    """The file's text for these nodes, the nodes that publish no domain, the base block size."""
    found, lonely = conf.blocks({n.name: spares.node_domain(n) for n in nodes})
    size = conf.block_size(found, domain_size, per_domain)
    return conf.render(found, fmt, size), lonely, size


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ""


def run(
    client: SlurmClient,
    topo: Mapping[str, Any],
    path: Path,
    fmt: str,
    check: bool,
    out: Any = sys.stdout,
    err: Any = sys.stderr,
) -> int:
    """One pass (see the module doc); returns the exit code."""
    nodes = client.nodes()
    per_domain = int(topo["spares_per_domain"])
    mark, release = spares.plan(nodes, per_domain) if per_domain else ([], [])
    text, lonely, size = render(nodes, fmt, topo["domain_size"], per_domain)
    unusable = {n.name: domain.problem(spares.published(n)) for n in nodes}
    for name in lonely:
        why = unusable[name]
        what = f"an unusable domain ({why})" if why else "no domain"
        print(
            f"hma topology: warning: {printable(name)} publishes {what}; in a block of its own",
            file=err,
        )
    if fmt != "tree" and lonely:
        print(f"hma topology: warning: BlockSizes lowered to {size} by those blocks", file=err)
    refused = conf.problems(text, fmt)
    if refused:
        for why in refused:
            print(
                f"hma topology: error: the new {path.name} would be refused: {printable(why)}",
                file=err,
            )
        print(f"hma topology: error: {path} kept, no spare changed, no reconfigure", file=err)
        return EX_REFUSED
    old = _read(path)
    changed = text != old
    if check:
        if changed:
            diff = difflib.unified_diff(
                old.splitlines(True), text.splitlines(True), str(path), f"{path} (new)"
            )
            out.write(printable("".join(diff), newlines=True))
        for name in mark:
            print(f"would make {name} a spare (drain, reason {spares.SPARE_REASON})", file=out)
        for name in release:
            print(f"would put spare {name} back in service", file=out)
        return EX_CHANGES if changed or mark or release else 0
    if mark:
        client.update(conf.compress(mark), State="DRAIN", Reason=spares.SPARE_REASON)
        print(f"spares: {conf.compress(mark)} drained ({spares.SPARE_REASON})", file=out)
    if release:
        client.update(conf.compress(release), State="RESUME")
        print(f"spares: {conf.compress(release)} back in service", file=out)
    if not changed:
        print(f"{path}: unchanged", file=out)
        return 0
    write_text(path, text)
    print(f"{path}: written ({text.count(chr(10)) - 1} lines)", file=out)
    if topo["reconfigure"]:
        client.reconfigure()
        print("scontrol reconfigure: done", file=out)
    return 0


def main(config: Optional[str], fmt: Optional[str], path: Optional[str], check: bool) -> int:
    """``hma topology [--format F] [--file PATH] [--check]``."""
    from hma import assembly
    from hma.config.files import ConfigError

    try:
        setup = assembly.load(config)
        client = common.slurm_client(setup)
    except ConfigError as exc:
        return common.config_failed(exc, EX_CONFIG)
    topo = dict(setup.config.section("topology"))
    sl = setup.config.section("slurm")
    fmt = fmt or str(topo["format"])
    try:
        return run(client, topo, Path(path) if path else target(topo, sl, fmt), fmt, check)
    except (SlurmError, OSError) as exc:
        print(f"hma topology: {exc}", file=sys.stderr)
        return EX_SLURM
