"""`stored-runs`: the stored runs of a profile (data/results/PROFILE/runs/run<k>/: the timing notebooks' raw
rows and run.json), how often the A/A's intervals over them contain 0, and each timing claim's verdict as the
stored runs rule it (each study's stored_claims). `--rule-again` writes those verdicts into the profile's
committed claim records (the timing claims only, matched by their key), at the current rules version."""

from __future__ import annotations

import importlib
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict

import pandas as pd

from artifact.errors import RunsError, UserError
from artifact.experiments.bench.grid import CELL_KEYS
from artifact.experiments.outputs.paths import RECORD_SUFFIX, reference_data_dir, short_path
from artifact.experiments.outputs.stored_runs import (
    TIMED_STEMS,
    TIMED_STUDIES,
    check_stored_runs,
    row_files,
    run_meta,
    runs_root,
    stored_rows,
)
from artifact.experiments.settings import load_profile
from artifact.experiments.verdicts.pairs import run_effects
from artifact.experiments.verdicts.pooling import one_run, pooled
from artifact.experiments.verdicts.records import RULES_VERSION
from artifact.paths import atomic_write_text


def check_stored_rows(P, stems: Sequence[str] = TIMED_STEMS) -> None:
    """Every stored run's row file of a grid has the columns and the policies that most of the runs' files of
    that name have (what the claims rule on); else RunsError naming the run, the file and what differs: a
    file that lost its metric column, or holds a policy no other run measured, is refused in one line rather
    than failing inside a verdict."""
    seen: dict[str, list[tuple[str, tuple, tuple]]] = {}
    for run in check_stored_runs(P.name):
        for stem in stems:
            for f in row_files(P, stem, run):
                try:
                    rows = pd.read_csv(f)
                except (OSError, ValueError) as e:
                    raise RunsError(f"{short_path(f)}: unreadable as CSV ({e})") from None
                policies = tuple(sorted(rows.policy.astype(str).unique())) if "policy" in rows else ()
                seen.setdefault(f.name, []).append((run.name, tuple(sorted(rows.columns)), policies))
    for name, per_run in seen.items():
        for i, what in ((1, "columns"), (2, "policies")):
            counts = Counter(r[i] for r in per_run)
            want = counts.most_common(1)[0][0]
            for r in per_run:
                if r[i] != want:
                    lacks, extra = sorted(set(want) - set(r[i])), sorted(set(r[i]) - set(want))
                    raise RunsError(
                        f"{short_path(runs_root(P.name))}/{r[0]}/{name}: "
                        + "; ".join(
                            ([f"lacks {what} {lacks}"] if lacks else [])
                            + ([f"has {what} {extra}"] if extra else [])
                        )
                        + f", unlike {counts[want]} of the {len(per_run)} stored runs' {name}; the claims "
                        "rule on what every run measured (record the runs again)"
                    )


def coverage(P, stems: Sequence[str] = TIMED_STEMS) -> dict:
    """Over every stored grid with an A/A (its true effect is 0): in how many cells its pooled interval over
    the runs contains 0, and in how many (cell, run) the interval over one run's pairs does."""
    out = {"pooled": [0, 0], "within": [0, 0], "runs": len(check_stored_runs(P.name))}
    for stem in stems:
        per_run = [rows for _, rows in stored_rows(P, stem)]
        if not per_run:
            continue
        cols = set(per_run[0].columns)
        metric = next((m for m in ("tokens_per_second", "forwards_per_second") if m in cols), None)
        by = [k for k in CELL_KEYS if k in cols]
        if metric is None:
            continue
        effects = [run_effects(rows, "A/A", "demand", by, metric) for rows in per_run]
        for key in set().union(*effects):
            means = [float(e[key].mean()) for e in effects if key in e and len(e[key])]
            iv = pooled(means)
            if iv is not None:
                out["pooled"][0] += iv.low <= 0 <= iv.high
                out["pooled"][1] += 1
            for e in effects:
                if key in e and len(e[key]) >= 2:
                    w = one_run(e[key], [])
                    out["within"][0] += w.low <= 0 <= w.high
                    out["within"][1] += 1
    return out


