"""Figures: the colours of the policies and the paper's marks, the figure title naming the profile, and `save`,
which writes a figure (<name>.png into outputs.figures_dir) with the data it drew (<name>.csv into
outputs.run_data_dir)."""
from __future__ import annotations

import io
from pathlib import Path

from artifact.experiments.outputs.paths import figures_dir, run_data_dir, short_path
from artifact.experiments.settings import CONTROL, Settings
from artifact.paths import atomic_write_bytes, atomic_write_text

DPI = 100
COLORS = {"demand": "tab:blue", "last_step": "tab:orange", "oracle": "tab:green", "interval_refresh": "tab:purple",
          "belady": "tab:gray", "resident": "tab:gray"}
CONTROL_COLOR = "dimgray"     # the A/A control (settings.CONTROL over demand): never a policy's colour
AA_LABEL = f"A/A control ({CONTROL} over demand)"     # its series in every timing figure
# what an interval is over (rules.Interval.unit), as a figure's title says it
INTERVAL_BASIS = {"runs": "pooled over runs", "hull": "one run: hull of its interval and the pooled one",
                  "run": "one run, widened by the stored runs' spread", "pairs": "within one run"}
PAPER_STYLE = dict(color="crimson", lw=1.5, ls="--")     # how the paper's figures are marked on a plot


def title(fig, P: Settings, text: str) -> None:
    """The figure's title, naming the profile. Constrained layout makes room for it above the panels' titles
    (and for a legend placed outside the axes: fig.legend(loc="outside lower center"))."""
    if fig.get_layout_engine() is None:
        fig.set_layout_engine("constrained")
    fig.suptitle(f"{text}  [profile {P.name}: {P.model if P.model == 'tiny' else 'checkpoint'}, {P.device}]",
                 fontsize=11)


def save(fig, df, P: Settings, name: str, log=print) -> tuple[Path, Path]:
    """Write <name>.png (dpi 100) into figures_dir(P) and <name>.csv into run_data_dir(P); returns both paths."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    png = atomic_write_bytes(figures_dir(P) / f"{name}.png", buf.getvalue())
    csv = atomic_write_text(run_data_dir(P) / f"{name}.csv", df.to_csv(index=False))
    log(f"saved {short_path(png)} and {short_path(csv)}")
    return png, csv
