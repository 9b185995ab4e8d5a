"""What every claim module hands a notebook: `Claim`s, printed by `report` as the lines the notebook runner
parses, and recorded with the run that printed them in <notebook>.claims.json, the source of the claims tables
(claims_table.py). A run writes the record into an ignored place (results/<profile>/data:
outputs.paths.run_data_dir, relocatable by ARTIFACT_OUTPUT); only `--store` copies it to the committed
data/results/<profile>/."""

from __future__ import annotations

import json
import textwrap
from dataclasses import asdict, dataclass, field
from pathlib import Path

from artifact.experiments.criteria.claims import STATED
from artifact.experiments.outputs.paths import RECORD_SUFFIX, run_data_dir
from artifact.experiments.outputs.provenance import run_info
from artifact.experiments.settings import Settings
from artifact.experiments.verdicts.rules import (
    INCONCLUSIVE,
    NOT_MEASURABLE,
    NOT_REPRODUCED,
    REPRODUCED,
    VERDICTS,
)
from artifact.paths import atomic_write_text

__all__ = ["INCONCLUSIVE", "NOT_MEASURABLE", "NOT_REPRODUCED", "REPRODUCED", "VERDICTS", "Claim", "report"]
RULES_VERSION = 5  # bumped by every change to a rule; docs/verdicts.md's rule history has a row per version


@dataclass(frozen=True)
class Claim:
    claim: str
    paper: str
    measured: str
    verdict: str
    reason: str = ""
    timing: bool = False  # judged from wall-clock time: may differ run to run (nbval masks these lines)
    counting: str = ""  # what is counted or timed
    interval: str = ""  # EXACT, or what the timing intervals are over (judge.py)
    pairs: int | None = None  # pairs per cell behind the interval (the fewest over cells)
    margin: str = ""  # where the measured value lies against the threshold
    per_run: tuple = ()  # timing: each stored run's own verdict, in run order
    pooled: str = ""  # timing: the stored runs' pooled verdict ("" with fewer than 2)
    ruled: str = ""  # timing: "pooled" (the stored runs) or "this run"
    leave_one_out: tuple = ()  # timing: the pooled verdict with each stored run left out of every input
    agreement: str = ""  # timing, a fresh run: agrees with / differs from the stored verdict, or inconclusive
    key: str = ""  # the claim's definition in criteria/claims.py (a timing claim's rule: criteria/timing.py)
    cells: list = field(default_factory=list)  # timing: per cell, the interval the verdict uses (judge.py)
    to_decide: str = ""  # timing, inconclusive: what would decide it, in one line (verdicts/next_step.py)

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict {self.verdict!r}: expected one of {', '.join(VERDICTS)}")

    def runs_text(self) -> str:
        """Each stored run's own verdict beside the pooled one, the leave-one-out, and a fresh run's
        agreement with the stored verdict (a display: it never decides)."""
        if not self.per_run:
            return "one run, no stored runs of this profile to compare"
        n = len(self.per_run)
        same = sum(v == self.pooled for v in self.per_run)
        each = ", ".join(self.per_run)
        text = f"{n} stored runs: pooled {self.pooled}; alone, {same} of {n} runs say so ({each})"
        if self.leave_one_out:
            k = sum(v == self.pooled for v in self.leave_one_out)
            text += f"; leave one out: {k} of {len(self.leave_one_out)} give the pooled verdict"
        if self.agreement:
            text += f"; this run {self.agreement}"
        return text

    def lines(self) -> list[str]:
        """The printed lines; basis: what is counted or timed, what the interval is over, and its pairs."""
        tag = " [timing]" if self.timing else ""
        basis = (self.counting, self.interval, f"{self.pairs} pairs" if self.pairs is not None else "")
        basis = "; ".join(p for p in basis if p)
        out = [f"claim: {self.claim}", f"paper: {self.paper}"]
        if basis:
            out.append(f"basis{tag}: {basis}")
        out.append(f"measured{tag}: {self.measured}")
        if self.margin:
            out.append(f"margin{tag}: {self.margin}")
        if self.timing:
            out.append(f"runs{tag}: {self.runs_text()}")
        verdict = f"{self.verdict} ({self.reason})" if self.reason else self.verdict
        decide = f"; {TO_DECIDE}{self.to_decide}" if self.to_decide else ""
        return out + [f"verdict{tag}: {verdict}{decide}"]


TO_DECIDE = "to decide: "  # an inconclusive timing claim's verdict line ends with what would decide it
WRAP = 88  # printed claim lines break at a word before this many characters (notebook output areas)
CONTINUED = "    "  # ... and go on, indented by this, on the next line (unwrap joins them back)


def wrapped(line: str) -> str:
    """One claim line as printed: broken between words only (a long number or path stays whole)."""
    return textwrap.fill(
        line, WRAP, subsequent_indent=CONTINUED, break_long_words=False, break_on_hyphens=False
    )


def unwrap(text: str) -> str:
    """Printed claim lines back to one line each: a line indented by CONTINUED continues the one above."""
    out: list[str] = []
    for line in text.split("\n"):
        if out and out[-1] and line.startswith(CONTINUED) and line.strip():
            out[-1] += " " + line[len(CONTINUED) :]
        else:
            out.append(line)
    return "\n".join(out)


def stated(key: str, measured: str, verdict: str, fill: dict | None = None, **fields) -> Claim:
    """The claim `key` of the registry (criteria/claims.py), its text and the paper's words rendered from
    there, with what was measured and its verdict."""
    s = STATED[key]
    return Claim(s.claim_text(**(fill or {})), s.said, measured, verdict, key=key, **fields)


def verdict_of(ok: bool) -> str:
    """The verdict of a claim that holds (`ok`) or does not: reproduced, else not reproduced."""
    return REPRODUCED if ok else NOT_REPRODUCED


def report(*claims: Claim, P: Settings | None = None, notebook: str | None = None) -> None:
    """The claim cell's output: a few lines per claim (the notebook runner parses claim and verdict). With a
    profile and the notebook's name, the claims are also recorded with the run (record)."""
    print("\n\n".join("\n".join(wrapped(line) for line in c.lines()) for c in claims))
    if P is not None and notebook is not None:
        record(P, notebook, claims)


# --- the record of a claim cell's run: what the claims table is generated from ---------------------------


def record_path(P: Settings, notebook: str) -> Path:
    return run_data_dir(P) / f"{notebook}{RECORD_SUFFIX}"


def record(P: Settings, notebook: str, claims) -> Path:
    """Write <run dir>/data/<notebook>.claims.json atomically: the run (run_info) and every claim (`--store`
    copies it to data/results/<profile>/, where the claims table is generated from)."""
    doc = {
        "notebook": notebook,
        "profile": P.name,
        **run_info(),
        "rules_version": RULES_VERSION,
        "claims": [asdict(c) for c in claims],
    }
    return atomic_write_text(record_path(P, notebook), json.dumps(doc, indent=1) + "\n")