def coverage_text(P) -> str:
    runs = check_stored_runs(P.name)
    lines = [f"{len(runs)} stored runs of profile {P.name}:"]
    for r in runs:
        m = run_meta(r)
        load = m.get("load_average")
        load = ", ".join(f"{x:.1f}" for x in load) if isinstance(load, list) else str(load)
        lines.append(f"  {r.name}: commit {m.get('commit')}, {m.get('date')}, load average {load}")
    c = coverage(P)
    for key, what in (("pooled", "pooled over runs"), ("within", "over one run's pairs")):
        k, n = c[key]
        share = f" ({k / n:.0%})" if n else ""
        lines.append(f"A/A, 95% interval {what}: contains 0 in {k} of {n} cells{share}")
    return "\n".join(lines)


def ruled_claims(P) -> dict[str, list]:
    """{notebook: its timing claims as the stored runs rule them}."""
    out = {}
    for t in TIMED_STUDIES:
        module = importlib.import_module(f"artifact.experiments.studies.{t.module}")
        out[t.notebook] = [c for c in module.stored_claims(P) if c.timing]
    return out


def claims_text(ruled: dict[str, list]) -> str:
    lines = ["timing claims on the stored runs:"]
    for notebook, claims in ruled.items():
        for c in claims:
            lines.append(
                f"  {notebook[:2]} {c.key or c.claim}: {c.verdict}; per run {', '.join(c.per_run) or '-'}"
            )
    return "\n".join(lines)


def rule_again(P, ruled: dict[str, list]) -> list[str]:
    """Write the stored runs' timing verdicts into the committed claim records (matched by key, else by the
    claim's text); returns the flips, one line each."""
    flips = []
    for notebook, claims in ruled.items():
        path = reference_data_dir(P.name) / f"{notebook}{RECORD_SUFFIX}"
        doc = json.loads(path.read_text())
        old = [c for c in doc["claims"] if c.get("timing")]
        kept = [c for c in doc["claims"] if not c.get("timing")]
        for c in claims:
            was = next((o for o in old if (o.get("key") or o["claim"]) == (c.key or c.claim)), None)
            if was and was["verdict"] != c.verdict:
                flips.append(f"{notebook} {c.key}: {was['verdict']} -> {c.verdict}")
        doc["claims"] = kept + [asdict(c) for c in claims]
        doc["rules_version"] = RULES_VERSION
        atomic_write_text(path, json.dumps(doc, indent=1) + "\n")
    return flips


def cmd_stored_runs(a) -> int:
    P = load_profile(a.profile)
    if not check_stored_runs(P.name):
        raise UserError(
            f"profile {P.name}: no stored runs under data/results/{P.name}/runs/ (record them with "
            f"`PYTHONPATH=. python scripts/record_runs.py --profile {P.name} --runs 9`)"
        )
    try:
        check_stored_rows(P)
        print(coverage_text(P))
        ruled = ruled_claims(P)
        print(claims_text(ruled))
        if a.rule_again:
            flips = rule_again(P, ruled)
            print(
                f"records rewritten at rules version {RULES_VERSION}; flips: " + ("; ".join(flips) or "none")
            )
    except RunsError as e:
        raise UserError(str(e)) from e
    return 0


def add_cli(subparsers) -> None:
    """Register `stored-runs`."""
    c = subparsers.add_parser(
        "stored-runs",
        help="the stored runs of a profile, their A/A coverage and the timing verdicts they give",
    )
    c.add_argument("--profile", default="cpu", help="the profile whose stored runs to read (default: cpu)")
    c.add_argument(
        "--rule-again",
        action="store_true",
        help="write the stored runs' timing verdicts into the profile's committed claim records",
    )
    c.set_defaults(fn=cmd_stored_runs)
