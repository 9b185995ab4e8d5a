"""The environment installs as written and every run says what it ran on: requirements.lock, environment.yml
and pyproject.toml agree; scripts/env.sh installs with the lock (and without it when told or on another
Python); CITATION.cff is whole; seaborn, which draws some figures, is pinned at one version in all three. What
a run records of its environment: tests/test_run_environment.py."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

import artifact
from artifact.experiments.tide.checkout import TIDE_REPO, TIDE_REVISION

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import write_lock  # noqa: E402  (scripts/ is not a package)

LOCK = ROOT / "requirements.lock"


def lock() -> dict[str, str]:
    """requirements.lock as {canonical name: version}; every line a comment or NAME==VERSION."""
    pins = {}
    for line in LOCK.read_text().splitlines():
        if line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        assert sep and name == canonicalize_name(name) and Version(version), (
            f"requirements.lock: bad line {line!r}"
        )
        pins[name] = version
    return pins


def lock_python() -> str:
    (py,) = re.findall(r"^# python: (\d+\.\d+)$", LOCK.read_text(), re.M)
    return py


def env_yml() -> tuple[str, list[str]]:
    """environment.yml's python pin and its pip lines."""
    doc = yaml.safe_load((ROOT / "environment.yml").read_text())
    deps = doc["dependencies"]
    (python,) = [d for d in deps if isinstance(d, str) and d.startswith("python=")]
    (pip,) = [d["pip"] for d in deps if isinstance(d, dict)]
    return python.partition("=")[2], pip


def test_every_dependency_of_pyproject_is_locked_at_a_version_it_allows():
    pins = lock()
    for req in write_lock.roots():
        name = canonicalize_name(req.name)
        assert name in pins, (
            f"{req} is in pyproject.toml and not in requirements.lock (scripts/write_lock.py)"
        )
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"the lock pins {name}=={pins[name]}: {req}"
        )
    assert "artifact" not in pins  # the project itself is installed from the checkout


def test_the_lock_installs_on_a_cpu_machine():
    """No CUDA runtime and no local build label: torch==2.13.0 is met by the CPU wheel and by any CUDA
    build."""
    pins = lock()
    assert not [n for n in pins if n.startswith(write_lock.NEVER)]
    assert not [f"{n}=={v}" for n, v in pins.items() if "+" in v]
    assert pins["torch"] == "2.13.0"


def test_environment_yml_pins_what_the_lock_pins():
    python, pip = env_yml()
    assert python.startswith(lock_python() + "."), (
        f"environment.yml's python={python}, the lock's {lock_python()}"
    )
    assert "-c requirements.lock" in pip and pip[-1] == "-e .[dev]"
    pins, direct = lock(), {canonicalize_name(r.name) for r in write_lock.roots()}
    pinned = {}
    for line in pip:
        if line.startswith("-"):
            continue
        req = Requirement(line)
        (spec,) = req.specifier
        assert spec.operator == "==", f"environment.yml: {line} is not a pin"
        pinned[canonicalize_name(req.name)] = spec.version
    assert {n: pins[n] for n in pinned} == pinned, (
        "environment.yml and requirements.lock pin different versions"
    )
    assert set(pinned) == direct, (
        "environment.yml pins pyproject.toml's direct dependencies, no more, no fewer"
    )


def test_the_lock_is_this_environments_closure_when_this_is_the_locked_environment():
    """scripts/write_lock.py writes the lock from the running environment: here, where every locked package is
    installed at its locked version, it writes the committed file again, byte for byte."""
    from importlib import metadata

    have = {}
    for n in lock():
        try:
            have[n] = Version(metadata.version(n)).public
        except metadata.PackageNotFoundError:
            have[n] = None
    off = {n: v for n, v in have.items() if v != lock()[n]}
    if off or f"{sys.version_info.major}.{sys.version_info.minor}" != lock_python():
        pytest.skip(
            f"this environment is not the locked one ({len(off)} packages differ, e.g. {list(off)[:3]})"
        )
    assert write_lock.render(write_lock.closure(write_lock.roots())) == LOCK.read_text()
    assert write_lock.main(["--check"]) == 0


def test_a_requirement_the_environment_does_not_meet_is_named():
    with pytest.raises(ValueError, match=r"numpy<1 is required and numpy .* is installed"):
        write_lock.closure([Requirement("numpy<1")])
    with pytest.raises(ValueError, match="no-such-package-here is required and not installed"):
        write_lock.closure([Requirement("no-such-package-here")])


# --- scripts/env.sh: what it asks pip to do (a stand-in python records it) ---------------------------------
SHIM = """#!/bin/sh
# A stand-in for the venv's python: it prints the Python version asked for, and logs every other call.
case "$*" in
  *"sys.version_info[:2]"*) echo "$SHIM_PY" ;;
  *) echo "$*" >> "$SHIM_LOG" ;;
esac
"""


