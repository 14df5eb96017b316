"""docs/slurm.md, tested: a real Slurm started with the page's slurm.conf lines runs hma as its
HealthCheckProgram, and the node is drained on a fault and resumed when healthy, as the page says.

The lines are read from the page's marked code blocks (so the page and this test cannot drift);
only the program paths (the page's /usr/bin/hma-healthcheck and /usr/sbin/reboot: a launcher of
this tree and the harness's RebootProgram stand-in) and the interval (seconds here, minutes on a
cluster) are changed. Slurm 22.05 only: 24.11's slurmd runs in a chroot that cannot see this
tree's Python.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import pytest
from conftest import journald_usable, read_back

from hma.reporters import journal
from tests.integration.remediation_helpers import back_in_service, write_config
from tests.slurmcluster import SlurmCluster, available

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "slurm.md"
BLOCK = re.compile(r"<!-- slurm\.conf mode=(\w+) -->\n```[^\n]*\n(.*?)```", re.S)
NODE = "node1"
INTERVAL = "2"  # HealthCheckInterval here (slurmctld's background loop looks every second)


def page_lines() -> dict[str, list[str]]:
    """The slurm.conf lines of each mode of docs/slurm.md."""
    return {
        mode: [line.strip() for line in body.splitlines() if line.strip()]
        for mode, body in BLOCK.findall(PAGE.read_text(encoding="utf-8"))
    }


def test_the_page_has_a_block_per_mode_with_the_keys_it_explains() -> None:
    blocks = page_lines()
    assert set(blocks) == {"daemon", "healthcheck", "hyperpod"}
    for mode, lines in blocks.items():
        keys = {line.split("=", 1)[0] for line in lines}
        assert {"HealthCheckProgram", "HealthCheckInterval", "HealthCheckNodeState"} <= keys
        assert "HealthCheckProgram=/usr/bin/hma-healthcheck" in lines
        assert any(line.startswith("HealthCheckNodeState=ANY") for line in lines), mode
        if mode != "hyperpod":  # the default reboot mode needs it; HyperPod's does not
            assert "RebootProgram=/usr/sbin/reboot" in lines


def launcher(folder: Path) -> Path:
    """Stands in for /usr/bin/hma-healthcheck: this tree's ``hma.commands.healthcheck:main``
    (the console script's entry point), the node's configuration (the test cannot use /etc/hma),
    and one log line per run (exit status, then the line hma printed)."""
    path = folder / "hma-healthcheck"
    entry = "import sys; from hma.commands.healthcheck import main; sys.exit(main())"
    path.write_text(
        "#!/bin/sh\n"
        f'HMA_CONFIG="{folder}/hma-$SLURMD_NODENAME.toml"; export HMA_CONFIG\n'
        f'out=$("{sys.executable}" -c "{entry}" "$@" 2>>"{folder}/stderr.log"); rc=$?\n'
        f'printf "%s %s\\n" "$rc" "$out" | head -c 2000 >> "{folder}/runs-$SLURMD_NODENAME.log"\n'
        "exit $rc\n"
    )
    path.chmod(0o755)
    return path


def conf_for(mode: str, program: Path, base: Path) -> list[str]:
    """The page's lines of ``mode`` with the paths of this machine and a short interval."""
    out = []
    for line in page_lines()[mode]:
        key, _, value = line.partition("=")
        if key == "HealthCheckProgram":
            value = str(program)
        elif key == "HealthCheckInterval":
            value = INTERVAL
        elif key == "RebootProgram":
            value = str(base / "etc" / "reboot")  # the harness's stand-in (never reboots)
        out.append(f"{key}={value}")
    return out


def site_probe(folder: Path, flag: Path) -> None:
    """An executable probe that is critical while ``flag`` exists."""
    folder.mkdir(mode=0o755)
    probe = folder / "gpucheck"
    probe.write_text(
        f"#!/bin/sh\nif [ -e {flag} ]; then echo 'GPU 3 missing'; exit 2; fi\necho ok; exit 0\n"
    )
    probe.chmod(0o755)


def runs(folder: Path) -> list[str]:
    try:
        return (folder / f"runs-{NODE}.log").read_text().splitlines()
    except FileNotFoundError:
        return []


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    os.chmod(tmp_path, 0o755)  # slurmd (root) runs the launcher; keep it plain
    return tmp_path


def start(
    mode: str,
    folder: Path,
    trusted_dir: Path,
    flag: Path,
    recovery: Optional[dict[str, Any]] = None,
    extra: str = "",
) -> SlurmCluster:
    """A one-node Slurm with the page's lines of ``mode``; the node's hma.toml (fast timings,
    the site probe that is critical while ``flag`` exists)."""
    why = available()
    if why:
        pytest.skip(f"Slurm 22.05: {why}")
    program = launcher(folder)
    cluster = SlurmCluster([NODE])
    cluster.conf_lines = conf_for(mode, program, cluster.base)
    site_probe(trusted_dir / "probes.d", flag)
    write_config(
        folder / f"hma-{NODE}.toml",
        cluster,
        NODE,
        {"resume_after": 0.0, **(recovery or {})},
        # the kernel-log source off: the daemon must not read this machine's /dev/kmsg
        extra="[probes.system]\nenabled = false\n[probes.gpucheck]\ninterval = 0.5\n"
        "[sources.kernel_log]\nenabled = false\n" + extra,
        agent={"probes_dir": str(trusted_dir / "probes.d")},
    )
    cluster.start()
    return cluster


@pytest.fixture
def flag(tmp_path: Path) -> Path:
    return tmp_path / "broken"


def assert_in_effect(cluster: SlurmCluster) -> None:
    """slurmctld runs with every line the test gave it (``scontrol show config``)."""
    shown = {}
    for line in cluster.scontrol("show", "config").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            shown[key.strip()] = value.strip()
    for line in cluster.conf_lines:
        key, _, value = line.partition("=")
        if "," in value:  # flag lists come back in Slurm's own order
            assert set(shown[key].split(",")) == set(value.split(",")), (key, shown[key])
        else:
            assert shown[key] in (value, f"{value} sec"), (key, shown[key])


def shown(cluster: SlurmCluster) -> dict[str, str]:
    return cluster.show(NODE)


def drained_by_hma(cluster: SlurmCluster) -> bool:
    s = shown(cluster)
    return "DRAIN" in s.get("State", "") and s.get("Reason", "").startswith(
        "HMA: SITE_PROBE_CRITICAL site:gpucheck"
    )


def test_health_check_only(folder: Path, trusted_dir: Path, flag: Path) -> None:
    cluster = start("healthcheck", folder, trusted_dir, flag)
    try:
        assert_in_effect(cluster)
        # slurmd runs the program, which checks the node itself (no daemon) and finds it healthy
        cluster.wait(lambda: any(r.startswith("0 ") for r in runs(folder)), 30, "a health check")
        assert "daemon pid" not in runs(folder)[-1] and "OK" in runs(folder)[-1]
        flag.touch()
        cluster.wait(lambda: drained_by_hma(cluster), 30, "the health check's drain")
        cluster.wait(
            lambda: any(r.startswith("2 ") and "SITE_PROBE_CRITICAL" in r for r in runs(folder)),
            30,
            "the run that drained to end",
        )
        # drained, and still checked (HealthCheckNodeState=ANY): resumed once healthy
        seen = len(runs(folder))
        flag.unlink()
        cluster.wait(lambda: back_in_service(cluster, cluster.node(NODE)), 30, "the resume")
        cluster.wait(
            lambda: any(r.startswith("0 ") for r in runs(folder)[seen:]), 30, "the healthy run"
        )
        assert "hma=" not in cluster.node(NODE)["extra"]
    finally:
        cluster.stop()


class Daemon:
    """``hma run`` for the node, as hma.service would run it."""

    def __init__(self, folder: Path) -> None:
        self.log = open(folder / "daemon.log", "wb")  # noqa: SIM115 - closed in stop()
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
        env["HMA_CONFIG"] = str(folder / f"hma-{NODE}.toml")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hma", "run"],
            env=env,
            cwd=ROOT,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()


def test_daemon_and_health_check(folder: Path, trusted_dir: Path, flag: Path) -> None:
    """The daemon drains and resumes; the health check slurmd runs answers with its verdict."""
    cluster = start("daemon", folder, trusted_dir, flag)
    daemon = Daemon(folder)
    try:
        assert_in_effect(cluster)
        cluster.wait(
            lambda: any(r.startswith("0 ") and "daemon pid" in r for r in runs(folder)),
            45,
            "a health check answered by the daemon",
        )
        flag.touch()
        cluster.wait(lambda: drained_by_hma(cluster), 30, "the daemon's drain")
        cluster.wait(
            lambda: any(r.startswith("2 ") and "daemon pid" in r for r in runs(folder)),
            30,
            "a health check reporting the fault",
        )
        flag.unlink()
        cluster.wait(lambda: back_in_service(cluster, cluster.node(NODE)), 30, "the resume")
        assert daemon.proc.poll() is None, (folder / "daemon.log").read_text()
    finally:
        daemon.stop()
        cluster.stop()
    # once the daemon answered, no health check ran the probes itself (before it, slurmd's
    # check at its start did: the daemon had no status.json yet)
    done = [r for r in runs(folder) if r[:2] in ("0 ", "2 ")]
    first = next(i for i, r in enumerate(done) if "daemon pid" in r)
    assert all("daemon pid" in r for r in done[first:]), done


def test_a_stopped_daemon_leaves_the_health_check_to_check(
    folder: Path, trusted_dir: Path, flag: Path
) -> None:
    """Daemon mode with the daemon down (crashed, not started yet): the health check runs the
    probes itself and drains."""
    cluster = start("daemon", folder, trusted_dir, flag)
    try:
        flag.touch()
        cluster.wait(lambda: drained_by_hma(cluster), 30, "the health check's drain")
        cluster.wait(lambda: any(r.startswith("2 ") for r in runs(folder)), 30, "its end")
        last = [r for r in runs(folder) if r.startswith("2 ")][-1]
        assert "daemon pid" not in last and "SITE_PROBE_CRITICAL" in last
    finally:
        cluster.stop()


def test_hyperpod(folder: Path, trusted_dir: Path, flag: Path) -> None:
    """HyperPod's lines and [recovery] modes: a fault whose action is reboot sets the node FAIL
    with HyperPod's exact reason; after the instance's reboot (a new boot, the agent started
    again) the healthy node is resumed by hma."""
    cluster = start(
        "hyperpod",
        folder,
        trusted_dir,
        flag,
        recovery={"reboot_mode": "hyperpod", "replace_mode": "hyperpod"},
        extra='[codes.SITE_PROBE_CRITICAL]\naction = "reboot"\n',
    )
    daemon = Daemon(folder)
    try:
        cluster.wait(
            lambda: any(r.startswith("0 ") and "daemon pid" in r for r in runs(folder)),
            45,
            "a health check answered by the daemon",
        )
        flag.touch()
        cluster.wait(
            lambda: "FAIL" in shown(cluster)["State"]
            and shown(cluster)["Reason"].startswith("Action:Reboot"),
            30,
            "State=FAIL Reason=Action:Reboot",
        )
        daemon.stop()  # HyperPod reboots the instance: the agent stops, the boot id changes
        cluster.set_boot_id(NODE)
        flag.unlink()
        daemon = Daemon(folder)
        cluster.wait(lambda: back_in_service(cluster, cluster.node(NODE)), 45, "the resume")
    finally:
        daemon.stop()
        cluster.stop()


def fleet(folder: Path) -> dict[str, Any]:
    """``hma fleet --json`` as an operator runs it (the node's own configuration file is
    broken: a copy without the drop-ins' folder reaches the same Slurm)."""
    import json

    login = folder / "login"
    login.mkdir(exist_ok=True)
    (login / "hma.toml").write_text((folder / f"hma-{NODE}.toml").read_text())
    done = subprocess.run(
        [sys.executable, "-m", "hma", "--config", str(login / "hma.toml"), "fleet", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return {row["node"]: row for row in json.loads(done.stdout)["nodes"]}


@pytest.mark.skipif(not journald_usable(), reason="needs root, systemd-journald, journalctl")
@pytest.mark.parametrize("on_error", ["note", "drain"])
def test_a_bad_drop_in_shows_the_node_blind(
    folder: Path, trusted_dir: Path, flag: Path, journald: tuple[str, str], on_error: str
) -> None:
    """One typo in a drop-in: the health check cannot check. The node's label field says so
    (``hma fleet`` lists it blind), journald has the entry, and the node is drained only with
    ``on_error = "drain"`` (the default, ``note``, leaves it in service); fixed, the next run
    lifts the label (and the drain it made)."""
    ns, sock = journald
    extra = f'[reporters.journald]\nsocket = "{sock}"\n[healthcheck]\non_error = "{on_error}"\n'
    cluster = start("healthcheck", folder, trusted_dir, flag, extra=extra)
    try:
        cluster.wait(lambda: any(r.startswith("0 ") for r in runs(folder)), 30, "a health check")
        dropins = folder / "hma.d"
        dropins.mkdir()
        (dropins / "50-site.toml").write_text("[recovery]\nresume_afterr = 0\n")  # the typo
        cluster.wait(
            lambda: "hma=blind:HMA_CONFIG_INVALID:none" in cluster.node(NODE)["extra"],
            30,
            "the blind label",
        )
        cluster.wait(lambda: any(r.startswith("3 ") for r in runs(folder)), 30, "the run's end")
        node = shown(cluster)
        if on_error == "drain":
            assert "DRAIN" in node.get("State", ""), node
            assert node.get("Reason", "").startswith("HMA: HMA_CONFIG_INVALID agent"), node
        else:
            assert "DRAIN" not in node.get("State", ""), node
        row = fleet(folder)[NODE]
        assert (row["label"], row["code"]) == ("blind", "HMA_CONFIG_INVALID")
        entries = read_back(ns, "HMA_CODE=HMA_CONFIG_INVALID")
        assert entries, "no journal entry"
        assert entries[0]["MESSAGE_ID"] == journal.message_id("HMA", "raised")
        assert "resume_afterr" in entries[0]["MESSAGE"]
        assert entries[0]["PRIORITY"] == "4"
        seen = len(runs(folder))
        (dropins / "50-site.toml").unlink()
        cluster.wait(
            lambda: any(r.startswith("0 ") for r in runs(folder)[seen:]), 30, "a healthy run"
        )
        cluster.wait(lambda: "hma=" not in cluster.node(NODE)["extra"], 30, "the label lifted")
        cluster.wait(lambda: back_in_service(cluster, cluster.node(NODE)), 30, "in service")
    finally:
        cluster.stop()
