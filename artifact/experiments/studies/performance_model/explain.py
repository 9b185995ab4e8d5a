"""Why the model puts demand and last_step level at the paper point, where the abstract reports demand
faster (paper.FASTER_PCT).

`decomposition` splits demand's and last_step's modelled seconds per denoising step (model_run) into compute
(non-expert), experts, host and exposed transfer (stall), which add up to the step, and names the term with
the largest share of the step and the one whose demand-minus-last_step difference is largest; its text says
who paces the step (engines.host_work) and rules the cell by the measured cells' host-share limit
(rules.host_bound). `explanation` adds what the paper's gain would need (search.py) and which reading that
supports; `engines_table` sets the eager engine beside the segmented one (engines.py) per GPU and C/W: what
demand against last_step becomes once the host no longer hides the link.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from artifact.experiments.criteria import paper, thresholds
from artifact.experiments.hardware import HARDWARE
from artifact.experiments.studies.performance_model.engines import (
    EAGER,
    ENGINES,
    REPLAY_US,
    SEGMENTED,
    host_work,
)
from artifact.experiments.studies.performance_model.search import (
    BANDWIDTH_FLOOR,
    EXPLAIN_RATIO,
    EXPLAIN_SHAPE,
    HOST_SCALES,
    PAIR,
    Sensitivity,
    gain_pct,
    pair_runs,
    sensitivity,
    sensitivity_text,
)
from artifact.experiments.studies.performance_model.virtual import GPUS, GRID_RATIOS, model_grid
from artifact.experiments.verdicts import rules
from artifact.offload.links.costs import Hardware
from artifact.offload.replay.trace import Trace
from artifact.offload.spec import RunSpec

TERMS = {  # model_run's <term>_per_step -> its name in the table; they add up to seconds_per_step
    "compute": "compute (non-expert)",
    "experts": "experts",
    "host": "host",
    "stall": "exposed transfer (stall)",
}
DIFF = "demand - last_step"  # the table's difference column (seconds per step: > 0 where demand is slower)


@dataclass(frozen=True)
class Decomposition:
    """Demand's and last_step's modelled step split into TERMS (seconds per denoising step)."""

    hardware: str
    cache_ratio: float
    table: pd.DataFrame  # rows: TERMS' names, then "step"; columns: PAIR, DIFF, share (of demand's)
    runs: dict  # policy -> model_run's outputs
    largest: str  # the term with the largest share of demand's step
    largest_difference: str  # the term whose |demand - last_step| is largest
    gain_pct: float  # demand over last_step, modelled tokens/s, %
    device_compute: float  # the non-expert compute per step on the device's rooflines alone (no launches)
    engine: str = EAGER  # the engine priced (engines.ENGINES)
    host: dict | None = None  # policy -> engines.host_work of its run (who paces the step)

    @property
    def host_share(self) -> float:
        """The cell's host share: the larger of its policies' (engines.py, as pairs.host_shares)."""
        return max(h["share"] for h in self.host.values())


def decomposition(
    trace: Trace, hw: Hardware, spec: RunSpec, ratio: float = EXPLAIN_RATIO, engine: str = EAGER
) -> Decomposition:
    """The split (module docstring) of demand's and last_step's step at C/W `ratio` on `hw` as `engine`."""
    runs = pair_runs(trace, hw, spec, ratio, engine=engine)
    rows = {TERMS[t]: {p: runs[p][f"{t}_per_step"] for p in PAIR} for t in TERMS} | {
        "step": {p: runs[p]["seconds_per_step"] for p in PAIR}
    }
    table = pd.DataFrame.from_dict(rows, orient="index")
    table[DIFF] = table[PAIR[0]] - table[PAIR[1]]
    table["share"] = table[PAIR[0]] / table.loc["step", PAIR[0]]
    terms = table.drop(index="step")
    return Decomposition(
        hw.name,
        ratio,
        table,
        runs,
        str(terms["share"].idxmax()),
        str(terms[DIFF].abs().idxmax()),
        gain_pct(runs),
        runs[PAIR[0]]["device_compute_per_step"],
        engine,
        {p: host_work(runs[p]) for p in PAIR},
    )


def host_text(d: Decomposition) -> list[str]:
    """Who paces demand's step (engines.host_work), the host-share rule on the cell (rules.host_bound), and
    what that leaves the link."""
    h = d.host
    dem, ls = (d.runs[p] for p in PAIR)
    stall = d.table.loc[TERMS["stall"]]
    ms = {k: 1e3 * v for k, v in h[PAIR[0]].items() if k != "share"}
    step = 1e3 * dem["seconds_per_step"]
    bound = rules.host_bound(d.host_share)
    busy = [100 * r["link_busy_over_wall"] for r in (dem, ls)]
    level = abs(d.gain_pct) <= thresholds.MARGIN
    link = (
        f"the link is busy {busy[0]:.0f}% / {busy[1]:.0f}% of the wall (idle {100 - max(busy):.0f}% or "
        f"more): last_step's {ls['speculative_transfers']} speculative copies change the exposed transfer "
        f"by {1e3 * stall[DIFF]:+.3f} ms, and demand over last_step is {d.gain_pct:+.2f}%"
        + (f", within +-{thresholds.MARGIN:g}%: the model levels the policies" if level else "")
    )
    ruling = (
        f"the cell's host share {100 * d.host_share:.1f}% (the larger of the two policies') is ruled "
        f"inconclusive, as a measured GPU cell would be: {bound}. The host's work, not the link, sets "
        f"the step: {link}"
        if bound
        else f"the cell's host share {100 * d.host_share:.1f}% is at most "
        f"{100 * thresholds.HOST_SHARE_LIMIT:.0f}%: not host-bound, so the cell is ruled on its "
        f"difference; {link}"
    )
    return [
        f"host work of demand's step (the host term, plus what the launches add above the rooflines of the "
        f"non-expert compute and of the experts): {ms['host']:.3f} ms = "
        f"{1e3 * d.table.loc[TERMS['host'], PAIR[0]]:.3f} + {ms['launch_compute']:.3f} + "
        f"{ms['launch_experts']:.3f}, {100 * h[PAIR[0]]['share']:.1f}% of the step "
        f"({100 * h[PAIR[1]]['share']:.1f}% of last_step's); device rooflines {ms['device']:.3f} ms, "
        f"exposed transfer {ms['link']:.3f} ms; without the experts' launches, the host term and the "
        f"non-expert launches alone are {100 * (ms['host'] - ms['launch_experts']) / step:.1f}%",
        ruling,
    ]


def decomposition_text(d: Decomposition) -> str:
    """The table in ms per step and what it names, in words built from its numbers."""
    ms = d.table[[*PAIR, DIFF]] * 1e3
    shown = pd.DataFrame(
        {
            **{p: ms[p].map("{:.3f}".format) for p in PAIR},
            DIFF: ms[DIFF].map("{:+.3f}".format),
            "share of demand's step": (100 * d.table["share"]).map("{:.1f}%".format),
        }
    )
    shown.index.name = f"{d.hardware}, {d.engine} engine, ms per step"
    dem, ls = (d.runs[p] for p in PAIR)
    step = d.table.loc["step"]
    big, dif = d.table.loc[d.largest], d.table.loc[d.largest_difference]
    stall = d.table.loc[TERMS["stall"]]
    extra = ls["transfers"] - dem["transfers"]
    compute = d.table.loc[TERMS["compute"], PAIR[0]]
    launches = (
        f"the host replaying the segments' CUDA graphs ({REPLAY_US:g} us each, assumed)"
        if d.engine == SEGMENTED
        else "the host launching kernels one at a time (eager)"
    )
    lines = [
        shown.to_string(),
        f"largest share of the step: {d.largest} ({100 * big.share:.0f}%, demand minus last_step "
        f"{1e3 * big[DIFF]:+.3f} ms); largest difference: {d.largest_difference} "
        f"({1e3 * dif[DIFF]:+.3f} ms of the step's {1e3 * step[DIFF]:+.3f} ms); demand over "
        f"last_step {d.gain_pct:+.2f}% tokens/s",
        f"last_step moves {ls['transfers']} experts to demand's {dem['transfers']} ({extra:+d}: "
        f"{ls['speculative_transfers']} speculative, {ls['prefetch_hits']} of them used) with the link "
        f"busy {100 * dem['link_busy_over_wall']:.0f}% / {100 * ls['link_busy_over_wall']:.0f}% of the "
        f"wall: the exposed transfer differs by {1e3 * stall[DIFF]:+.3f} ms "
        f"({100 * stall[DIFF] / step[PAIR[0]]:+.2f}% of the step)",
        f"{TERMS['compute']} on the device's rooflines alone would be {1e3 * d.device_compute:.3f} ms of "
        f"its {1e3 * compute:.3f} ms: the rest, {1e3 * (compute - d.device_compute):.3f} ms, is {launches}",
        *host_text(d),
    ]
    return "\n".join(lines)


def finding_text(decs: list[Decomposition], sens: list[Sensitivity]) -> str:
    """Which of the two readings the numbers support: the model lacking the mechanism (no setting searched
    gives the target), or the mechanism present but hidden at the profiles' costs (with the link share it
    needs)."""
    busy = ", ".join(f"{d.hardware} {100 * d.runs[PAIR[0]]['link_busy_over_wall']:.0f}%" for d in decs)
    shares = ", ".join(f"{d.hardware} {d.largest} {100 * d.table.loc[d.largest, 'share']:.0f}%" for d in decs)
    here = (
        f"at the profiles' own costs (C/W {decs[0].cache_ratio:g}) the link is busy {busy} of demand's wall"
    )
    hit = [s for s in sens if s.reached]
    if not hit:
        return (
            f"finding: the model cannot give the paper's {sens[0].target_pct:+.1f}% at any setting searched; "
            f"{here}: within the model, the paper's effect comes from something other than link contention"
        )
    need = min(hit, key=lambda s: s.link_busy)
    return (
        f"finding: the model has the link contention the paper's effect needs, and hides it: it gives "
        f"{need.target_pct:+.1f}% once the link is busy {100 * need.link_busy:.0f}% or more of demand's wall "
        f"({need.hardware} C/W {need.cache_ratio:g}, {need.gbps:.1f} GB/s, host costs x{need.host_scale:g}); "
        f"{here}, and the largest share of the step is paid alike by both policies ({shares}); so the "
        "paper's effect is link contention only if its runs' link was that busy, which the eager engine's "
        "costs (their host time per step) do not reproduce"
    )


def explanation(trace: Trace, spec: RunSpec) -> str:
    """Notebook 08's explanation at the paper point (`trace`): each GPU's decomposition at EXPLAIN_RATIO,
    the sensitivity at each C/W of the grid inside the claim's range (paper.FASTER_RANGE), and the finding."""
    lo, hi = paper.FASTER_RANGE
    gpus = [HARDWARE[g] for g in GPUS]
    decs = [decomposition(trace, hw, spec) for hw in gpus]
    sens = [sensitivity(trace, hw, spec, r) for hw in gpus for r in GRID_RATIOS if lo <= r <= hi]
    head = (
        f"why the model puts demand and last_step level on the paper point ({EXPLAIN_SHAPE}, fifo, "
        f"C/W {EXPLAIN_RATIO:g}, the {EAGER} engine the claims price): modelled ms per denoising step by term"
    )
    what = (
        f"what the paper's {paper.FASTER_PCT[0]:+.1f}% would need (link bandwidth scaled down to "
        f"{BANDWIDTH_FLOOR:g}x, host costs x{min(HOST_SCALES):g}-{max(HOST_SCALES):g}):"
    )
    return "\n\n".join(
        [
            head,
            *(decomposition_text(d) for d in decs),
            "\n".join([what, *(sensitivity_text(s) for s in sens)]),
            finding_text(decs, sens),
        ]
    )


