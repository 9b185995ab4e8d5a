"""The synthetic stored runs of the calibration harness (the model in the package docstring): the scenarios,
the noise sized on the stored runs, the true effect, and the generator that writes a claim's grid with
them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from artifact.experiments.criteria import thresholds
from artifact.experiments.criteria.timing import DEMAND, FASTER, NO_DIFFERENCE, OTHERS, TimingClaim
from artifact.experiments.effects import BASES
from artifact.experiments.settings import CONTROL
from artifact.experiments.stats import PAIR_KEYS


@dataclass(frozen=True)
class Scenario:
    name: str
    truth: str = "boundary"  # "boundary": T = +m; "clear": T on the claim's side, `clear` run sds away;
    # "stored": each cell's T and role bias are the stored runs' pooled net
    # effect
    # and A/A control (the scenario a fresh run of this commit faces)
    role_bias: float = 0.0  # % the non-demand role costs (tokens/s lower; stall higher by these points);
    # negative: it gains
    slot_bias: float = 2.0  # % the first slot of a repetition costs
    outlier: float = 0.0  # one run's A side shifted by this many between-run sds (0: none)
    tails: float | None = None  # t degrees of freedom of u and e (None: normal)
    missing_cell: bool = False  # the first stored run lacks one cell of the claim
    clear: float = 4.0


SCENARIOS = (
    Scenario("boundary"),
    Scenario("boundary, non-demand role 5% slower", role_bias=5.0),
    Scenario("boundary, non-demand role 5% faster", role_bias=-5.0),
    Scenario("boundary, outlier run, heavy tails", outlier=5.0, tails=3.0),
    Scenario("clear, non-demand role 5% slower", truth="clear", role_bias=5.0),
    Scenario("clear, a run lacks a cell", truth="clear", missing_cell=True),
    Scenario("as stored", truth="stored", slot_bias=0.0),
)
AS_STORED = SCENARIOS[-1].name


@dataclass(frozen=True)
class Noise:
    """The spread of the claim's per-pair effect in the stored runs (points on the additive scale): `pair`,
    the within-run sd of one pair's difference (pooled over cells and runs), `run`, the between-run sd of a
    run's true effect (the sd of the runs' per-cell means less the pairs' share, the median over cells)."""

    pair: float
    run: float
    pairs: int  # pairs per cell per run (median)

    @classmethod
    def of(cls, compared) -> "Noise":
        cells = [[p for p in r.per if p is not None and len(p.diffs) >= 1] for r in compared.effects.values()]
        cells = [per for per in cells if len(per) >= 2]
        if not cells:
            raise ValueError("no cell with two stored runs: nothing to size the noise on")
        within = [p.pooled_sd for per in cells for p in per if p.pooled_sd is not None]
        pair = float(np.median(within)) if within else 0.0
        counts = [float(np.median([len(p.diffs) for p in per])) for per in cells]
        between = [
            math.sqrt(max(float(np.std([p.mean for p in per], ddof=1)) ** 2 - pair**2 / n, 0.0))
            for per, n in zip(cells, counts)
        ]
        return cls(pair, float(np.median(between)), int(np.median(counts)))

    @property
    def run_mean(self) -> float:
        """The sd of one run's mean effect in a cell."""
        return math.sqrt(self.run**2 + self.pair**2 / max(self.pairs, 1))


def true_effect(c: TimingClaim, s: Scenario, noise: Noise) -> float:
    """The claim's true effect T (A over B, net of every bias: what the net effect estimates) in the
    scenario."""
    m = thresholds.MARGIN
    if s.truth == "boundary":
        return m
    away = s.clear * noise.run_mean
    return {FASTER: m + away, NO_DIFFERENCE: 0.0}.get(c.question, m - away)


