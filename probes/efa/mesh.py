"""``efa_mesh`` probe: fi_pingpong between the EFA adapters of this node, to find the broken one.

Each run screens one round of the round-robin tournament: n/2 disjoint pairs run concurrently, so
every adapter is tested at every run, and the round rotates from run to run, so every path is
tested once every n-1 runs (the round travels in the snapshot). When the screen fails, or every
``full_interval`` seconds (a day by default), it runs the full tournament (n-1 rounds of disjoint
pairs, at most ``max_concurrency`` pairs at once: by default one per two cores the agent may use)
and localizes: an adapter that fails with at least max(2, ceil(0.75 (n-1))) peers while other
pairs pass is broken; an isolated failing pair is a path warning; every pair failing is a
node-level fault.

A pair test starts the server on the lower adapter and the client on the other, each through
``ctx.runner`` with a timeout (an unreachable peer makes the client hang; the runner kills the
process group when the timeout expires). The adapters come from sysfs (as the ``efa`` probe finds
them) or from the ``adapters`` table, which may place an adapter in a network namespace and give
its address: production uses provider ``efa`` with ``FI_EFA_ENABLE_SHM_TRANSFER=0`` so that
pairs on one host really cross the adapters; the tests use provider ``tcp`` between namespaces.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, ClassVar, Collection, Iterator, Mapping, Optional, Sequence

from hma.adapters.command import CommandResult
from hma.adapters.files import ReadError
from hma.contracts.model import Finding
from hma.contracts.options import Option, pci_ids
from hma.contracts.probe import Probe, ProbeContext, unknown

NODE = "node"
REFUSED_RC = 111  # ECONNREFUSED: the server is not listening yet
ADAPTER_KEYS = ("address", "netns", "domain")
EVIDENCE_PAIRS = 64  # pairs listed in one finding's evidence at most


def _adapters_check(value: Any) -> Optional[str]:
    for name, spec in value.items():
        if not isinstance(spec, dict):
            return f"{name}: expected a table with address/netns/domain"
        for key, item in spec.items():
            if key not in ADAPTER_KEYS:
                return f"{name}.{key}: unknown key (known: {', '.join(ADAPTER_KEYS)})"
            if not isinstance(item, str) or not item:
                return f"{name}.{key}: expected a non-empty string"
    return None


def _env_check(value: Any) -> Optional[str]:
    for key, item in value.items():
        if not isinstance(item, str):
            return f"{key}: environment values must be strings"
    return None


def _format_check(value: Any) -> Optional[str]:
    try:
        value.format(adapter="x")
    except (KeyError, IndexError, ValueError) as exc:
        return f"bad format (only {{adapter}} is known): {exc}"
    return None


# --- scheduling (pure) -----------------------------------------------------------------------


def tournament_rounds(n: int) -> list[list[tuple[int, int]]]:
    """Round-robin (circle method): n-1 rounds of disjoint pairs (n rounds when n is odd)."""
    if n < 2:
        return []
    players: list[Optional[int]] = list(range(n))
    if n % 2:
        players.append(None)  # bye
    m = len(players)
    rounds = []
    for _ in range(m - 1):
        rnd = []
        for i in range(m // 2):
            a, b = players[i], players[m - 1 - i]
            if a is not None and b is not None:
                rnd.append((min(a, b), max(a, b)))
        rounds.append(sorted(rnd))
        players = [players[0], players[-1], *players[1:-1]]
    return rounds


def screen_index(n: int, previous: Any) -> int:
    """The tournament round the next screen runs: the one after the previous run's, so that
    every adapter is tested at every run and every path once every n-1 runs."""
    last = previous.get("screen_round") if isinstance(previous, dict) else None
    rounds = len(tournament_rounds(n))
    return (last + 1) % rounds if isinstance(last, int) and rounds else 0


def broken_threshold(peers: int) -> int:
    """Failing peers that make an adapter broken: max(2, ceil(0.75 * peers))."""
    return max(2, math.ceil(0.75 * peers))


# --- the probe -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """Where one adapter's fi_pingpong runs."""

    name: str
    address: str
    netns: Optional[str]
    domain: Optional[str]


