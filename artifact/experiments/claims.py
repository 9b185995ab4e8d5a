"""What every claim module hands a notebook: `Claim`s, printed by `report` as the lines the notebook runner
parses, and recorded with the run that printed them in <notebook>.claims.json, the source of the claims tables
(outputs/claims_table.py). A run writes the record into an ignored place (results/<profile>/data:
outputs.run_data_dir, relocatable by ARTIFACT_OUTPUT, so tests never overwrite a user's results); only
`--store` copies it to the
committed data/results/<profile>/. Figures and the data they drew: figures.py."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import textwrap
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

import torch

from artifact.experiments.outputs.paths import RECORD_SUFFIX, run_data_dir
from artifact.experiments.settings import Settings
from artifact.offload.replay.sim import DENOISING_ONLY, WITH_PREFILL
from artifact.paths import atomic_write_text, repo_root

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"
NOT_MEASURABLE = "not measurable on this profile"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, NOT_MEASURABLE)

# Counting bases (what an exact count counts) and the interval of timing verdicts (docs/verdicts.md)
DENOISING, ALL_DEMANDS, PER_RUN = (
    "denoising steps only (prefill excluded)",
    "all demands (prefill included)",
    "per run",
)
EXACT = "exact counts, no interval"
# A count's two bases (sim.BASES) as a claim names them: in its basis line, and short in its text
BASIS = {DENOISING_ONLY: DENOISING, WITH_PREFILL: ALL_DEMANDS}
BASIS_SHORT = {DENOISING_ONLY: "denoising steps", WITH_PREFILL: "all demands"}
MODELED = "modelled: deterministic, no interval"  # a performance-model figure (virtual clock, notebook 08)


@dataclass(frozen=True)
class Claim:
    claim: str
    paper: str
    measured: str
    verdict: str
    reason: str = ""
    timing: bool = False  # judged from wall-clock time: may differ run to run (nbval masks these lines)
    counting: str = ""  # what is counted or timed (DENOISING, ALL_DEMANDS, PER_RUN, "tokens/s", ...)
    interval: str = ""  # EXACT, or the interval ruled on (replication.METHOD, SINGLE or WITHIN)
    pairs: int | None = None  # pairs per cell behind the interval (the fewest over cells)
    margin: str = ""  # where the measured value lies against the threshold or interval bounds
    per_run: tuple = ()  # timing: each stored run's own verdict (replication.py), in run order
    pooled: str = ""  # timing: the pooled verdict over the stored runs ("" with fewer than 2)
    this_run: str = ""  # timing: this run's own verdict (differs from `verdict` when this run is stored)
    ruled: str = ""  # timing: "pooled" (this run is a stored run) or "this run" (a single run)
    leave_one_out: tuple = ()  # timing: the pooled verdict with each stored run left out, in run order
    paper_criterion: str = ""  # timing, direction claims: how many cells' interval lies above 0 (the paper's
    # criterion, shown beside the verdict, never ruling)
    key: str = ""  # timing: the claim's definition in criteria/timing.py (its calibration row)

    def __post_init__(self):
        assert self.verdict in VERDICTS, self.verdict

    def basis(self) -> str:
        parts = [p for p in (self.counting, self.interval) if p]
        if self.pairs is not None:
            parts.append(f"{self.pairs} pairs")
        return "; ".join(parts)

    def runs_text(self) -> str:
        """Each stored run's own verdict beside the pooled one, and which one this verdict is."""
        own = f"this run alone: {self.this_run or self.verdict}"
        if not self.per_run:
            return f"this verdict comes from one run, with no stored runs to compare ({own})"
        n = len(self.per_run)
        same = sum(v == self.pooled for v in self.per_run)
        other = sum(v not in (self.pooled, INCONCLUSIVE) for v in self.per_run)
        head = (
            "this verdict is the pooled one" if self.ruled == "pooled" else "this verdict comes from one run"
        )
        loo = ""
        if self.leave_one_out:
            k = sum(v == self.pooled for v in self.leave_one_out)
            loo = (
                f"; leave one out: pooled over the other {n - 1} runs, {k} of {len(self.leave_one_out)} "
                "give the "
                f"pooled verdict ({', '.join(self.leave_one_out)})"
            )
        return (
            f"{head} ({own}); {n} stored runs: pooled {self.pooled}, per run {', '.join(self.per_run)} "
            f"({same} of {n} give the pooled verdict, {other} another){loo}"
        )

    def verdict_text(self) -> str:
        return f"{self.verdict} ({self.reason})" if self.reason else self.verdict

    def lines(self) -> list[str]:
        tag = " [timing]" if self.timing else ""
        out = [f"claim: {self.claim}", f"paper: {self.paper}"]
        if self.basis():
            out.append(f"basis{tag}: {self.basis()}")
        out.append(f"measured{tag}: {self.measured}")
        if self.margin:
            out.append(f"margin{tag}: {self.margin}")
        if self.paper_criterion:
            out.append(f"margin{tag}: {self.paper_criterion}")
        if self.timing:
            out.append(f"runs{tag}: {self.runs_text()}")
        return out + [f"verdict{tag}: {self.verdict_text()}"]


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


