"""Executable probes in probes_dir: the Nagios plugin protocol, timeouts, output cap, refusal."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import User, users_usable

from hma.detection.registry import unsafe_reason

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="ownership checks need root")


def probe_doc(hma_env, name: str) -> dict:  # type: ignore[no-untyped-def]
    res = hma_env.hma("check", name, "--json")
    doc = json.loads(res.stdout)
    [probe] = doc["probes"]
    return {"rc": res.returncode, "severity": doc["severity"], **probe}


@pytest.mark.parametrize(
    "rc, severity, code",
    [
        (0, "ok", None),
        (1, "warning", "SITE_PROBE_WARNING"),
        (2, "critical", "SITE_PROBE_CRITICAL"),
        (3, "unknown", "SITE_PROBE_UNKNOWN"),
        (7, "unknown", "SITE_PROBE_UNKNOWN"),
    ],
)
def test_nagios_exit_codes(hma_env, rc: int, severity: str, code: str) -> None:  # type: ignore[no-untyped-def]
    hma_env.exec_probe("site", f'echo "first line {rc}"\necho second\nexit {rc}')
    doc = probe_doc(hma_env, "site")
    assert (
        doc["severity"] == severity
        and doc["rc"] == {"ok": 0, "warning": 1, "critical": 2, "unknown": 3}[severity]
    )
    if code is None:
        assert doc["findings"] == []
    else:
        [f] = doc["findings"]
        assert f["code"] == code and f["component"] == "site:site"
        assert f["message"].endswith(f"first line {rc}")


def test_timeout_kills_process_group(hma_env, tmp_path) -> None:  # type: ignore[no-untyped-def]
    marker = tmp_path / "child.pid"
    hma_env.exec_probe("slow", f"sleep 60 &\necho $! > {marker}\nwait")
    hma_env.write("[probes.slow]\ntimeout = 1\n")
    doc = probe_doc(hma_env, "slow")
    [f] = doc["findings"]
    assert f["code"] == "SITE_PROBE_UNKNOWN" and "timed out" in f["message"]
    child = int(marker.read_text())
    with pytest.raises(ProcessLookupError):
        for _ in range(50):
            os.kill(child, 0)
            __import__("time").sleep(0.1)


def test_megabyte_of_output_is_capped(hma_env) -> None:  # type: ignore[no-untyped-def]
    hma_env.exec_probe("loud", "echo 'too much'\nhead -c 1048576 /dev/zero | tr '\\0' x\nexit 1")
    doc = probe_doc(hma_env, "loud")
    [f] = doc["findings"]
    assert f["code"] == "SITE_PROBE_WARNING" and f["message"] == "too much"
    assert f["details"]["truncated"] is True
    assert len(f["details"]["output"]) <= 4000


@pytest.mark.parametrize("target", ["file", "folder"])
def test_world_writable_refused(hma_env, target: str) -> None:  # type: ignore[no-untyped-def]
    path = hma_env.exec_probe("ww", "exit 0")
    os.chmod(path if target == "file" else hma_env.probes_d, 0o777 if target == "folder" else 0o757)
    doc = probe_doc(hma_env, "ww")
    [f] = doc["findings"]
    assert f["code"] == "HMA_PROBE_REFUSED" and "writable by group or others" in f["message"]


def test_not_root_owned_refused(hma_env) -> None:  # type: ignore[no-untyped-def]
    path = hma_env.exec_probe("nobody", "exit 0")
    os.chown(path, 65534, 65534)
    [f] = probe_doc(hma_env, "nobody")["findings"]
    assert f["code"] == "HMA_PROBE_REFUSED" and "uid 65534" in f["message"]


# --- every component of the path (StrictModes) ---------------------------------------------------

NOBODY = 65534


def _marker_probe(folder: Path, marker: Path) -> Path:
    """A root-owned 0755 script that leaves ``marker`` behind when it runs."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "planted"
    script.write_text(f"#!/bin/sh\necho ran > {marker}\nexit 2\n")
    os.chmod(script, 0o755)
    return script


