"""Every invalid-configuration case we can think of, each with its message; `hma config check`."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from hma import assembly
from hma.config.schema import ConfigError, render_defaults, validate
from hma.contracts import catalogue
from hma.detection import registry

CLASSES, BROKEN = registry.discover()
SCHEMA = assembly.schema_for(CLASSES, BROKEN, catalogue.load_builtin())


def errors_of(raw: dict) -> list[str]:
    with pytest.raises(ConfigError) as info:
        validate(raw, SCHEMA)
    return info.value.errors


@pytest.mark.parametrize(
    "raw, expected",
    [
        (
            {"agent": {"state_dirr": "/x"}},
            "agent.state_dirr: unknown key (did you mean 'state_dir'?)",
        ),
        ({"agent": {"state_dir": "relative"}}, "agent.state_dir: must be an absolute path"),
        ({"agent": {"state_dir": 3}}, "agent.state_dir: expected a path string, got int 3"),
        ({"agent": "x"}, "agent: expected a table"),
        ({"agent": {"history_days": 0}}, "agent.history_days: must be > 0"),
        ({"agent": {"exec_output_cap": 10}}, "agent.exec_output_cap: must be >= 256"),
        ({"agnet": {}}, "agnet: unknown section (did you mean 'agent'?)"),
        ({"probes": {"system": {"interval": -1}}}, "probes.system.interval: must be > 0"),
        ({"probes": {"system": {"interval": "60"}}}, "probes.system.interval: expected a number"),
        (
            {"probes": {"system": {"enabled": "yes"}}},
            "probes.system.enabled: expected true or false",
        ),
        (
            {"probes": {"system": {"filesystems": "/"}}},
            "probes.system.filesystems: expected a list",
        ),
        (
            {"probes": {"system": {"min_free_percent": 120}}},
            "probes.system.min_free_percent: must be <= 100",
        ),
        ({"probes": {"systen": {}}}, "probes.systen: no such probe (did you mean 'system'?)"),
        (
            {"probes": {"system": {"intervall": 5}}},
            "probes.system.intervall: unknown key (did you mean 'interval'?)",
        ),
        ({"probes": []}, "probes: expected a table"),
        (
            {"codes": {"SYS_FS_FULL": {"severity": "fatal"}}},
            "codes.SYS_FS_FULL.severity: expected one of",
        ),
        (
            {"codes": {"SYS_FS_FULL": {"action": "explode"}}},
            "codes.SYS_FS_FULL.action: expected one of",
        ),
        (
            {"codes": {"SYS_FS_FULL": {"fail_after": 0}}},
            "codes.SYS_FS_FULL.fail_after: must be >= 1",
        ),
        (
            {"codes": {"SYS_FS_FULL": {"fail_after": True}}},
            "codes.SYS_FS_FULL.fail_after: expected an integer",
        ),
        ({"codes": {"SYS_NOPE": {}}}, "codes.SYS_NOPE: unknown code"),
        ({"codes": {"SYS_FS_FULL": {"colour": 1}}}, "codes.SYS_FS_FULL.colour: unknown key"),
        ({"reporters": {"nosuch": {}}}, "reporters.nosuch: no such reporter"),
        ({"sources": {"nosuch": {}}}, "sources.nosuch: no such source"),
        # numbers: finite, in their declared range, below the key they must stay under
        ({"probes": {"system": {"interval": float("inf")}}}, "probes.system.interval: must be a"),
        ({"probes": {"system": {"timeout": float("nan")}}}, "probes.system.timeout: must be a fin"),
        ({"probes": {"system": {"timeout": 1e300}}}, "probes.system.timeout: must be <= 86400"),
        ({"slurm": {"facts_interval": 1e300}}, "slurm.facts_interval: must be between -1e+09"),
        ({"probes": {"efa_mesh": {"base_port": 70000}}}, "probes.efa_mesh.base_port: must be <="),
        (
            {"codes": {"SYS_FS_FULL": {"fail_after": 2**64}}},
            "codes.SYS_FS_FULL.fail_after: must fit",
        ),
        (
            {"recovery": {"max_drained_percent": 200}},
            "recovery.max_drained_percent: must be <= 100",
        ),
        (
            {"probes": {"gpu": {"timeout": 5}}},
            "probes.gpu.nvml_deadline_s: must be below timeout (5)",
        ),
        (
            {"probes": {"nvidia_smi": {"command_timeout": 90}}},
            "probes.nvidia_smi.command_timeout: must be below timeout (60)",
        ),
        ({"probes": {"system": {"triggers": ["usb"]}}}, "probes.system.triggers: expected one of"),
        # strings: one line, no NUL anywhere (an argv or a table value included)
        ({"agent": {"node_name": "a\nb"}}, "agent.node_name: must not contain control character"),
        ({"agent": {"node_name": "a\0b"}}, "agent.node_name: must not contain control character"),
        ({"agent": {"state_dir": "/var/\0"}}, "agent.state_dir: must not contain control"),
        ({"recovery": {"reboot_command": ["/bin/x\0"]}}, "recovery.reboot_command: must not con"),
        ({"probes": {"efa_mesh": {"env": {"A": "\0"}}}}, "probes.efa_mesh.env: must not contain"),
        # bounds that keep a value from costing a core or the controller (issue 23)
        ({"probes": {"system": {"interval": 5e-324}}}, "probes.system.interval: must be >= 0.1"),
        ({"slurm": {"heartbeat": 1e-6}}, "slurm.heartbeat: must be >= 1"),
        ({"slurm": {"facts_interval": 1e-6}}, "slurm.facts_interval: must be >= 0.02"),
        ({"probes": {"system": {"filesystems": ["tmp"]}}}, "probes.system.filesystems: must be an"),
        ({"probes": {"system": {"filesystems": [""]}}}, "probes.system.filesystems: must be an"),
        ({"probes": {"efa": {"vendor_ids": ["0x11d0f"]}}}, "probes.efa.vendor_ids: expected a PCI"),
        ({"probes": {"efa": {"vendor_ids": ["-0x1"]}}}, "probes.efa.vendor_ids: expected a PCI"),
        ({"probes": {"efa_mesh": {"vendor_ids": ["1d0fz"]}}}, "probes.efa_mesh.vendor_ids: expect"),
        ({"agent": {"node_name": "a\x85b"}}, "agent.node_name: must not contain control character"),
        ({"agent": {"node_name": "a\u202eb"}}, "agent.node_name: must not contain control"),
        ({"agent": {"node_name": "a\u2066b"}}, "agent.node_name: must not contain control"),
        ({"probes": {"neuron": {"status_counters": ["\x9b2J"]}}}, "probes.neuron.status_counte"),
    ],
)
def test_invalid(raw: dict, expected: str) -> None:
    errs = errors_of(raw)
    assert any(e.startswith(expected) for e in errs), errs


def test_all_errors_at_once() -> None:
    errs = errors_of({"agent": {"x": 1, "y": 2}, "probes": {"system": {"interval": 0}}})
    assert len(errs) == 3


def test_defaults_filled() -> None:
    cfg = validate({}, SCHEMA)
    assert cfg.section("agent")["state_dir"] == "/var/lib/hma"
    assert cfg.probe("system")["interval"] == 60.0
    assert cfg.probe("system")["filesystems"] == ["/", "/tmp"]


def test_defaults_render_every_key() -> None:
    text = render_defaults(SCHEMA)
    for section, options in SCHEMA.sections.items():
        assert f"# [{section}]" in text
        for key in options:
            assert f"# {key} = " in text


def test_cli_config_check(hma_env) -> None:  # type: ignore[no-untyped-def]
    assert hma_env.hma("config", "check").returncode == 0
    hma_env.write('[probes.system]\ninterval = "soon"\n[bogus]\n')
    res = hma_env.hma("config", "check")
    assert res.returncode == 2
    assert res.stderr.splitlines() == [
        f"probes.system.interval: expected a number, got str 'soon' (in {hma_env.config})",
        f"bogus: unknown section (in {hma_env.config})",
    ]


def test_cli_dropins_merge_in_name_order(hma_env) -> None:  # type: ignore[no-untyped-def]
    dropins = hma_env.base / "hma.d"
    dropins.mkdir()
    (dropins / "10-a.toml").write_text("[probes.system]\ninterval = 5\n")
    (dropins / "20-b.toml").write_text("[probes.system]\ninterval = 0\n")
    res = hma_env.hma("config", "check")
    assert res.returncode == 2 and "probes.system.interval: must be > 0" in res.stderr
    (dropins / "20-b.toml").write_text("[probes.system]\nenabled = true\n")
    assert hma_env.hma("config", "check").returncode == 0


def test_cli_broken_toml(hma_env) -> None:  # type: ignore[no-untyped-def]
    hma_env.config.write_text("[agent\n")
    res = hma_env.hma("config", "check")
    assert res.returncode == 2 and "invalid TOML" in res.stderr


def test_cli_every_file_reports_its_own_errors(hma_env) -> None:  # type: ignore[no-untyped-def]
    dropins = hma_env.base / "hma.d"
    dropins.mkdir()
    (dropins / "10-broken.toml").write_text("[probes.system\n")
    (dropins / "20-also-broken.toml").write_text("interval = = 1\n")
    (dropins / "30-valid-toml.toml").write_text("[probes.system]\ninterval = 0\n")
    res = hma_env.hma("config", "check")
    lines = res.stderr.splitlines()
    assert res.returncode == 2 and len(lines) == 3, lines
    assert lines[0].startswith(f"{dropins / '10-broken.toml'}: invalid TOML")
    assert lines[1].startswith(f"{dropins / '20-also-broken.toml'}: invalid TOML")
    assert lines[2] == f"probes.system.interval: must be > 0 (in {dropins / '30-valid-toml.toml'})"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("[probes.system]\ninterval = inf\n", "probes.system.interval: must be a finite number"),
        ("[probes.system]\ninterval = nan\n", "probes.system.interval: must be a finite number"),
        ("x = " + "[" * 5000 + "]" * 5000 + "\n", "invalid TOML: nested too deeply"),
        ("x = " + "[" * 40 + "]" * 40 + "\n", "invalid TOML: nested too deeply"),
        ('[agent]\nnode_name = "a\\u0000b"\n', "agent.node_name: must not contain"),
    ],
)
def test_cli_refuses_hostile_files(hma_env, text: str, expected: str) -> None:  # type: ignore[no-untyped-def]
    hma_env.config.write_text(text)
    res = hma_env.hma("config", "check")
    assert res.returncode == 2 and expected in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    res = hma_env.hma("run", timeout=30)
    assert res.returncode == 78 and expected in res.stderr, res.stderr


def test_cli_missing_explicit_file(hma_env) -> None:  # type: ignore[no-untyped-def]
    res = hma_env.hma("--config", str(hma_env.base / "nope.toml"), "config", "check")
    assert res.returncode == 2 and "file not found" in res.stderr


def test_run_refuses_invalid_config_with_78(hma_env) -> None:  # type: ignore[no-untyped-def]
    hma_env.write("[probes.system]\ninterval = 0\n")
    res = hma_env.hma("run", timeout=30)
    assert res.returncode == 78
    assert "probes.system.interval: must be > 0" in res.stderr


def test_toml_parser_is_imported_only_for_a_file(tmp_path: Path) -> None:
    """A start without a configuration file does not pay for importing the TOML parser."""
    probe = (
        "import sys; from pathlib import Path; from hma.config import files as configfile; "
        "layers, errors = configfile.read_layers(Path(sys.argv[1])); "
        "print(len(layers), any(m in sys.modules for m in ('tomllib', 'tomli')))"
    )
    (tmp_path / "hma.toml").write_text("[agent]\n")
    for name, expected in (("absent.toml", "0 False"), ("hma.toml", "1 True")):
        out = subprocess.run(
            [sys.executable, "-c", probe, str(tmp_path / name)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert out.stdout.split("\n")[0] == expected, out.stderr


def test_load_parses_each_file_once_and_merging_keeps_the_layers(
    hma_env,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`hma check` and the daemon read each file once (it was three times: the probe folder, the
    merge, the validation); merging a drop-in over the main file changes neither."""
    from hma.adapters import tomlcompat
    from hma.config import files as configfile

    dropins = hma_env.base / "hma.d"
    dropins.mkdir()
    (dropins / "10-a.toml").write_text("[probes.system]\ninterval = 7\n")
    hma_env.write("[probes.system]\ntimeout = 5\n")
    parsed: list[str] = []
    real = tomlcompat.loads
    monkeypatch.setattr(tomlcompat, "loads", lambda text: parsed.append(text) or real(text))
    monkeypatch.setenv("HMA_CONFIG", str(hma_env.config))
    setup = assembly.load(str(hma_env.config), only=["system"])
    assert len(parsed) == 2  # the main file and the drop-in
    system = setup.config.probes["system"]
    assert (system["interval"], system["timeout"]) == (7, 5)
    layers, errors = configfile.read_layers(hma_env.config)
    configfile.merged(layers)
    assert errors == [] and layers[0][1]["probes"]["system"] == {"timeout": 5}