def verdict_of(ok: bool) -> str:
    """The verdict of a claim that holds (`ok`) or does not: reproduced, else not reproduced."""
    return REPRODUCED if ok else NOT_REPRODUCED


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


def on_basis(field: str) -> property:
    """A study's Numbers property: `field` of its counts on the basis its count claims rule on
    (`self.by_prefill[self.basis].<field>`; by_prefill maps each counting basis to the study's counts)."""
    return property(lambda n: getattr(n.by_prefill[n.basis], field), doc=f"{field} on the ruling basis")


def report(*claims: Claim, P: Settings | None = None, notebook: str | None = None) -> None:
    """The claim cell's output: a few lines per claim (the notebook runner parses claim and verdict). With a
    profile and the notebook's name, the claims are also recorded with the run (record)."""
    print("\n\n".join("\n".join(wrapped(line) for line in c.lines()) for c in claims))
    if P is not None and notebook is not None:
        record(P, notebook, claims)


# ---------------------------------------------------------------------------------------------
# The record of a claim cell's run: what the claims table is generated from
# ---------------------------------------------------------------------------------------------


def record_path(P: Settings, notebook: str) -> Path:
    return run_data_dir(P) / f"{notebook}{RECORD_SUFFIX}"


def run_info() -> dict:
    """The run that prints these claims: UTC date, the checkout's commit (with "-dirty" when the code that
    produced them, artifact/, differs from it; the notebooks only call into it, and their stored outputs, like
    the run's own outputs under data/ and figures/, change with every --store), the command that started
    the notebook (the kernel's parent process, when readable) and the environment (software versions, CPU)."""

    def git(*args):
        try:
            return subprocess.run(
                ["git", "-C", str(repo_root()), *args], capture_output=True, text=True, timeout=30
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    commit = git("rev-parse", "--short=12", "HEAD") or "unknown"
    if git("status", "--porcelain", "--untracked-files=no", "--", "artifact"):
        commit += "-dirty"
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "commit": commit,
        "command": _parent_command(),
        "environment": environment(),
    }


VERSIONED = ("torch", "numpy", "pandas", "transformers")  # beside python, in every record's environment
SIMD = ("sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "avx_vnni", "asimd", "sve", "sve2")
SIMD_FAMILIES = ("avx512", "amx")  # every flag of these families (avx512f, amx_tile, ...)
CPUINFO = Path("/proc/cpuinfo")


def environment() -> dict:
    """What a run ran on, recorded with it (run_info): "versions", of python and VERSIONED (None where one is
    not installed); "torch_cpu_capability", torch's CPU kernel level (AVX2, AVX512, ...: the kernels that
    round the router's scores, docs/DESIGN.md "Exact counts"); "cpu", its model and its SIMD flags (SIMD and
    SIMD_FAMILIES, from /proc/cpuinfo; None where that file is not, e.g. on macOS, whose model is then what
    `platform` knows). Stored runs and claim records written before this was recorded lack it: nothing
    compares it."""
    versions = {"python": platform.python_version()}
    for name in VERSIONED:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except (AttributeError, RuntimeError):  # a torch without the query
        capability = None
    return {"versions": versions, "torch_cpu_capability": capability, "cpu": _cpu()}


def _cpu() -> dict:
    """{"model", "machine", "simd"} of this CPU: the first processor's entries in /proc/cpuinfo (x86: "model
    name" and "flags"; ARM: "Features"), else platform's names and simd None."""
    fields: dict[str, str] = {}
    try:
        for line in CPUINFO.read_text().splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    flags = (fields.get("flags") or fields.get("Features") or "").split()
    return {
        "model": fields.get("model name") or fields.get("Processor") or platform.processor() or "unknown",
        "machine": platform.machine(),
        "simd": sorted({f for f in flags if f in SIMD or f.startswith(SIMD_FAMILIES)}) if fields else None,
    }


def _parent_command() -> str:
    try:
        raw = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
    except OSError:
        return "unknown"
    argv = [a for a in raw.decode(errors="replace").split("\0") if a]
    if len(argv) > 2 and argv[1:3] == ["-m", "artifact"]:
        return " ".join(["python", *argv[1:]])
    return "notebook run outside `python -m artifact notebooks`"


def record(P: Settings, notebook: str, claims) -> Path:
    """Write <run dir>/data/<notebook>.claims.json atomically: the run (run_info) and every claim (`--store`
    copies it to data/results/<profile>/, where the claims table is generated from)."""
    doc = {"notebook": notebook, "profile": P.name, **run_info(), "claims": [asdict(c) for c in claims]}
    return atomic_write_text(record_path(P, notebook), json.dumps(doc, indent=1) + "\n")
