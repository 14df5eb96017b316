"""`hma config show`: the merged configuration with where each value came from (issue 32)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hma import cli


def layered(tmp_path: Path) -> tuple[Path, Path]:
    """A main file, a drop-in that overrides it, and a drop-in for other hosts only."""
    main = tmp_path / "hma.toml"
    main.write_text(
        f'[agent]\nrun_dir = "{tmp_path}/run"\nnode_name = "n\u200b1"\n'
        "[probes.system]\ninterval = 30.0\nmin_free_percent = 7.0\n"
    )
    dropins = tmp_path / "hma.d"
    dropins.mkdir()
    site = dropins / "50-site\u202e.toml"
    site.write_text(
        '[probes.system]\ninterval = 5.0\n[codes.SYS_FS_MISSING]\nfail_after = 1\nwithin = "1h"\n'
    )
    (dropins / "60-other.toml").write_text(
        '[match]\nhosts = ["nowhere-[1-9]"]\n[probes.system]\ninterval = 99.0\n'
    )
    return main, site


def test_each_value_says_where_it_came_from(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    main, site = layered(tmp_path)
    assert cli.main(["--config", str(main), "config", "show"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    shown_site = str(site).replace("\u202e", "\\u202e")  # others' text, escaped
    assert f"# drop-in {shown_site}" in out and "\u202e" not in out and "\u200b" not in out
    assert "not applied" in out and "60-other.toml" in out  # the [match] note
    section = lines[lines.index("[agent]") :]
    assert f'run_dir = "{tmp_path}/run"  # file {main}' in section
    assert 'node_name = "n\\u200b1"  # file ' + str(main) in section
    assert 'state_dir = "/var/lib/hma"  # default' in section
    system = lines[lines.index("[probes.system]") :]
    assert f"interval = 5.0  # drop-in {shown_site}" in system  # the drop-in wins
    assert f"min_free_percent = 7.0  # file {main}" in system
    assert "enabled = true  # default" in system
    codes = lines[lines.index("[codes.SYS_FS_MISSING]") :]
    assert f"fail_after = 1  # drop-in {shown_site}" in codes
    assert f'within = "1h"  # drop-in {shown_site}' in codes
    assert "interval = 99.0" not in out  # the drop-in for other hosts is not merged


def test_json_names_the_file_of_each_value(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    main, site = layered(tmp_path)
    assert cli.main(["--config", str(main), "config", "show", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["command"] == "config"
    assert doc["files"] == [
        {"path": str(main), "kind": "file"},
        {"path": str(site), "kind": "drop-in"},
    ]
    values = doc["values"]
    assert values["agent.run_dir"] == {
        "value": f"{tmp_path}/run",
        "from": "file",
        "path": str(main),
    }
    assert values["probes.system.interval"] == {"value": 5.0, "from": "drop-in", "path": str(site)}
    assert values["agent.state_dir"] == {"value": "/var/lib/hma", "from": "default"}
    assert values["codes.SYS_FS_MISSING.fail_after"]["from"] == "drop-in"
    assert any("not applied" in note for note in doc["notes"])


def test_only_defaults_without_a_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cfg = tmp_path / "absent" / "hma.toml"  # --config names a missing file: an error
    assert cli.main(["--config", str(cfg), "config", "show"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "file not found" in captured.err
    empty = tmp_path / "hma.toml"
    empty.write_text("")
    assert cli.main(["--config", str(empty), "config", "show"]) == 0
    out = capsys.readouterr().out
    assert "[healthcheck]" in out and "timeout = 50.0  # default" in out


def test_an_invalid_configuration_is_its_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    cfg = tmp_path / "hma.toml"
    cfg.write_text("[agent]\nstate_dirr = 1\n")
    assert cli.main(["--config", str(cfg), "config", "show"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "agent.state_dirr: unknown key" in captured.err
    assert "Traceback" not in captured.err
    assert cli.main(["--config", str(cfg), "config", "show", "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["command"] == "config" and "agent.state_dirr" in doc["problem"]
