"""Wall time of `hma check system` against a bare interpreter start (median of 20 runs each).

Two layouts, each against a bare start of the interpreter it runs on:

- the development virtualenv: its console script and ``python -c pass`` (the editable install's
  path hook is imported by both);
- the packaged layout: hma installed into a private folder with the launcher the .deb and .rpm
  ship (packaging/tree.py ``launcher``: ``/usr/bin/python3 -I``), against
  ``/usr/bin/python3 -I -c pass``; skipped without a /usr/bin/python3 of 3.11 or later (older ones
  need the vendored tomli).

Commands alternate so that a change of load hits all of them, after one warm-up run of each. Byte
code is cached (``__pycache__``) as an installed package's is, whatever PYTHONDONTWRITEBYTECODE
says here. The `system` probe reads this machine's /proc and /sys; the configuration file is a
small one, so the TOML parser is imported as on a node. Prints the machine too (docs/cli.md keeps
the figures; issue 14's 2x target was retired by issue 19).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, median_ms, time_command  # noqa: E402

RUNS = 20
ROOT = Path(__file__).resolve().parent.parent
SYSTEM_PYTHON = "/usr/bin/python3"


def packaged(tmp: Path) -> list[str] | None:
    """hma in a private folder under ``tmp`` with the shipped launcher; its argv, or None."""
    probe = [SYSTEM_PYTHON, "-c", "import sys; sys.exit(sys.version_info < (3, 11))"]
    if (
        not os.access(SYSTEM_PYTHON, os.X_OK)
        or subprocess.run(probe, timeout=30, check=False).returncode
    ):
        return None
    lib = tmp / "lib"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--target", str(lib), str(ROOT)],
        check=True,
        timeout=300,
    )  # fmt: skip
    spec = importlib.util.spec_from_file_location("hma_tree", ROOT / "packaging" / "tree.py")
    assert spec and spec.loader
    tree = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tree)
    launcher = tmp / "hma"
    launcher.write_text(tree.launcher(SYSTEM_PYTHON, lib), encoding="utf-8")
    launcher.chmod(0o755)
    return [str(launcher)]


def main() -> None:
    python = sys.executable  # the interpreter the console script runs on (its shebang)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "hma.toml"
        cfg.write_text(f'[agent]\nrun_dir = "{tmp}"\nstate_dir = "{tmp}"\n')
        env = {**os.environ, "HMA_CONFIG": str(cfg)}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        # layout -> (bare start, hma check system)
        layouts = {
            "venv": ([python, "-c", "pass"], [str(Path(python).with_name("hma"))]),
        }
        launcher = packaged(Path(tmp))
        if launcher:
            layouts["packaged"] = ([SYSTEM_PYTHON, "-I", "-c", "pass"], launcher)
        commands = {
            (layout, kind): argv if kind == "bare" else [*argv, "check", "system"]
            for layout, pair in layouts.items()
            for kind, argv in zip(("bare", "hma"), pair)
        }
        samples: dict[tuple[str, str], list[float]] = {key: [] for key in commands}
        for argv in commands.values():
            time_command(argv, 1, env)
        for _ in range(RUNS):
            for key, argv in commands.items():
                samples[key] += time_command(argv, 1, env)
    print(machine())
    if not launcher:
        print(f"packaged layout skipped: no {SYSTEM_PYTHON} of 3.11 or later")
    for (layout, kind), values in samples.items():
        bare = median_ms(samples[layout, "bare"])
        ms = median_ms(values)
        label = f"{layout}: " + ("bare start" if kind == "bare" else "hma check system")
        print(f"{label:<32} median of {RUNS}: {ms:7.1f} ms  ({ms / bare:.2f}x bare)")


if __name__ == "__main__":
    main()