# --- the engines side by side: what the model predicts once the host no longer hides the link ----------
def engines_table(trace: Trace, spec: RunSpec) -> pd.DataFrame:
    """Notebook 08's engines table: demand against last_step (fifo) on `trace` for every GPU, engine
    (engines.ENGINES) and C/W of the grid: modelled tokens/s of each, demand over last_step (%), the cell's
    host share (the larger of the two policies', engines.host_work) and its ruling (rules.host_bound),
    demand's link busy / wall and last_step's speculative transfers."""
    grids = [
        model_grid([trace], HARDWARE[g], EXPLAIN_SHAPE, spec, PAIR, GRID_RATIOS, ("fifo",), engine=e)
        for g in GPUS
        for e in ENGINES
    ]
    values = ["tokens_per_second", "host_share", "link_busy_over_wall", "speculative_transfers"]
    cell = ["hardware", "engine", "cache_ratio"]
    w = pd.concat(grids).pivot_table(values, cell, "policy", aggfunc="first", sort=False)
    tps, share = w.tokens_per_second, w.host_share.max(axis=1)
    out = pd.DataFrame(
        {
            **{f"{p}_tokens_per_second": tps[p] for p in PAIR},
            "diff_pct": 100 * (tps[PAIR[0]] / tps[PAIR[1]] - 1),
            "host_share": share,
            "ruled": ["host-bound" if rules.host_bound(x) else "decides" for x in share],
            "link_busy": w.link_busy_over_wall[PAIR[0]],
            "speculative": w.speculative_transfers[PAIR[1]],
        }
    )
    return out.reset_index()


