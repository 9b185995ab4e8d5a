"""Delete what nothing uses: every public function and class defined under artifact/ (outside the
engine, artifact/offload/ and artifact/model/, frozen with the stored runs: tests/test_stored_runs_commit.py)
is used by the artifact's own code, its scripts, benchmarks, examples or notebooks; one only a test uses
belongs in the test. Use: a name, attribute, import or string naming it anywhere but its own definition."""

from __future__ import annotations

import ast
import json
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FROZEN = ("artifact/offload/", "artifact/model/")


def source(path: Path) -> str:
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text())["cells"]
        return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    return path.read_text()


def names_used(tree: ast.AST, skip: ast.AST | None = None) -> set[str]:
    out = set()
    for n in ast.walk(tree):
        if n is skip:
            continue
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
        elif isinstance(n, ast.alias):
            out.add(n.name.split(".")[-1])
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.isidentifier():
            out.add(n.value)
    return out


@cache
def users() -> dict[Path, set[str]]:
    files = [*ROOT.glob("artifact/**/*.py"), *ROOT.glob("scripts/*.py"), *ROOT.glob("benchmarks/*.py")]
    files += [*ROOT.glob("examples/*.py"), *ROOT.glob("notebooks/*.ipynb")]
    return {p: names_used(ast.parse(source(p))) for p in files}


def unused(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    out = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            own = node.name in {
                x for n in tree.body if n is not node for x in names_used(n)
            }  # called in its own module
            elsewhere = any(node.name in names for p, names in users().items() if p != path)
            if not own and not elsewhere:
                out.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    return out


def test_every_public_function_is_used_by_the_artifact():
    mine = [
        p for p in sorted(ROOT.glob("artifact/**/*.py")) if not str(p.relative_to(ROOT)).startswith(FROZEN)
    ]
    found = [u for p in mine for u in unused(p)]
    assert not found, "used by nothing but tests (move it into the test, or delete it):\n" + "\n".join(found)


def test_the_check_finds_a_function_nothing_calls(tmp_path):
    planted = ROOT / "artifact" / "experiments" / "zz_planted_unused.py"
    planted.write_text("def never_called():\n    return 1\n\n\ndef called():\n    return never_called\n")
    try:
        assert unused(planted) == [f"{planted.relative_to(ROOT)}:5 called"]
    finally:
        planted.unlink()
