"""A real Slurm cluster on loopback for tests, benchmarks and the demo (root only).

Starts munged (own socket and key), ``slurmctld -c`` and one ``slurmd -N <node>`` per node, all
under a private base folder (``/tmp/hma-slurm-<runid>`` by default), with unique ports. The
``RebootProgram`` is a stand-in that never reboots the machine: it restarts the node's slurmd with
``-b`` (reporting a reboot to slurmctld) and writes a new boot id into the node's fake procfs root
(``cluster.procfs(node)``, file ``sys/kernel/random/boot_id``).

Usage::

    from tests.slurmcluster import SlurmCluster, available

    if not available():
        pytest.skip("needs root and the Debian slurm packages")
    with SlurmCluster(nodes=4) as cluster:
        cluster.scontrol("update", "NodeName=node1", "State=DRAIN", "Reason=x")
        print(cluster.node("node1")["state"])

Everything started is stopped by PID in ``stop()`` (also on exceptions, via the context manager).
Leftovers of earlier runs whose owner process is dead are swept at start (only folders named
``hma-slurm-*`` whose ``owner.pid`` no longer runs, and only processes whose command line names that
folder). Run ``python -m tests.slurmcluster [NODES [VERSION]]`` to start a cluster by hand
(Ctrl-C stops it).

``SlurmCluster(version="24.11")`` runs Debian 13's Slurm 24.11 instead of the host's 22.05: the
daemons and clients run in a cached trixie root (tests/slurmchroot.py, which says how); ``run()``
and ``scontrol()`` call the 24.11 clients, ``client(tool)`` gives a path for callers that need
one (the agent's ``[slurm]`` options: ``agent_slurm()``), ``as_user()`` runs a program as an
ordinary user next to that Slurm (job submission), and ``node()``/``nodes_json()`` give 22.05's
node shape on both versions.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Optional, Sequence

from hma.reporters.statusfile import pid_alive
from tests import slurmchroot

CRED_EXPIRE_S = 10  # slurm.conf AuthInfo cred_expire (see _write_files)

PREFIX = "hma-slurm-"
DAEMONS = ("munged", "slurmctld", "slurmd")
ARRAY_SIZE = 1000  # jobs per held array (MaxArraySize is set one above)


def available(version: str = "22.05") -> Optional[str]:
    """None when a cluster of this Slurm version can be started here, else why not."""
    if os.geteuid() != 0:
        return "needs root"
    if version != "22.05":
        return slurmchroot.why_not()
    for tool in ("slurmctld", "slurmd", "scontrol", "sinfo", "munged"):
        if shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None:
            return f"{tool} not installed (apt-get install slurmctld slurmd slurm-client munge)"
    return None


def _which(tool: str) -> str:
    found = shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    if found is None:
        raise RuntimeError(f"{tool} not found")
    return found


def free_ports(count: int) -> list[int]:
    """Ports free on 127.0.0.1 right now (kept open together so that they differ)."""
    socks, ports = [], []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def free_port_block(count: int) -> int:
    """The first of ``count`` consecutive ports free on 127.0.0.1, below the kernel's ephemeral
    range (net.ipv4.ip_local_port_range), so no client connection can be holding one of them."""
    low, _ = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    for base in random.sample(range(20000, low - count), 200):
        socks = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {count} consecutive free ports below {low}")


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def _read_pid(path: Path) -> Optional[int]:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _kill_pid(pid: int, marker: str, timeout: float = 5.0) -> None:
    """SIGTERM then SIGKILL ``pid`` if its command line contains ``marker``."""
    if not pid_alive(pid) or marker not in _cmdline(pid):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and pid_alive(pid):
        time.sleep(0.05)
    if pid_alive(pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _cwd(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""


def _pids_naming(folder: str) -> list[int]:
    """PIDs of processes whose command line names ``folder`` (slurmd, munged, reboot stand-ins)
    or whose working directory is inside it (slurmstepd, which names nothing)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        pid = int(entry)
        if folder in _cmdline(pid) or _cwd(pid).startswith(folder + "/"):
            out.append(pid)
    return out


