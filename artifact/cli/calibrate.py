"""`calibrate`: the verdict pipeline checked against known truth (artifact.experiments.calibration): synthetic
stored runs of every timing claim's grid with a known true effect, role bias, slot bias and noise sized on the
stored runs, ruled by the real pipeline; prints coverage, verdict rates and fresh runs' opposite verdicts per
claim and scenario, and 08's model-error rule beside them."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from artifact.errors import UserError
from artifact.experiments import calibration
from artifact.experiments.criteria import thresholds
from artifact.experiments.settings import load_profile
from artifact.paths import atomic_write_text, check_writable

COLUMNS = {
    "cover_effect": "cover A/B %",
    "cover_net": "cover net %",
    "cover_single": "cover 1 run %",
    "reproduced": "R %",
    "not_reproduced": "NR %",
    "cell_reproduced": "cell R %",
    "cell_not_reproduced": "cell NR %",
    "fresh": "fresh",
    "fresh_opposite": "opposite",
    "fresh_decides": "decides %",
    "runs_aligned": "runs aligned %",
}


def render(t: pd.DataFrame, markdown: bool = False) -> str:
    """The calibration table as text (or, with `markdown`, as the table docs/verdicts.md holds)."""
    show = t.rename(columns=COLUMNS).drop(
        columns=["noise_pair", "noise_run", "question", "demand", "studies"]
    )
    if not markdown:
        return show.to_string(index=False, float_format=lambda x: f"{x:.1f}")
    cells = [
        [f"{v:.1f}" if isinstance(v, float) else str(v) for v in row] for row in show.itertuples(index=False)
    ]
    head = list(show.columns)
    return "\n".join(
        ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        + ["| " + " | ".join(r) + " |" for r in cells]
    )


def cmd_calibrate(a) -> int:
    P = load_profile(a.profile)
    if a.out is not None:
        check_writable(a.out, "--out", a.force)
    scenarios = calibration.SCENARIOS
    if a.scenario:
        names = {s.name: s for s in scenarios}
        bad = [n for n in a.scenario if n not in names]
        if bad:
            raise UserError(f"--scenario {bad[0]!r}: expected one of {', '.join(map(repr, names))}")
        scenarios = tuple(names[n] for n in a.scenario)
    try:
        rows = calibration.run(
            P, a.claim or None, scenarios, a.studies, a.fresh, a.family, a.seed, processes=a.processes
        )
    except ValueError as e:
        raise UserError(str(e)) from e
    t = calibration.table(rows)
    print(
        f"calibration of the verdict pipeline on profile {P.name}'s stored runs: {a.studies} studies per "
        "claim and "
        f"scenario, {a.fresh} fresh runs each, family {a.family}, seed {a.seed}"
    )
    print(render(t, a.markdown))
    m = calibration.model_error(studies=a.studies, fresh=a.fresh, seed=a.seed)
    print(
        f"08 model error (median of 9 run figures, truth at the limit {thresholds.MODEL_ERROR:.0%}, run sd "
        "2 points):"
        f" reproduced {m['reproduced']:.1f}%, not reproduced {m['not_reproduced']:.1f}%, "
        f"{m['fresh_opposite']} of "
        f"{m['fresh']} fresh runs opposite, a fresh run decides in {m['fresh_decides']:.1f}%"
    )
    noise = t.drop_duplicates("claim").set_index("claim")[["question", "demand", "noise_pair", "noise_run"]]
    print("noise sized on the stored runs (points): pair = within-run sd of a pair, run = between-run sd")
    print(noise.to_string(float_format=lambda x: f"{x:.2f}"))
    if a.out is not None:
        atomic_write_text(a.out, t.round(3).to_csv(index=False))
        print(f"wrote {a.out}")
    return 0


def add_cli(subparsers) -> None:
    """Register `calibrate`."""
    c = subparsers.add_parser(
        "calibrate",
        help="check the verdict pipeline against known truth on synthetic "
        "stored runs (coverage, error rates, fresh runs' verdicts)",
    )
    c.add_argument(
        "--profile", default="cpu", help="the profile whose stored runs shape the studies (default cpu)"
    )
    c.add_argument(
        "--claim", action="append", help="a timing claim of criteria/timing.py (repeatable; default all)"
    )
    c.add_argument("--scenario", action="append", help="a scenario by name (repeatable; default all)")
    c.add_argument(
        "--studies", type=int, default=1000, help="simulated studies per claim and scenario (1000)"
    )
    c.add_argument("--fresh", type=int, default=10, help="fresh runs ruled beside each study (10)")
    c.add_argument(
        "--family",
        default=thresholds.FAMILY,
        choices=("bonferroni", "none"),
        help=f"how a claim over k cells rules `not reproduced` (default {thresholds.FAMILY})",
    )
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--processes", type=int, default=None, help="worker processes (default: one per core)")
    c.add_argument(
        "--out", type=Path, help="also write the table as CSV (atomically; never over a file without --force)"
    )
    c.add_argument("--force", action="store_true", help="overwrite --out")
    c.add_argument("--markdown", action="store_true", help="print the table as markdown (docs/verdicts.md's)")
    c.set_defaults(fn=cmd_calibrate)
