"""Why the model puts demand and last_step level at the paper point, where the abstract reports demand
faster (paper.FASTER_PCT): the split of each policy's modelled step into its terms, and what the paper's
smallest gain would take of the model.

`decomposition` splits demand's and last_step's modelled seconds per denoising step (model_run) into
compute (non-expert), experts, host and the exposed transfer (stall), which add up to the step, with their
difference per term; it names, computed, the term with the largest share of the step and the term whose
demand-minus-last_step difference is largest.

`host_text` says who paces the step (engines.host_work: the host term plus the launches above the rooflines,
the device's rooflines, the exposed transfer) and rules the cell by the measured cells' host-share limit
(rules.host_bound): on the eager engine the non-expert compute is almost all kernel launches, the host sets
the step, the link idles and the policies come out level. `engine_predictions` sets the eager engine beside
the segmented one (engines.py: graph replays in place of eager launches, REPLAY_US assumed) per GPU and C/W:
what demand against last_step becomes once the host no longer hides the link.

`sensitivity` asks what the paper's smallest gain (paper.FASTER_PCT[0]) would need: for each scale of the
host costs in HOST_SCALES (launch, sync, planning and per-copy host time together; the measured costs first)
it scales the link's bandwidth down from the profile's to BANDWIDTH_FLOOR of it (a geometric scan, then
bisection at the first crossing) until demand over last_step reaches the target, and reports the bandwidth,
the link's busy share of demand's wall there and the host scale; if no setting in those bounds reaches it,
it says so (`reached` False) with the best difference found.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from artifact.experiments.criteria import paper, thresholds
from artifact.experiments.studies.performance_model.engines import (
    EAGER,
    ENGINES,
    REPLAY_US,
    SEGMENTED,
    costs_for,
    host_work,
)
from artifact.experiments.studies.performance_model.virtual import CLAIM_SHAPE, model_run, shape
from artifact.experiments.verdicts import rules
from artifact.offload.links.costs import Costs, Hardware
from artifact.offload.replay.sim import capacity_for, replay
from artifact.offload.replay.trace import Trace, mean_working_set
from artifact.offload.spec import RunSpec

TERMS = {  # model_run's <term>_per_step -> its name in the table; they add up to seconds_per_step
    "compute": "compute (non-expert)",
    "experts": "experts",
    "host": "host",
    "stall": "exposed transfer (stall)",
}
PAIR = ("demand", "last_step")  # the abstract's comparison: demand-async over async last-step prefetch
DIFF = "demand - last_step"  # the table's difference column (seconds per step: > 0 where demand is slower)
# The C/W the decomposition is read at: inside the claim's range (paper.FASTER_RANGE), and the C/W the
# floor claim of notebook 08 reads (its "over the floor" figures).
EXPLAIN_RATIO = 1.0
EXPLAIN_SHAPE = CLAIM_SHAPE  # the shape the modelled claims rule on
BANDWIDTH_FLOOR = 0.1  # the slowest link searched: this share of the profile's bandwidth
HOST_SCALES = (1.0, 0.0, 0.5, 2.0, 5.0, 10.0)  # host costs x these (1.0, the measured, first)
HOST_FIELDS = ("launch_us", "sync_us", "plan_us", "copy_host_us")
SCAN_POINTS = 12  # geometric scan of the bandwidth scale from 1 down to BANDWIDTH_FLOOR
BISECTIONS = 20  # then halvings (in log scale) of the bracket where the target is first reached


def pair_runs(
    trace: Trace,
    hw: Hardware,
    spec: RunSpec,
    ratio: float,
    shape_name: str = EXPLAIN_SHAPE,
    floor=None,
    engine: str = EAGER,
) -> dict[str, dict]:
    """model_run of demand and last_step (fifo) on `trace` at C/W `ratio` on `hw`, priced as `engine`
    (engines.py), each `spec` otherwise."""
    C = capacity_for(ratio, mean_working_set(trace), trace.meta["num_experts"])
    floor = replay(trace, "min", C)["demand_misses"] if floor is None else floor
    costs = costs_for(hw, shape(shape_name), engine)
    return {
        p: model_run(trace, costs, spec.replace(capacity=C, policy=p, link_priority="fifo"), floor)
        for p in PAIR
    }


def gain_pct(runs: dict[str, dict]) -> float:
    """Demand's modelled tokens/s over last_step's, %."""
    a, b = (runs[p]["tokens_per_second"] for p in PAIR)
    return 100 * (a / b - 1)


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
        """The cell's host share: the larger of its policies' (engines.py, as rules.host_shares)."""
        return max(h["share"] for h in self.host.values())


def decomposition(
    trace: Trace,
    hw: Hardware,
    spec: RunSpec,
    ratio: float = EXPLAIN_RATIO,
    shape_name: str = EXPLAIN_SHAPE,
    engine: str = EAGER,
) -> Decomposition:
    """The split (module docstring) of demand's and last_step's step at C/W `ratio` on `hw`, priced as
    `engine`."""
    runs = pair_runs(trace, hw, spec, ratio, shape_name, engine=engine)
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


def launches_text(engine: str) -> str:
    """What the host does above the rooflines on `engine`."""
    if engine == SEGMENTED:
        return f"the host replaying the segments' CUDA graphs ({REPLAY_US:g} us each, assumed)"
    return "the host launching kernels one at a time (eager)"


def host_text(d: Decomposition) -> list[str]:
    """Who paces demand's step (engines.host_work), the host-share rule on the cell (rules.host_bound), and
    what that leaves the link."""
    h = {p: d.host[p] for p in PAIR}
    dem, ls = (d.runs[p] for p in PAIR)
    stall = d.table.loc[TERMS["stall"]]
    ms = {k: 1e3 * v for k, v in h[PAIR[0]].items() if k != "share"}
    step = 1e3 * dem["seconds_per_step"]
    bound = rules.host_bound(d.host_share)
    lines = [
        f"host work of demand's step (the host term, plus what the launches add above the rooflines of the "
        f"non-expert compute and of the experts): {ms['host']:.3f} ms = "
        f"{1e3 * d.table.loc[TERMS['host'], PAIR[0]]:.3f} + {ms['launch_compute']:.3f} + "
        f"{ms['launch_experts']:.3f}, {100 * h[PAIR[0]]['share']:.1f}% of the step "
        f"({100 * h[PAIR[1]]['share']:.1f}% of last_step's); device rooflines {ms['device']:.3f} ms, "
        f"exposed transfer {ms['link']:.3f} ms; without the experts' launches, the host term and the "
        f"non-expert launches alone are {100 * (ms['host'] - ms['launch_experts']) / step:.1f}%"
    ]
    busy = [100 * r["link_busy_over_wall"] for r in (dem, ls)]
    level = abs(d.gain_pct) <= thresholds.MARGIN
    link = (
        f"the link is busy {busy[0]:.0f}% / {busy[1]:.0f}% of the wall (idle {100 - max(busy):.0f}% or "
        f"more): last_step's {ls['speculative_transfers']} speculative copies change the exposed transfer "
        f"by {1e3 * stall[DIFF]:+.3f} ms, and demand over last_step is {d.gain_pct:+.2f}%"
        + (f", within +-{thresholds.MARGIN:g}%: the model levels the policies" if level else "")
    )
    if bound:
        lines.append(
            f"the cell's host share {100 * d.host_share:.1f}% (the larger of the two policies') is ruled "
            f"inconclusive, as a measured GPU cell would be: {bound}. The host's work, not the link, sets "
            f"the step: {link}"
        )
    else:
        lines.append(
            f"the cell's host share {100 * d.host_share:.1f}% is at most "
            f"{100 * thresholds.HOST_SHARE_LIMIT:.0f}%: not host-bound, so the cell is ruled on its "
            f"difference; {link}"
        )
    return lines


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
        f"its {1e3 * compute:.3f} ms: the rest, {1e3 * (compute - d.device_compute):.3f} ms, is "
        f"{launches_text(d.engine)}",
        *host_text(d),
    ]
    return "\n".join(lines)


def crossing(
    f: Callable[[float], float], target: float, lowest: float = BANDWIDTH_FLOOR
) -> tuple[float | None, float, float]:
    """(the largest scale s in [lowest, 1] with f(s) >= target up to the bisection's resolution, or None;
    f there, else the best f seen; the scale of that best). A geometric scan from 1 down to `lowest` finds
    the first scale that reaches the target; bisection between it and the scan's point before narrows it."""
    scan = [lowest ** (i / (SCAN_POINTS - 1)) for i in range(SCAN_POINTS)]
    best, best_at, prev = -math.inf, scan[0], None
    for s in scan:
        v = f(s)
        if v >= target:
            if prev is None:
                return s, v, s
            lo, vlo, hi = s, v, prev  # f(lo) reaches the target, f(hi) does not
            for _ in range(BISECTIONS):
                mid = math.sqrt(lo * hi)
                vm = f(mid)
                if vm >= target:
                    lo, vlo = mid, vm
                else:
                    hi = mid
            return lo, vlo, lo
        if v > best:
            best, best_at = v, s
        prev = s
    return None, best, best_at