class Generator:
    """Synthetic runs of one claim's grid in one scenario: the stored runs' rows as the template, the claim's
    metric (or the stall basis' columns) drawn from the model of the module docstring."""

    def __init__(
        self,
        c: TimingClaim,
        template: Sequence[tuple[str, pd.DataFrame]],
        noise: Noise,
        s: Scenario,
        rng: np.random.Generator,
        stored: dict | None = None,
    ):
        """`stored`: {claim key: (net %, control %)}, the stored runs' pooled estimates, for truth
        "stored"."""
        self.c, self.s, self.noise, self.rng = c, s, noise, rng
        self.basis = BASES[c.basis]
        if s.truth == "stored" and not stored:
            raise ValueError(f"scenario {s.name!r} needs the stored runs' estimates per cell")
        self.T = true_effect(c, s, noise) if s.truth != "stored" else float("nan")
        self.stored = stored or {}
        self.runs = [(name, self._prepare(rows)) for name, rows in template]

    def _truth(self, key) -> tuple[float, float]:
        """(T %, the non-demand role's additive shift) of one claim key (A over B: a cell, or (policy,
        cell))."""
        if self.s.truth != "stored":
            return self.T, self._cost(self.s.role_bias)
        net, control = self.stored.get(key, (0.0, 0.0))  # a cell the stored runs lack: no effect, no bias
        return net, (100.0 * math.log1p(control / 100.0) if self.basis.ratio else control)

    def _scale(self, T: float) -> float:
        return 100.0 * math.log1p(T / 100.0) if self.basis.ratio else T

    def _prepare(self, rows: pd.DataFrame):
        keep = [
            k for k in (*self.c.by, *PAIR_KEYS, "policy", "order", self.c.metric, "fingerprint") if k in rows
        ]
        rows = rows[list(dict.fromkeys(keep))].reset_index(drop=True)
        if self.basis.ratio:
            base = rows[self.c.metric].astype(float).groupby([rows[k] for k in self.c.by]).transform("median")
            rows = rows.assign(_base=base.to_numpy())
        else:
            rows = rows.assign(forwards=100, seconds=10.0, stall_seconds=0.0)  # 0.1 s per forward
        cell = rows.groupby(list(self.c.by), sort=True).ngroup().to_numpy()
        pair = rows.groupby([*self.c.by, "rep"], sort=True).ngroup().to_numpy()
        pol = rows.policy.astype(str).to_numpy()
        a_side = (pol == self.c.a) if self.c.a != OTHERS else ~np.isin(pol, [self.c.b, DEMAND, CONTROL])
        b_side = (pol == self.c.b) & (pol != DEMAND)
        nondemand = pol != DEMAND
        slot0 = rows["order"].to_numpy() == 0 if "order" in rows else np.zeros(len(rows), bool)
        cells = [tuple(r) for r in rows[list(self.c.by)].itertuples(index=False)]
        if self.c.a == OTHERS:  # a key is (policy, cell); demand's and the control's rows read the first A's
            others = [p for p in dict.fromkeys(pol) if p not in (self.c.b, DEMAND, CONTROL)]
            cells = [(p if p in others else others[0], k) for p, k in zip(pol, cells)]
        truth = [self._truth(k) for k in cells]
        tau = np.array([self._scale(t) for t, _ in truth])
        role = np.array([r for _, r in truth])
        fixed = -tau * b_side if self.c.a == DEMAND else tau * a_side
        fixed = fixed + role * nondemand + self._cost(self.s.slot_bias) * slot0
        policies = {p: i for i, p in enumerate(sorted(set(pol)))}
        return rows, cell, pair, np.array([policies[p] for p in pol]), fixed, a_side

    def _cost(self, pct: float) -> float:
        """A cost of `pct` on the additive scale: less metric on a ratio basis, more stall on the stall
        basis."""
        return (
            100.0 * math.log1p(-abs(pct) / 100.0) * np.sign(pct)
            if self.basis.ratio
            else abs(pct) * np.sign(pct)
        )

    def _draw(self, size) -> np.ndarray:
        if self.s.tails is None:
            return self.rng.standard_normal(size)
        t = self.rng.standard_t(self.s.tails, size)
        return t / math.sqrt(self.s.tails / (self.s.tails - 2))  # unit variance

    def run(self, k: int, outlier: bool = False) -> pd.DataFrame:
        """One synthetic run with the k-th stored run's rows as its template."""
        rows, cell, pair, pol, fixed, a_side = self.runs[k % len(self.runs)][1]
        n_pol = pol.max() + 1
        u = self._draw((cell.max() + 1, n_pol)) * self.noise.run / math.sqrt(2)
        e = self._draw(len(rows)) * self.noise.pair / math.sqrt(2)
        h = self.rng.standard_normal(pair.max() + 1) * 2.0
        y = fixed + u[cell, pol] + e + h[pair]
        if outlier:
            y = y + a_side * self.s.outlier * self.noise.run
        return self._rows(rows, y)

    def _rows(self, rows: pd.DataFrame, y: np.ndarray) -> pd.DataFrame:
        out = rows.copy()
        if self.basis.ratio:
            out[self.c.metric] = rows["_base"].to_numpy() * np.exp(y / 100.0)
        else:
            out["stall_seconds"] = (20.0 + y) / 100.0 * 10.0  # 20 points of stall beside the effect
        return out

    def study(self) -> list[tuple[str, pd.DataFrame]]:
        """N synthetic stored runs (one of them an outlier run when the scenario says so; the first lacking
        one cell of the claim when it says so)."""
        n = len(self.runs)
        odd = int(self.rng.integers(n)) if self.s.outlier else -1
        runs = [(name, self.run(k, outlier=k == odd)) for k, (name, _) in enumerate(self.runs)]
        if self.s.missing_cell:
            name, rows = runs[0]
            keys = rows[list(self.c.by)].drop_duplicates()
            keep = [tuple(r) for r in keys.itertuples(index=False) if self.c.keeps(tuple(r))]
            drop = keep[-1]
            mask = np.logical_and.reduce([rows[k].to_numpy() == v for k, v in zip(self.c.by, drop)])
            runs[0] = (name, rows[~mask].reset_index(drop=True))
        return runs

    def targets(self, key=None) -> tuple[float, float]:
        """(A over B, its net of the role bias) true values of a claim key in the claim's unit: what the
        pooled effect and net intervals should contain (`key` matters only for truth "stored")."""
        T, role = self._truth(key)
        tau = self._scale(T)
        if self.basis.ratio:
            shift = tau + role if self.c.b == DEMAND else tau - role
            return math.expm1(shift / 100.0) * 100.0, T
        return (tau + role if self.c.b == DEMAND else tau - role), T