class EfaMeshProbe(Probe):
    """Connectivity between every EFA adapter of the node (fi_pingpong screen + tournament)."""

    name = "efa_mesh"
    description = "EFA ping-mesh: fi_pingpong screen of disjoint pairs, tournament to localize"
    default_interval = 1800.0
    default_timeout = 600.0
    options: ClassVar[Mapping[str, Option]] = {
        "command": Option("argv", ["fi_pingpong"], "fi_pingpong argv (libfabric fabtests)."),
        "provider": Option(
            "str", "efa", "libfabric provider (-p): efa in production, tcp in tests."
        ),
        "endpoint": Option("choice", "rdm", "Endpoint type (-e).", choices=("rdm", "msg", "dgram")),
        "iterations": Option(
            "int",
            10,
            "Ping-pong iterations per pair (-I): a broken path fails the first; more only "
            "refine the latency.",
            minimum=1,
        ),
        "size": Option("int", 4096, "Transfer size in bytes (-S).", minimum=1),
        "pair_timeout": Option(
            "float",
            10.0,
            "Seconds before a pair test is killed and counted as failed.",
            minimum=0.5,
            below="timeout",
        ),
        "env": Option(
            "table",
            {"FI_EFA_ENABLE_SHM_TRANSFER": "0"},
            "Environment added for fi_pingpong (shm off: local pairs must cross the adapters).",
            check=_env_check,
        ),
        "adapters": Option(
            "table",
            None,
            "Adapter -> { address, netns, domain }; unset: every EFA adapter found in sysfs.",
            check=_adapters_check,
        ),
        "server_address": Option(
            "str", "127.0.0.1", "Address clients connect to when an adapter gives none."
        ),
        "domain_format": Option(
            "str",
            "{adapter}-rdm",
            "Domain (-d) from the adapter name when the table gives none; '' passes no -d.",
            check=_format_check,
        ),
        "netns_exec": Option(
            "argv", ["ip", "netns", "exec"], "Prefix that runs a command in a network namespace."
        ),
        "base_port": Option(
            "int",
            47600,
            "First control port (-B/-P); concurrent pairs use the next ones.",
            minimum=1,
            maximum=65535 - 255,
        ),
        "max_concurrency": Option(
            "int",
            0,
            "Pair tests running at once; 0: one per two cores the agent may use (CPU affinity "
            "and cgroup cpu.max).",
            minimum=0,
            maximum=256,
        ),
        "full_interval": Option(
            "float",
            86400.0,
            "Seconds between full tournaments when the screen passes (0: every run).",
            minimum=0,
        ),
        "skip_when_busy": Option("bool", True, "Do not run while a job holds the node."),
        "run_when_unknown": Option(
            "bool",
            False,
            "Run when Slurm is configured but whether a job runs is unknown (else skip).",
        ),
        "vendor_ids": Option(
            "strlist", ["0x1d0f"], "PCI vendor ids of EFA adapters (sysfs).", check=pci_ids
        ),
        "lock_file": Option(
            "path",
            "/run/lock/hma-efa_mesh.lock",
            "flock file so that the daemon and `hma check` never run two meshes at once.",
        ),
    }

    def applies(self, ctx: ProbeContext) -> Optional[str]:
        busy = busy_reason(ctx)
        if busy:
            return busy
        try:
            endpoints = resolve_endpoints(ctx)
        except ReadError as exc:
            return f"cannot list EFA adapters: {exc}"
        if len(endpoints) < 2:
            return f"needs at least 2 EFA adapters ({len(endpoints)} found)"
        return None

    def collect(self, ctx: ProbeContext) -> Any:
        started = time.monotonic()
        endpoints = resolve_endpoints(ctx)
        names = [e.name for e in endpoints]
        snap: dict[str, Any] = {"adapters": names, "ts": ctx.clock(), "error": ""}
        prev = ctx.previous if isinstance(ctx.previous, dict) else {}
        last_full = float(prev.get("last_full_ts") or 0.0)
        snap["last_full_ts"] = last_full
        with _locked(ctx.options["lock_file"]) as got:
            if not got:
                snap["error"] = "another efa_mesh run holds " + str(ctx.options["lock_file"])
                return snap
            mesh = Mesh(ctx, endpoints, deadline=started + _budget(ctx.options))
            rounds = tournament_rounds(len(endpoints))
            snap["screen_round"] = screen_index(len(endpoints), prev)
            snap["screen"] = mesh.run([rounds[snap["screen_round"]]])
            interval = float(ctx.options["full_interval"])
            due = interval == 0 or (not ctx.oneshot and snap["ts"] - last_full >= interval)
            failed = any(p["status"] != "ok" for p in snap["screen"])
            if failed or due:
                snap["tournament"] = mesh.run(rounds)
                snap["last_full_ts"] = snap["ts"]
                snap["full_reason"] = "screen failed" if failed else "scheduled"
        snap["wall_s"] = round(time.monotonic() - started, 3)
        return snap

    def evaluate(self, snapshot: Any, ctx: ProbeContext) -> list[Finding]:
        return evaluate_mesh(snapshot)

    def summary(self, snapshot: Any) -> Optional[dict]:
        """Matrix and per-pair latency for the status document."""
        if not isinstance(snapshot, dict) or not snapshot.get("adapters"):
            return None
        pairs = snapshot.get("tournament") or snapshot.get("screen") or []
        return {"test": "tournament" if snapshot.get("tournament") else "screen", **matrix(pairs)}