def scaled(hw: Hardware, bandwidth: float = 1.0, host: float = 1.0) -> Hardware:
    """`hw` with its link bandwidth x `bandwidth` and its host costs (HOST_FIELDS) x `host`."""
    return dataclasses.replace(
        hw,
        h2d_gbps=hw.h2d_gbps * bandwidth,
        **{k: getattr(hw, k) * host for k in HOST_FIELDS},
    )


@dataclass(frozen=True)
class Sensitivity:
    """What the target gain needs of the link (and the host), searched within the bounds it names."""

    hardware: str
    cache_ratio: float
    target_pct: float
    reached: bool
    bandwidth_scale: float  # where reached: the largest scale reaching the target; else the best one's
    host_scale: float  # the host costs' scale of that setting
    gain_pct: float  # demand over last_step there
    gbps: float  # the link's bandwidth there
    link_busy: float  # demand's link busy / wall there
    speculative: int  # last_step's speculative transfers at the profile's costs
    lowest: float  # the bounds searched: bandwidth down to this share, host costs x HOST_SCALES
    host_scales: tuple = HOST_SCALES


def sensitivity(
    trace: Trace,
    hw: Hardware,
    spec: RunSpec,
    ratio: float = EXPLAIN_RATIO,
    target: float = paper.FASTER_PCT[0],
    lowest: float = BANDWIDTH_FLOOR,
    host_scales: tuple = HOST_SCALES,
    shape_name: str = EXPLAIN_SHAPE,
) -> Sensitivity:
    """The search of the module docstring: at the measured host costs if they reach the target, else at the
    host scale that reaches it on the fastest link; else the best setting seen, `reached` False."""
    C = capacity_for(ratio, mean_working_set(trace), trace.meta["num_experts"])
    floor = replay(trace, "min", C)["demand_misses"]

    def runs(b: float, h: float) -> dict:
        return pair_runs(trace, scaled(hw, b, h), spec, ratio, shape_name, floor)

    found = {}
    for h in host_scales:
        s, v, at = crossing(lambda b, h=h: gain_pct(runs(b, h)), target, lowest)
        found[h] = (s is not None, at, v)
    reached = {h: f for h, f in found.items() if f[0]}
    if reached:
        h = host_scales[0] if host_scales[0] in reached else max(reached, key=lambda k: reached[k][1])
    else:
        h = max(found, key=lambda k: found[k][2])
    ok, b, v = found[h]
    at = runs(b, h)
    base = runs(1.0, 1.0)
    return Sensitivity(
        hw.name,
        ratio,
        target,
        ok,
        b,
        h,
        v,
        Costs(scaled(hw, b, h), shape(shape_name)).link_gbps,
        at[PAIR[0]]["link_busy_over_wall"],
        base[PAIR[1]]["speculative_transfers"],
        lowest,
        tuple(host_scales),
    )


