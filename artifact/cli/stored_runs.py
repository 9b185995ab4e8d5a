"""`stored-runs`: the stored runs of a profile (data/results/PROFILE/runs/run<k>/: the timing notebooks' raw
rows and run.json), the coverage of the A/A control's intervals over them, and each timing claim's verdict
with the achieved half-widths of its intervals (each study's stored_claims)."""

from __future__ import annotations

import importlib
import math
from collections.abc import Sequence

from artifact.errors import UserError
from artifact.experiments.verdicts.pairs import run_effects
from artifact.experiments.verdicts.pooling import METHOD, Replicas, RunsError, t_interval
from artifact.experiments.settings import CONTROL, load_profile
from artifact.experiments.outputs.paired_table import CELL_KEYS
from artifact.experiments.verdicts.stored_runs import TIMED_STEMS, TIMED_STUDIES, run_meta, stored_rows, stored_runs


def coverage(P, stems: Sequence[str] = TIMED_STEMS, base: str = "demand") -> dict:
    """Over every stored grid that times CONTROL beside `base`: in how many cells the pooled interval of the
    A/A control contains 0, and in how many (cell, run) the interval over one run's pairs does (its true
    effect is 0, so a 95% interval should contain it about 95% of the time)."""
    out = {"pooled": [0, 0], "within": [0, 0], "runs": len(stored_runs(P.name))}
    for stem in stems:
        per_run = stored_rows(P, stem)
        have = [(n, r) for n, r in per_run if {CONTROL, base} <= set(r.policy)] if per_run else []
        if not have:
            continue
        for fp in sorted(
            set.intersection(
                *(set(r.fingerprint.astype(str)) if "fingerprint" in r else {""} for _, r in have)
            )
        ):
            kept = tuple(
                (n, r[r.fingerprint.astype(str) == fp] if "fingerprint" in r else r) for n, r in have
            )
            cols = set(kept[0][1].columns)
            metric = next((m for m in ("tokens_per_second", "forwards_per_second") if m in cols), None)
            if metric is None:
                continue
            by = [k for k in CELL_KEYS if k in cols]
            for r in Replicas(kept[0][1], kept, metric=metric).effects(CONTROL, base, by).values():
                if r.pooled is not None and r.pooled.usable:
                    out["pooled"][0] += r.pooled.low <= 0 <= r.pooled.high
                    out["pooled"][1] += 1
            for _, rows in kept:
                for eff in run_effects(rows, CONTROL, base, by, metric).values():
                    _, lo, hi = t_interval(eff.diffs)
                    if math.isfinite(lo):
                        out["within"][0] += lo <= 0 <= hi
                        out["within"][1] += 1
    return out


def coverage_text(P) -> str:
    runs = stored_runs(P.name)
    lines = [f"{len(runs)} stored runs of profile {P.name}:"]
    for r in runs:
        m = run_meta(r)
        lines.append(
            f"  {r.name}: commit {m.get('commit')}, {m.get('date')}, load average "
            f"{', '.join(f'{x:.1f}' for x in m.get('load_average') or [])}, {m.get('seconds')} s, "
            f"{len(m.get('files') or [])} row files"
        )
    c = coverage(P)
    for key, what in (("pooled", f"pooled over runs ({METHOD})"), ("within", "over one run's pairs")):
        k, n = c[key]
        lines.append(
            f"A/A control, 95% interval {what}: contains 0 in {k} of {n} cells"
            + (f" ({k / n:.0%})" if n else "")
        )
    return "\n".join(lines)


def claims_text(P) -> str:
    """Every timing claim as the stored runs rule it (each study's `stored_claims`): its verdict, the runs
    behind it and the achieved half-widths of its intervals (effect and A/A control, in points)."""
    lines = ["timing claims on the stored runs:"]
    for t in TIMED_STUDIES:
        for c in importlib.import_module(f"artifact.experiments.studies.{t.module}").stored_claims(P):
            if not c.timing:
                continue
            lines.append(f"  {t.notebook[:2]} {c.claim}")
            lines.append(
                f"     verdict: {c.verdict}; pooled over {len(c.per_run)} runs; per run "
                f"{', '.join(c.per_run) or '-'}"
            )
            widths = c.interval.split("; ", 1)[1] if "; " in c.interval else "no intervals"
            lines.append(f"     {widths}")
    return "\n".join(lines)


def cmd_stored_runs(a) -> int:
    P = load_profile(a.profile)
    found = stored_runs(P.name)
    if not found:
        raise UserError(
            f"profile {P.name}: no stored runs under data/results/{P.name}/runs/ (record them "
            "with "
            f"`PYTHONPATH=. python scripts/record_runs.py --profile {P.name} --runs 9`)"
        )
    try:
        print(coverage_text(P))
        print(claims_text(P))
    except RunsError as e:
        raise UserError(str(e)) from e
    return 0


def add_cli(subparsers) -> None:
    """Register `stored-runs`."""
    c = subparsers.add_parser(
        "stored-runs",
        help="the stored runs of a profile and how often the A/A control's intervals contain 0 over them",
    )
    c.add_argument("--profile", default="cpu", help="the profile whose stored runs to read (default: cpu)")
    c.set_defaults(fn=cmd_stored_runs)