def _user_folder(parent: Path) -> Path:
    """A folder owned by an ordinary user (mode 0755): that user may put anything in it."""
    folder = parent / "user"
    folder.mkdir(mode=0o755)
    os.chown(folder, NOBODY, NOBODY)
    return folder


def test_probe_symlink_into_a_user_folder_is_refused(hma_env, tmp_path) -> None:  # type: ignore[no-untyped-def]
    marker = tmp_path / "ran"
    script = _marker_probe(_user_folder(hma_env.probes_d.parent), marker)
    (hma_env.probes_d / "site").symlink_to(script)
    [f] = probe_doc(hma_env, "site")["findings"]
    assert f["code"] == "HMA_PROBE_REFUSED"
    assert f"{script.parent} is owned by uid {NOBODY}" in f["message"]
    assert not marker.exists()


def test_probes_dir_itself_a_symlink_into_a_user_folder_is_refused(hma_env, tmp_path) -> None:  # type: ignore[no-untyped-def]
    marker = tmp_path / "ran"
    user = _user_folder(hma_env.probes_d.parent)
    _marker_probe(user, marker)
    link = hma_env.probes_d.parent / "probes.link"
    link.symlink_to(user)
    hma_env.config.write_text(hma_env.config.read_text().replace(str(hma_env.probes_d), str(link)))
    [f] = probe_doc(hma_env, "planted")["findings"]
    assert f["code"] == "HMA_PROBE_REFUSED" and f"owned by uid {NOBODY}" in f["message"]
    assert not marker.exists()


@pytest.mark.skipif(not users_usable(), reason="needs useradd and setpriv")
def test_user_planted_symlink_in_a_sticky_world_writable_folder_is_refused(  # type: ignore[no-untyped-def]
    hma_env, tmp_path, ordinary_user: User
) -> None:
    marker = tmp_path / "ran"
    script = _marker_probe(hma_env.probes_d.parent / "root-only", marker)
    sticky = hma_env.probes_d.parent / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)  # like /tmp
    planted = sticky / "p"
    ordinary_user.run("ln", "-s", str(script), str(planted))
    (hma_env.probes_d / "site").symlink_to(planted)
    [f] = probe_doc(hma_env, "site")["findings"]
    assert f["code"] == "HMA_PROBE_REFUSED" and "writable by group or others" in f["message"]
    assert not marker.exists()


@pytest.mark.skipif(not users_usable(), reason="needs useradd and setpriv")
def test_a_user_placed_link_to_reboot_is_refused(hma_env, ordinary_user: User) -> None:  # type: ignore[no-untyped-def]
    # judged only: a broken check must never get this test to run reboot
    user = hma_env.probes_d.parent / "user"
    user.mkdir(mode=0o755)
    os.chown(user, ordinary_user.uid, ordinary_user.gid)
    ordinary_user.run("ln", "-s", "/usr/sbin/reboot", str(user / "reboot"))
    (hma_env.probes_d / "reboot").symlink_to(user / "reboot")
    reason = unsafe_reason(hma_env.probes_d / "reboot")
    assert reason == f"{user} is owned by uid {ordinary_user.uid}, not root"


def test_links_within_root_owned_paths_run(hma_env, tmp_path) -> None:  # type: ignore[no-untyped-def]
    marker = tmp_path / "ran"
    script = _marker_probe(hma_env.probes_d.parent / "lib" / "probes", marker)
    (hma_env.probes_d.parent / "lib" / "alias").symlink_to("probes")  # relative, in a root folder
    (hma_env.probes_d / "site").symlink_to("../lib/alias/./planted")
    assert unsafe_reason(hma_env.probes_d / "site") is None
    [f] = probe_doc(hma_env, "site")["findings"]
    assert f["code"] == "SITE_PROBE_CRITICAL" and marker.read_text() == "ran\n"
    assert script.exists()


def test_symlink_loops_and_dangling_links_are_refused(hma_env) -> None:  # type: ignore[no-untyped-def]
    loop = hma_env.probes_d / "loop"
    loop.symlink_to("loop")
    assert "too many levels of symbolic links" in str(unsafe_reason(loop))
    gone = hma_env.probes_d / "gone"
    gone.symlink_to("nowhere")
    assert "No such file or directory" in str(unsafe_reason(gone))


