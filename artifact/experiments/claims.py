"""What every claim module hands a notebook: `Claim`s (printed by `report` as the lines the notebook runner
parses) and figures saved with the data they drew (`save`: figures/<profile>/<name>.png and
data/results/<profile>/<name>.csv, both written atomically, both relocatable by ARTIFACT_FIGURES and
ARTIFACT_DATA so tests never overwrite a user's results)."""
from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path

from artifact.experiments.settings import Profile
from artifact.paths import atomic_write_bytes, atomic_write_text, data_dir, repo_root

REPRODUCED, NOT_REPRODUCED, NOT_MEASURABLE = "reproduced", "not reproduced", "not measurable on this profile"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, NOT_MEASURABLE)


@dataclass(frozen=True)
class Claim:
    claim: str
    paper: str
    measured: str
    verdict: str
    reason: str = ""
    timing: bool = False     # judged from wall-clock time: may differ run to run (nbval masks these lines)

    def __post_init__(self):
        assert self.verdict in VERDICTS, self.verdict

    def lines(self) -> list[str]:
        tag = " [timing]" if self.timing else ""
        verdict = f"{self.verdict} ({self.reason})" if self.reason else self.verdict
        return [f"claim: {self.claim}", f"paper: {self.paper}", f"measured{tag}: {self.measured}",
                f"verdict{tag}: {verdict}"]


def judged(ok: bool) -> str:
    return REPRODUCED if ok else NOT_REPRODUCED


def report(*claims: Claim) -> None:
    """The claim cell's output: four lines per claim (the notebook runner parses them)."""
    print("\n\n".join("\n".join(c.lines()) for c in claims))


# ---------------------------------------------------------------------------------------------
# Where a profile's outputs go
# ---------------------------------------------------------------------------------------------
def figures_dir(P: Profile) -> Path:
    return Path(os.environ.get("ARTIFACT_FIGURES", repo_root() / "figures")) / P.name


def results_dir(P: Profile) -> Path:
    return data_dir() / "results" / P.name


def traces_dir(P: Profile) -> Path:
    return data_dir() / "traces" / P.name


# ---------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------
DPI = 100
COLORS = {"demand": "tab:blue", "last_step": "tab:orange", "oracle": "tab:green", "interval_refresh": "tab:purple",
          "belady": "tab:gray", "resident": "tab:gray"}
PAPER_STYLE = dict(color="crimson", lw=1.5, ls="--")     # how the paper's figures are marked on a plot


def title(fig, P: Profile, text: str) -> None:
    fig.suptitle(f"{text}  [profile {P.name}: {P.model if P.model == 'tiny' else 'checkpoint'}, {P.device}]",
                 fontsize=11)


def save(fig, df, P: Profile, name: str, log=print) -> tuple[Path, Path]:
    """Write figures/<profile>/<name>.png (dpi 100) and data/results/<profile>/<name>.csv; returns both paths."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    png = atomic_write_bytes(figures_dir(P) / f"{name}.png", buf.getvalue())
    csv = atomic_write_text(results_dir(P) / f"{name}.csv", df.to_csv(index=False))
    log(f"saved {short_path(png)} and {short_path(csv)}")
    return png, csv


def short_path(path: Path) -> str:
    """Relative to the checkout when inside it (the usual case: no machine paths in notebook outputs)."""
    try:
        return str(path.resolve().relative_to(repo_root().resolve()))
    except ValueError:
        return str(path.resolve())
