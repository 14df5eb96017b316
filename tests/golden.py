"""Golden outputs of the real command line over the committed fixtures (golden/layout).

``produce(python, scratch)`` runs ``PYTHON -m hma ...`` (argv lists, timeouts, never a shell) for
every case below and returns ``{name: normalized text}``. The module imports nothing of hma, so
the same function runs any tree's interpreter: the files in tests/fixtures/golden/layout were
written with the tree before the layout change (commit 7977b9b), and
tests/unit/test_golden_layout.py compares this tree's outputs with them.

Every command runs with its working folder in ``scratch``, not in the repository: ``python -m``
puts the working folder first on sys.path, and the repository root holds ``hma/`` and
``hma.egg-info`` (entry points), which would shadow the package the interpreter has installed.
Fixture paths are absolute paths into this checkout (``FIXTURES``), so every tree reads the same
files.

Each text is ``$ hma ARGS``, ``[exit N]``, then stdout and stderr, put through ``normalize``.

Regenerate (only from the tree the goldens describe, see the README there)::

    python tests/golden.py PYTHON OUTDIR
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
STANDIN = ROOT / "tests" / "standin"
GOLDEN_DIR = FIXTURES / "golden" / "layout"
ROOTS = FIXTURES / "roots"
SMI_DOCS = FIXTURES / "nvidia-smi"
KERNEL_LOGS = FIXTURES / "kernel-log"
STATUS_SAMPLE = FIXTURES / "status" / "sample.json"

TIMEOUT = 60.0  # one command
NO_SUCH_PID = 2**22 + 1  # above PID_MAX_LIMIT: never a running process
DAEMON_TIMEOUT = 30.0  # the daemon reaching its first complete status.json

for _folder in (STANDIN, FIXTURES):  # nvmlstub (the stand-in NVML), gen_sysfs: no hma imports
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

import gen_sysfs  # noqa: E402
import nvmlstub  # noqa: E402

# --- normalization ---------------------------------------------------------------------------

# JSON keys whose values legitimately change from run to run: wall-clock times, durations,
# the daemon's pid (a number; a pid read from a log line is a string and is kept), and the free
# space of the real filesystem "/" (the system probe is asked about "/" as in
# tests/unit/test_system_probe.py); then the machine's boot id and host name.
_VOLATILE_NUMBERS = (
    "duration_s",
    "generated",
    "started",
    "last_run",
    "next_run",
    "first_seen",
    "last_seen",
    "updated",
    "since",
    "pid",
    "free_percent",
    "inodes_free_percent",
)
_VOLATILE_STRINGS = ("boot_id", "hostname")
_JSON_NUMBER = re.compile(
    r'("(?:' + "|".join(_VOLATILE_NUMBERS) + r')": )-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?'
)
_JSON_STRING = re.compile(r'("(?:' + "|".join(_VOLATILE_STRINGS) + r')": )"[^"]*"')
# `hma check` text: "  system       ran               3 ms"
_CHECK_MS = re.compile(r"^(  \S+ +\S+) +\d+ ms", re.M)
# `hma status` text over the live daemon: clock times, ages, uptime, pid
_CLOCK = re.compile(r"\b\d\d:\d\d:\d\d \((?:\d+(?:\.\d+)? (?:s|min|h|d) ago|in [^)]*)\)")
_UPTIME = re.compile(r"\bup \d+(?:\.\d+)? (?:s|min|h|d)\b")
_PID = re.compile(r"\bpid \d+\b")
_TOOK = re.compile(r"(?<= )\s*\d+(?:\.\d+)? (?:ms|s)(?=  )")
# Prometheus text: sample values of time-like series
_PROM_TIME = re.compile(r"^(hma_\w*(?:timestamp|seconds|duration)\w*(?:\{[^}]*\})?) \S+$", re.M)


def normalize(text: str, scratch: Path, src: Optional[Path] = None, live: bool = False) -> str:
    """What is left of an output once what legitimately differs between two runs is masked.

    - ``scratch`` (this run's temporary folder) becomes ``<scratch>``; this checkout's
      ``tests/`` becomes ``<repo>/tests``; ``src``, the folder holding the interpreter's ``hma``
      package, becomes ``<src>`` (a data file's path then compares as its place in the tree);
    - JSON numbers of ``_VOLATILE_NUMBERS`` and strings of ``_VOLATILE_STRINGS`` become
      ``"<volatile>"`` (times, durations, the daemon's pid, free space of the real "/", boot id,
      host name);
    - `hma check` text: a probe's run time (``3 ms``) becomes ``<n> ms``; ``pid N`` in any text
      becomes ``pid <pid>``;
    - with ``live`` (output about the running daemon): clock times with their age, ``up N s``,
      a probe's run time in `hma status`, and time-like Prometheus samples.

    Nothing else is touched: messages, codes, order, exit codes, module names stay as printed.
    """
    for path in {str(scratch), os.path.realpath(scratch)}:
        text = text.replace(path, "<scratch>")
    text = text.replace(str(ROOT / "tests"), "<repo>/tests")
    if src is not None:
        text = text.replace(str(src), "<src>")
    text = _JSON_NUMBER.sub(r'\1"<volatile>"', text)
    text = _JSON_STRING.sub(r'\1"<volatile>"', text)
    text = _CHECK_MS.sub(r"\1 <n> ms", text)
    text = _PID.sub("pid <pid>", text)
    if live:
        text = _CLOCK.sub("<clock> (<age>)", text)
        text = _UPTIME.sub("up <age>", text)
        text = _TOOK.sub(" <took>", text)
        text = _PROM_TIME.sub(r"\1 <volatile>", text)
    return text


# --- running the command line ----------------------------------------------------------------


def base_env() -> dict[str, str]:
    """The caller's environment without what would change what hma reads, plus fixed settings."""
    drop = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("HMA_")}
    env.update(TZ="UTC", LC_ALL="C.UTF-8", COLUMNS="100", PYTHONDONTWRITEBYTECODE="1")
    env["PYTHONIOENCODING"] = "utf-8"
    return env


def transcript(args: list[str], done: subprocess.CompletedProcess) -> str:
    """The text kept of one command: its arguments, exit code, stdout and stderr."""
    return (
        f"$ hma {' '.join(args)}\n[exit {done.returncode}]\n--- stdout\n{done.stdout}"
        f"--- stderr\n{done.stderr}"
    )


class Golden:
    """The cases, run with ``python`` in ``scratch`` (which must exist and be empty)."""

    def __init__(self, python: str, scratch: Path) -> None:
        self.python = python
        self.scratch = scratch.resolve()
        self.src = self._src()
        self.out: dict[str, str] = {}

    def _src(self) -> Path:
        code = "import os, hma; print(os.path.dirname(os.path.dirname(hma.__file__)))"
        done = subprocess.run(
            [self.python, "-c", code],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            cwd=self.scratch,
            env=base_env(),
            check=True,
        )
        return Path(done.stdout.strip())

    def folder(self, name: str) -> Path:
        path = self.scratch / name
        path.mkdir()
        return path

    def config(self, name: str, extra: str = "") -> Path:
        """A private installation ``scratch/name`` (as tests/conftest.py's Env): its hma.toml."""
        base = self.folder(name)
        (base / "probes.d").mkdir()
        config = base / "hma.toml"
        config.write_text(
            f'[agent]\nstate_dir = "{base}/state"\nrun_dir = "{base}/run"\n'
            f'probes_dir = "{base}/probes.d"\nnode_name = "testnode"\n' + extra
        )
        return config

    def run(
        self,
        config: Path,
        *args: str,
        env: Optional[dict[str, str]] = None,
        timeout: float = TIMEOUT,
    ) -> subprocess.CompletedProcess:
        environ = base_env()
        environ["HMA_CONFIG"] = str(config)
        environ.update(env or {})
        return subprocess.run(
            [self.python, "-m", "hma", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.scratch,
            env=environ,
            check=False,
        )

    def case(
        self, name: str, config: Path, *args: str, env: Optional[dict[str, str]] = None
    ) -> None:
        """Run ``hma ARGS`` and keep its normalized transcript as ``name``."""
        done = self.run(config, *args, env=env)
        self.out[name] = normalize(transcript(list(args), done), self.scratch, self.src)

    def check_pair(self, name: str, config: Path, probe: str, env: Optional[dict] = None) -> None:
        """``hma check PROBE --json`` and plain ``hma check PROBE``."""
        self.case(f"{name}.json", config, "check", probe, "--json", env=env)
        self.case(f"{name}.txt", config, "check", probe, env=env)

    # --- the cases ---------------------------------------------------------------------------

    def system(self) -> None:
        """The system probe over tests/fixtures/roots (as tests/unit/test_system_probe.py)."""
        for variant in ("healthy", "faulty"):
            root = ROOTS / variant
            config = self.config(
                f"system-{variant}",
                f'[paths]\nsysfs = "{root}/sys"\nprocfs = "{root}/proc"\n'
                '[probes.system]\nfilesystems = ["/"]\nexpected_memory_gib = 2000\n'
                'processes = ["slurmd"]\n',
            )
            self.check_pair(f"check-system-{variant}", config, "system")

    def nvidia_smi(self) -> None:
        """The nvidia_smi probe over every captured document, through the stand-in nvidia-smi."""
        smi = STANDIN / "nvidia-smi"
        for doc in sorted(SMI_DOCS.glob("*.xml")):
            config = self.config(
                f"smi-{doc.stem}",
                f'[probes.nvidia_smi]\ncommand = ["{smi}", "-q", "-x"]\n',
            )
            env = {"HMA_SMI_DOCUMENT": str(doc), "HMA_SMI_EXIT": "0"}
            if "8gpu" in doc.stem:
                self.check_pair(f"check-nvidia_smi-{doc.stem}", config, "nvidia_smi", env)
            else:
                name = f"check-nvidia_smi-{doc.stem}.json"
                self.case(name, config, "check", "nvidia_smi", "--json", env=env)
        config = self.config("smi-fails", f'[probes.nvidia_smi]\ncommand = ["{smi}", "-q", "-x"]\n')
        env = {"HMA_SMI_EXIT": "9", "HMA_SMI_STDERR": "NVIDIA-SMI has failed (golden)"}
        self.case("check-nvidia_smi-exit9.json", config, "check", "nvidia_smi", "--json", env=env)

    def gpu(self) -> None:
        """The gpu probe over the stand-in NVML library (8x H100 scenarios; needs cc)."""
        if nvmlstub.compiler() is None:
            return
        lib = nvmlstub.build(self.folder("nvml"))
        healthy = nvmlstub.Scenario(self.scratch / "nvml-healthy.txt")
        for i in range(8):
            healthy.drop(i, "fabric")  # no NVSwitch fabric: no fabric manager expected
        faulty = nvmlstub.Scenario(self.scratch / "nvml-faulty.txt")
        faulty.dev(5, **{"ecc.1.0": 4}, remap="0 2 1 0", temp=88)
        faulty.dev(2, **{"nvlink_state.7": 0})
        faulty.set("err.nvmlDeviceGetRemappedRows.6", nvmlstub.ERROR_GPU_IS_LOST)
        faulty.set("err.nvmlDeviceGetTemperature.4", 4)
        for name, scenario in (("healthy", healthy), ("faulty", faulty)):
            config = self.config(
                f"gpu-{name}",
                f'[probes.gpu]\nlibrary = "{lib}"\nexpected_gpus = 8\n'
                'fabricmanager_process = "hma-golden-no-such-process"\n',
            )
            env = {nvmlstub.ENV: str(scenario.path)}
            self.check_pair(f"check-gpu-nvml-h100x8-{name}", config, "gpu", env)
        config = self.config("gpu-nolib", f'[probes.gpu]\nlibrary = "{self.scratch}/none.so"\n')
        self.case("check-gpu-nolibrary.json", config, "check", "gpu", "--json")

    def neuron_efa(self) -> None:
        """The neuron and efa probes over trees written by tests/fixtures/gen_sysfs.py."""
        trees = {
            "trn2-healthy": ("trn2.48xlarge", []),
            "trn2-faulty": (
                "trn2.48xlarge",
                [
                    "neuron_core_count",
                    "neuron_mem_ecc",
                    "neuron_unreadable",
                    "efa_unbound_function",
                ],
            ),
            "inf2-healthy": ("inf2.48xlarge", []),
            "p5-healthy": ("p5.48xlarge", []),
            "p5-faulty": (
                "p5.48xlarge",
                ["efa_missing_adapter", "efa_unreadable_counter", "efa_ena_no_carrier"],
            ),
        }
        for name, (instance, faults) in trees.items():
            root = gen_sysfs.build(self.scratch / f"sysfs-{name}", instance, faults)
            config = self.config(
                f"tree-{name}",
                f'[paths]\nsysfs = "{root}"\n'  # the instance type: the tree's DMI product_name
                # the second sample of `hma check` 0.2 s after the first, not 1 s (time only)
                "[probes.neuron]\noneshot_sample_s = 0.2\n[probes.efa]\noneshot_sample_s = 0.2\n",
            )
            for probe in ("neuron", "efa"):
                if probe == "neuron" and instance.startswith("p5"):
                    continue
                if name.endswith("faulty"):
                    self.check_pair(f"check-{probe}-{name}", config, probe)
                else:
                    self.case(f"check-{probe}-{name}.json", config, "check", probe, "--json")

    def status(self) -> None:
        """`hma status` over tests/fixtures/status/sample.json (as tests/unit/test_status.py):
        the writer's pid is this process (alive), the boot id the one of a private procfs, and
        the clock of the command is pinned (``_pinned_clock``) two seconds after ``generated``,
        as test_render_golden does; a second file names a pid that cannot be running."""
        doc = json.loads(STATUS_SAMPLE.read_text("utf-8"))
        procfs = self.folder("status-proc")
        (procfs / "sys/kernel/random").mkdir(parents=True)
        boot = "6f1c2c8d-3e9a-4b7f-8a1d-2e3f4a5b6c7d"
        (procfs / "sys/kernel/random/boot_id").write_text(boot + "\n")
        env = self._pinned_clock(float(doc["generated"]) + 2.0)
        live = dict(doc, pid=os.getpid(), boot_id=boot.replace("-", ""))
        config = self.config("status-live", f'[paths]\nprocfs = "{procfs}"\n')
        run_dir = config.parent / "run"
        run_dir.mkdir()
        (run_dir / "status.json").write_text(json.dumps(live, indent=2) + "\n")
        self.case("status-sample.txt", config, "status", env=env)
        self.case("status-sample.json", config, "status", "--json", env=env)
        gone = dict(live, pid=NO_SUCH_PID)
        config = self.config("status-gone", f'[paths]\nprocfs = "{procfs}"\n')
        (config.parent / "run").mkdir()
        (config.parent / "run" / "status.json").write_text(json.dumps(gone) + "\n")
        self.case("status-nodaemon.txt", config, "status", env=env)
        config = self.config("status-none")
        self.case("status-nofile.txt", config, "status", env=env)

    def _pinned_clock(self, now: float) -> dict[str, str]:
        """Environment under which the command's ``time.time()`` answers ``now``: a
        sitecustomize module in a folder of its own on PYTHONPATH (nothing of hma there)."""
        folder = self.scratch / "pinned-clock"
        if not folder.exists():
            folder.mkdir()
            (folder / "sitecustomize.py").write_text(
                "import os, time\n"
                "_NOW = float(os.environ['HMA_GOLDEN_NOW'])\n"
                "time.time = lambda: _NOW\n"
            )
        return {"PYTHONPATH": str(folder), "HMA_GOLDEN_NOW": repr(now)}

    def misc(self) -> None:
        """Configuration, the catalogue, `check` argument errors, the probe list, logscan."""
        config = self.config("misc")
        self.case("config-defaults.txt", config, "config", "defaults")
        self.case("config-check-ok.txt", config, "config", "check")
        bad = self.config(
            "misc-bad",
            "[probes.system]\ninterval = -1\nbogus = 1\n[probes.nope]\nenabled = true\n"
            '[codes.GPU_XID_79]\nseverity = "grave"\n[recovery]\npolicy = "sometimes"\n',
        )
        self.case("config-check-bad.txt", bad, "config", "check")
        self.case("explain-list.txt", config, "explain", "--list")
        for code in ("GPU_XID_79", "SYS_FS_READONLY", "NEURON_MEM_ECC_UNCORRECTED", "NOPE_CODE"):
            self.case(f"explain-{code}.txt", config, "explain", code)
        self.case("check-kernel_log-error.txt", config, "check", "kernel_log")
        self.case("check-unknown-error.txt", config, "check", "no_such_probe")
        # `hma check --help`: only the part hma writes (argparse's own text varies by Python)
        done = self.run(config, "check", "--help")
        listing = done.stdout[done.stdout.find("probes installed here") :]
        kept = subprocess.CompletedProcess(done.args, done.returncode, listing, done.stderr)
        self.out["check-help-probes.txt"] = normalize(
            transcript(["check", "--help"], kept), self.scratch, self.src
        )
        self.broken_plugins()
        logs = sorted(str(p) for p in KERNEL_LOGS.glob("*.log"))
        self.case("logscan.txt", config, "logscan", *logs)
        self.case("logscan.json", config, "logscan", "--json", *logs)
        for path in logs:
            stem = Path(path).stem
            self.case(f"logscan-{stem}.json", config, "logscan", "--json", path)

    def broken_plugins(self) -> None:
        """Entry points that do not load or name no Probe/EventSource subclass, from a
        distribution made here (metadata only, on PYTHONPATH): what `hma check` says of them."""
        folder = self.folder("plugins")
        dist = folder / "hma_golden_plugins-0.1.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(
            "Metadata-Version: 2.1\nName: hma-golden-plugins\nVersion: 0.1\n"
        )
        (dist / "entry_points.txt").write_text(
            "[hma.probes]\nnotaprobe = collections:OrderedDict\n"
            "gone = hma_golden_no_such_module:Probe\n"
            "[hma.sources]\nnotasource = collections:OrderedDict\n"
        )
        env = {"PYTHONPATH": str(folder)}
        config = self.config("plugins-config", "[probes.system]\nfilesystems = []\n")
        done = self.run(config, "check", "--help", env=env)
        listing = done.stdout[done.stdout.find("probes installed here") :]
        kept = subprocess.CompletedProcess(done.args, done.returncode, listing, done.stderr)
        self.out["check-help-broken-plugins.txt"] = normalize(
            transcript(["check", "--help"], kept), self.scratch, self.src
        )
        for probe in ("notaprobe", "gone"):
            name = f"check-broken-plugin-{probe}.json"
            self.case(name, config, "check", probe, "--json", env=env)

    def daemon(self) -> None:
        """`hma run` without systemd (no NOTIFY_SOCKET) over the faulty root, with a private
        run_dir and state_dir: the system probe, the other probes answering unsupported or
        failing the same way everywhere, the kernel_log source reading tests/fixtures/
        kernel-log/kmsg.log through a FIFO, and the Prometheus text file. Waited for: every
        probe has a result and the last kmsg record's fault is in status.json (records are
        handled in order). Then status.json, `hma status` and the .prom file are kept."""
        root = ROOTS / "faulty"
        base = self.scratch / "daemon"
        fifo = self.scratch / "daemon-kmsg"
        os.mkfifo(fifo)
        config = self.config(
            "daemon",
            f'[paths]\nsysfs = "{root}/sys"\nprocfs = "{root}/proc"\n'
            '[probes.system]\nfilesystems = ["/"]\nexpected_memory_gib = 2000\n'
            'processes = ["slurmd"]\n'
            f'[probes.gpu]\nlibrary = "{self.scratch}/no-libnvidia-ml.so.1"\n'
            "[probes.nvidia_smi]\nenabled = false\n"  # one GPU_DRIVER_NOT_LOADED, from gpu
            f'[probes.efa_mesh]\ncommand = ["{self.scratch}/no-fi_pingpong"]\n'
            "[slurm]\nenabled = false\n"
            "[reporters.journald]\nenabled = false\n"
            f'[reporters.prometheus]\nenabled = true\ntextfile = "{self.scratch}/hma.prom"\n'
            f'[sources.nvml_events]\nlibrary = "{self.scratch}/no-libnvidia-ml.so.1"\n'
            f'[sources.kernel_log]\npath = "{fifo}"\nbackend = "kmsg"\n'
            f'rules_dir = "{base}/rules.d"\n'
            f'[sources.postmortem]\npstore_dir = "{base}/pstore"\njournal = false\n'
            f'systemd_pstore_dir = "{base}/pstore"\nkdump_dir = "{base}/pstore"\n',
        )
        records = (KERNEL_LOGS / "kmsg.log").read_text()
        # a last record whose fault says every earlier record was handled
        marker = "4,999999,999999000,-;NVRM: Xid (PCI:0000:ee:00): 79, golden end marker\n"
        status = base / "run" / "status.json"
        log = open(self.scratch / "daemon.log", "w+")  # noqa: SIM115 - closed below
        environ = base_env()
        environ["HMA_CONFIG"] = str(config)
        proc = subprocess.Popen(
            [self.python, "-m", "hma", "run"],
            cwd=self.scratch,
            env=environ,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        fd = -1
        try:
            fd = _open_writer(fifo, proc, log)
            os.write(fd, (records if records.endswith("\n") else records + "\n").encode())
            os.write(fd, marker.encode())
            doc = _wait_for(status, _daemon_settled, proc, log)
            self.out["daemon-status.json"] = normalize(
                json.dumps(doc, indent=2, sort_keys=True) + "\n", self.scratch, self.src, True
            )
            for name, args in (("daemon-hma-status.txt", ["status"]),):
                done = self.run(config, *args)
                self.out[name] = normalize(transcript(args, done), self.scratch, self.src, True)
            prom = self.scratch / "hma.prom"
            text = prom.read_text() if prom.exists() else "(no file)\n"
            self.out["daemon-prometheus.prom"] = normalize(text, self.scratch, self.src, True)
        finally:
            if fd >= 0:
                os.close(fd)
            rc = _stop(proc)
            log.seek(0)
            output = log.read()
            log.close()
        self.out["daemon-log.txt"] = normalize(
            f"$ hma run (stopped by SIGTERM)\n[exit {rc}]\n--- stdout and stderr\n{output}",
            self.scratch,
            self.src,
            True,
        )


def _open_writer(fifo: Path, proc: subprocess.Popen, log: Any) -> int:
    """The FIFO opened for writing once the daemon holds it open for reading."""
    deadline = time.monotonic() + DAEMON_TIMEOUT
    while True:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the daemon did not open {fifo}:\n{_tail(log)}")
        time.sleep(0.02)


def _daemon_settled(doc: dict[str, Any]) -> bool:
    """Every probe has a result, every event source has left ``starting`` (a tree before
    issue 28 shows none) and the end marker's fault is in the document."""
    probes = doc.get("probes") or []
    ran = probes and all(p.get("status") not in (None, "pending") for p in probes)
    started = all(s.get("state") != "starting" for s in doc.get("sources") or [])
    marker = any(f.get("component") == "gpu:0000:ee:00" for f in doc.get("faults") or [])
    return bool(ran and started and marker)


def _wait_for(
    path: Path, cond: Callable[[dict], bool], proc: subprocess.Popen, log: Any
) -> dict[str, Any]:
    deadline = time.monotonic() + DAEMON_TIMEOUT
    last: dict[str, Any] = {}
    while True:
        try:
            last = json.loads(path.read_text())
        except (OSError, ValueError):
            pass
        if last and cond(last):
            return last
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(
                f"status.json never settled (daemon rc {proc.poll()}):\n"
                f"{json.dumps(last, indent=1)[:4000]}\n{_tail(log)}"
            )
        time.sleep(0.05)


def _tail(log: Any) -> str:
    log.flush()
    log.seek(0)
    return log.read()[-4000:]


def _stop(proc: subprocess.Popen) -> Optional[int]:
    """SIGTERM the daemon (by its PID), SIGKILL it after 20 s; then, while it is a zombie not yet
    reaped (so its PID cannot be reused), SIGKILL whatever is left of its process group (it runs
    in a session of its own: probe workers it failed to stop). Its exit code."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        if not _exited(proc.pid, 20.0):
            os.kill(proc.pid, signal.SIGKILL)
            _exited(proc.pid, 20.0)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait(TIMEOUT)
    return proc.returncode


def _exited(pid: int, timeout: float) -> bool:
    """Wait until ``pid`` (our child) has exited, without reaping it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True  # already reaped
        if info is not None:
            return True
        time.sleep(0.02)
    return False


CASES = ("daemon", "neuron_efa", "misc", "nvidia_smi", "gpu", "system", "status")  # longest first


def produce(python: str, scratch: Path, workers: int = 2) -> dict[str, str]:
    """{name: normalized output} of every case, run with ``python`` in the empty ``scratch``;
    ``workers`` cases at a time (each has its own folders and names)."""
    from concurrent.futures import ThreadPoolExecutor

    golden = Golden(python, scratch)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for future in [pool.submit(getattr(golden, case)) for case in CASES]:
            future.result()
    return dict(sorted(golden.out.items()))


def stored() -> Iterator[tuple[str, str]]:
    """(name, text) of the committed goldens."""
    for path in sorted(GOLDEN_DIR.glob("*")):
        if path.name != "README.md":
            yield path.name, path.read_text("utf-8")


def main(argv: list[str]) -> int:
    """``golden.py PYTHON OUTDIR``: write every output of ``PYTHON`` into OUTDIR."""
    import tempfile

    python, outdir = argv[0], Path(argv[1])
    outdir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="hma-golden-"))
    try:
        for name, text in produce(python, scratch).items():
            (outdir / name).write_text(text, "utf-8")
            print(name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