def test_dot_dot_is_resolved_after_the_link_before_it(hma_env) -> None:  # type: ignore[no-untyped-def]
    # /trusted/user-link/../probes.d: lexically the trusted probes.d, for the kernel the folder
    # next to what the link points at
    root = hma_env.probes_d.parent
    hma_env.exec_probe("site", "exit 0")  # what a lexical reading would check, and accept
    user = _user_folder(root)
    (user / "probes.d").mkdir()
    (user / "probes.d" / "site").write_text("#!/bin/sh\nexit 0\n")
    os.chmod(user / "probes.d" / "site", 0o755)
    (root / "link").symlink_to(user / "inner")
    (user / "inner").mkdir()
    reason = unsafe_reason(root / "link" / ".." / "probes.d" / "site")
    assert reason == f"{user} is owned by uid {NOBODY}, not root"


def test_an_interpreter_in_a_user_writable_place_is_refused(hma_env, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The #! line is a program hma runs as root too: it is judged like the probe (tmp_path is
    under the world-writable /tmp)."""
    shell = tmp_path / "sh"
    shell.write_bytes(Path("/bin/sh").read_bytes())
    shell.chmod(0o755)
    marker = tmp_path / "ran"
    path = hma_env.exec_probe("site", f"touch {marker}")
    path.write_text(f"#!{shell}\ntouch {marker}\n")
    doc = probe_doc(hma_env, "site")
    [f] = doc["findings"]
    assert f["code"] == "HMA_PROBE_REFUSED" and f"interpreter of {path}" in f["message"]
    assert not marker.exists()


def test_an_interpreter_found_through_env_is_judged_too(hma_env, tmp_path) -> None:  # type: ignore[no-untyped-def]
    planted = tmp_path / "bin"
    planted.mkdir()
    (planted / "fakesh").write_bytes(Path("/bin/sh").read_bytes())
    (planted / "fakesh").chmod(0o755)
    marker = tmp_path / "ran"
    path = hma_env.exec_probe("site", "")
    path.write_text(f"#!/usr/bin/env -S fakesh -e\ntouch {marker}\n")
    env = {**hma_env.env(), "PATH": f"{planted}:{os.environ.get('PATH', os.defpath)}"}
    res = hma_env.hma("check", "site", "--json", env=env)
    [f] = json.loads(res.stdout)["probes"][0]["findings"]
    assert f["code"] == "HMA_PROBE_REFUSED" and f"interpreter of {path}: /tmp " in f["message"]
    assert not marker.exists()
    path.write_text(f"#!/usr/bin/env sh\ntouch {marker}\n")  # a root-owned sh on PATH: runs
    assert hma_env.hma("check", "site", "--json", env=env).returncode == 0 and marker.exists()


@pytest.mark.parametrize(
    "line, why",
    [
        ("#!sh", "no absolute interpreter"),
        ("#!", "no absolute interpreter"),
        ("#!/usr/bin/env", "names no program"),
        ("#!/usr/bin/env ./sh", "relative path"),
        ("#!/usr/bin/env no-such-program-hma", "is not on PATH"),
        ("#!/bin/\xe9sh", "not ASCII"),
    ],
)
def test_a_shebang_that_cannot_be_judged_is_refused(hma_env, line: str, why: str) -> None:  # type: ignore[no-untyped-def]
    path = hma_env.exec_probe("site", "")
    path.write_bytes(line.encode("latin-1") + b"\nexit 0\n")
    reason = unsafe_reason(path)
    assert reason is not None and why in reason


def test_nested_interpreters_are_followed_and_bounded(trusted_dir: Path) -> None:
    chain = [trusted_dir / f"i{n}" for n in range(6)]
    chain[0].write_text("#!/bin/sh\n")
    for prev, cur in zip(chain, chain[1:]):
        cur.write_text(f"#!{prev}\n")
    for p in chain:
        p.chmod(0o755)
    assert unsafe_reason(chain[3]) is None  # four interpreters deep, as the kernel allows
    assert "nested #! interpreters" in str(unsafe_reason(chain[4]))
