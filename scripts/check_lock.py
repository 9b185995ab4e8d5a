"""Before pip installs with requirements.lock as constraints (scripts/env.sh): every pin of the lock must
satisfy pyproject.toml's requirement of that package, else pip stops with ResolutionImpossible and a page of
resolver output. This names the first pin that disagrees in one sentence and exits 2.

    python scripts/check_lock.py [pyproject.toml] [requirements.lock]

It uses only the standard library and pip's own copy of `packaging`, since it runs before the project's
dependencies are installed."""

from __future__ import annotations

import re
import sys
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    from pip._vendor import tomli as tomllib
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name
from pip._vendor.packaging.version import Version


def disagreement(pyproject: Path, lock: Path) -> str | None:
    """The first requirement of pyproject.toml (dependencies and the dev extra) whose locked version it does
    not allow, as a sentence; None when every pin fits."""
    project = tomllib.loads(pyproject.read_text())["project"]
    wanted = [*project.get("dependencies", []), *project.get("optional-dependencies", {}).get("dev", [])]
    pins = {}
    for line in lock.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;#]+)", line.strip())
        if m:
            pins[canonicalize_name(m.group(1))] = m.group(2)
    for text in wanted:
        req = Requirement(text)
        have = pins.get(canonicalize_name(req.name))
        if have is not None and req.specifier and Version(have) not in req.specifier:
            return (
                f"requirements.lock pins {req.name}=={have}, but pyproject.toml asks for {req}: rewrite the "
                "lock (.venv/bin/python scripts/write_lock.py) or install without it (ARTIFACT_LOCK=0)"
            )
    return None


def main(argv: list[str]) -> int:
    root = Path(__file__).resolve().parent.parent
    pyproject = Path(argv[0]) if argv else root / "pyproject.toml"
    lock = Path(argv[1]) if len(argv) > 1 else root / "requirements.lock"
    why = disagreement(pyproject, lock)
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