def test_options_of_a_reporter_left_off_are_a_warning(hma_env) -> None:  # type: ignore[no-untyped-def]
    """Issue 20 (defect 5): `textfile` without `enabled = true` wrote nothing, silently."""
    textfile = hma_env.base / "hma.prom"
    hma_env.write(f'[reporters.prometheus]\ntextfile = "{textfile}"\n')
    res = hma_env.hma("config", "check")
    assert res.returncode == 0, res.stderr  # valid: the file is only likely wrong
    assert res.stderr.splitlines() == [
        "warning: reporters.prometheus: textfile set, but the reporter is off (enabled defaults "
        f"to false): add enabled = true (in {hma_env.config})"
    ]
    # said false on purpose, or turned on: no warning (turned on without prometheus-client, as
    # in the minimal compat virtualenvs, the missing library is the one error)
    has_client = importlib.util.find_spec("prometheus_client") is not None
    for enabled in ("false", "true"):
        hma_env.write(f'[reporters.prometheus]\nenabled = {enabled}\ntextfile = "{textfile}"\n')
        res = hma_env.hma("config", "check")
        if enabled == "true" and not has_client:
            assert res.returncode == 2, res.stderr
            needs = "reporters.prometheus: enabled, but needs prometheus-client"
            assert res.stderr.startswith(needs), res.stderr
            assert "textfile set" not in res.stderr
        else:
            assert res.returncode == 0 and res.stderr == "", res.stderr
    # options of a probe on by default are not a warning
    hma_env.write("[probes.system]\ninterval = 5\n")
    assert hma_env.hma("config", "check").stderr == ""


