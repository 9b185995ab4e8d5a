"""What an exact count counts, as a claim names it: the counting bases (sim.BASES: denoising steps only, or
all demands with prefill), and a count claim judged on each basis (`on_bases`). Vocabulary of the claim
records (verdicts/records.py), shared by the studies."""

from __future__ import annotations

from artifact.experiments.verdicts.records import Claim, stated, verdict_of
from artifact.offload.replay.sim import DENOISING_ONLY, WITH_PREFILL

DENOISING, ALL_DEMANDS, PER_RUN = (
    "denoising steps only (prefill excluded)",
    "all demands (prefill included)",
    "per run",
)
EXACT = "exact counts, no interval"
BASIS = {DENOISING_ONLY: DENOISING, WITH_PREFILL: ALL_DEMANDS}  # a count's two bases (sim.BASES)
BASIS_SHORT = {DENOISING_ONLY: "denoising steps", WITH_PREFILL: "all demands"}
MODELED = "modelled: deterministic, no interval"  # a performance-model figure (virtual clock, notebook 08)


def on_bases(holds: dict, figures: dict, rules: str) -> tuple[str, str]:
    """A count claim judged on each counting basis (sim.BASES): `holds` says whether it holds on a basis,
    `figures` its deciding figure there, and the claim rules on `rules` (docs/verdicts.md: denoising steps
    where counted). Returns the verdict on `rules` and, where another basis would give another verdict, a
    note naming both for the claim's measured text and reason ("denoising steps: 56.6% (rules); all
    demands: 48.4% (would say reproduced)"), else ''."""
    verdict = verdict_of(holds[rules])
    other = [b for b in holds if b != rules and verdict_of(holds[b]) != verdict]
    if not other:
        return verdict, ""
    return verdict, "; ".join(
        [f"{BASIS_SHORT[rules]}: {figures[rules]} (rules)"]
        + [f"{BASIS_SHORT[b]}: {figures[b]} (would say {verdict_of(holds[b])})" for b in other]
    )


def stated_on_bases(
    key: str, measured: str, bases: dict, rules: str, holds, figure, reason="", **fields
) -> Claim:
    """Count claim `key` (records.stated) ruled by on_bases over `bases` (counting basis -> a study's counts):
    `holds(counts)` and its deciding `figure(counts)` per basis; exact counts on `rules`. Its reason is
    on_bases' note, else `reason`."""
    verdict, note = on_bases(
        {b: holds(c) for b, c in bases.items()}, {b: figure(c) for b, c in bases.items()}, rules
    )
    return stated(
        key, measured, verdict, reason=note or reason, counting=BASIS[rules], interval=EXACT, **fields
    )


def on_basis(field: str) -> property:
    """A study's Numbers property: `field` of its counts on the basis its count claims rule on
    (`self.by_prefill[self.basis].<field>`; by_prefill maps each counting basis to the study's counts)."""
    return property(lambda n: getattr(n.by_prefill[n.basis], field), doc=f"{field} on the ruling basis")
