"""Real fresh runs, kept to check the calibration's model of one (data/results/<profile>/fresh_runs/): each is
the timing row files of one plain `./run_all.sh` in a fresh clone (TIMED_STEMS) with a run.json (its code
commit, date, wall time and the machine's load). Nothing rules on them; they answer two questions:

    noise_ratio   how much noisier a fresh run's pairs are than the stored runs': per timing claim, the sd
                  of a pair's effect pooled over the claim's comparison cells (pooling.Within), fresh over
                  stored; the median over claims and runs is what the harness's "fresh run" scenario
                  assumes (scenarios.FRESH_NOISE)
    decided       each timing claim ruled on each fresh run alone against the stored runs (judge.judge), as
                  ./run_all.sh rules it: how many claims a real fresh run decides, beside the share the
                  harness predicts

    python -m artifact fresh-runs --keep SRC NAME [--note TEXT]   copy a clone's rows in
    python -m artifact fresh-runs                                print both tables, write decided.csv"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from datetime import date
from pathlib import Path

import numpy as np
import pandas as pd

from artifact.experiments.criteria.timing import CLAIMS
from artifact.experiments.outputs.stored_runs import TIMED_STUDIES, notebook_rows, row_files, runs_root
from artifact.experiments.settings import load_profile
from artifact.experiments.verdicts import judge
from artifact.experiments.verdicts.pooling import Replicas, Within
from artifact.experiments.verdicts.rules import INCONCLUSIVE
from artifact.paths import atomic_write_text

FOLDER = "fresh_runs"


def root(profile: str) -> Path:
    return runs_root(profile).parent / FOLDER


def fresh_runs(profile: str) -> list[Path]:
    d = root(profile)
    return sorted(p for p in d.iterdir() if p.is_dir() and (p / "run.json").is_file()) if d.is_dir() else []


def rule(P, key: str, folder: Path) -> judge.Timed | None:
    """Claim `key` ruled on the fresh run in `folder` alone, against the stored runs (None: no rows)."""
    c = CLAIMS[key]
    this, stored = notebook_rows(P, c.notebook, folder)
    if this is None:
        return None
    return judge.judge(judge.claim_compared(Replicas(this, stored), c), c, str)


def _within(compared) -> tuple[Within, Within]:
    """(this run's, the stored runs') within-run noise of the claim's effect, pooled over its cells."""
    reps = list(compared.effects.values())
    if not reps:
        return Within(float("nan"), 0), Within(float("nan"), 0)
    mine = Within.of(r.own for r in reps)
    theirs = Within.pooled(Within.of(r.per[i] for r in reps) for i in range(len(reps[0].per)))
    return mine, theirs


def tables(profile: str = "cpu") -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per fresh run and claim: verdict, the stored verdict, noise ratio; per claim: decided of runs)."""
    P = load_profile(profile)
    out = []
    for folder in fresh_runs(profile):
        for key in CLAIMS:
            c = CLAIMS[key]
            this, stored = notebook_rows(P, c.notebook, folder)
            if this is None:
                continue
            comp = judge.claim_cells(judge.claim_compared(Replicas(this, stored), c), c)
            t = judge.judge(comp, c, str)
            mine, theirs = _within(comp)
            ratio = float(np.sqrt(mine.var / theirs.var)) if theirs.var > 0 and mine.df else float("nan")
            out.append(
                dict(run=folder.name, claim=key, verdict=t.verdict, stored=t.pooled, noise_ratio=ratio)
            )
    per = pd.DataFrame(out)
    if per.empty:
        return per, per
    summary = per.groupby("claim", sort=False).agg(
        runs=("run", "size"),
        decided=("verdict", lambda v: int((v != INCONCLUSIVE).sum())),
        agree=("verdict", lambda v: int((v == per.loc[v.index, "stored"]).sum())),
        noise_ratio=("noise_ratio", "median"),
    )
    return per, summary.reset_index()


def keep(src: Path, name: str, profile: str = "cpu", note: str = "", seconds: float | None = None) -> Path:
    """Copy a clone's timing row files (its data/results/<profile>/) into fresh_runs/NAME with a run.json;
    refuses an existing NAME (results are never overwritten)."""
    dest = root(profile) / name
    if dest.exists():
        raise FileExistsError(f"{dest} exists: choose another NAME (fresh runs are never overwritten)")
    P = load_profile(profile)
    files = [f for t in TIMED_STUDIES for s in t.stems for f in row_files(P, s, src)]
    if not files:
        raise FileNotFoundError(
            f"{src}: no timing row files ({', '.join(t.stems[0] for t in TIMED_STUDIES)})"
        )
    tmp = dest.with_name(f".{name}.tmp")
    tmp.mkdir(parents=True)
    for f in files:
        shutil.copy2(f, tmp / f.name)
    clone = src.resolve().parents[2]
    commit = subprocess.run(
        ["git", "-C", str(clone), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    meta = dict(date=str(date.today()), commit=commit, note=note, seconds=seconds, load=os.getloadavg())
    atomic_write_text(tmp / "run.json", json.dumps(meta, indent=1) + "\n")
    tmp.rename(dest)
    return dest
