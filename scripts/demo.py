#!/usr/bin/env python3
"""`make demo`: run the agent on this machine with an embedded default configuration.

Everything lives in a temporary folder (config, state, status file, a site probe that reports a
failed fan); nothing on the host is changed. It shows `hma check`, starts `hma run`, waits for the
fault to be raised, prints `hma status`, acknowledges nothing, stops the daemon and cleans up.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def hma(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hma", *args],
        env=env,
        text=True,
        capture_output=True,
        timeout=60,
        check=False,
    )


def step(title: str) -> None:
    print(f"\n=== {time.strftime('%H:%M:%S')} {title}", flush=True)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="hma-demo-") as tmp:
        base = Path(tmp)
        os.chmod(base, 0o755)
        probes_d = base / "probes.d"
        probes_d.mkdir(mode=0o755)
        fan = probes_d / "fans"
        fan.write_text('#!/bin/sh\necho "fan 3: 0 RPM (failed)"\nexit 2\n')
        fan.chmod(0o755)
        config = base / "hma.toml"
        config.write_text(
            f'[agent]\nstate_dir = "{base}/state"\nrun_dir = "{base}/run"\n'
            f'probes_dir = "{probes_d}"\n'
            '[probes.system]\ninterval = 2\nfilesystems = ["/", "/tmp"]\n'
            "[probes.fans]\ninterval = 1\n"
            "[sources.kernel_log]\nenabled = false\n"
        )
        env = {**os.environ, "HMA_CONFIG": str(config)}
        step(f"configuration {config}")
        print(config.read_text())
        step("hma config check")
        print(hma(env, "config", "check").stdout.strip())
        step("hma check (one-shot, no remediation)")
        res = hma(env, "check")
        print(res.stdout.rstrip())
        print(f"(exit status {res.returncode})")
        step("hma run (the daemon) for a few seconds")
        daemon = subprocess.Popen(
            [sys.executable, "-m", "hma", "run"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if hma(env, "status", "--json").stdout.find("SITE_PROBE_CRITICAL") >= 0:
                    break
                if daemon.poll() is not None:
                    print(daemon.communicate()[0])
                    print("demo: the daemon exited early", file=sys.stderr)
                    return 1
                time.sleep(0.5)
            else:
                print("demo: the fault was not raised within 30 s", file=sys.stderr)
                return 1
            step("hma status")
            res = hma(env, "status")
            print(res.stdout.rstrip())
            print(f"(exit status {res.returncode})")
        finally:
            daemon.send_signal(signal.SIGTERM)
            try:
                out = daemon.communicate(timeout=15)[0]
            except subprocess.TimeoutExpired:
                daemon.kill()
                out = daemon.communicate()[0]
        step("daemon log (stderr; journald where it runs)")
        print("\n".join(out.splitlines()[-12:]))
        step("done: temporary folder removed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
