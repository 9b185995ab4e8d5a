"""Strip notebooks to what git stores (the pre-commit hook; artifact.experiments.notebooks.store.strip): only
the claim cell's stdout output, no execution counts but its own, no machine metadata, the project's kernel. A
figure reaches a repository browser as a markdown image of the committed figures/cpu/<name>.png, not as an
output (tests/test_figures_readable.py).

    .venv/bin/python scripts/strip_notebooks.py notebooks/*.ipynb      # rewrites the files that change
Exits 1 when it changed a file (so a commit hook stops and the stripped files can be added), else 0."""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

from artifact.experiments.notebooks.store import strip
from artifact.paths import atomic_write_text


def main(paths: list[str]) -> int:
    changed = 0
    for p in map(Path, paths):
        text = p.read_text()
        out = nbformat.writes(strip(nbformat.reads(text, as_version=4))) + "\n"
        if out != text:
            atomic_write_text(p, out)
            print(f"stripped {p}")
            changed += 1
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
