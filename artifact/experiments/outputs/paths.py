"""Where a profile's outputs go. A run writes only into ignored places: results/<profile>/ (ARTIFACT_OUTPUT
relocates it) holds the executed notebooks, figures/ (ARTIFACT_FIGURES relocates it) and data/ (each figure's
CSV and each claim cell's record); the resumable bench grids and the traces live in data/results/<profile>/
and data/traces/<profile>/ (ignored but for the reference files). The committed reference results,
figures/<profile>/*.png, data/results/<profile>/NN_*.csv and NN_*.claims.json, and the routing traces they
were computed from, data/results/<profile>/traces/, change only with an explicit `--store`
(notebooks.store.store_outputs copies a run's files there)."""

from __future__ import annotations

import os
from pathlib import Path

from artifact.experiments.settings import Settings
from artifact.paths import data_dir, repo_root

RECORD_SUFFIX = ".claims.json"  # a notebook's claim record: results/<profile>/data/<notebook>.claims.json


def run_dir(P: Settings) -> Path:
    return Path(os.environ.get("ARTIFACT_OUTPUT", repo_root() / "results")) / P.name


def figures_dir(P: Settings) -> Path:
    """Where a run saves its figures: ARTIFACT_FIGURES/<profile>, else results/<profile>/figures."""
    env = os.environ.get("ARTIFACT_FIGURES")
    return Path(env) / P.name if env else run_dir(P) / "figures"


def run_data_dir(P: Settings) -> Path:
    """Where a run saves each figure's data and its claim records: results/<profile>/data."""
    return run_dir(P) / "data"


def reference_figures_dir(profile_name: str) -> Path:
    """The committed figures (README links them): figures/<profile>/."""
    return repo_root() / "figures" / profile_name


def reference_data_dir(profile_name: str) -> Path:
    """The committed figure data and claim records (the claims table reads them): data/results/<profile>/."""
    return data_dir() / "results" / profile_name


def results_dir(P: Settings) -> Path:
    """The resumable result files of the bench grids (ignored by git): data/results/<profile>/."""
    return data_dir() / "results" / P.name


def traces_dir(P: Settings) -> Path:
    """Where a run records its routing traces (ignored by git): data/traces/<profile>/."""
    return data_dir() / "traces" / P.name


def reference_traces_dir(profile_name: str) -> Path:
    """The committed routing traces every exact count of the profile is computed from (harness.current_trace
    prefers them to a run's own; --store writes them): data/results/<profile>/traces/."""
    return reference_data_dir(profile_name) / "traces"


def short_path(path: Path) -> str:
    """Relative to the checkout when inside it (the usual case: no machine paths in notebook outputs)."""
    try:
        return str(path.resolve().relative_to(repo_root().resolve()))
    except ValueError:
        return str(path.resolve())
