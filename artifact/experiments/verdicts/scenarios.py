"""The calibration's scenarios (calibration.py): the true effect planted in every cell, the noise of the
synthetic fresh run, and which verdicts are right for a planted truth.

    faster         as stored; zero (false reproduced); zero, t3; zero, x3 noise; the paper's smallest
                   effect, paper.FASTER_PCT[0] (false not reproduced; power); 03 takes it in points
    no difference  as stored; margin +3 (false reproduced); margin, t3; margin, x3 noise; zero (false not
                   reproduced); the paper's own effect at C/W 0.43, paper.AT_LOW (power)
    not faster     as stored; margin +3 (false reproduced); margin, t3; margin, x3 noise; zero (power)

"As stored" (each cell's pooled stored mean) comes four ways: the fresh run as noisy as a stored run, as
noisy as the fresh runs measured on this machine (FRESH_NOISE, fresh_runs.py), twice and three times the
stored runs' within-run noise."""

from __future__ import annotations

from dataclasses import dataclass

from artifact.experiments.criteria import paper, thresholds
from artifact.experiments.criteria.timing import FASTER, NO_DIFFERENCE, TimingClaim
from artifact.experiments.verdicts import next_step
from artifact.experiments.verdicts.rules import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED

MARGIN = thresholds.MARGIN
FRESH_NOISE = 1.7  # a fresh run's within-run sd over the stored runs': the quiet kept runs' median
# (tests/test_fresh_runs.py measures it on the kept quiet runs and holds the two together)


@dataclass(frozen=True)
class Scenario:
    name: str
    truth: float | None  # mu in every cell; None: each cell's stored pooled mean
    checks: str  # the rate the row measures
    tails: float = 0.0  # t degrees of freedom of the noise (0: normal)
    noise: float = 1.0  # the fresh run's within-run sd, in multiples of the stored runs' (its pairs only)


def scenarios(c: TimingClaim) -> tuple[Scenario, ...]:
    """The claim's default scenarios (the module docstring)."""
    fresh = f"fresh run x{FRESH_NOISE:g} noise"
    stored = (
        Scenario("as stored", None, "fresh run decides vs stored runs decide; clear cells decide"),
        Scenario(f"as stored, {fresh}", None, "what a fresh run here decides", noise=FRESH_NOISE),
        Scenario("as stored, x2 noise", None, "fresh decides; clear cells decide", noise=2.0),
        Scenario("as stored, x3 noise", None, "fresh run wrong <= 5%", noise=3.0),
    )
    if c.question == FASTER:
        return (
            *stored,
            Scenario("zero", 0.0, "false reproduced"),
            Scenario("zero, t3", 0.0, "false reproduced", 3.0),
            Scenario("zero, x3 noise", 0.0, "false reproduced; fresh run wrong <= 5%", noise=3.0),
            Scenario(f"paper {paper.FASTER_PCT[0]:+g}", paper.FASTER_PCT[0], "false not reproduced; power"),
        )
    edge = (
        Scenario("margin", MARGIN, "false reproduced"),
        Scenario("margin, t3", MARGIN, "false reproduced", 3),
        Scenario("margin, x3 noise", MARGIN, "false reproduced; fresh run wrong <= 5%", noise=3.0),
    )
    if c.question == NO_DIFFERENCE:
        at_low = Scenario(f"paper {paper.AT_LOW.diff_pct:+g}", paper.AT_LOW.diff_pct, "power")
        return (*stored, *edge, Scenario("zero", 0.0, "false not reproduced"), at_low)
    return (*stored, *edge, Scenario("zero", 0.0, "false not reproduced; power"))


def right_verdict(c: TimingClaim, truth: dict) -> tuple[str, str]:
    """The verdicts not wrong for these true effects: reproduced or inconclusive when the claim holds strictly
    in every cell, else not reproduced or inconclusive (on the boundary, next_step.distance 0, the rules'
    null holds: `reproduced` is the error)."""
    holds = all(next_step.distance(c.question, mu) > 0 for mu in truth.values())
    return (REPRODUCED if holds else NOT_REPRODUCED, INCONCLUSIVE)
