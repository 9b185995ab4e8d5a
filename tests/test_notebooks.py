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
    SETTINGS_KEY,
    NotebookError,
    claims_of,
    complete,
    find_notebooks,
    injected_parameters,
    settings_of,
)
from artifact.experiments.notebooks.store import CELL_METADATA, KERNELSPEC, NOTEBOOK_METADATA, strip
from artifact.experiments.settings import load_profile

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def write_nb(path: Path, params: str, body: str) -> Path:
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    p = new_code_cell(params)
    p.metadata["tags"] = ["parameters"]
    nb.cells = [p, new_code_cell(body)]
    nbformat.write(nb, path)
    return path


PARAMS = 'profile = "cpu"\noverrides = {}'
# prints the gen_length of the profile it was given, with its overrides (what the runner injected)
OK_BODY = (
    "from artifact.experiments.settings import load_profile\n"
    "n = load_profile(profile, overrides).gen_length\n"
    'print("claim: the tiny one works\\npaper: -\\nmeasured: " + str(n) + "\\nverdict: reproduced")'
)


def test_a_parameters_cell_that_is_not_profile_and_overrides_fails_before_anything_runs(tmp_path):
    write_nb(tmp_path / "00_good.ipynb", PARAMS, OK_BODY)
    write_nb(tmp_path / "01_old.ipynb", 'profile = "cpu"\ngen_length = 32', OK_BODY)
    with pytest.raises(NotebookError) as e:
        injected_parameters(find_notebooks(tmp_path), "cpu")
    msg = str(e.value)
    assert "01_old.ipynb" in msg and "'gen_length'" in msg and "exactly `profile` and `overrides`" in msg
    assert "00_good" not in msg
    rc = main_for_tests(
        ["notebooks", "--notebook-dir", str(tmp_path), "--results", str(tmp_path / "results"), "--quiet"]
    )
    assert rc == 2 and not (tmp_path / "results").exists()
    assert main_for_tests(["notebooks", "--profile", "nope", "--notebook-dir", str(tmp_path), "--quiet"]) == 2
    with pytest.raises(NotebookError, match="no such notebook"):
        find_notebooks(tmp_path, ["07"])


def test_a_bad_override_fails_before_anything_runs(tmp_path, capsys):
    write_nb(tmp_path / "00_a.ipynb", PARAMS, OK_BODY)
    res = tmp_path / "results"
    for bad in (["--set", "gen_lenght=3"], ["--set", "gen_length=-1"]):
        rc = main_for_tests(
            ["notebooks", "--notebook-dir", str(tmp_path), "--results", str(res), "--quiet", *bad]
        )
        err = capsys.readouterr().err
        assert rc == 2 and "nothing was run" in err and "gen_len" in err and not res.exists()
    assert "did you mean 'gen_length'" in err or "gen_length" in err


def test_injected_parameters_are_the_profile_and_its_overrides(tmp_path):
    write_nb(tmp_path / "00_a.ipynb", PARAMS, OK_BODY)
    (params,) = injected_parameters(
        find_notebooks(tmp_path), "h200", {"model": "/ckpt", "gen_length": 64}
    ).values()
    assert params == {"profile": "h200", "overrides": {"model": "/ckpt", "gen_length": 64}}
    (params,) = injected_parameters(find_notebooks(tmp_path), "cpu").values()
    assert params == {"profile": "cpu", "overrides": {}}