def sensitivity_text(s: Sensitivity) -> str:
    """One line: the setting that gives the target, or plainly that none in the bounds does."""
    head = f"{s.hardware} C/W {s.cache_ratio:g}: "
    where = (
        f"the link at {s.bandwidth_scale:.2f}x its bandwidth ({s.gbps:.1f} GB/s), demand's link busy "
        f"{100 * s.link_busy:.0f}% of its wall, host costs x{s.host_scale:g}"
    )
    if s.reached:
        return (
            f"{head}demand over last_step reaches {s.gain_pct:+.2f}% (>= {s.target_pct:+.1f}%) with {where}"
        )
    bounds = f"link bandwidth 1-{s.lowest:g}x and host costs x{min(s.host_scales):g}-{max(s.host_scales):g}"
    return (
        f"{head}the model cannot give {s.target_pct:+.1f}% anywhere in {bounds}: its best is "
        f"{s.gain_pct:+.2f}% with {where} (last_step issues {s.speculative} speculative transfers at the "
        "profile's costs)"
    )


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


def explain_paper_point(trace: Trace, spec: RunSpec, hardware: dict[str, Hardware], ratios) -> str:
    """Notebook 08's explanation at the paper point: each GPU's decomposition at EXPLAIN_RATIO, the
    sensitivity line at each C/W of `ratios`, and the finding."""
    decs = [decomposition(trace, hw, spec) for hw in hardware.values()]
    sens = [sensitivity(trace, hw, spec, r) for hw in hardware.values() for r in ratios]
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
def engine_predictions(
    trace: Trace, spec: RunSpec, hardware: dict[str, Hardware], ratios, shape_name: str = EXPLAIN_SHAPE
) -> pd.DataFrame:
    """Demand against last_step (fifo) on `trace` for every GPU of `hardware`, engine (engines.ENGINES) and
    C/W of `ratios`: modelled tokens/s of each, demand over last_step (%), the cell's host share (the larger
    of the two policies', engines.host_work) and its ruling by the host-share rule (rules.host_bound),
    demand's link busy / wall and last_step's speculative transfers."""
    rows = []
    for hw in hardware.values():
        for engine in ENGINES:
            for ratio in ratios:
                runs = pair_runs(trace, hw, spec, ratio, shape_name, engine=engine)
                share = max(host_work(runs[p])["share"] for p in PAIR)
                rows.append(
                    {
                        "hardware": hw.name,
                        "engine": engine,
                        "cache_ratio": ratio,
                        **{f"{p}_tokens_per_second": runs[p]["tokens_per_second"] for p in PAIR},
                        "diff_pct": gain_pct(runs),
                        "host_share": share,
                        "ruled": "host-bound" if rules.host_bound(share) else "decides",
                        "link_busy": runs[PAIR[0]]["link_busy_over_wall"],
                        "speculative": runs[PAIR[1]]["speculative_transfers"],
                    }
                )
    return pd.DataFrame(rows)


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