def busy_reason(ctx: ProbeContext) -> Optional[str]:
    """Why the mesh must not run now (skip_when_busy), or None.

    ``job_running`` None means unknown: without Slurm configured nothing can run there, so the
    mesh runs; with Slurm configured it is skipped unless ``run_when_unknown`` is set.
    """
    if not ctx.options["skip_when_busy"]:
        return None
    running = ctx.facts.job_running
    if running:
        jobs = ", ".join(ctx.facts.job_ids) or "a job"
        return f"skipped: {jobs} holds the node (skip_when_busy)"
    if running is None and ctx.facts.slurm_configured and not ctx.options["run_when_unknown"]:
        return "skipped: cannot tell whether a job holds the node (Slurm unreachable)"
    return None


def resolve_endpoints(ctx: ProbeContext) -> list[Endpoint]:
    """Adapters from the ``adapters`` table, else from sysfs; sorted by name."""
    opts = ctx.options
    table: Optional[Mapping[str, Mapping[str, str]]] = opts["adapters"]
    if table is None:
        from hma.probes.efa.adapters import discover_adapters

        layout = discover_adapters(ctx.sysfs, list(opts["vendor_ids"]))
        table = {name: {} for name in layout.adapters}
    fmt = opts["domain_format"]
    out = []
    for name in sorted(table):
        spec = table[name]
        out.append(
            Endpoint(
                name=name,
                address=spec.get("address") or opts["server_address"],
                netns=spec.get("netns"),
                domain=spec.get("domain") or (fmt.format(adapter=name) if fmt else None),
            )
        )
    return out


def _budget(opts: Mapping[str, Any]) -> float:
    """Seconds the mesh may use: the probe timeout less a margin, at least one pair."""
    timeout = float(opts.get("timeout") or EfaMeshProbe.default_timeout)
    return max(timeout - 2.0, float(opts["pair_timeout"]) + 1.0)