def _kill_hard(pid: int, folder: str) -> None:
    """SIGKILL ``pid`` if it still belongs to ``folder`` (orphaned slurmstepd ignore SIGTERM)."""
    if pid_alive(pid) and (folder in _cmdline(pid) or _cwd(pid).startswith(folder + "/")):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def sweep(tmp: str = tempfile.gettempdir()) -> list[str]:
    """Stop and remove leftovers of dead runs; returns the folders removed."""
    removed = []
    for entry in sorted(Path(tmp).glob(PREFIX + "*")):
        owner = _read_pid(entry / "owner.pid")
        if owner is not None and pid_alive(owner):
            continue  # a live run (maybe another test process): never touch it
        for pidfile in entry.glob("run/*.pid"):
            pid = _read_pid(pidfile)
            if pid is not None:
                _kill_pid(pid, str(entry), timeout=3.0)
        for pid in _pids_naming(str(entry)):
            _kill_hard(pid, str(entry))
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(str(entry))
    # step daemons of runs whose folder is already gone (cwd shows "... (deleted)")
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            cwd = _cwd(int(entry))
            if cwd.startswith(os.path.join(tmp, PREFIX)) and cwd.endswith(" (deleted)"):
                if "slurmstepd" in _cmdline(int(entry)):
                    try:
                        os.kill(int(entry), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
    return removed + slurmchroot.sweep(tmp)  # 24.11 roots: jobs killed, unmounted, removed


REBOOT_PROGRAM = r'''#!{python}
"""RebootProgram stand-in: restart this node's slurmd with -b instead of rebooting."""
import os, signal, sys, time, uuid

BASE = {base!r}
CONF = {conf!r}
SLURMD = {slurmd!r}
DELAY = {delay!r}  # seconds "shutting down" before slurmd stops


def cmdline(pid):
    try:
        with open(f"/proc/{{pid}}/cmdline", "rb") as fh:
            return fh.read().split(b"\0")
    except OSError:
        return []


def parent(pid):
    try:
        with open(f"/proc/{{pid}}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


pid, node = os.getppid(), None
while pid > 1:
    argv = cmdline(pid)
    if argv and argv[0].endswith(b"slurmd") and b"-N" in argv:
        node = argv[argv.index(b"-N") + 1].decode()
        break
    pid = parent(pid)
if node is None:
    sys.exit("reboot stand-in: no slurmd -N ancestor")
with open(os.path.join(BASE, "log", "reboots.log"), "a") as fh:
    fh.write(f"{{time.time():.3f}} {{node}}\n")
if os.fork():
    sys.exit(0)  # slurmd sees success at once
os.setsid()
if os.fork():
    os._exit(0)
for fd in (0, 1, 2):
    os.dup2(os.open(os.devnull, os.O_RDWR), fd)
time.sleep(DELAY)
try:
    os.kill(pid, signal.SIGTERM)
except ProcessLookupError:
    pass
deadline = time.time() + 15
while time.time() < deadline and os.path.exists(f"/proc/{{pid}}"):
    time.sleep(0.05)
    try:
        with open(f"/proc/{{pid}}/stat") as fh:
            if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
    except OSError:
        break
boot = os.path.join(BASE, "procfs", node, "sys", "kernel", "random")
os.makedirs(boot, exist_ok=True)
with open(os.path.join(boot, "boot_id.tmp"), "w") as fh:
    fh.write(str(uuid.uuid4()) + "\n")
os.replace(os.path.join(boot, "boot_id.tmp"), os.path.join(boot, "boot_id"))
os.execv(SLURMD, [SLURMD, "-b", "-N", node, "-f", CONF])
'''


class SlurmCluster:
    """munged + slurmctld + N slurmd on loopback under a private folder; see the module doc."""

    def __init__(
        self,
        nodes: int | Sequence[str] = 4,
        base: Optional[str] = None,
        partition: str = "batch",
        extra_conf: str = "",
        munge: bool = True,
        reboot_delay: float = 0.2,
        version: str = "22.05",
        conf_files: Optional[dict[str, str]] = None,
        placeholders: int = 0,
        held_jobs: int = 0,
        conf_lines: Sequence[str] = (),
        expansion: bool = False,
        gres: str = "",
    ) -> None:
        self.nodes = (
            [f"node{i + 1}" for i in range(nodes)] if isinstance(nodes, int) else list(nodes)
        )
        self.runid = uuid.uuid4().hex[:8]
        self.base = Path(base or os.path.join(tempfile.gettempdir(), PREFIX + self.runid))
        self.partition = partition
        self.extra_conf = extra_conf
        self.munge = munge
        self.reboot_delay = reboot_delay  # RebootProgram: seconds before it stops slurmd
        self.placeholders = placeholders  # scale: nodes ph[1-N] without slurmd (see scale_conf)
        self.held_jobs = held_jobs  # scale: jobs queued as held arrays (see submit_held)
        self.held_arrays: list[str] = []
        self.conf = self.base / "etc" / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self.started = False
        self.conf_files = dict(conf_files or {})  # more files next to slurm.conf (topology.conf)
        # ``Key=value`` lines that replace the harness's own line of that key (or are added):
        # docs/slurm.md's blocks (tests/integration/test_slurm_conf_modes.py)
        self.conf_lines = list(conf_lines)
        # SchedulerParameters=permit_job_expansion (hma srun's in-place replacement)
        self.expansion = expansion
        self.gres = gres  # "NAME:COUNT": every node has that generic resource (no device file)
        self.version = version  # "22.05": the host's Slurm; "24.11": slurmchroot's
        if version not in slurmchroot.VERSIONS:
            raise ValueError(f"Slurm {version!r}: not one of {slurmchroot.VERSIONS}")
        self.chroot = slurmchroot.SlurmRoot(self.base) if version != "22.05" else None

    # --- Slurm version ----------------------------------------------------------------------------

    def tool(self, name: str) -> list[str]:
        """The command line prefix of a Slurm program (client or daemon) of this version."""
        return self.chroot.argv(name) if self.chroot else [_which(name)]

    def client(self, name: str) -> str:
        """One executable path for a Slurm client (for the agent's ``[slurm]`` options and a
        job's PATH): the host's program, or a wrapper that runs it in the 24.11 root."""
        return str(self.chroot.bin / name) if self.chroot else _which(name)

    def _munged_argv(self) -> list[str]:
        """munged started as user munge (inside the root for 24.11)."""
        runas = ["-u", "munge", "--"]
        if self.chroot:
            return [
                *self.chroot.argv("munged")[:2],
                "/usr/sbin/runuser",
                *runas,
                "/usr/sbin/munged",
            ]
        return ["runuser", *runas, _which("munged")]

    # --- files ----------------------------------------------------------------------------------

    def procfs(self, node: str) -> Path:
        """Fake procfs root of ``node`` (holds ``sys/kernel/random/boot_id``)."""
        return self.base / "procfs" / node

    def boot_id(self, node: str) -> str:
        """The node's current (fake) boot id."""
        return (self.procfs(node) / "sys/kernel/random/boot_id").read_text().strip()

    def set_boot_id(self, node: str, value: Optional[str] = None) -> str:
        """Write a new boot id for ``node`` (a fake reboot of the agent's view)."""
        value = value or str(uuid.uuid4())
        path = self.procfs(node) / "sys/kernel/random/boot_id"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(value + "\n")
        return value

    def reboots(self) -> list[str]:
        """Nodes the RebootProgram stand-in was run for, in order."""
        log = self.base / "log" / "reboots.log"
        if not log.exists():
            return []
        return [line.split()[1] for line in log.read_text().splitlines() if line.strip()]

    def _write_files(self) -> None:
        for sub in ("etc", "run", "log", "state", "spool", "munge", "procfs"):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        (self.base / "owner.pid").write_text(str(os.getpid()))
        os.chmod(self.base, 0o755)
        ports = free_ports(len(self.nodes) + 1)
        self.ctld_port = ports[0]
        # cred_expire also holds a requeued job back (BeginTime) for that long, 120 s by
        # default: auto-resume tests wait for the requeued job to run again
        expire = f"cred_expire={CRED_EXPIRE_S}"
        auth = (
            f"AuthType=auth/munge\nAuthInfo=socket={self.base}/munge/munge.socket.2,{expire}\n"
            "CryptoType=crypto/munge\n"
            if self.munge
            else f"AuthType=auth/none\nAuthInfo={expire}\nCredType=cred/none\n"
        )
        lines = [
            f"ClusterName=hma{self.runid}",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={self.ctld_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            auth.strip(),
            "ProctrackType=proctrack/pgid",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SchedulerType=sched/backfill",
            "MpiDefault=none",
            "ReturnToService=2",
            "SlurmdTimeout=30",
            "ResumeTimeout=60",
            "KillWait=2",
            "MinJobAge=5",
            f"StateSaveLocation={self.base}/state",
            f"SlurmdSpoolDir={self.base}/spool/%n",
            f"SlurmctldPidFile={self.base}/run/slurmctld.pid",
            f"SlurmdPidFile={self.base}/run/slurmd-%n.pid",
            f"SlurmctldLogFile={self.base}/log/slurmctld.log",
            f"SlurmdLogFile={self.base}/log/slurmd-%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            f"RebootProgram={self.base}/etc/reboot",
        ]
        gres = f" Gres={self.gres}" if self.gres else ""
        for node, port in zip(self.nodes, ports[1:]):
            lines.append(
                f"NodeName={node} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} "
                f"CPUs=1 RealMemory=100 State=UNKNOWN{gres}"
            )
        if self.gres:
            name, _, count = self.gres.partition(":")
            lines.append(f"GresTypes={name}")
            self.conf_files.setdefault("gres.conf", f"Name={name} Count={count or 1}\n")
        if self.expansion:
            lines.append("SchedulerParameters=permit_job_expansion")
        lines += self.scale_conf()
        lines.append(
            f"PartitionName={self.partition} Nodes={','.join(self.partition_nodes())} Default=YES "
            "MaxTime=INFINITE State=UP"
        )
        if self.extra_conf:
            lines.append(self.extra_conf)
        given = {line.split("=", 1)[0].strip().lower() for line in self.conf_lines}
        lines = [line for line in lines if line.split("=", 1)[0].lower() not in given]
        lines += self.conf_lines
        self.conf.write_text("\n".join(lines) + "\n")
        if self.chroot:  # 24.11's slurmd wants cgroups unless told not to (22.05: task/none)
            (self.base / "etc" / "cgroup.conf").write_text("CgroupPlugin=disabled\n")
        for name, text in self.conf_files.items():
            (self.base / "etc" / name).write_text(text)
        reboot = self.base / "etc" / "reboot"
        reboot.write_text(
            REBOOT_PROGRAM.format(
                python="/usr/bin/python3" if self.chroot else sys.executable,
                base=str(self.base),
                conf=str(self.conf),
                slurmd=self.tool("slurmd")[-1],
                delay=float(self.reboot_delay),
            )
        )
        reboot.chmod(0o755)
        for node in self.nodes:
            self.set_boot_id(node)
            (self.base / "spool" / node).mkdir(parents=True, exist_ok=True)

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> SlurmCluster:
        """Start everything and wait until every node is idle."""
        why = available(self.version)
        if why:
            raise RuntimeError(why)
        sweep(str(self.base.parent))
        self._write_files()
        try:
            if self.chroot:
                self.chroot.mount()
            if self.munge:
                self._start_munged()
            self.start_controller(clean=True)
            for node in self.nodes:
                self.start_node(node)
            self.started = True
            self.wait_idle(self.nodes, timeout)
            self.submit_held(self.held_jobs)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_munged(self) -> None:
        mdir = self.base / "munge"  # socket folder: munged wants it searchable by all
        private = mdir / "private"
        private.mkdir(exist_ok=True)
        key = private / "munge.key"
        key.write_bytes(os.urandom(1024))
        for path in (mdir, private, key):
            shutil.chown(path, "munge", "munge")
        os.chmod(mdir, 0o755)
        os.chmod(private, 0o700)
        os.chmod(key, 0o400)
        argv = [
            *self._munged_argv(),
            f"--socket={mdir}/munge.socket.2",
            f"--pid-file={mdir}/munged.pid",
            f"--key-file={key}",
            f"--log-file={mdir}/munged.log",
            f"--seed-file={private}/munged.seed",
        ]
        subprocess.run(
            argv,
            check=True,
            timeout=15,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self._wait_file(mdir / "munge.socket.2", 10.0)
        pid = _read_pid(mdir / "munged.pid")
        if pid is not None:  # keep it with the others so stop() and sweep() find it
            (self.base / "run" / "munged.pid").write_text(str(pid))

    @staticmethod
    def _wait_file(path: Path, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not path.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{path} did not appear")
            time.sleep(0.05)

    def start_controller(self, clean: bool = False) -> None:
        """Start slurmctld (``clean``: ``-c``, discarding saved state)."""
        argv = [*self.tool("slurmctld"), "-f", str(self.conf)] + (["-c"] if clean else [])
        subprocess.run(argv, check=True, timeout=30, env=self.env, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.run("scontrol", "ping", timeout=5).stdout.count("UP") >= 1:
                return
            time.sleep(0.1)
        raise RuntimeError(f"slurmctld did not come up; see {self.base}/log/slurmctld.log")

    def _controllerpid_alive(self) -> bool:
        pid = _read_pid(self.base / "run" / "slurmctld.pid")
        return pid is not None and pid_alive(pid)

    def stop_controller(self) -> None:
        """Stop slurmctld (clients then fail after about 9 s, as on a real outage)."""
        pid = _read_pid(self.base / "run" / "slurmctld.pid")
        if pid is not None:
            _kill_pid(pid, "slurmctld", timeout=10.0)

    def start_node(self, node: str) -> None:
        """Start the slurmd of ``node``."""
        argv = [*self.tool("slurmd"), "-N", node, "-f", str(self.conf)]
        subprocess.run(argv, check=True, timeout=30, env=self.env, stdout=subprocess.DEVNULL)

    def stop_node(self, node: str) -> None:
        """Stop the slurmd of ``node`` (and any step daemon left under its spool folder)."""
        pid = _read_pid(self.base / "run" / f"slurmd-{node}.pid")
        if pid is not None:
            _kill_pid(pid, "slurmd", timeout=10.0)

    def stop(self) -> None:
        """Stop every daemon this cluster started (by PID), unmount, and remove the folder."""
        try:
            self._stop_daemons()
        finally:
            if self.chroot:
                self.chroot.remove()
        if os.environ.get("HMA_KEEP_SLURM"):
            return
        shutil.rmtree(self.base, ignore_errors=True)

    def _stop_daemons(self) -> None:
        if self.started and self._controllerpid_alive():
            try:
                self.run("scancel", f"--nodelist={','.join(self.nodes)}", timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for pidfile in sorted((self.base / "run").glob("slurmd-*.pid")):
            pid = _read_pid(pidfile)
            if pid is not None:
                _kill_pid(pid, "slurmd", timeout=5.0)
        self.stop_controller()
        for pid in _pids_naming(str(self.base)):  # slurmstepd, reboot stand-ins, jobs
            _kill_hard(pid, str(self.base))
        pid = _read_pid(self.base / "run" / "munged.pid")
        if pid is not None:
            _kill_pid(pid, "munged", timeout=5.0)
        self.started = False

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # --- clients --------------------------------------------------------------------------------

    def run(self, tool: str, *args: str, timeout: float = 20.0) -> subprocess.CompletedProcess:
        """Run a Slurm client (scontrol, sinfo, squeue, sbatch, ...) against this cluster."""
        return subprocess.run(
            [*self.tool(tool), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def scontrol(self, *args: str, timeout: float = 20.0) -> str:
        """``scontrol ARGS``; raises RuntimeError on failure."""
        proc = self.run("scontrol", *args, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"scontrol {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    def nodes_json(self) -> list[dict[str, Any]]:
        """``sinfo --json`` node objects (24.11: as ``_nodes_json_2411`` gives them)."""
        if self.chroot:
            return self._nodes_json_2411()
        out = self.run("sinfo", "--json").stdout
        return list(json.loads(out).get("nodes", []))

    def _nodes_json_2411(self) -> list[dict[str, Any]]:
        """24.11's ``sinfo --json`` lists node sets, not nodes: ``scontrol --json show node``,
        each node in 22.05's shape (``state`` the lower-case base state, flags in
        ``state_flags``), so that tests read both versions alike."""
        out = []
        for item in json.loads(self.scontrol("--json", "show", "node")).get("nodes", []):
            state = [str(s) for s in item.get("state") or ["UNKNOWN"]]
            out.append({**item, "state": state[0].lower(), "state_flags": state[1:]})
        return out

    def as_user(self, user: str, env: Sequence[str], cwd: str) -> list[str]:
        """The command line prefix that runs a program as ``user`` with ``env`` (``K=V`` items)
        in ``cwd``, next to this version's Slurm (24.11: inside the root, where ``PATH`` must
        find the program)."""
        if not self.chroot:
            return ["runuser", "-u", user, "--", "env", "-C", cwd, *env]
        chroot, root = self.chroot.argv("env")[:2]
        return [chroot, f"--userspec={user}", root, "/usr/bin/env", "-C", cwd, *env]

    def agent_slurm(self) -> dict[str, list[str]]:
        """``[slurm]`` options that make an agent on the host call this version's clients."""
        if not self.chroot:
            return {}
        return {tool: [self.client(tool)] for tool in ("scontrol", "sinfo", "squeue")}

    def node(self, name: str) -> dict[str, Any]:
        """The ``sinfo --json`` object of one node."""
        for item in self.nodes_json():
            if item.get("name") == name:
                return item
        raise KeyError(name)

    def show(self, name: str) -> dict[str, str]:
        """``scontrol -o show node`` as a dict (``Reason`` keeps its spaces)."""
        text = self.scontrol("-o", "show", "node", name).strip()
        out: dict[str, str] = {}
        reason = ""
        if " Reason=" in text:
            text, reason = text.split(" Reason=", 1)
            out["Reason"] = reason
        for part in text.split():
            if "=" in part:
                key, value = part.split("=", 1)
                out[key] = value
        return out

    def state(self, name: str) -> str:
        """``State=`` of ``scontrol show node`` (e.g. ``IDLE+DRAIN``)."""
        return self.show(name).get("State", "")

    def wait_idle(self, nodes: Sequence[str], timeout: float = 30.0) -> None:
        """Wait until every node in ``nodes`` is plain IDLE (responding, no flags)."""
        self.wait(lambda: all(self.state(n) == "IDLE" for n in nodes), timeout, f"{nodes} idle")

    def wait(self, predicate: Any, timeout: float, what: str, every: float = 0.1) -> None:
        """Poll ``predicate`` until true; raises TimeoutError naming ``what``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if predicate():
                    return
            except (RuntimeError, KeyError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out waiting for {what} ({self.base})")
            time.sleep(every)

    def reset(self) -> None:
        """Return every node to IDLE with empty Extra/Comment and no jobs (between tests)."""
        jobs = self.unheld_jobs()
        if jobs:  # running ones and requeued (pending) ones alike
            self.run("scancel", *jobs)
        self.wait(lambda: not self.unheld_jobs(), 30.0, "no jobs")
        for node in self.nodes:
            pid = _read_pid(self.base / "run" / f"slurmd-{node}.pid")
            if pid is None or not pid_alive(pid):
                self.start_node(node)
            self.run("scontrol", "update", f"NodeName={node}", "Extra=", "Comment=")
            if self.state(node) != "IDLE":
                self.run("scontrol", "update", f"NodeName={node}", "State=RESUME")
        try:
            self.wait_idle(self.nodes, 30.0)
        except TimeoutError:
            # a slurmd continued after a SIGSTOP can stay NOT_RESPONDING for longer than that:
            # started again, it registers at once
            for node in [n for n in self.nodes if self.state(n) != "IDLE"]:
                self.stop_node(node)
                self.start_node(node)
            self.wait_idle(self.nodes, 30.0)

    def submit(self, node: str, seconds: int = 300) -> str:
        """Start a job that sleeps on ``node``; returns its id once it runs."""
        proc = self.run(
            "sbatch", "--parsable", "-w", node, "-o", "/dev/null", f"--wrap=sleep {seconds}"
        )
        if proc.returncode != 0:
            raise RuntimeError(f"sbatch: {proc.stderr.strip()}")
        job = proc.stdout.strip().split(";")[0]
        self.wait(
            lambda: self.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip() == "RUNNING",
            30.0,
            f"job {job} running",
        )
        return job

    # --- scale: placeholder nodes and held job arrays -------------------------------------------

    def scale_conf(self) -> list[str]:
        """slurm.conf lines for the placeholder nodes ``ph[1-N]`` (no slurmd; they show as down,
        and every client RPC pays for them as for real nodes) and a job table big enough."""
        if not self.placeholders and not self.held_jobs:
            return []
        lines = [
            f"MaxJobCount={max(10000, 2 * self.held_jobs)}",
            f"MaxArraySize={ARRAY_SIZE + 1}",
        ]
        if self.placeholders:
            port = free_ports(1)[0]
            lines.append(
                f"NodeName=ph[1-{self.placeholders}] NodeAddr=127.0.0.2 Port={port} "
                "CPUs=1 RealMemory=100 State=UNKNOWN"
            )
        return lines

    def partition_nodes(self) -> list[str]:
        """Nodes of the partition: the real ones, then ``ph[1-N]``."""
        return self.nodes + ([f"ph[1-{self.placeholders}]"] if self.placeholders else [])

    def submit_held(self, count: int) -> list[str]:
        """Queue ``count`` held jobs as arrays of up to ARRAY_SIZE; returns the array job ids."""
        ids = []
        while count > 0:
            size = min(count, ARRAY_SIZE)
            proc = self.run(
                "sbatch",
                "--parsable",
                "--hold",
                f"--array=1-{size}",
                "-o",
                "/dev/null",
                "--wrap=true",
            )
            if proc.returncode != 0:
                raise RuntimeError(f"sbatch --hold: {proc.stderr.strip()}")
            ids.append(proc.stdout.strip().split(";")[0])
            count -= size
        self.held_arrays += ids
        return ids

    def rpc_counts(self, reset: bool = False) -> dict[str, tuple[int, int]]:
        """slurmctld's RPCs by message type since the last reset, as (count, total µs), from
        ``sdiag`` (its own REQUEST_STATS_INFO left out); ``reset``: ``sdiag -r`` afterwards."""
        text = self.run("sdiag").stdout
        if reset:
            self.run("sdiag", "-r")
        body = text.split("by message type", 1)[-1].split("by user", 1)[0]
        out = {}
        for line in body.splitlines():
            words = line.split()
            values = dict(w.split(":", 1) for w in words[1:] if ":" in w)
            if words and "count" in values and words[0] != "REQUEST_STATS_INFO":
                out[words[0]] = (int(values["count"]), int(values.get("total_time", "0")))
        return out

    def unheld_jobs(self) -> list[str]:
        """Job ids in the queue other than the held arrays' (``reset()`` cancels these)."""
        held = set(self.held_arrays)
        out = self.run("squeue", "-h", "-o", "%i %F").stdout.split("\n")
        return [p[0] for p in (line.split() for line in out) if len(p) == 2 and p[1] not in held]


def main() -> int:
    """Start a cluster by hand and keep it until Ctrl-C:
    ``[NODES [VERSION [PLACEHOLDERS [HELD_JOBS]]]]``."""
    argv = sys.argv[1:]
    nodes = int(argv[0]) if argv else 4
    version = argv[1] if len(argv) > 1 else "22.05"
    placeholders = int(argv[2]) if len(argv) > 2 else 0
    held = int(argv[3]) if len(argv) > 3 else 0
    with SlurmCluster(nodes, version=version, placeholders=placeholders, held_jobs=held) as cluster:
        print(f"export SLURM_CONF={cluster.conf}", flush=True)
        if cluster.chroot:
            print(f"export PATH={cluster.chroot.bin}:$PATH", flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
