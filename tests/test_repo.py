"""The repository explains itself: docs/layout.md matches the tree, docs are cited inside the
repository, and no tracked file names a path of the machine it was written on."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("model", "offload", "experiments")
PACKAGES = LAYERS + ("cli",)  # every module of these (sub-packages too) is named in docs/layout.md


def tracked_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    return [ROOT / f for f in out.splitlines() if (ROOT / f).is_file()]


def texts():
    for path in tracked_files():
        try:
            yield path, path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary files (figures, fixtures)


def readme_layout() -> str:
    text = (ROOT / "docs" / "layout.md").read_text()
    section = text[text.index("# Layout") :] + "\n## "
    return section[: section.index("\n## ", 4)]


def test_readme_layout_names_every_module_of_the_three_layers():
    layout = readme_layout()
    for layer in PACKAGES:
        assert f"{layer}/" in layout, layer
        for module in sorted((ROOT / "artifact" / layer).rglob("*.py")):
            if module.stem != "__init__":
                assert re.search(rf"\b{module.stem}\b", layout), (
                    f"docs/layout.md misses {layer}/{module.stem}.py"
                )
        for package in sorted((ROOT / "artifact" / layer).glob("*/__init__.py")):
            assert f"{package.parent.name}/" in layout, (
                f"docs/layout.md misses {layer}/{package.parent.name}/"
            )
    for top in ("errors.py", "validate.py", "paths.py", "docs/", "notebooks/", "benchmarks/", "tests/"):
        assert top.rstrip("/").removesuffix(".py") in layout, top


def test_every_layer_is_a_real_package():
    for layer in LAYERS:
        assert (ROOT / "artifact" / layer / "__init__.py").is_file()
    assert (ROOT / "artifact" / "__init__.py").is_file() and (ROOT / "docs/DESIGN.md").is_file()


def test_design_doc_is_cited_inside_the_repository():
    for path, text in texts():
        if path == Path(__file__).resolve():
            continue  # this test spells the name in its patterns
        for m in re.finditer(r"DESIGN\.md", text):
            before = text[max(0, m.start() - 40) : m.start()]
            assert re.search(r"docs/\s*$", before), (
                f"{path.relative_to(ROOT)} cites a DESIGN.md outside docs/"
            )


def test_no_machine_paths_in_tracked_files():
    pattern = re.compile(r"(?<![\w.])/(work|root|home/\w+|tmp)/")
    for path, text in texts():
        m = pattern.search(text)
        assert m is None, (
            f"{path.relative_to(ROOT)} names a machine path: {text[m.start() : m.start() + 40]!r}"
        )


def test_outputs_go_to_the_checkout_a_notebook_runs_in(tmp_path, monkeypatch):
    """Two clones sharing one editable install: a notebook opened in the other clone (its kernel starts in
    that clone's notebooks/) writes under that clone, not under the installed one."""
    from artifact.paths import data_dir, repo_root

    other = tmp_path / "other-clone"
    (other / "artifact").mkdir(parents=True)
    (other / "artifact" / "__init__.py").write_text("")
    (other / "notebooks").mkdir()
    (other / "pyproject.toml").write_text("[project]\nname = 'artifact'\n")
    monkeypatch.delenv("ARTIFACT_DATA", raising=False)
    monkeypatch.chdir(other / "notebooks")
    assert repo_root() == other and data_dir() == other / "data"
    monkeypatch.chdir(tmp_path)  # outside any checkout: the installed one
    assert repo_root() == ROOT


def test_no_tracker_references_in_user_facing_text():
    """The issue tracker does not ship with the artifact: README, docs, the package (claim texts included) and
    the notebooks say what was decided, never "issue N"."""
    pattern = re.compile(r"issue \d")
    for path, text in texts():
        rel = path.relative_to(ROOT)
        if rel.parts[0] in ("docs", "artifact", "notebooks") or rel.name == "README.md":
            m = pattern.search(text)
            assert m is None, (
                f"{rel} names a tracker issue: {text[max(0, m.start() - 30) : m.start() + 20]!r}"
            )
