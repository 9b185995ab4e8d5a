"""`calibrate`: the verdict rules checked against known truth (artifact.experiments.verdicts.calibration):
synthetic studies of N runs per timing claim, with a planted true effect per cell and each cell's noise read
from the profile's stored runs, ruled by the real rules (pooling.replicate, judge.judge). Prints, per claim
and scenario, the coverage of the pooled and of a single fresh run's interval, the verdict rates, the power,
and how often a fresh run decides beside how many stored runs decide alone, each with its Monte-Carlo
standard error; then each cell's noise."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from artifact.errors import UserError
from artifact.experiments.settings import load_profile
from artifact.experiments.verdicts import calibration
from artifact.paths import atomic_write_text, check_writable
from artifact.validate import check_number

SHOWN = (
    "coverage",
    "coverage_single",
    "reproduced",
    "not_reproduced",
    "power",
    "fresh_decides",
    "fresh_wrong",
    "clear_decide",
    "stored_decide",
)


def render(t: pd.DataFrame) -> str:
    """The table as text: each rate as `rate +- se` (%), blank where the row does not measure it."""

    def pm(r, name):
        v, se = r[name], r[f"{name}_se"]
        return "" if pd.isna(v) else f"{v:.1f}+-{se:.1f}"

    show = t[["claim", "scenario", "truth", "studies"]].copy()
    for name in SHOWN:
        show[name] = [pm(r, name) for _, r in t.iterrows()]
    show["flag"] = t.decide_flag
    show["checks"] = t.checks
    return show.to_string(index=False)


def power_table(t: pd.DataFrame) -> str:
    """Each claim at the abstract's effect sizes (its power rows: the smallest direction effect, the tie's
    +0.73%, a true 0 for a non-superiority claim): how often the pooled design and one fresh run decide, and
    how often either is wrong."""
    rows = t[t.checks.str.contains("power")]
    show = pd.DataFrame(
        dict(
            claim=rows.claim,
            truth=rows.truth,
            pooled_reproduced=rows.power.round(1),
            pooled_wrong=rows.not_reproduced.round(1),
            fresh_decides=rows.fresh_decides.round(1),
            fresh_wrong=rows.fresh_wrong.round(1),
        )
    )
    return show.to_string(index=False)


def cmd_calibrate(a) -> int:
    check_number("--studies", a.studies, low=1, integer=True)  # each integer flag named, as every command's
    check_number("--processes", a.processes, low=1, integer=True)
    if a.pairs is not None:
        check_number("--pairs", a.pairs, low=2, integer=True)
    check_number("--seed", a.seed, low=0, integer=True)  # numpy's "expected non-negative integer" names none
    try:
        claims = calibration.claim_keys(a.claim)
    except ValueError as e:
        raise UserError(f"--claim: {e}") from e
    if a.out is not None:
        check_writable(a.out, "--out", a.force)
    P = load_profile(a.profile)
    try:
        t, noise = calibration.run(
            P, claims, a.studies, a.seed, a.processes, progress=not a.quiet, pairs=a.pairs
        )
    except ValueError as e:
        raise UserError(str(e)) from e
    print(
        f"calibration of the verdict rules on profile {P.name}'s stored runs: {a.studies} studies of "
        f"{calibration.RUNS} runs per claim and scenario, seed {a.seed}; rates in %, +- one Monte-Carlo se"
    )
    print(render(t))
    print("power at the abstract's effects (%): the stored design pooled, and one fresh run")
    print(power_table(t))
    disagree = t[t.decide_flag == "disagree"]
    if len(disagree):
        names = ", ".join(disagree.claim)
        print(f"fresh and stored runs decide at different rates (binomial p < 0.05): {names}")
    print(
        "noise per cell, from the stored runs (the claim's unit): sd within a run, n pairs, tau between runs"
    )
    print(noise.to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    if a.out is not None:
        atomic_write_text(a.out, t.round(3).to_csv(index=False))
        print(f"wrote {a.out}")
    return 0


def add_cli(subparsers) -> None:
    """Register `calibrate`."""
    c = subparsers.add_parser(
        "calibrate",
        help="check the verdict rules against known truth on synthetic studies (coverage, errors, power)",
    )
    c.add_argument(
        "--profile", default="cpu", help="the profile whose stored runs size the noise (default cpu)"
    )
    c.add_argument(
        "--claim", action="append", help="a timing claim of criteria/timing.py (repeatable; default all)"
    )
    c.add_argument(
        "--studies",
        type=int,
        default=calibration.STUDIES,
        help=f"synthetic studies per claim and scenario (default {calibration.STUDIES})",
    )
    c.add_argument("--processes", type=int, default=2, help="worker processes (default 2; 1: this process)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument(
        "--pairs",
        type=int,
        default=None,
        help="what if every run measured this many pairs per cell (a grid design; default: as stored)",
    )
    c.add_argument(
        "--out", type=Path, help="also write the table as CSV (atomically; an existing file needs --force)"
    )
    c.add_argument("--force", action="store_true", help="overwrite --out")
    c.add_argument("--quiet", action="store_true", help="no progress bar")
    c.set_defaults(fn=cmd_calibrate)