def engine_predictions_text(df: pd.DataFrame) -> str:
    """The predictions as a table (the engines side by side per GPU and C/W) and one line per GPU: the
    segmented engine's effect where the host-share rule lets the cell decide."""
    cell = dict(index=["hardware", "cache_ratio"], columns="engine", aggfunc="first", sort=False)
    wide = df.pivot_table(values=["diff_pct", "host_share"], **cell)
    ruled = df.pivot_table(values="ruled", **cell)
    shown = pd.DataFrame(index=wide.index)
    for e in ENGINES:
        shown[f"{e}: demand vs last_step"] = wide["diff_pct"][e].map("{:+.2f}%".format)
        shown[f"{e}: host share"] = (100 * wide["host_share"][e]).map("{:.1f}%".format) + ruled[e].map(
            lambda r: " (host-bound)" if r == "host-bound" else ""
        )
    shown.index.names = ["GPU", "C/W"]
    head = (
        f"demand against last_step (modelled tokens/s, {EXPLAIN_SHAPE}, fifo) on the eager engine (the "
        f"measured launch costs) and the segmented engine ({REPLAY_US:g} us of host time per CUDA graph "
        f"replay, assumed, plus the rooflines); a host share over "
        f"{100 * thresholds.HOST_SHARE_LIMIT:.0f}% is host-bound (rules.host_bound): the cell cannot decide"
    )
    lines = [head, shown.to_string()]
    seg = df[df.engine == SEGMENTED]
    for hw, g in seg.groupby("hardware", sort=False):
        ok = g[g.ruled == "decides"]
        parts = ", ".join(f"C/W {r.cache_ratio:g} {r.diff_pct:+.1f}%" for r in ok.itertuples()) or "none"
        off = ", ".join(f"C/W {r.cache_ratio:g}" for r in g[g.ruled != "decides"].itertuples())
        busy = ", ".join(f"{100 * b:.0f}%" for b in g.link_busy)
        lines.append(
            f"{hw}, segmented: the cells that decide: {parts}"
            + (f"; host-bound: {off}" if off else "")
            + f"; demand's link busy {busy} of the wall (C/W {', '.join(f'{r:g}' for r in g.cache_ratio)})"
        )
    return "\n".join(lines)
