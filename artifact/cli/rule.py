"""`rule`: a named claim's rule applied to 95% intervals given by hand, one per cell (the paper's printed
results, or a reviewer's own table): prints the verdict and the reason. `--list` names the claims.

    python -m artifact rule 04-equal --cell 0.73 -1.16 2.63
    python -m artifact rule 04-faster --cell 4.9 '>0' '?' --cell 11.8 '>0' '?'

A LOW bound may be ">0" (stated only as above 0, as the paper states its direction intervals), either bound
"?" (not stated: the other bound mirrored about the effect); every number finite, LOW <= EFFECT <= HIGH. A
value refused is named as typed, with what is expected (one line, exit 2). No A/A gates intervals given by
hand."""

from __future__ import annotations

import math
import re

from artifact.errors import UserError
from artifact.experiments.criteria import paper
from artifact.experiments.criteria.claims import STATED
from artifact.experiments.criteria.timing import CLAIMS, OTHERS
from artifact.experiments.verdicts.judge import question, rule_stated
from artifact.experiments.verdicts.rules import ABOVE_ZERO

NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)(e[-+]?\d+)?$|^-(inf|infinity|nan)$", re.I)


def parse_bound(text: str, effect: float, other: float | None = None) -> float:
    """A bound as the `rule` command takes it: a number, ">0" (above 0, its value not stated), or "?" (not
    stated: the other bound mirrored about the effect)."""
    t = str(text).strip()
    if t == ">0":
        return ABOVE_ZERO
    if t == "?":
        if other is None or not math.isfinite(other):
            raise ValueError("both bounds are '?': give at least one bound of the interval")
        return 2 * effect - other
    try:
        x = float(t)
    except ValueError:
        raise ValueError(f"bound {text!r}: expected a number, '>0' or '?'") from None
    if not math.isfinite(x):
        raise ValueError(f"bound {text!r}: expected a finite number, '>0' or '?'")
    return x


def parse_cell(i: int, e: str, lo: str, hi: str) -> tuple[float, float, float]:
    """--cell number i's EFFECT LOW HIGH as typed: (effect, low, high), or a UserError naming the value as
    typed and what is expected. EFFECT: a finite number; LOW: a finite number, '>0' or '?'; HIGH: a finite
    number or '?' ('>0' states a low bound only); not both '?'; LOW <= EFFECT <= HIGH."""
    where = f"rule: --cell {i} ({e} {lo} {hi})"

    def bad(arg: str, text: str, expected: str) -> UserError:
        return UserError(f"{where}: {arg} {text!r}: expected {expected}")

    try:
        effect = float(e)
    except ValueError:
        effect = math.nan
    if not math.isfinite(effect):
        raise bad("EFFECT", e, "a finite number (the effect, %)")
    if hi.strip() == ">0":
        raise bad("HIGH", hi, "a finite number or '?' ('>0' states a LOW bound only: an interval above 0)")
    if lo.strip() == ">0" and effect <= 0:
        raise bad("LOW", lo, f"a number at or below EFFECT {e} (an interval above 0 holds no effect <= 0)")
    try:
        low = parse_bound(lo, effect) if lo.strip() != "?" else None
    except ValueError:
        raise bad("LOW", lo, "a finite number, '>0' or '?'") from None
    try:
        high = parse_bound(hi, effect, low)
    except ValueError:
        raise (
            UserError(f"{where}: LOW and HIGH are both '?': expected at least one bound of the interval")
            if lo.strip() == "?" and hi.strip() == "?"
            else bad("HIGH", hi, "a finite number or '?'")
        ) from None
    low = parse_bound(lo, effect, high) if low is None else low
    if low > high and "?" not in (lo.strip(), hi.strip()):
        raise UserError(f"{where}: LOW {lo} is above HIGH {hi}: expected LOW <= EFFECT <= HIGH")
    if not low <= effect <= high:
        raise UserError(
            f"{where}: EFFECT {e} is not inside its interval [{lo}, {hi}]: expected LOW <= EFFECT <= HIGH"
        )
    return effect, low, high


def cmd_rule(a) -> int:
    if a.list:
        for key, c in CLAIMS.items():
            s = STATED[key]
            printed = "; the paper prints a result: see --paper" if key in paper.RESULTS else ""
            print(f"{key}: {s.claim_text(question=question(c), best='A', ratio=1.0)}")
            a_is = "A: each other policy of the grid" if c.a == OTHERS else f"A: {c.a}"
            print(f"    {a_is}, B: {c.b}; {s.said}{printed}")
        return 0
    if a.claim is None:
        raise UserError("rule: name a claim (one of " + ", ".join(CLAIMS) + "), or give --list")
    if a.claim not in CLAIMS:
        raise UserError(f"rule: claim {a.claim!r} is not one of {', '.join(CLAIMS)} (see --list)")
    if a.paper:
        if a.cell:
            raise UserError("rule: give --paper or --cell, not both")
        cells = paper.RESULTS.get(a.claim)
        if cells is None:
            raise UserError(
                f"rule: the paper prints no result for {a.claim}; it has {', '.join(paper.RESULTS)}"
            )
    else:
        if not a.cell:
            raise UserError("rule: give at least one --cell EFFECT LOW HIGH (95% interval), or --paper")
        cells = [parse_cell(i + 1, *cell) for i, cell in enumerate(a.cell)]
    try:
        verdict, reason = rule_stated(a.claim, cells)
    except ValueError as err:
        raise UserError(f"rule: {err}") from None
    print(f"{a.claim}: {question(CLAIMS[a.claim])}")
    print(f"verdict: {verdict} ({reason})")
    return 0


def add_cli(subparsers) -> None:
    """Register `rule`."""
    c = subparsers.add_parser("rule", help="rule 95%% intervals given by hand under a named claim's rule")
    # a value such as -inf or -1e3 is a bound, not a flag (argparse takes only -1 and -1.5 for numbers)
    c._negative_number_matcher = NEGATIVE_NUMBER
    c.add_argument("claim", nargs="?", help="the claim's key (see --list)")
    c.add_argument(
        "--cell",
        nargs=3,
        action="append",
        metavar=("EFFECT", "LOW", "HIGH"),
        help="one cell's effect and 95%% interval (%%); LOW/HIGH may be '>0' or '?'; repeat per cell",
    )
    c.add_argument("--paper", action="store_true", help="rule the paper's own printed result for the claim")
    c.add_argument("--list", action="store_true", help="name the claims and their questions")
    c.set_defaults(fn=cmd_rule)
