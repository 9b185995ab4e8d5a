"""The committed stored runs (data/results/cpu/runs/run<k>/) are the headline of every timing claim: N >= 3 runs at
one commit, and every timing interval, verdict and per-run verdict in the claim records (and so in the README's
and docs/claims.md's tables) is recomputed here from their raw rows alone."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from artifact.experiments import replication
from artifact.experiments.claims_table import records
from artifact.experiments.criteria import thresholds
from artifact.experiments.settings import load_profile
from artifact.experiments.studies import (
    bandwidth_throttling,
    beyond_the_paper,
    cache_design_space,
    capacity_sweep,
    performance_model,
    routing_map,
    tide_head_to_head,
)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "data" / "results"
STUDIES = {"03": bandwidth_throttling, "04": capacity_sweep, "05": tide_head_to_head, "06": beyond_the_paper,
           "07": routing_map, "08": performance_model, "09": cache_design_space}
TIMED = [(r["notebook"], [c for c in r["claims"] if c.get("timing")]) for r in records("cpu", RESULTS)]
TIMED = [(nb, cs) for nb, cs in TIMED if cs]
FIELDS = ("claim", "measured", "verdict", "reason", "margin", "interval", "per_run", "pooled")


@pytest.fixture(scope="module")
def cpu():
    return load_profile("cpu")


def test_the_stored_result_is_at_least_three_runs_at_one_commit():
    runs = replication.stored_runs("cpu", ROOT)
    assert len(runs) >= thresholds.MIN_RUNS, "data/results/cpu/runs/ must hold >= 3 runs (scripts/record_runs.py)"
    metas = [json.loads((r / "run.json").read_text()) for r in runs]
    assert len({m["commit"] for m in metas}) == 1 and "dirty" not in metas[0]["commit"], [m["commit"] for m in metas]
    for r, m in zip(runs, metas):
        assert sorted(p.name for p in r.glob("*.csv")) == m["files"], r
        assert set(m["files"]) >= {f"{s}.csv" for s in replication.TIMED_STEMS}, r


def test_every_timing_notebook_has_a_record_from_the_stored_runs():
    assert {nb[:2] for nb, _ in TIMED} == set(STUDIES)
    for nb, claims in TIMED:
        for c in claims:
            assert len(c.get("per_run") or []) >= thresholds.MIN_RUNS and c["ruled"] == "pooled", (nb, c["claim"])


@pytest.mark.parametrize("notebook, recorded", TIMED, ids=[nb for nb, _ in TIMED])
def test_every_timing_claim_is_recomputed_from_the_committed_rows(notebook, recorded, cpu):
    got = STUDIES[notebook[:2]].stored_claims(cpu)
    assert len(got) == len(recorded), notebook
    for c, want in zip(got, recorded):
        for f in FIELDS:
            have = getattr(c, f)
            assert (list(have) if isinstance(have, tuple) else have) == want.get(f), (notebook, c.claim, f)