@contextlib.contextmanager
def _locked(path: str) -> Iterator[bool]:
    """Hold an exclusive flock on ``path`` (True), False when another run holds it.

    A lock file that cannot be created (no /run/lock) does not stop the mesh.
    """
    import fcntl

    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        yield True
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def allowed_cores(root: str = "/") -> int:
    """Cores this process may use: its CPU affinity, lowered by its cgroup v2 ``cpu.max`` quota
    (a systemd ``CPUQuota=``) when one is set; at least 1."""
    cores = len(os.sched_getaffinity(0))
    try:
        with open(os.path.join(root, "proc/self/cgroup"), encoding="ascii") as fh:
            group = next((ln[3:].strip() for ln in fh if ln.startswith("0::")), None)
        if group is not None:
            cpu_max = os.path.join(root, "sys/fs/cgroup", group.lstrip("/"), "cpu.max")
            with open(cpu_max, encoding="ascii") as fh:
                quota, period = fh.read().split()[:2]
            if quota != "max":
                cores = min(cores, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError, UnicodeDecodeError):
        pass  # no cgroup v2 or unreadable: the affinity alone
    return max(1, cores)


class Mesh:
    """Runs rounds of pair tests through ``ctx.runner``."""

    def __init__(self, ctx: ProbeContext, endpoints: Sequence[Endpoint], deadline: float) -> None:
        self.ctx = ctx
        self.opts = ctx.options
        self.endpoints = list(endpoints)
        self.deadline = deadline
        self.env = {**os.environ, **dict(self.opts["env"])}

    def argv(self, ep: Endpoint, port: int, server: Optional[Endpoint]) -> list[str]:
        """fi_pingpong argv for ``ep``: server when ``server`` is None, else its client."""
        opts = self.opts
        argv = [*opts["command"], "-p", opts["provider"], "-e", opts["endpoint"]]
        argv += ["-I", str(opts["iterations"]), "-S", str(opts["size"])]
        if ep.domain:
            argv += ["-d", ep.domain]
        argv += ["-B", str(port)] if server is None else ["-P", str(port), server.address]
        if ep.netns:
            argv = [*opts["netns_exec"], ep.netns, *argv]
        return argv

    def run(self, rounds: list[list[tuple[int, int]]]) -> list[dict[str, Any]]:
        """Run every round (batches of max_concurrency pairs, concurrent within a batch)."""
        results: list[dict[str, Any]] = []
        limit = int(self.opts["max_concurrency"]) or max(1, allowed_cores() // 2)
        pair_timeout = float(self.opts["pair_timeout"])
        for number, rnd in enumerate(rounds):
            for start in range(0, len(rnd), limit):
                batch = rnd[start : start + limit]
                if time.monotonic() + pair_timeout + 1.0 > self.deadline:
                    results += [self._skipped(a, b, number) for a, b in batch]
                    continue
                slots: list[dict[str, Any]] = [{} for _ in batch]
                threads = [
                    threading.Thread(
                        target=self._pair,
                        args=(a, b, int(self.opts["base_port"]) + i, number, slots[i]),
                        daemon=True,
                    )
                    for i, (a, b) in enumerate(batch)
                ]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                results += slots
        return results

    def _skipped(self, a: int, b: int, number: int) -> dict[str, Any]:
        return {
            "a": self.endpoints[a].name,
            "b": self.endpoints[b].name,
            "round": number,
            "status": "skipped",
            "rc": None,
            "latency_us": None,
            "duration_s": 0.0,
            "error": "time budget spent",
        }

    def _pair(self, a: int, b: int, port: int, number: int, out: dict[str, Any]) -> None:
        try:
            self._pair_test(a, b, port, number, out)
        except Exception as exc:  # noqa: BLE001 - one pair's bug must not lose the matrix
            out.update(self._skipped(a, b, number))
            out.update({"status": "error", "error": f"{type(exc).__name__}: {exc}"})

    def _pair_test(self, a: int, b: int, port: int, number: int, out: dict[str, Any]) -> None:
        server_ep, client_ep = self.endpoints[a], self.endpoints[b]
        timeout = float(self.opts["pair_timeout"])
        started = time.monotonic()
        box: dict[str, CommandResult] = {}
        server_argv = self.argv(server_ep, port, None)

        def serve() -> None:
            box["server"] = self.ctx.runner.run(server_argv, timeout=timeout + 1.0, env=self.env)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        client_argv = self.argv(client_ep, port, server_ep)
        client: Optional[CommandResult] = None
        time.sleep(0.05)
        while True:
            remaining = started + timeout - time.monotonic()
            if remaining <= 0.05:
                break
            client = self.ctx.runner.run(client_argv, timeout=remaining, env=self.env)
            refused = client.rc == REFUSED_RC or "Connection refused" in client.stderr
            if refused and thread.is_alive():
                time.sleep(0.1)  # the server is not listening yet
                continue
            break
        thread.join()
        server = box.get("server")
        out.update(
            {
                "a": server_ep.name,
                "b": client_ep.name,
                "round": number,
                **_outcome(client, server),
                "duration_s": round(time.monotonic() - started, 3),
            }
        )


def _outcome(client: Optional[CommandResult], server: Optional[CommandResult]) -> dict[str, Any]:
    """Status, rc, latency and the error text of one pair."""
    if client is None:
        return {"status": "timeout", "rc": None, "latency_us": None, "error": "no time left"}
    if client.error or (server is not None and server.error):
        error = client.error or (server.error if server else "")
        return {"status": "error", "rc": None, "latency_us": None, "error": error}
    if client.timed_out:
        return {
            "status": "timeout",
            "rc": None,
            "latency_us": None,
            "error": "client killed at pair_timeout (peer unreachable or hung)",
        }
    if client.rc != 0 or server is None or not server.ok:
        text = (client.stderr or client.stdout).strip().splitlines()
        if client.rc == 0 and server is not None:
            text = (server.stderr or server.stdout or "server timed out").strip().splitlines()
        return {
            "status": "failed",
            "rc": client.rc if client.rc != 0 else (server.rc if server else None),
            "latency_us": None,
            "error": text[-1][:200] if text else "",
        }
    return {"status": "ok", "rc": 0, "latency_us": parse_latency(client.stdout), "error": ""}


def parse_latency(text: str) -> Optional[float]:
    """usec/xfer of the first result row of fi_pingpong's table, or None."""
    lines = [line.split() for line in text.splitlines() if line.strip()]
    for i, cols in enumerate(lines):
        if "usec/xfer" in cols and i + 1 < len(lines):
            idx = cols.index("usec/xfer")
            row = lines[i + 1]
            try:
                return float(row[idx])
            except (IndexError, ValueError):
                return None
    return None


# --- evaluation (pure) -----------------------------------------------------------------------


def matrix(pairs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """{"matrix": {a: {b: status}}, "latency_us": {"a-b": usec}} of the measured pairs."""
    grid: dict[str, dict[str, str]] = {}
    latency: dict[str, Optional[float]] = {}
    for p in pairs:
        grid.setdefault(p["a"], {})[p["b"]] = p["status"]
        grid.setdefault(p["b"], {})[p["a"]] = p["status"]
        if p.get("latency_us") is not None:
            latency[f"{p['a']}-{p['b']}"] = p["latency_us"]
    return {"matrix": grid, "latency_us": latency}


def _statuses(failing: Sequence[Mapping[str, Any]], name: str) -> dict[str, str]:
    """Peer -> status of ``name``'s failing pairs."""
    out = {}
    for p in failing:
        if name in (p["a"], p["b"]):
            out[p["b"] if p["a"] == name else p["a"]] = p["status"]
    return out


def evaluate_mesh(snapshot: Mapping[str, Any]) -> list[Finding]:
    """Findings of one mesh snapshot (see the module docstring for the rules)."""
    if snapshot.get("error"):
        return [unknown("EFA_MESH_ERROR", NODE, f"efa_mesh did not run: {snapshot['error']}")]
    used = "tournament" if snapshot.get("tournament") else "screen"
    pairs = list(snapshot.get(used) or [])
    out: list[Finding] = []
    not_run = _not_run(pairs)
    if not_run is not None:
        out.append(not_run)
    measured = [p for p in pairs if p["status"] in ("ok", "failed", "timeout")]
    failing = [p for p in measured if p["status"] != "ok"]
    if not failing:
        return out
    # The matrix is the probe's summary (status.json probes[].summary), written once; each
    # finding carries only its own pairs, so evidence does not grow with the findings.
    evidence: dict[str, Any] = {"test": used, "matrix_in": "probes[efa_mesh].summary"}
    if snapshot.get("screen") and used == "tournament":
        evidence["screen_failed"] = [
            [p["a"], p["b"]] for p in snapshot["screen"] if p["status"] != "ok"
        ][:EVIDENCE_PAIRS]
    if len(failing) == len(measured):
        out.append(
            Finding(
                "EFA_MESH_ALL_FAILED",
                NODE,
                f"all {len(measured)} EFA pair tests failed ({failing[0]['error']})",
                {
                    **evidence,
                    "failed": len(failing),
                    "failed_pairs": [[p["a"], p["b"], p["status"]] for p in failing][
                        :EVIDENCE_PAIRS
                    ],
                },
            )
        )
        return out
    broken, findings = _broken_adapters(measured, failing, evidence)
    return out + findings + _failed_paths(failing, broken, evidence)


def _not_run(pairs: Sequence[Mapping[str, Any]]) -> Optional[Finding]:
    """One unknown finding for the pair tests that did not run (errors, skipped), or None."""
    errors = [p for p in pairs if p["status"] == "error"]
    skipped = [p for p in pairs if p["status"] == "skipped"]
    if not errors and not skipped:
        return None
    first = (errors or skipped)[0]
    return unknown(
        "EFA_MESH_ERROR",
        NODE,
        f"{len(errors) + len(skipped)} of {len(pairs)} pair tests did not run: {first['error']}",
        errors=len(errors),
        skipped=len(skipped),
    )


def _broken_adapters(
    measured: Sequence[Mapping[str, Any]],
    failing: Sequence[Mapping[str, Any]],
    evidence: Mapping[str, Any],
) -> tuple[list[str], list[Finding]]:
    """The adapters failing with enough of their peers (by name), and their
    EFA_ADAPTER_BROKEN findings."""
    peers: dict[str, int] = {}
    fails: dict[str, list[str]] = {}
    for p in measured:
        for me, other in ((p["a"], p["b"]), (p["b"], p["a"])):
            peers[me] = peers.get(me, 0) + 1
            if p["status"] != "ok":
                fails.setdefault(me, []).append(other)
    broken = sorted(
        name for name, bad in fails.items() if len(bad) >= broken_threshold(peers[name])
    )
    return broken, [
        Finding(
            "EFA_ADAPTER_BROKEN",
            f"efa:{name}",
            f"{name} fails with {len(fails[name])} of {peers[name]} peers "
            f"({', '.join(sorted(fails[name]))})",
            {
                **evidence,
                "adapter": name,
                "failed_peers": sorted(fails[name]),
                "statuses": _statuses(failing, name),
            },
        )
        for name in broken
    ]


def _failed_paths(
    failing: Sequence[Mapping[str, Any]], broken: Collection[str], evidence: Mapping[str, Any]
) -> list[Finding]:
    """EFA_PATH_FAILED for failing pairs between adapters that are not broken."""
    paths: dict[str, list[str]] = {}
    path_status: dict[str, dict[str, str]] = {}
    for p in failing:
        if p["a"] in broken or p["b"] in broken:
            continue
        a, b = sorted((p["a"], p["b"]))
        paths.setdefault(a, []).append(b)
        path_status.setdefault(a, {})[b] = p["status"]
    return [
        Finding(
            "EFA_PATH_FAILED",
            f"efa:{a}",
            f"EFA path {a} <-> {', '.join(sorted(others))} fails while both work with "
            "other peers",
            {**evidence, "adapter": a, "peers": sorted(others), "statuses": path_status[a]},
        )
        for a, others in sorted(paths.items())
    ]
