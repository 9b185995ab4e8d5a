"""The code's shape, checked: the import order (import-linter, which must also fail on a back edge), no
command-line code outside artifact/cli/, the command line's options as they were, and small files in the
experiments layer."""
from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from artifact.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
LIBRARY = ("model", "offload", "experiments")
MAX_LINES = 500                 # no file of the experiments layer over this
MAX_MODULES = 12                # no folder of the experiments layer holds more modules than this (its __init__ aside)


def _lint(root: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(root))        # the copy's `artifact`, not the installed one
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", str(root / "pyproject.toml")], cwd=root,
                          env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def tree_copy(tmp_path_factory):
    """The package and its contracts, copied (the checks below edit the copy, never the checkout)."""
    if not LINT_IMPORTS.is_file():
        pytest.skip(f"import-linter is not installed beside {sys.executable} (pip install -e .[dev])")
    root = tmp_path_factory.mktemp("tree")
    shutil.copytree(ROOT / "artifact", root / "artifact", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


@pytest.mark.parametrize("module, back_edge, contract", [
    ("artifact/experiments/bench/grid.py", "from artifact.experiments import harness", "experiments: entry points"),
    ("artifact/experiments/bench/results.py", "from artifact.experiments import submit", "only artifact.cli imports"),
    ("artifact/offload/cache.py", "import artifact.experiments.settings", "layers: cli > experiments"),
    ("artifact/experiments/studies/capacity_sweep.py", "from artifact.experiments.studies import quickstart",
     "studies never import each other"),
    ("artifact/experiments/bench/results.py", "import artifact.experiments.studies.quickstart",
     "the bench never imports a study"),
    ("artifact/experiments/tide/adapter.py", "from artifact.experiments import rules",
     "TIDE's adapter imports only the bench and the settings"),
    ("artifact/experiments/bench/grid.py", "from artifact.experiments.bench import results",
     "bench: run > model_runner"),
])
def test_the_import_contracts_pass_and_fail_on_a_back_edge(tree_copy, module, back_edge, contract):
    ok = _lint(tree_copy)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    path = tree_copy / module
    text = path.read_text()
    try:
        path.write_text(text + f"\n{back_edge}  # a deliberate back edge\n")
        broken = _lint(tree_copy)
    finally:
        path.write_text(text)
    assert broken.returncode != 0, broken.stdout
    assert any(contract in line and "BROKEN" in line for line in broken.stdout.splitlines()), broken.stdout


def _defines_a_cli(tree: ast.Module) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [f"imports {m}" for m in mods if m.split(".")[0] == "argparse"]
        elif isinstance(node, ast.FunctionDef) and (node.name.startswith("cmd_") or node.name == "add_cli"):
            found.append(f"defines {node.name}()")
        elif isinstance(node, ast.Attribute) and node.attr in ("add_parser", "add_subparsers", "ArgumentParser"):
            found.append(f"calls {node.attr}")
    return found


def test_no_library_module_defines_a_command_line():
    for layer in LIBRARY:
        for path in sorted((ROOT / "artifact" / layer).rglob("*.py")):
            found = _defines_a_cli(ast.parse(path.read_text()))
            assert not found, f"{path.relative_to(ROOT)} {', '.join(found)}: command-line code lives in artifact/cli/"


def test_the_cli_check_sees_command_line_code():
    assert _defines_a_cli(ast.parse((ROOT / "artifact/cli/bench.py").read_text()))   # the check can fail


def _options(ap) -> dict:
    sub = next(a for a in ap._actions if a.__class__.__name__ == "_SubParsersAction")
    out = {"": sorted(s for a in ap._actions for s in a.option_strings), "commands": sorted(sub.choices)}
    for name, p in sorted(sub.choices.items()):
        out[name] = (sorted(s for a in p._actions for s in a.option_strings)
                     + sorted(a.dest for a in p._actions if not a.option_strings))
    return out


def test_every_command_takes_the_options_it_always_took():
    """tests/fixtures/cli_options.json: every subcommand's options and positionals, stored before the
    command line moved into artifact/cli/ (a change to the command line updates it on purpose)."""
    stored = json.loads((ROOT / "tests/fixtures/cli_options.json").read_text())
    assert _options(build_parser()) == stored


def test_no_experiments_module_is_over_500_lines():
    for path in sorted((ROOT / "artifact" / "experiments").rglob("*.py")):
        n = len(path.read_text().splitlines())
        assert n <= MAX_LINES, f"{path.relative_to(ROOT)} has {n} lines (> {MAX_LINES}): split it by job"


def test_no_experiments_folder_is_a_flat_folder_of_more_than_12_modules():
    layer = ROOT / "artifact" / "experiments"
    folders = [layer, *(p.parent for p in layer.glob("*/__init__.py"))]
    assert len(folders) >= 4, folders                   # the layer and its sub-packages: bench, studies, tide
    for folder in folders:
        modules = [p.stem for p in folder.glob("*.py") if p.stem != "__init__"]
        assert len(modules) <= MAX_MODULES, f"{folder.relative_to(ROOT)} holds {len(modules)} modules: group them"