def test_run_skip_force_and_failures(tmp_path, capsys):
    """Real papermill runs of two tiny notebooks (no model): one prints a claim, one raises."""
    d, res = tmp_path / "nb", tmp_path / "results"
    d.mkdir()
    good = write_nb(d / "00_good.ipynb", PARAMS, OK_BODY)
    write_nb(d / "01_bad.ipynb", PARAMS, 'raise RuntimeError("boom")')
    args = ["notebooks", "--notebook-dir", str(d), "--results", str(res), "--quiet"]
    assert main_for_tests(args + ["--set", "gen_length=48"]) == 1  # one failure, the other still ran
    out = capsys.readouterr().out
    assert re.search(r"00_good\s+ok\s+\d+\s+the tiny one works\s+reproduced", out)
    assert re.search(r"01_bad\s+FAILED", out) and "RuntimeError: boom" in out
    executed = res / "cpu" / "00_good.ipynb"
    nb = nbformat.read(executed, as_version=4)
    assert claims_of(nb) == [("the tiny one works", "reproduced")]
    assert "measured: 48" in json.dumps(nb.dict())  # the override reached the notebook
    assert nb.metadata[SETTINGS_KEY]["gen_length"] == 48
    assert (res / "cpu" / "01_bad.ipynb").is_file() and not list((res / "cpu").glob(".*tmp*"))

    assert main_for_tests(args) == 1  # other overrides: both run again
    out = capsys.readouterr().out
    assert re.search(r"00_good\s+ok", out) and "measured: 32" in json.dumps(nbformat.read(executed, 4).dict())
    assert main_for_tests(args) == 1  # good: skipped; bad: run again
    out = capsys.readouterr().out
    assert re.search(r"00_good\s+skipped \(complete\)", out) and re.search(r"01_bad\s+FAILED", out)

    (d / "01_bad.ipynb").unlink()
    assert main_for_tests(args + ["--force"]) == 0
    assert re.search(r"00_good\s+ok", capsys.readouterr().out)

    params, cpu = {"profile": "cpu", "overrides": {}}, settings_of(load_profile("cpu"))
    assert complete(executed, params, cpu, good)
    assert not complete(executed, params, cpu | {"gen_length": 64}, good)  # the profile file changed
    assert not complete(executed, {"profile": "cpu", "overrides": {"seed": 1}}, cpu, good)
    write_nb(good, PARAMS, OK_BODY + "\n1 + 1")  # the notebook changed
    assert not complete(executed, params, cpu, good)


# --- the stored notebooks -----------------------------------------------------------------------
STORED = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def test_the_ten_notebooks_exist():
    assert [p.stem.split("_")[0] for p in STORED] == [
        "00",
        "01",
        "02",
        "03",
        "04",
        "05",
        "06",
        "07",
        "08",
        "09",
    ]


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
    assert all(not c.outputs and c.execution_count is None for c in code[:-1]), (
        "only the claim cell keeps output"
    )
    assert set(nb.metadata) <= set(NOTEBOOK_METADATA) and nb.metadata["kernelspec"] == KERNELSPEC
    assert all(set(c.metadata) <= set(CELL_METADATA) for c in nb.cells), "no machine or run metadata in cells"
    assert nbformat.writes(strip(nbformat.reads(raw, as_version=4))) + "\n" == raw, (
        "scripts/strip_notebooks.py"
    )
    claims = claims_of(nb)
    assert claims and all(
        v.split(" (")[0] in ("reproduced", "not reproduced", "inconclusive", "not measurable on this profile")
        for _, v in claims
    )


@pytest.mark.parametrize("path", STORED, ids=lambda p: p.stem)
def test_a_notebook_is_the_thin_face_of_its_module(path):
    """Parameters `profile = "cpu"` and `overrides = {}`; calls into artifact, no definitions; one markdown
    sentence under each figure; the figure saved through figures.save."""
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code[0].source == 'profile = "cpu"\noverrides = {}'
    assert sum("harness.setup(profile, overrides)" in c.source for c in code) == 1
    for c in code:
        assert not re.search(r"^\s*(def|class) ", c.source, re.M), (
            f"{path.name}: logic belongs in the package"
        )
        assert len(c.source.splitlines()) <= 6, f"{path.name}: a cell of {len(c.source.splitlines())} lines"
    figures = [k for k, c in enumerate(nb.cells) if c.cell_type == "code" and "save(fig, df, P," in c.source]
    assert figures, f"{path.name}: no figure saved"
    for k in figures:
        below = nb.cells[k + 1]
        assert below.cell_type == "markdown", f"{path.name}: no sentence under the figure of cell {k}"
        text = below.source.strip()
        assert text.count(". ") == 0 and text.endswith(".") and "TODO" not in text, f"{path.name}: {text!r}"


