"""The committed stored runs (data/results/cpu/runs/run<k>/) are the headline of every timing claim: N >=
MIN_RUNS runs at one commit, and every timing interval, verdict and per-run verdict in the claim records (and
so in the README's
and docs/claims.md's tables) is recomputed here from their raw rows alone."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from artifact.experiments.claims_table import records
from artifact.experiments.criteria import thresholds
from artifact.experiments.outputs import stored_runs
from artifact.experiments.settings import load_profile

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "data" / "results"
STUDIES = {
    t.notebook: importlib.import_module(f"artifact.experiments.studies.{t.module}")
    for t in stored_runs.TIMED_STUDIES
}
TIMED = [(r["notebook"], [c for c in r["claims"] if c.get("timing")]) for r in records("cpu", RESULTS)]
TIMED = [(nb, cs) for nb, cs in TIMED if cs]
FIELDS = ("claim", "measured", "verdict", "reason", "margin", "interval", "per_run", "pooled")


@pytest.fixture(scope="module")
def cpu():
    return load_profile("cpu")


def test_the_stored_result_is_at_least_three_runs_at_one_commit():
    runs = stored_runs.check_stored_runs("cpu", ROOT)
    assert len(runs) >= thresholds.MIN_RUNS, (
        f"data/results/cpu/runs/ must hold >= {thresholds.MIN_RUNS} runs (scripts/record_runs.py)"
    )
    metas = [json.loads((r / "run.json").read_text()) for r in runs]
    assert len({m["commit"] for m in metas}) == 1 and "dirty" not in metas[0]["commit"], [
        m["commit"] for m in metas
    ]
    for r, m in zip(runs, metas):
        assert sorted(p.name for p in r.glob("*.csv")) == m["files"], r
        assert set(m["files"]) >= {f"{s}.csv" for s in stored_runs.TIMED_STEMS}, r


def test_every_timing_notebook_has_a_record_from_the_stored_runs():
    assert {nb for nb, _ in TIMED} == set(STUDIES)
    for nb, claims in TIMED:
        for c in claims:
            assert len(c.get("per_run") or []) >= thresholds.MIN_RUNS and c["ruled"] == "pooled", (
                nb,
                c["claim"],
            )


@pytest.mark.parametrize("notebook, recorded", TIMED, ids=[nb for nb, _ in TIMED])
def test_every_timing_claim_is_recomputed_from_the_committed_rows(notebook, recorded, cpu):
    got = STUDIES[notebook].stored_claims(cpu)
    assert len(got) == len(recorded), notebook
    for c, want in zip(got, recorded):
        for f in FIELDS:
            have = getattr(c, f)
            assert (list(have) if isinstance(have, tuple) else have) == want.get(f), (notebook, c.claim, f)


@pytest.mark.parametrize(
    "study", stored_runs.TIMED_STUDIES, ids=[t.notebook for t in stored_runs.TIMED_STUDIES]
)
def test_the_timed_studies_registry_names_each_study_and_its_row_files(study):
    """Each entry's module measures and rules (measure, stored_claims) and writes the row files it names."""
    module = STUDIES[study.notebook]
    assert callable(module.measure) and callable(module.stored_claims)
    named = next(getattr(module, n) for n in ("STEM", "STREAMS", "VALIDATION") if hasattr(module, n))
    assert set(named.values() if isinstance(named, dict) else [named]) == set(study.stems)
