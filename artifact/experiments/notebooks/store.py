"""--store: a run of the notebooks made the committed reference (store_outputs: its figures, data, claim
records and routing traces copied to figures/<profile>/ and data/results/<profile>/, on the cpu profile its
claim cells' outputs into the source notebooks, then the claims tables generated again), and a notebook as git
stores it (strip: also the pre-commit hook, scripts/strip_notebooks.py). The run itself is the package's
__init__.

nbformat is imported inside the functions that use it (the package's docstring says why).
"""

from __future__ import annotations

from pathlib import Path

from artifact.experiments.claims_readme import update_readme
from artifact.experiments.notebooks import CHECK, Outcome, notebook_dir
from artifact.experiments.outputs.paths import (
    figures_dir,
    reference_data_dir,
    reference_figures_dir,
    run_data_dir,
    run_dir,
    short_path,
)
from artifact.experiments.settings import load_profile
from artifact.paths import atomic_write_bytes, atomic_write_text, repo_root

KERNELSPEC = {"name": "artifact", "display_name": "artifact (.venv)", "language": "python"}  # scripts/env.sh
NOTEBOOK_METADATA = ("kernelspec", "language_info")  # all a committed notebook's metadata holds
CELL_METADATA = ("tags",)  # all a committed cell's metadata holds


def strip(nb, claim_outputs: dict | None = None):
    """A notebook as git stores it: every output cleared but the claim cell's stdout (taken from
    `claim_outputs`, claim cell source -> executed cell, when given; else kept as it is), no execution counts
    but the claim cell's, no metadata beyond NOTEBOOK_METADATA and CELL_METADATA, the project's kernel."""
    for cell in nb.cells:
        cell.metadata = {k: v for k, v in cell.metadata.items() if k in CELL_METADATA}
        if cell.cell_type != "code":
            cell.pop("outputs", None)
            cell.pop("execution_count", None)
            continue
        claim = cell.source.startswith(CHECK)
        done = (
            (claim_outputs or {}).get(cell.source, cell if claim_outputs is None else None) if claim else None
        )
        outputs = (
            []
            if done is None
            else [o for o in done.outputs if o.get("output_type") == "stream" and o.get("name") == "stdout"]
        )
        cell.outputs, cell.execution_count = outputs, (1 if outputs else None)
    nb.metadata = {k: v for k, v in nb.metadata.items() if k in NOTEBOOK_METADATA}
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata["language_info"] = {"name": "python"}
    return nb


def store_claim_outputs(executed: Path, source: Path) -> None:
    """Copy the claim cells' outputs of an executed cpu run into the source notebook, every other output
    cleared (strip: what git stores, and what nbval compares against)."""
    import nbformat

    run = nbformat.read(executed, as_version=4)
    src = nbformat.read(source, as_version=4)
    by_source = {c.source: c for c in run.cells if c.cell_type == "code" and c.source.startswith(CHECK)}
    atomic_write_text(source, nbformat.writes(strip(src, by_source)) + "\n")


def store_outputs(
    profile: str,
    overrides: dict,
    outcomes: list[Outcome],
    notebooks: Path | None = None,
    results: Path | None = None,
    reference: Path | None = None,
    log=print,
) -> bool:
    """--store: make a run the committed reference. For every notebook that did not fail, the figures, their
    data and the claim record it saved (in the run's ignored folders, outputs.figures_dir and run_data_dir)
    are copied to figures/<profile>/ and data/results/<profile>/ (under `reference` when given, else the
    checkout), the run's own routing traces (when its files are in their usual places: `results` None) to
    data/results/<profile>/traces/ where no reference trace of the profile's settings is
    (harness.store_traces), and on the cpu profile its claim cells' outputs into the source notebook (what
    nbval compares); then the claims tables (README, docs/claims.md) are generated again. A reference is a
    profile's own settings: refused with --set overrides, and on the cpu profile with --model. False when
    nothing was stored."""
    if any(o.status == "FAILED" for o in outcomes):
        log("--store: some notebooks failed; their stored outputs are left as they were")
    P = load_profile(profile, {k: v for k, v in overrides.items() if k == "model"})
    if set(overrides) - {"model"} or (P.name == "cpu" and overrides):
        log(
            "--store keeps the reference of a profile's own settings only (no --set; "
            "--model only off the cpu profile); skipped"
        )
        return False
    ok = [o.name for o in outcomes if o.status != "FAILED"]
    if reference is None and notebooks is not None:
        log("--store with another notebook directory: the reference results are left as they are")
    else:
        figs = Path(reference) / "figures" / P.name if reference else reference_figures_dir(P.name)
        data = Path(reference) / "data" / "results" / P.name if reference else reference_data_dir(P.name)
        n = 0
        for name in ok:
            prefix = name[:3]  # "02_": the files notebook 02 saved
            run = Path(results) / P.name if results else None
            for src, dst in (
                (run / "figures" if run else figures_dir(P), figs),
                (run / "data" if run else run_data_dir(P), data),
            ):
                for f in sorted(src.glob(f"{prefix}*")) if src.is_dir() else []:
                    atomic_write_bytes(dst / f.name, f.read_bytes())
                    n += 1
        log(f"stored {n} reference files into {short_path(figs)} and {short_path(data)}")
        if results is None:  # the run's own places: its traces are in data/traces/
            from artifact.experiments.harness import store_traces  # (torch: only when storing)

            t = store_traces(P, data / "traces")
            if t:
                log(
                    f"stored {t} routing traces into {short_path(data / 'traces')} (the counts' "
                    "reference input)"
                )
    if P.name == "cpu":
        directory = Path(notebooks or notebook_dir())
        for name in ok:
            store_claim_outputs(
                (Path(results) / "cpu" if results else run_dir(P)) / f"{name}.ipynb",
                directory / f"{name}.ipynb",
            )
        log(f"stored claim outputs into {short_path(directory)}")
    if notebooks is None and reference is None:  # the checkout's own notebooks: its claims tables follow them
        readme = repo_root() / "README.md"
        changed = update_readme(readme, "cpu")
        log(
            f"{readme.name}: the claims table "
            f"{'rewritten from the stored records' if changed else 'unchanged'}"
        )
    return True