def env_sh(tmp_path, py: str, **env) -> tuple[str, str]:
    venv = tmp_path / f"venv{py}{sorted(env.items())}".replace(" ", "").replace("'", "")
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(SHIM)
    (venv / "bin" / "python").chmod(0o755)
    log = venv / "calls.log"
    run = subprocess.run(
        ["bash", "-c", "set -euo pipefail; source scripts/env.sh"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "ARTIFACT_VENV": str(venv), "SHIM_PY": py, "SHIM_LOG": str(log), **env},
    )
    assert run.returncode == 0, run.stderr
    return run.stdout, log.read_text()


def test_env_sh_installs_with_the_lock_unless_told_or_on_another_python(tmp_path):
    out, calls = env_sh(tmp_path, lock_python())
    install = [c for c in calls.splitlines() if c.endswith(f"-e {ROOT}[dev]")]
    assert install == [f"-m pip install -q --disable-pip-version-check -c {LOCK} -e {ROOT}[dev]"], calls
    assert "-m ipykernel install --sys-prefix --name artifact" in calls
    out, calls = env_sh(tmp_path, lock_python(), ARTIFACT_LOCK="0")
    assert "requirements.lock" not in calls and f"-e {ROOT}[dev]" in calls
    out, calls = env_sh(tmp_path, "3.10")
    assert "requirements.lock" not in calls and f"requirements.lock is for Python {lock_python()}" in out


# --- the citation and what is not a dependency -------------------------------------------------------------
def test_the_citation_file_is_whole_and_of_this_version():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0"
    for key in ("message", "title", "authors", "version", "date-released", "license"):
        assert cff.get(key), f"CITATION.cff lacks {key}"
    assert cff["version"] == artifact.__version__
    assert str(cff["date-released"]) == "2026-12-05"
    text = (ROOT / "pyproject.toml").read_text()
    assert f'license = "{cff["license"]}"' in text
    assert all(a.get("name") or a.get("family-names") for a in cff["authors"])
    refs = {r["title"]: r for r in cff["references"]}
    assert {"LLaDA2.0-mini", "LLaDA2.0-flash"} <= set(refs)
    assert (refs["TIDE"]["repository-code"], refs["TIDE"]["commit"]) == (TIDE_REPO, TIDE_REVISION)


PAPER_TITLE = "Rethinking Expert Prefetching for Offloaded Diffusion MoE Inference"
# words that mark a made-up or unfinished author (the paper's authors are not known to this artifact)
PLACEHOLDER = re.compile(
    r"authors? of this artifact|placeholder|\bTODO\b|unknown author|lorem|john doe", re.I
)


def test_the_citation_names_the_paper_as_an_article_and_invents_no_author():
    """CITATION.cff cites the paper this artifact reproduces by its title, as a reference of type article,
    sums up the abstract's claims in `abstract`, and names no author it does not know: no placeholder, and the
    paper's entry names no one (CFF requires an author: one empty person)."""
    text = (ROOT / "CITATION.cff").read_text()
    cff = yaml.safe_load(text)
    assert not PLACEHOLDER.search(text), PLACEHOLDER.search(text)
    (ref,) = [r for r in cff["references"] if r["title"] == PAPER_TITLE]
    assert ref["type"] == "article" and ref["authors"] == [{}]
    assert PAPER_TITLE in cff["title"] and PAPER_TITLE in cff["abstract"]
    for figure in ("6.7x", "4.9-11.8%", "+0.73%", "[-1.16,+2.63]", "14.4x", "6.1x", "five tasks"):
        assert figure in cff["abstract"], figure
    names = [a.get("name") or a.get("family-names") for a in cff["authors"]]
    assert names and all(names) and not any(PLACEHOLDER.search(n) for n in names)


def test_the_zenodo_metadata_names_the_paper_and_the_license():
    """.zenodo.json: what Zenodo's GitHub integration archives a release with (docs/usage.md, "Citing and
    archiving: a DOI"): software, the citation's title and creators, the repository's license, the paper
    named."""
    zen = json.loads((ROOT / ".zenodo.json").read_text())
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert zen["upload_type"] == "software" and zen["title"] == cff["title"].strip()
    assert (
        zen["license"] == cff["license"] and "Apache License, Version 2.0" in (ROOT / "LICENSE").read_text()
    )
    assert PAPER_TITLE in zen["notes"] and PAPER_TITLE in zen["description"]
    assert zen["creators"] == cff["authors"] and not PLACEHOLDER.search(json.dumps(zen))


def _imports(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_seaborn_is_declared_at_one_version_in_pyproject_the_lock_and_environment_yml():
    """The figures drawn with seaborn (artifact/experiments/studies/) need it: pyproject.toml pins it, and the
    lock and environment.yml pin the same version."""
    (req,) = [r for r in write_lock.roots() if canonicalize_name(r.name) == "seaborn"]
    (spec,) = req.specifier
    assert spec.operator == "==", f"pyproject.toml: {req} is not a pin"
    assert lock()["seaborn"] == spec.version, "requirements.lock pins another seaborn than pyproject.toml"
    _, pip = env_yml()
    assert f"seaborn=={spec.version}" in pip, "environment.yml pins another seaborn than pyproject.toml"
    used = [p for p in (ROOT / "artifact").rglob("*.py") if "seaborn" in _imports(p.read_text())]
    assert used, "seaborn is declared and no module of the artifact imports it"
