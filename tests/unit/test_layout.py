"""Repository layout rules that pytest, packaging and the import contracts rely on."""

from __future__ import annotations

import ast
import configparser
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _setup_cfg() -> configparser.ConfigParser:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg", encoding="utf-8")
    return cfg


def test_test_module_basenames_are_unique() -> None:
    """pytest imports test modules by basename (no __init__.py): duplicates fail collection."""
    names = Counter(
        p.name
        for p in (ROOT / "tests").rglob("test_*.py")
        if "__init__.py" not in {q.name for q in p.parent.iterdir()}
    )
    assert [n for n, c in names.items() if c > 1] == []


def test_builtin_plugins_live_in_probes() -> None:
    """Each built-in entry point of ``hma.probes``/``hma.sources`` names a module of probes/ (the
    folder setup.cfg maps to ``hma.probes``), inside a check family's folder."""
    cfg = _setup_cfg()
    folders = dict(
        line.replace(" ", "").split("=")
        for line in cfg["options"]["package_dir"].strip().splitlines()
    )
    assert folders == {"hma": "hma", "hma.probes": "probes"}
    entry_points = cfg["options.entry_points"]
    for group in ("hma.probes", "hma.sources"):
        targets = [line.partition("=")[2].strip() for line in entry_points[group].split("\n")]
        assert [t for t in targets if t], group
        for target in filter(None, targets):
            module = target.partition(":")[0].split(".")
            assert module[:2] == ["hma", "probes"] and len(module) == 4, target
            assert (ROOT / "probes" / module[2] / f"{module[3]}.py").is_file(), target


def test_setup_py_finds_every_package() -> None:
    """setup.py lists every folder of hma/ and probes/ with an ``__init__.py`` (the editable
    install finds a missing one, the .deb and .rpm do not)."""
    seen: dict[str, Any] = {}
    code = compile((ROOT / "setup.py").read_text(), "setup.py", "exec")
    setuptools = pytest.importorskip("setuptools")
    real = setuptools.setup
    setuptools.setup = lambda **kw: seen.update(kw)
    try:
        cwd = Path.cwd()
        os.chdir(ROOT)
        try:
            exec(code, {"__name__": "__main__"})  # noqa: S102  # the project's own setup.py
        finally:
            os.chdir(cwd)
    finally:
        setuptools.setup = real
    found = {
        ".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "hma").rglob("__init__.py")
    } | {
        "hma." + ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "probes").rglob("__init__.py")
    }
    assert set(seen["packages"]) == found


def test_the_top_of_hma_is_entry_and_wiring() -> None:
    """At most five modules sit loose in hma/; every folder and module there is in a layer."""
    modules = sorted(p.stem for p in (ROOT / "hma").glob("*.py"))
    assert modules == ["__init__", "__main__", "assembly", "cli"]
    layers = _setup_cfg()["importlinter:contract:layers"]["layers"].split()
    children = {p.stem for p in (ROOT / "hma").glob("*.py") if p.stem != "__init__"}
    children |= {p.parent.name for p in (ROOT / "hma").glob("*/__init__.py")} | {"probes"}
    assert sorted(children - set(layers)) == []
    assert sorted(set(layers) - children) == []


def _lint_imports(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """lint-imports over a copy of the tree (hma/, probes/, setup.cfg) in ``tmp_path``."""
    view = tmp_path / "view"
    subprocess.run([str(tmp_path / "scripts" / "lint-view"), str(view)], check=True, timeout=60)
    return subprocess.run(
        [
            str(Path(sys.executable).parent / "lint-imports"),
            "--no-logo",
            "--config",
            str(tmp_path / "setup.cfg"),
        ],
        cwd=view,
        env={"PYTHONPATH": str(view), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("module", "planted", "contract"),
    [
        ("probes/system/probe.py", "from hma.remediation import engine", "One way down"),
        ("probes/nvidia/smi.py", "from hma.probes.efa import adapters", "families are independent"),
        (
            "probes/support/counters.py",
            "from hma.probes.efa import adapters",
            "import no check family",
        ),
        ("hma/config/schema.py", "from hma.topology import options", "One way down"),
        ("hma/remediation/engine.py", "from hma.cluster import slurm", "cluster backend"),
        ("hma/detection/runner.py", "from hma.probes.system import probe", "One way down"),
        ("hma/remediation/repair.py", "import subprocess", "hook runner"),
        ("hma/remediation/worker.py", "from hma.adapters import command", "hook runner"),
        ("hma/remediation/transitions.py", "from hma.remediation import outbox", "are pure"),
    ],
)
def test_a_planted_forbidden_import_breaks_the_contracts(
    tmp_path: Path, module: str, planted: str, contract: str
) -> None:
    pytest.importorskip("importlinter")
    for name in ("hma", "probes", "scripts"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "setup.cfg", tmp_path / "setup.cfg")
    assert _lint_imports(tmp_path).returncode == 0
    target = tmp_path / module
    target.write_text(target.read_text() + f"\n{planted}  # noqa\n")
    res = _lint_imports(tmp_path)
    assert res.returncode == 1, res.stdout
    assert contract in res.stdout.replace("\n", " ")


def test_every_remediation_module_but_the_hook_runner_is_kept_from_running_commands() -> None:
    """A module added to hma/remediation/ is in the contract that keeps commands in the hook
    runner (the contract names its modules one by one)."""
    contract = _setup_cfg()["importlinter:contract:commands-in-hooks"]
    listed = set(contract["source_modules"].split())
    modules = {
        f"hma.remediation.{p.stem}"
        for p in (ROOT / "hma" / "remediation").glob("*.py")
        if p.stem != "__init__"
    }
    assert modules - listed == {"hma.remediation.hooks"}
    assert listed <= modules


def _definitions() -> list[tuple[str, str, str, int]]:
    """(kind, file, name, lines) of every class and function in hma/ and probes/."""
    found = []
    for path in sorted([*(ROOT / "hma").rglob("*.py"), *(ROOT / "probes").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                kind = "class" if isinstance(node, ast.ClassDef) else "function"
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                found.append((kind, str(path.relative_to(ROOT)), node.name, lines))
    return found


def test_no_class_over_300_lines_no_function_over_80() -> None:
    """Classes split along their seams (issue 27): a class over 300 lines or a function over 80
    is where the next feature would pile up."""
    limits = {"class": 300, "function": 80}
    assert [d for d in _definitions() if d[3] > limits[d[0]]] == []


def _code_words(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of every name, attribute, argument, definition and string in ``path`` that
    is not a docstring: what the code says, leaving out what it documents."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.lineno, node.value
        elif isinstance(node, ast.Name):
            yield node.lineno, node.id
        elif isinstance(node, ast.Attribute):
            yield node.lineno, node.attr
        elif isinstance(node, ast.arg):
            yield node.lineno, node.arg
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.lineno, node.name


def test_contracts_and_remediation_speak_no_scheduler_words() -> None:
    """HyperPod, Slurm's commands and its node/job field names stay in hma/cluster/slurm/
    (issue 27): the contracts and remediation name them only in comments and docstrings."""
    words = re.compile(r"hyperpod|scontrol|sinfo|squeue|\b(extra|comment)\b", re.IGNORECASE)
    found = [
        f"{path.relative_to(ROOT)}:{line}: {text[:60]!r}"
        for folder in ("hma/contracts", "hma/remediation")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for line, text in _code_words(path)
        if words.search(text)
    ]
    assert found == []
