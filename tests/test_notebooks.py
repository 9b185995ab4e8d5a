"""The notebook runner (python -m artifact notebooks): parameters checked against the profile before anything
runs, skip/--force, failures counted without stopping the others; and the stored notebooks themselves."""
from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from artifact.cli import main as main_for_tests
from artifact.experiments.notebooks import (
    CHECK,
    NotebookError,
    claims_of,
    complete,
    declared_parameters,
    find_notebooks,
    injected_parameters,
)
from artifact.experiments.settings import PROFILE_KEYS, load_profile

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def write_nb(path: Path, params: str, body: str) -> Path:
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    p = new_code_cell(params)
    p.metadata["tags"] = ["parameters"]
    nb.cells = [p, new_code_cell(body)]
    nbformat.write(nb, path)
    return path


OK_BODY = 'print("claim: the tiny one works\\npaper: -\\nmeasured: " + str(gen_length) + "\\nverdict: reproduced")'


def test_a_parameter_that_is_not_a_profile_key_fails_before_anything_runs(tmp_path):
    write_nb(tmp_path / "00_good.ipynb", 'profile = "cpu"\ngen_length = 32', OK_BODY)
    write_nb(tmp_path / "01_typo.ipynb", 'profile = "cpu"\ngen_lenght = 32\nrepetitions = 1', OK_BODY)
    with pytest.raises(NotebookError) as e:
        injected_parameters(find_notebooks(tmp_path), "cpu", "cpu")
    msg = str(e.value)
    assert "01_typo.ipynb" in msg and "'gen_lenght'" in msg and "did you mean 'gen_length'" in msg
    assert "00_good" not in msg and "valid keys:" in msg
    rc = main_for_tests(["notebooks", "--notebook-dir", str(tmp_path), "--results", str(tmp_path / "results"),
                         "--quiet"])
    assert rc == 1 and not (tmp_path / "results").exists()
    assert main_for_tests(["notebooks", "--profile", "nope", "--notebook-dir", str(tmp_path), "--quiet"]) == 1
    with pytest.raises(NotebookError, match="no such notebook"):
        find_notebooks(tmp_path, ["07"])


def test_injected_values_are_the_profiles(tmp_path):
    write_nb(tmp_path / "00_a.ipynb", 'profile = "cpu"\ngen_length = 1\ntasks = ["x"]', OK_BODY)
    (params,) = injected_parameters(find_notebooks(tmp_path), "h200", "h200").values()
    h200 = load_profile("h200")
    assert params == {"profile": "h200", "gen_length": h200.gen_length, "tasks": list(h200.tasks)}


def test_run_skip_force_and_failures(tmp_path, capsys):
    """Real papermill runs of two tiny notebooks (no model): one prints a claim, one raises."""
    d, res = tmp_path / "nb", tmp_path / "results"
    d.mkdir()
    good = write_nb(d / "00_good.ipynb", 'profile = "cpu"\ngen_length = 7', OK_BODY)
    write_nb(d / "01_bad.ipynb", 'profile = "cpu"', 'raise RuntimeError("boom")')
    args = ["notebooks", "--notebook-dir", str(d), "--results", str(res), "--quiet"]
    assert main_for_tests(args) == 1                         # one failure, the other still ran
    out = capsys.readouterr().out
    assert re.search(r"00_good\s+ok\s+\d+\s+the tiny one works\s+reproduced", out)
    assert re.search(r"01_bad\s+FAILED", out) and "RuntimeError: boom" in out
    executed = res / "cpu" / "00_good.ipynb"
    nb = nbformat.read(executed, as_version=4)
    assert claims_of(nb) == [("the tiny one works", "reproduced")]
    assert "measured: 32" in json.dumps(nb.dict())          # the cpu profile's gen_length was injected
    assert (res / "cpu" / "01_bad.ipynb").is_file() and not list((res / "cpu").glob(".*tmp*"))

    assert main_for_tests(args) == 1                         # good: skipped; bad: run again
    out = capsys.readouterr().out
    assert re.search(r"00_good\s+skipped \(complete\)", out) and re.search(r"01_bad\s+FAILED", out)

    (d / "01_bad.ipynb").unlink()
    assert main_for_tests(args + ["--force"]) == 0
    assert re.search(r"00_good\s+ok", capsys.readouterr().out)

    params = {"profile": "cpu", "gen_length": 32}
    assert complete(executed, params, good)
    assert not complete(executed, {"profile": "cpu", "gen_length": 64}, good)     # the profile changed
    write_nb(good, 'profile = "cpu"\ngen_length = 7', OK_BODY + "\n1 + 1")            # the notebook changed
    assert not complete(executed, params, good)


# --- the stored notebooks -----------------------------------------------------------------------
STORED = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def test_the_six_notebooks_exist():
    assert [p.stem.split("_")[0] for p in STORED] == ["00", "01", "02", "03", "04", "05"]


@pytest.mark.parametrize("path", STORED, ids=lambda p: p.stem)
def test_stored_notebook_is_clean_and_ends_with_a_checked_claim_cell(path):
    raw = path.read_text()
    assert len(raw) < 50_000, "stored notebooks hold no images"
    for machine in ("/work", "/tmp", "/root", "/home", "C:\\\\"):
        assert machine not in raw, f"machine path {machine!r} in {path.name}"
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "parameters" in code[0].metadata.get("tags", [])
    assert code[-1].source.startswith(CHECK)
    assert [c for c in code if c.source.startswith(CHECK)] == [code[-1]]
    assert all(not c.outputs for c in code[:-1]), "only the claim cell keeps its output"
    claims = claims_of(nb)
    assert claims and all(v.split(" (")[0] in ("reproduced", "not reproduced", "not measurable on this profile")
                          for _, v in claims)


@pytest.mark.parametrize("path", STORED, ids=lambda p: p.stem)
def test_parameters_are_the_cpu_profiles_values(path):
    names = declared_parameters(path)
    assert names[0] == "profile" and set(names[1:]) <= set(PROFILE_KEYS)
    ns: dict = {}
    exec(next(c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code").source, ns)
    cpu = load_profile("cpu").as_dict()
    assert ns["profile"] == "cpu"
    wrong = {k: (ns[k], cpu[k]) for k in names[1:] if ns[k] != cpu[k]}
    assert not wrong, f"{path.name}: parameters differ from artifact/experiments/profiles/cpu.yaml (notebook, profile): {wrong}"


def test_overrides_reach_the_declared_parameters(tmp_path):
    write_nb(tmp_path / "00_a.ipynb", 'profile = "cpu"\nmodel = "tiny"\ngen_length = 1', OK_BODY)
    (params,) = injected_parameters(find_notebooks(tmp_path), "cpu", "cpu", {"model": "/ckpt", "gen_length": 64}
                                    ).values()
    assert params == {"profile": "cpu", "model": "/ckpt", "gen_length": 64}
    rc = main_for_tests(["notebooks", "--notebook-dir", str(tmp_path), "--set", "gen_lenght=3", "--quiet"])
    assert rc == 1
