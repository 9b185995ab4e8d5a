"""Each timing claim's definition, written once: which policy is A and which is B, the question it asks of
each cell, the basis a pair is measured on, the metric, the cells it rules on and the paper's range. The
studies read their claims from here (verdicts.judge), and so does the calibration harness (python -m artifact
calibrate): one definition for the verdict and for its check against known truth. A change to a definition
that changes a verdict is a rule change (docs/verdicts.md's rule history).

`a` may be OTHERS: every policy of the grid but B, demand and the stand-in A/A (06's predictors, 09's best
eviction), one comparison each. `select` keeps a cell when, for every (key, values) pair, the cell's key field
lies in `values` (two numbers: an inclusive range; else a set of allowed values)."""

from __future__ import annotations

from dataclasses import dataclass

from artifact.experiments.criteria import paper

FASTER, NO_DIFFERENCE, NOT_FASTER = "faster", "no difference", "not faster"  # verdicts.rules' questions
PERCENT, STALL_SHARE = "percent", "stall share"  # verdicts.pairs' bases
OTHERS = "*"  # `a`: every other policy of the grid (each against B)
DEMAND = "demand"  # every claim compares a policy with demand; the A/A is demand against demand

CELL = ("task", "batch_size", "cache_ratio", "bandwidth_scale")  # bench.grid.CELL_KEYS: an interval each


@dataclass(frozen=True)
class TimingClaim:
    key: str  # "<notebook number>-<short name>"
    notebook: str
    a: str
    b: str
    question: str  # FASTER, NO_DIFFERENCE or NOT_FASTER
    metric: str
    basis: str = PERCENT
    by: tuple[str, ...] = CELL  # the keys of one cell
    select: tuple[tuple[str, tuple], ...] = ()
    paper: tuple[float, float] | None = None  # a direction claim's paper range, reported beside, never ruling
    unit: str = "%"

    def __post_init__(self):
        if self.question not in (FASTER, NO_DIFFERENCE, NOT_FASTER):
            raise ValueError(
                f"{self.key}: question {self.question!r} is not one of faster, no difference, not faster"
            )
        if DEMAND not in (self.a, self.b):
            raise ValueError(f"{self.key}: demand must be A or B (each claim compares a policy with demand)")
        for k, _ in self.select:
            if k not in self.by:
                raise ValueError(f"{self.key}: select key {k!r} is not one of the cell keys {self.by}")

    def keeps(self, key: tuple) -> bool:
        """Whether a cell (its key, in `by` order) is one of this claim's cells."""
        for name, values in self.select:
            v = key[self.by.index(name)]
            if len(values) == 2 and all(isinstance(x, float) for x in values):
                if not values[0] <= v <= values[1]:
                    return False
            elif v not in values:
                return False
        return True


CLAIMS = {
    c.key: c
    for c in (
        TimingClaim(
            "03-stall",
            "03_bandwidth_throttling",
            "last_step",
            DEMAND,
            FASTER,
            "stall_seconds",
            STALL_SHARE,
            unit=" points",
        ),
        TimingClaim(
            "04-faster",
            "04_capacity_sweep",
            DEMAND,
            "last_step",
            FASTER,
            "tokens_per_second",
            select=(("cache_ratio", paper.FASTER_RANGE),),
            paper=paper.FASTER_PCT,
        ),
        TimingClaim(
            "04-equal",
            "04_capacity_sweep",
            DEMAND,
            "last_step",
            NO_DIFFERENCE,
            "tokens_per_second",
            select=(("cache_ratio", (paper.AT_LOW.cache_ratio,)),),
        ),
        TimingClaim(
            "05-refresh", "05_tide_head_to_head", "interval_refresh", DEMAND, NOT_FASTER, "tokens_per_second"
        ),
        TimingClaim(
            "06-priority",
            "06_beyond_the_paper",
            OTHERS,
            DEMAND,
            NOT_FASTER,
            "tokens_per_second",
            by=("link_priority", *CELL),
            select=(("link_priority", ("demand",)),),
        ),
        TimingClaim(
            "07-streams",
            "07_routing_map",
            DEMAND,
            "last_step",
            FASTER,
            "forwards_per_second",
            by=("task",),
            paper=paper.FASTER_PCT,
        ),
        TimingClaim("09-eviction", "09_cache_design_space", OTHERS, DEMAND, FASTER, "tokens_per_second"),
    )
}
