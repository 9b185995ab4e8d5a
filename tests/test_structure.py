"""The code's shape, checked: the import order (import-linter, which must also fail on a back edge), no
import circle between files, no command-line code outside artifact/cli/, the command line's options as they
were, no private name imported across modules, small files and small functions (artifact/, scripts/,
benchmarks/, examples/)."""

from __future__ import annotations

import ast
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

from artifact.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
LIBRARY = ("model", "offload", "experiments")
MAX_LINES = 500  # no file of the experiments layer over this
MAX_MODULES = 12  # no folder of the experiments layer holds more modules than this (its __init__ aside)


def _lint(root: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(root))  # the copy's `artifact`, not the installed one
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", str(root / "pyproject.toml")],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def tree_copy(tmp_path_factory):
    """The package and its contracts, copied (the checks below edit the copy, never the checkout)."""
    if not LINT_IMPORTS.is_file():
        pytest.skip(f"import-linter is not installed beside {sys.executable} (pip install -e .[dev])")
    root = tmp_path_factory.mktemp("tree")
    shutil.copytree(ROOT / "artifact", root / "artifact", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


@pytest.mark.parametrize(
    "module, back_edge, contract",
    [
        (
            "artifact/experiments/bench/grid.py",
            "from artifact.experiments import harness",
            "experiments: entry points",
        ),
        (
            "artifact/experiments/bench/results.py",
            "from artifact.experiments import submit",
            "only artifact.cli imports",
        ),
        (
            "artifact/offload/backend/cache.py",
            "import artifact.experiments.settings",
            "layers: cli > experiments",
        ),
        (
            "artifact/experiments/studies/capacity_sweep.py",
            "from artifact.experiments.studies import quickstart",
            "studies never import each other",
        ),
        (
            "artifact/experiments/bench/results.py",
            "import artifact.experiments.studies.quickstart",
            "the bench never imports a study",
        ),
        (
            "artifact/experiments/tide/adapter.py",
            "from artifact.experiments.verdicts import rules",
            "TIDE's adapter imports only the bench and the settings",
        ),
        (
            "artifact/experiments/bench/grid.py",
            "from artifact.experiments.bench import results",
            "bench: run > model_runner",
        ),
        (
            "artifact/offload/backend/cache.py",
            "from artifact.offload.replay import trace",
            "offload: top > runner",
        ),
        (
            "artifact/offload/policy/policies.py",
            "from artifact.offload.links import link",
            "offload: top > runner",
        ),
        (
            "artifact/offload/replay/trace.py",
            "from artifact.offload.replay import sim",
            "offload.replay: fit > export",
        ),
    ],
)
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
        elif isinstance(node, ast.Attribute) and node.attr in (
            "add_parser",
            "add_subparsers",
            "ArgumentParser",
        ):
            found.append(f"calls {node.attr}")
    return found


def test_no_library_module_defines_a_command_line():
    for layer in LIBRARY:
        for path in sorted((ROOT / "artifact" / layer).rglob("*.py")):
            found = _defines_a_cli(ast.parse(path.read_text()))
            assert not found, (
                f"{path.relative_to(ROOT)} {', '.join(found)}: command-line code lives in artifact/cli/"
            )


def test_the_cli_check_sees_command_line_code():
    assert _defines_a_cli(ast.parse((ROOT / "artifact/cli/bench.py").read_text()))  # the check can fail


def _options(ap) -> dict:
    sub = next(a for a in ap._actions if a.__class__.__name__ == "_SubParsersAction")
    out = {"": sorted(s for a in ap._actions for s in a.option_strings), "commands": sorted(sub.choices)}
    for name, p in sorted(sub.choices.items()):
        out[name] = sorted(s for a in p._actions for s in a.option_strings) + sorted(
            a.dest for a in p._actions if not a.option_strings
        )
    return out


def test_every_command_takes_the_options_it_always_took():
    """tests/fixtures/cli_options.json: every subcommand's options and positionals, stored before the
    command line moved into artifact/cli/ (a change to the command line updates it on purpose)."""
    stored = json.loads((ROOT / "tests/fixtures/cli_options.json").read_text())
    assert _options(build_parser()) == stored


def test_no_experiments_folder_is_a_flat_folder_of_more_than_12_modules():
    layer = ROOT / "artifact" / "experiments"
    folders = [layer, *(p.parent for p in layer.glob("*/__init__.py"))]
    assert len(folders) >= 4, folders  # the layer and its sub-packages: bench, studies, tide
    for folder in folders:
        modules = [p.stem for p in folder.glob("*.py") if p.stem != "__init__"]
        assert len(modules) <= MAX_MODULES, (
            f"{folder.relative_to(ROOT)} holds {len(modules)} modules: group them"
        )


# --- the code's size and its import graph, file by file
# --------------------------------------------------------
MAX_FUNCTION_LINES = 80  # no function under SIZED over this, from its def line (decorators not counted)
SIZED = ("artifact", "scripts", "benchmarks", "examples")  # no file under these over MAX_LINES


def _py_files(*roots: str) -> list[Path]:
    return sorted(p for r in roots for p in (ROOT / r).rglob("*.py") if "__pycache__" not in p.parts)


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path, root: Path = ROOT) -> list[tuple[str, str]]:
    """(module imported, name taken or '') for every import of the file, at any depth (a lazy import
    counts)."""
    me = _module_name(path, root)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, "") for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = package.split(".")
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([base] if base else []))
            out += [(base, a.name) for a in node.names]
    return out


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the artifact modules it imports (a `from package import module` names the module)."""
    files = {
        _module_name(p, root): p for p in (root / "artifact").rglob("*.py") if "__pycache__" not in p.parts
    }
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        for base, name in _imports(path, root):
            target = f"{base}.{name}" if f"{base}.{name}" in files else base
            if target in files and target != mod:
                graph[mod].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle_between_files():
    found = circles(import_graph())
    assert not found, f"import circles (a package __init__ counts as a file): {found}"


def test_the_circle_check_sees_a_planted_circle(tree_copy):
    path = tree_copy / "artifact/paths.py"
    text = path.read_text()
    try:
        path.write_text(text + "\n\ndef _late():\n    from artifact import validate  # planted\n")
        (tree_copy / "artifact/validate.py").write_text(
            (ROOT / "artifact/validate.py").read_text() + "\n\ndef _back():\n    import artifact.paths  # "
            "planted\n"
        )
        found = circles(import_graph(tree_copy))
    finally:
        path.write_text(text)
        shutil.copy(ROOT / "artifact/validate.py", tree_copy / "artifact/validate.py")
    assert ["artifact.paths", "artifact.validate"] in found, found


MAX_LINE = 110  # ruff's line length (pyproject.toml), checked by ruff check and ruff format


def test_the_line_length_is_at_most_110_and_both_ruff_steps_enforce_it():
    """ruff's line length is 110 at most, E501 is among the rules `ruff check` runs, and the test command runs
    both `ruff check` and `ruff format --check`, so a longer line or an unformatted file fails it."""
    text = (ROOT / "pyproject.toml").read_text()
    ruff = text.split("[tool.ruff]", 1)[1].split("\n[", 1)[0]  # the [tool.ruff] table (tomllib is 3.11+)
    length = int(re.search(r"^line-length = (\d+)$", ruff, re.M).group(1))
    lint = text.split("[tool.ruff.lint]", 1)[1].split("\n[", 1)[0]
    assert length <= MAX_LINE
    assert re.search(r'select = \[[^]]*"E"', lint) and "E501" not in lint, lint
    script = (ROOT / "run_tests.sh").read_text()
    assert '/ruff" check .' in script and '/ruff" format --check artifact tests scripts' in script
    long = [
        f"{p.relative_to(ROOT)}:{n}"
        for d in ("artifact", "scripts", "benchmarks", "tests")
        for p in sorted((ROOT / d).rglob("*.py"))
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if len(line) > length
    ]
    assert not long, f"lines over {length} characters: {long[:10]}"


def test_no_file_under_artifact_or_scripts_is_over_500_lines():
    over = [
        f"{p.relative_to(ROOT)} ({n})"
        for p in _py_files(*SIZED)
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    ]
    assert not over, f"over {MAX_LINES} lines: {over}: split them by job"


def long_functions(paths) -> list[str]:
    """'path:line name (n lines)' of every function or method (nested ones too) over MAX_FUNCTION_LINES
    lines, counted from its def line to its last line (end_lineno - lineno + 1: decorators not counted)."""
    out = []
    for p in paths:
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    out.append(
                        f"{p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}:{node.lineno} "
                        f"{node.name} ({n} lines)"
                    )
    return out


def test_no_function_under_artifact_scripts_benchmarks_or_examples_is_over_80_lines(tmp_path):
    """Every function, no allow-list: a long one is split by concept into named helpers."""
    found = long_functions(_py_files(*SIZED))
    assert not found, f"functions over {MAX_FUNCTION_LINES} lines: {found}"
    planted = tmp_path / "long.py"
    planted.write_text("def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES)
    assert long_functions([planted]), "the check must see a function of 81 lines"


def private_imports(paths, root: Path = ROOT) -> list[str]:
    """`from artifact.x import _name` in another module than artifact.x (a test or a module of its own
    may)."""
    out = []
    for p in paths:
        for base, name in _imports(p, root):
            if base.startswith("artifact") and name.startswith("_") and not name.startswith("__"):
                out.append(f"{p.relative_to(root)} imports {name} from {base}")
    return out


def test_no_private_name_is_imported_across_modules(tree_copy):
    assert not (found := private_imports(_py_files(*SIZED))), found
    path = tree_copy / "artifact/paths.py"
    text = path.read_text()
    try:
        path.write_text(text + "\nfrom artifact.validate import _planted  # noqa\n")
        assert private_imports([path], tree_copy), "the check must see a planted private import"
    finally:
        path.write_text(text)


# --- string literals cut into fragments ------------------------------------------------------------------
SHORT_PIECE = 15  # a piece of an implicit concatenation this short is a fragment of a cut string
MAX_FRAGMENTED = 10  # fewer than this many concatenations with such a piece


def fragmented_literals(path: Path) -> list[int]:
    """Lines where adjacent string literals (implicit concatenation) include a piece of SHORT_PIECE characters
    or fewer: a string cut mid-phrase to fit the line, not worded to fit it."""
    skip = {tokenize.NL, tokenize.COMMENT, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    toks = [t for t in tokenize.generate_tokens(io.StringIO(path.read_text()).readline) if t.type not in skip]
    fstart, fend = getattr(tokenize, "FSTRING_START", -1), getattr(tokenize, "FSTRING_END", -1)
    found, i = [], 0
    while i < len(toks):
        run = []  # (line, the literal's length) of each adjacent literal
        while i < len(toks) and toks[i].type in (tokenize.STRING, fstart):
            line, text, depth = toks[i].start[0], "", 0
            while True:  # a STRING token, or an f-string's tokens up to its end (Python >= 3.12)
                t = toks[i]
                text += t.string
                depth += (t.type == fstart) - (t.type == fend)
                i += 1
                if depth == 0:
                    break
            body = text.lstrip("rbfuRBFU")
            quote = 3 if body[:3] in ('"""', "'''") else 1
            run.append((line, len(body) - 2 * quote))
        if len(run) > 1 and min(n for _, n in run) <= SHORT_PIECE:
            found.append(run[0][0])
        i += 0 if run else 1
    return found


def test_no_string_literal_is_cut_into_fragments():
    found = {str(p.relative_to(ROOT)): n for p in _py_files(*SIZED) if (n := fragmented_literals(p))}
    total = sum(len(n) for n in found.values())
    assert total < MAX_FRAGMENTED, f"{total} cut strings (join them, or word the line to fit): {found}"


def test_the_fragment_check_sees_a_cut_string(tmp_path):
    cut = tmp_path / "cut.py"
    cut.write_text('x = ("the tokenizer has more tokens than the model " "embeds; " "use its own")\n')
    whole = tmp_path / "whole.py"
    whole.write_text(
        'x = ("the tokenizer has more tokens than the model embeds; " "use the tokenizer of it")\n'
    )
    assert fragmented_literals(cut) == [1] and fragmented_literals(whole) == []
