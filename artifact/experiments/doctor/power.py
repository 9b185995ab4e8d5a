"""The design's chance to decide notebook 04's claims, under assumed noise.

GPU noise is unmeasured (no stored GPU runs), so the noise is assumed: each cell of the profile's grid that is
one of the claim's cells takes the cpu profile's stored runs' noise (calibration.noise: the within-run sd of a
pair's effect and the between-run sd tau, in % of tokens/s, so relative noise) of the cell with its batch size
and C/W, else the claim's noisiest cpu cell, with the profile's pairs per run (repetitions). The calibration
harness (calibration.calibrate, POWER_STUDIES seeded studies) then rules `runs` runs of that design with the
true effect the abstract's: the smallest direction effect for 04-faster (paper.FASTER_PCT[0]) and
04-equal's effect at C/W 0.43 (paper.AT_LOW). Power is the share of studies ruled reproduced.
"""

from __future__ import annotations

import dataclasses

from artifact.errors import RunsError
from artifact.experiments.bench.grid import grid
from artifact.experiments.criteria import paper
from artifact.experiments.criteria.timing import CLAIMS
from artifact.experiments.settings import Settings, load_profile
from artifact.experiments.verdicts import calibration

POWER_STUDIES = 100  # synthetic studies per claim (seeded: the same figures every time)
TRUTHS = {"04-faster": paper.FASTER_PCT[0], "04-equal": paper.AT_LOW.diff_pct}  # the abstract's effects


def power(P: Settings, runs: int) -> dict[str, float | None]:
    """{claim: % of studies ruled reproduced, or None where the grid has none of the claim's cells}."""
    cpu = load_profile("cpu")
    keys = [c.key for c in grid(P)]
    out = {}
    for claim, truth in TRUTHS.items():
        mine = [k for k in keys if CLAIMS[claim].keeps(k)]
        if not mine:
            out[claim] = None
            continue
        cn = calibration.noise(cpu, CLAIMS[claim])
        design = dataclasses.replace(
            cn,
            cells={k: assumed(cn.cells, k, P.repetitions) for k in mine},
            aa={k: assumed(cn.aa, k, P.repetitions) for k in mine},
            stored_decide=0,
            runs=0,
        )
        s = calibration.Scenario(f"paper {truth:+g}", truth, "power")
        t = calibration.calibrate(
            [design], POWER_STUDIES, seed=0, processes=1, progress=False, runs=runs, plan=[s]
        )
        out[claim] = float(t.reproduced.iloc[0])
    return out


def assumed(noise: dict, key, pairs: int):
    """The cpu cell's noise with key's batch size and C/W (else the noisiest), with `pairs` pairs per run."""
    same = [z for k, z in noise.items() if (k.batch_size, k.cache_ratio) == (key.batch_size, key.cache_ratio)]
    z = same[0] if same else max(noise.values(), key=lambda z: z.sd + z.tau)
    return dataclasses.replace(z, n=pairs)


def power_lines(P: Settings, runs: int) -> list[str]:
    """The power line of the report (module docstring), or why it was not computed."""
    if runs < 2:
        return [f"power: not computed for {runs} run (the harness pools at least 2)"]
    try:
        found = power(P, runs)
    except (ValueError, RunsError) as e:
        return [f"power: not computed (the cpu stored runs' noise: {e})"]
    noise = "the cpu stored runs' per-cell noise"
    if P.device.startswith("cuda"):
        noise = f"GPU noise unmeasured; assumed: {noise} in % of tokens/s"
    parts = [
        f"{claim} at {TRUTHS[claim]:+g}%: " + ("no cell of it in this grid" if p is None else f"{p:.0f}%")
        for claim, p in found.items()
    ]
    return [
        f"power: the chance that {runs} runs rule reproduced at the abstract's effects, {'; '.join(parts)} "
        f"({noise}, {P.repetitions} pairs per run; {POWER_STUDIES} seeded studies of calibration.calibrate)"
    ]
