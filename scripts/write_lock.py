"""Write requirements.lock: the exact version of every package that pyproject.toml's dependencies and its dev
extra pull in, read from the environment this runs in (the one the stored runs used: Python 3.11, torch 2.13.0
on the CPU). scripts/env.sh installs with it as pip constraints (`pip install -c requirements.lock -e
.[dev]`), and environment.yml pins the direct dependencies to the same versions (tests/test_environment.py
checks all three agree).

    .venv/bin/python scripts/write_lock.py            # rewrites requirements.lock (atomically)
    .venv/bin/python scripts/write_lock.py --check    # exit 1 when requirements.lock differs from this
    environment

The closure follows each installed distribution's own requirements, markers evaluated here with the extras
asked for, so a package this environment holds for another reason (a tool installed beside it) is not in it. A
local version label is dropped (torch 2.13.0+cpu is locked as torch==2.13.0, which a CPU or a CUDA build of
2.13.0 satisfies), and no CUDA runtime (nvidia-*, triton) is ever locked: the lock installs on a CPU
machine."""

from __future__ import annotations

import argparse
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

try:
    import tomllib
except ImportError:  # Python 3.10: pytest's own dependency
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements.lock"
EXTRAS = ("dev",)  # the tide extra pins another transformers: its own environment
NEVER = ("nvidia-", "triton")  # CUDA runtimes: a GPU machine's torch brings its own


def roots(pyproject: Path = ROOT / "pyproject.toml", extras=EXTRAS) -> list[Requirement]:
    """pyproject's dependencies and those of `extras`."""
    project = tomllib.loads(pyproject.read_text())["project"]
    return [
        Requirement(r)
        for r in project["dependencies"] + [r for e in extras for r in project["optional-dependencies"][e]]
    ]


def closure(reqs: list[Requirement]) -> dict[str, str]:
    """{canonical name: installed version} of `reqs` and everything they require here, each installed version
    checked against every specifier that asks for it (a ValueError names the first one it does not
    satisfy)."""
    found: dict[str, str] = {}
    todo = [(r, ("",)) for r in reqs]
    while todo:
        req, extras = todo.pop()
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in extras):
            continue
        name = canonicalize_name(req.name)
        if name.startswith(NEVER):
            continue
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            raise ValueError(f"{req} is required and not installed in {sys.prefix}") from None
        if not req.specifier.contains(Version(dist.version), prereleases=True):
            raise ValueError(f"{req} is required and {req.name} {dist.version} is installed in {sys.prefix}")
        new_extras = tuple(sorted(set(req.extras)))
        if name in found and not new_extras:
            continue
        found[name] = dist.version
        todo += [(Requirement(r), ("", *new_extras)) for r in dist.requires or []]
    return found


def public(version: str) -> str:
    """A version without its local label (2.13.0+cpu -> 2.13.0)."""
    return Version(version).public


def render(pins: dict[str, str]) -> str:
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    head = [
        "# The exact versions the stored runs used: pyproject.toml's dependencies and its dev extra, with",
        "# everything they pull in "
        "(scripts/write_lock.py writes it from the environment it runs in; do not edit).",
        "# scripts/env.sh installs with it: "
        "pip install -c requirements.lock -e .[dev] (ARTIFACT_LOCK=0: without).",
        "# A pip constraints file: it pins versions and installs nothing by itself. "
        "No CUDA runtime is in it.",
        f"# python: {py}",
    ]
    return "\n".join(head + [f"{n}=={public(v)}" for n, v in sorted(pins.items()) if n != "artifact"]) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--check", action="store_true", help="exit 1 when requirements.lock differs; write nothing"
    )
    a = ap.parse_args(argv)
    text = render(closure(roots()))
    if a.check:
        same = LOCK.is_file() and LOCK.read_text() == text
        print(f"{LOCK.name}: {'matches' if same else 'differs from'} this environment")
        return 0 if same else 1
    sys.path.insert(0, str(ROOT))
    from artifact.paths import atomic_write_text

    atomic_write_text(LOCK, text)
    print(f"wrote {LOCK.name}: {text.count(chr(10)) - 5} packages")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