@pytest.mark.timeout(60)
def test_the_daemon_logs_the_warning(hma_env) -> None:  # type: ignore[no-untyped-def]
    textfile = hma_env.base / "hma.prom"
    hma_env.write(
        f'[reporters.prometheus]\ntextfile = "{textfile}"\n[probes.system]\nenabled = false\n'
    )
    with subprocess.Popen(
        [sys.executable, "-m", "hma", "run"],
        env=hma_env.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            assert proc.stderr is not None
            for line in proc.stderr:  # the warning comes before the agent settles
                if "reporters.prometheus: textfile set, but the reporter is off" in line:
                    assert "WARNING" in line
                    break
            else:
                pytest.fail(f"daemon exited {proc.wait()} without the warning")
        finally:
            proc.terminate()
            proc.wait(30)
    assert not textfile.exists()


def test_enabled_reporter_without_its_library_fails_the_check(
    hma_env, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """Issue 20 (defect 5): with prometheus-client missing, `config check` passed."""
    from hma import cli

    hma_env.write(f'[reporters.prometheus]\nenabled = true\ntextfile = "{hma_env.base}/h.prom"\n')
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import now raises ImportError
    rc = cli.main(["--config", str(hma_env.config), "config", "check"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.splitlines() == [
        "reporters.prometheus: enabled, but needs prometheus-client, which is not installed "
        "(pip install 'hma[prometheus]' or apt install python3-prometheus-client)"
    ]
    hma_env.write(f'[reporters.prometheus]\nenabled = false\ntextfile = "{hma_env.base}/h.prom"\n')
    assert cli.main(["--config", str(hma_env.config), "config", "check"]) == 0