def test_strip_keeps_only_the_claim_output_and_names_the_kernel():
    nb = new_notebook(
        cells=[
            new_code_cell(
                "x = 1",
                execution_count=3,
                outputs=[nbformat.v4.new_output("stream", name="stdout", text="noise\n")],
                metadata={"tags": ["parameters"], "execution": {"iopub.status.busy": "2026-12-04T00:00:00Z"}},
            ),
            new_code_cell(
                f"{CHECK}\nreport()",
                execution_count=9,
                outputs=[
                    nbformat.v4.new_output("stream", name="stdout", text="claim: x\n"),
                    nbformat.v4.new_output("stream", name="stderr", text="progress\n"),
                ],
            ),
        ],
        metadata={"kernelspec": {"name": "python3", "display_name": "/venv/bin/python"}, "papermill": {}},
    )
    out = strip(nb)
    assert out.cells[0].outputs == [] and out.cells[0].execution_count is None
    assert out.cells[0].metadata == {"tags": ["parameters"]}
    assert [o["text"] for o in out.cells[1].outputs] == ["claim: x\n"] and out.cells[1].execution_count == 1
    assert out.metadata == {"kernelspec": KERNELSPEC, "language_info": {"name": "python"}}


def test_store_copies_a_runs_files_to_the_reference_and_only_with_the_profiles_own_settings(tmp_path):
    from artifact.experiments.notebooks import Outcome
    from artifact.experiments.notebooks.store import store_outputs

    results, ref, nbdir = tmp_path / "results", tmp_path / "ref", tmp_path / "nb"
    run = results / "cpu"
    for rel in (
        "figures/02_miss_accounting.png",
        "data/02_miss_accounting.csv",
        "data/02_miss_accounting.claims.json",
        "figures/03_bandwidth_throttling.png",
    ):
        (run / rel).parent.mkdir(parents=True, exist_ok=True)
        (run / rel).write_text(rel)
    claim = new_code_cell(f"{CHECK}\nreport()")
    executed = new_notebook(
        cells=[
            new_code_cell("x = 1", outputs=[nbformat.v4.new_output("stream", name="stdout", text="noise\n")]),
            new_code_cell(
                claim.source,
                outputs=[
                    nbformat.v4.new_output("stream", name="stdout", text="claim: c\nverdict: reproduced\n")
                ],
            ),
        ]
    )
    nbformat.write(executed, run / "02_miss_accounting.ipynb")
    nbdir.mkdir()
    nbformat.write(new_notebook(cells=[new_code_cell("x = 1"), claim]), nbdir / "02_miss_accounting.ipynb")
    ok = [Outcome("02_miss_accounting", "ok", 1.0, []), Outcome("03_bandwidth_throttling", "FAILED", 1.0, [])]
    assert not store_outputs("cpu", {"repetitions": 5}, ok, nbdir, results, ref, log=lambda s: None)
    assert not ref.exists()  # a run with overrides is no reference
    assert store_outputs("cpu", {}, ok, nbdir, results, ref, log=lambda s: None)
    assert sorted(str(p.relative_to(ref)) for p in ref.rglob("*") if p.is_file()) == [
        "data/results/cpu/02_miss_accounting.claims.json",
        "data/results/cpu/02_miss_accounting.csv",
        "figures/cpu/02_miss_accounting.png",
    ]  # the failed notebook's figure stays behind
    stored = nbformat.read(nbdir / "02_miss_accounting.ipynb", as_version=4)
    assert stored.cells[0].outputs == [] and stored.cells[1].outputs[0]["text"].startswith("claim: c")


def test_the_runner_starts_kernels_over_ipc_not_unencrypted_tcp():
    """papermill's kernels talk over Unix sockets: ipykernel warns on every notebook that runs over TCP
    without encryption (a warning the user cannot act on), and says nothing over IPC."""
    from artifact.experiments.notebooks import ipc_kernel_manager

    km = ipc_kernel_manager()(kernel_name="python3")
    assert km.transport == "ipc"
