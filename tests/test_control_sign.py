"""The A/A control's sign, derived from a known truth rather than from the formula that computes it.

The control (settings.CONTROL) does demand's work in the non-demand role, so CONTROL over demand measures
beta, the bias of that role (the prefetch path's hooks, its code path). A claim's true effect is A over B with
beta removed from whichever side is not demand: when demand is B, A over demand carries +beta; when demand is
A, demand over B carries -beta. A correct net effect equals the true effect whatever beta is, and whichever
side demand takes (effects.net_difference: a difference in differences on the log scale, oriented by demand's
role). The pre-fix rule
subtracted the control in both orientations and so counted beta twice when demand is A (04's direction claim,
07)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from artifact.experiments.criteria.timing import CLAIMS, DEMAND, FASTER, OTHERS, PERCENT
from artifact.experiments.verdicts.pairs import STALL_SHARE, run_views
from artifact.experiments.outputs.manifest import write_manifest
from artifact.experiments.settings import CONTROL, load_profile
from artifact.experiments.outputs.paired_table import CELL_KEYS, PAIR_KEYS

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "data" / "results" / "cpu" / "runs"
CELL = list(CELL_KEYS)
KEY = ("gsm8k", 1, 1.0, 1.0)


def truth_rows(a: str, b: str, true_pct: float, beta_pct: float, reps: int = 4) -> pd.DataFrame:
    """One cell of tokens/s rows with a known truth: demand at the pair's base, the control (demand's work in
    the other role) at base x (1 + beta), the non-demand policy at base x (1 + beta) x (1 + T)^(+-1), so that
    A over B net of the role bias is exactly T. The base moves from pair to pair (the machine's state), which
    cancels."""
    other = a if b == DEMAND else b
    rows = []
    for rep in range(reps):
        base = 50.0 * (1 + 0.03 * rep)
        role = base * (1 + beta_pct / 100)
        level = role * (1 + true_pct / 100) ** (1 if other == a else -1)
        for policy, v in ((DEMAND, base), (CONTROL, role), (other, level)):
            rows.append(dict(zip(CELL, KEY), rep=rep, policy=policy, tokens_per_second=v))
    return pd.DataFrame(rows)


@pytest.mark.parametrize(
    "a, b", [(DEMAND, "last_step"), ("last_step", DEMAND)], ids=["demand as A", "demand as B"]
)
@pytest.mark.parametrize("beta", [-5.0, 0.0, 5.0])
@pytest.mark.parametrize("true", [0.0, 6.0])
def test_the_net_is_the_true_effect_whatever_the_role_bias_and_whichever_side_demand_takes(a, b, beta, true):
    v = run_views(truth_rows(a, b, true, beta), a, b, CELL, "tokens_per_second")
    assert v["net"][KEY].mean == pytest.approx(true, abs=1e-9)
    assert np.allclose(v["net"][KEY].diffs, true, atol=1e-9)  # pair by pair, not only on average
    assert v["control"][KEY].mean == pytest.approx(beta, abs=1e-9)
    undifferenced = ((1 + true / 100) * (1 + beta / 100) ** (1 if b == DEMAND else -1) - 1) * 100
    assert v["effect"][KEY].mean == pytest.approx(undifferenced, abs=1e-9)


def test_the_pre_fix_sign_fails_this_truth():
    """The rule this replaces, d(A over B) - d(CONTROL over demand), with demand as A and a 5% role bias: it
    is off by about twice the bias, so the truth above is a test that could fail."""
    rows = truth_rows(DEMAND, "last_step", 6.0, 5.0)
    v = run_views(rows, DEMAND, "last_step", CELL, "tokens_per_second")
    old = v["effect"][KEY].mean - v["control"][KEY].mean
    assert abs(old - 6.0) > 9.0 and v["net"][KEY].mean == pytest.approx(6.0, abs=1e-9)


@pytest.mark.parametrize("beta", [-4.0, 0.0, 4.0])
def test_the_stall_basis_nets_an_additive_role_bias_in_points(beta):
    """03: last_step (A) over demand (B) in points of demand's wall time per forward; the non-demand role
    stalls beta points more (the control too), last_step T = 7 points more than that."""
    rows = []
    for rep in range(4):
        for policy, pts in ((DEMAND, 10.0), (CONTROL, 10.0 + beta), ("last_step", 17.0 + beta)):
            rows.append(
                dict(
                    zip(CELL, KEY),
                    rep=rep,
                    policy=policy,
                    forwards=100,
                    seconds=2.0 + 0.1 * rep,
                    stall_seconds=pts / 100 * (2.0 + 0.1 * rep),
                )
            )
    v = run_views(pd.DataFrame(rows), "last_step", DEMAND, CELL, "stall_seconds", STALL_SHARE)
    assert v["net"][KEY].mean == pytest.approx(7.0, abs=1e-9)
    assert v["effect"][KEY].mean == pytest.approx(7.0 + beta, abs=1e-9)


# --- the planted case of the audit: a role bias in the committed runs must not move a net effect
# ---------------
def _nets(measured: str) -> list[float]:
    return [float(x) for x in re.findall(r"net ([+-]\d+\.\d)(?:%| points)", measured)]


def test_a_role_bias_planted_in_the_stored_runs_moves_no_net_effect(tmp_path, monkeypatch):
    """Every non-demand policy's tokens/s x 1.05 in the stored runs' bench.csv (last_step and the control
    alike), manifests rewritten: the bias is common to both arms, so 04's net effects and its verdicts do not
    move (the pre-fix rule moved every net by about 10 points and turned the claim `not reproduced`)."""
    from artifact.experiments.studies import capacity_sweep

    P = load_profile("cpu")
    before = [c for c in capacity_sweep.stored_claims(P)]
    runs = tmp_path / "data" / "results" / "cpu" / "runs"
    shutil.copytree(RUNS, runs)
    for run in sorted(runs.glob("run*")):
        bench = pd.read_csv(run / "bench.csv")
        bench.loc[bench.policy != DEMAND, "tokens_per_second"] *= 1.05
        bench.to_csv(run / "bench.csv", index=False)
        write_manifest(run)
    monkeypatch.setenv("ARTIFACT_DATA", str(tmp_path / "data"))
    after = capacity_sweep.stored_claims(P)
    faster_before, faster_after = before[0], after[0]
    assert _nets(faster_before.measured) and _nets(faster_after.measured) == _nets(faster_before.measured)
    assert faster_after.verdict == faster_before.verdict
    # the equivalence claim rules on the undifferenced effect, gated by the control: a 5% bias shows in the
    # gate
    assert after[1].verdict == "inconclusive" and "A/A control" in after[1].reason
    moved = re.findall(r"A over B ([+-]\d+\.\d)%", faster_after.measured)
    assert moved != re.findall(r"A over B ([+-]\d+\.\d)%", faster_before.measured)  # the bias did land


# --- every stored net, recomputed from the raw rows without the pipeline ---------------------------------
def _independent_nets(claim) -> dict:
    """{cell key: pooled net effect} of a direction claim over the committed stored runs, from the raw rows
    with plain pandas: per pair the oriented difference in differences (log scale for tokens/s and forwards/s;
    points of demand's wall per forward for the stall basis), the mean per run, the mean over runs."""
    stem = {"03": "throttle_runs", "04": "bench", "07": "streams", "09": "cache_design_runs"}[
        claim.notebook[:2]
    ]
    per_run = []
    for run in sorted(RUNS.glob("run*"), key=lambda p: int(p.name[3:])):
        rows = pd.read_csv(run / f"{stem}.csv")
        a = (
            claim.a
            if claim.a != OTHERS
            else next(p for p in rows.policy.unique() if p not in (DEMAND, CONTROL))
        )
        keys = list(dict.fromkeys([*claim.by, *PAIR_KEYS]))
        values = [
            c
            for c in ("tokens_per_second", "forwards_per_second", "stall_seconds", "forwards", "seconds")
            if c in rows
        ]
        wide = rows.pivot_table(index=keys, columns="policy", values=values, aggfunc="first")
        if claim.basis == PERCENT:
            x = wide[claim.metric]
            sign = 1 if claim.b == DEMAND else -1
            d = (np.exp(np.log(x[a] / x[claim.b]) - sign * np.log(x[CONTROL] / x[DEMAND])) - 1) * 100
        else:
            pf = {p: wide["stall_seconds"][p] / wide["forwards"][p] for p in (a, CONTROL, DEMAND)}
            wall = wide["seconds"][DEMAND] / wide["forwards"][DEMAND]
            d = (pf[a] - pf[CONTROL]) / wall * 100
        per_run.append(d.groupby(level=list(claim.by)).mean())
    pooled = pd.concat(per_run, axis=1).mean(axis=1)
    return {
        k if isinstance(k, tuple) else (k,): float(v)
        for k, v in pooled.items()
        if claim.keeps(k if isinstance(k, tuple) else (k,))
    }


@pytest.mark.parametrize("key", [k for k, c in CLAIMS.items() if c.question == FASTER])
def test_every_stored_net_effect_is_the_oriented_difference_in_differences_of_the_raw_rows(key):
    claim = CLAIMS[key]
    want = sorted(round(v, 1) + 0.0 for v in _independent_nets(claim).values())
    record = json.loads((ROOT / "data" / "results" / "cpu" / f"{claim.notebook}.claims.json").read_text())
    measured = next(
        c["measured"] for c in record["claims"] if c.get("timing") and "net of the A/A" in c["claim"]
    )
    got = sorted(v + 0.0 for v in _nets(measured))
    assert want and got == pytest.approx(want, abs=0.051), (key, got, want)
