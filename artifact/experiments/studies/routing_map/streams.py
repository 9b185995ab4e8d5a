"""07 routing map, the timed part: the two streams (routing_map/__init__.py) through the stream-driven engine,
demand vs last_step and last_step_conservative (the stand-in A/A: the streams have no demand-against-demand
pair), paired by repetition; their rows, the replicas of the stored runs, the streams claim and figure."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from artifact.experiments.bench.order import AA, slot_order
from artifact.experiments.bench.results import bench_fingerprint
from artifact.experiments.criteria import paper
from artifact.experiments.criteria.claims import ROW_FILES
from artifact.experiments.criteria.timing import CLAIMS
from artifact.experiments.harness import load_model, traces
from artifact.experiments.outputs.figures import (
    CONTROL_COLOR,
    INTERVAL_BASIS,
    PAPER_STYLE,
    interval_fields,
    mark_margin,
    style,
    title,
)
from artifact.experiments.paired_table import paired_table
from artifact.experiments.recording import cached_rows
from artifact.experiments.settings import CONTROL, Settings
from artifact.experiments.studies.routing_map import map as the_map
from artifact.experiments.verdicts.judge import claim_compared, judge, timed_claim
from artifact.experiments.verdicts.pooling import Compared, Replicas, gather
from artifact.experiments.verdicts.records import Claim
from artifact.model.tasks import prompts
from artifact.offload.backend.store import HostStore
from artifact.offload.replay.sim import capacity_for
from artifact.offload.replay.synth import SynthParams, synth
from artifact.offload.replay.trace import Trace, mean_working_set
from artifact.offload.trace_engine import Calibration, ExpertShape, calibrate, make_store, run_stream


def calibration(P: Settings) -> Calibration:
    """The tiny model's per-expert compute and other time per demand, measured on this machine (cpu);
    on a GPU the matmul runs on the device and nothing is padded."""
    if P.device != "cpu":
        return Calibration(source="none: device compute")
    loaded = load_model(P)
    ids = prompts(loaded.tokenizer, P.tasks[0], 2, P.seed, P.max_prompt_tokens)[1]
    return calibrate(loaded, ids, P.run_spec())


def stream_points(n: the_map.Numbers) -> dict[str, tuple[float, float]]:
    """The 'paper point' (inferred from the abstract's oracle cut: the largest spread reaching it at the
    traces' novelty, else the best cell) and the cpu traces' median point."""
    paper_point = n.implied if n.implied is not None else n.best[:2]
    return {"paper point": paper_point, "cpu point": n.cpu_point}


def stream_runs(
    P: Settings, base: SynthParams, points: dict, g: the_map.MapGrid, cal: Calibration, progress: bool = True
) -> pd.DataFrame:
    """demand, last_step and the stand-in (settings.CONTROL) at the grid's first C/W on each point's stream
    (no prefill): an untimed warm-up run each (listed order), then g.repetitions rounds, round r in the order
    slot_order(policies, P.rotation * g.repetitions + r) (bench/order.py); a row per timed run. Forwards run
    eager (the stream replaces the model's; run_stream refuses segmented); other run keys are the cell's."""
    loaded = load_model(P)
    shape = ExpertShape(loaded.cfg.hidden_size, loaded.cfg.moe_intermediate_size)
    ratio = g.ratios[0]
    policies = ("demand", "last_step", CONTROL)
    rows = []
    for name, (nu, s) in tqdm(points.items(), desc="stream engine", disable=not progress):
        stream = dataclasses.replace(
            base, novelty=nu, w_spread=s, prefill=0.0, layers=g.stream_layers, steps=g.stream_steps
        )
        t = synth(stream)
        store = stream_store(loaded, t, shape, g.seed, P.device)
        C = capacity_for(ratio, mean_working_set(t), base.experts)
        for rep in range(-1, g.repetitions):  # rep -1: the warm-up
            for policy in policies if rep < 0 else slot_order(policies, P.rotation * g.repetitions + rep):
                st = run_stream(t, P.run_spec(C, policy, forward="eager"), shape, cal, store=store)
                if rep >= 0:  # not the warm-up
                    rows.append(
                        {
                            "task": name,
                            "batch_size": 1,
                            "cache_ratio": ratio,
                            "bandwidth_scale": 1.0,
                            "rep": rep,
                            "policy": policy,
                            "novelty": nu,
                            "w_spread": s,
                            "cache_experts": C,
                            "forwards": st["forwards"],
                            "seconds": st["seconds"],
                            "forwards_per_second": st["forwards_per_second"],
                            "stall_seconds": st["stall_seconds"],
                            "link_busy_seconds": st["link_busy_seconds"],
                            "demand_misses": st["demand_misses"],
                            "speculative_transfers": st["speculative_transfers"],
                            "transfers": st["transfers"],
                            "calibration": cost_text(cal),
                        }
                    )
    return pd.DataFrame(rows)


def cost_text(cal: Calibration) -> str:
    """The compute the timed streams spin per demand (the calibration), in words."""
    return (
        f"{cal.compute_us_per_expert:.0f} us per expert, {cal.other_us_per_demand:.0f} us other per demand"
        if cal.compute_us_per_expert is not None
        else "device compute"
    )


NOTEBOOK = "07_routing_map"
(STREAMS,) = ROW_FILES[NOTEBOOK][1]  # data/results/<profile>/streams.csv (recording.cached_rows)


def streams(
    P: Settings,
    base: SynthParams | None = None,
    points: dict | None = None,
    g: the_map.MapGrid | None = None,
    cal: Calibration | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """stream_runs' rows, reused from data/results/<profile>/streams.csv when made under these settings (so a
    stored run is ruled on its own rows); the map's inputs are computed from the traces when not given."""
    if base is None or points is None or g is None:
        g = the_map.grid_for(P)
        fits = the_map.trace_fits(traces(P))
        base = the_map.base_params(fits, g)
        rmap = the_map.routing_map(base, g, the_map.prefill_multiple(fits), progress=False)
        points = stream_points(the_map.numbers(rmap, fits))

    def run():
        return stream_runs(P, base, points, g, cal or calibration(P), progress=progress)

    return cached_rows(P, STREAMS, bench_fingerprint(P), run)


measure = streams  # what a stored run keeps of notebook 07 (stored_runs.TIMED_STUDIES): the timed streams


def stream_store(loaded, t: Trace, shape: ExpertShape, seed: int, device: str) -> HostStore:
    """The model's own host experts when the stream has its layers and experts (the tiny model's on cpu),
    else seeded random experts of its shape and dtype."""
    packed = loaded.experts
    pin = device.startswith("cuda")
    layers = t.meta["moe_layers"]
    if packed.device.type == "cpu" and tuple(packed.shape[:2]) == (len(layers), t.meta["num_experts"]):
        return HostStore(packed, layers, pin=pin)
    return make_store(t, shape, seed=seed, pin=pin, dtype=packed.dtype)


STREAM = ["task"]  # one cell per stream: the "task" column holds the stream's name (paper point, cpu point)
METRIC = "forwards_per_second"
CLAIM = CLAIMS["07-streams"]  # demand over last_step per stream, faster (criteria/timing.py)


def throughput_table(rows: pd.DataFrame) -> pd.DataFrame:
    """demand vs last_step forwards/s per stream in this run, paired by repetition (paired_table.py)."""
    return paired_table(rows, "demand", "last_step", STREAM, metric=METRIC)


def replicas(P: Settings, rows: pd.DataFrame) -> Replicas:
    """This run's stream rows with the stored runs' rows of the same streams and settings (pooling.py)."""
    return gather(P, rows, NOTEBOOK, bench_fingerprint(P), metric=METRIC)


@dataclass(frozen=True)
class Throughput(Compared):
    """{(stream,): Replicated} demand over last_step, forwards/s, with the stand-in A/A and host shares."""

    calibration: str = ""  # the compute the rows were timed with (their "calibration" column; "" if absent)


def throughput(reps: Replicas) -> Throughput:
    rows = reps.rows
    cal = rows.calibration.dropna().astype(str).unique() if "calibration" in rows else []
    return Throughput(**vars(claim_compared(reps, CLAIM)), calibration="; ".join(cal))


def stored_claims(P: Settings) -> list[Claim]:
    """The timing claim from the committed rows alone, as `--store` ruled it (tests/test_stored_runs.py)."""
    return [throughput_claim(throughput(replicas(P, None).last_stored()))]


def throughput_claim(t: Throughput, cal: Calibration | None = None) -> Claim:
    """The streams' verdict: `faster` (direction) per stream on the plain effect of demand over last_step,
    gated by the A/A on the same stream (criteria/timing.py, verdicts/)."""
    cost = t.calibration or (cost_text(cal) if cal is not None else "not recorded")
    return timed_claim(
        CLAIM.key,
        judge(t, CLAIM, lambda key: str(key[0])),
        "forwards/s per run, demand over last_step % per pair, one interval per stream",
        note=f"A/A: {t.aa_label or 'none'}; compute: {cost}",
    )


def plot_throughput(rows: pd.DataFrame, t: Throughput, P: Settings):
    """Left: forwards/s per stream and policy (dots: repetitions, bar: mean); middle: link stall seconds;
    right: demand over last_step per stream with its ruled interval, the A/A (the gate), the paper's band."""
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(14, 3.8), layout="constrained")
    names = list(dict.fromkeys(rows.task))
    _per_run(ax1, ax2, rows, names)
    point = rows.groupby("task").first()
    ticks = [f"{n}\nnu {point.novelty[n]:.3g}, spread {point.w_spread[n]:.3g}" for n in names]
    for ax in (ax1, ax2, ax3):
        ax.set_xticks(range(len(names)), ticks, fontsize=8)
    ratio = rows.cache_ratio.iloc[0]
    ax1.set(ylabel="denoising forwards / s", title=f"throughput at C/W {ratio:g}")
    ax2.set(ylabel="compute stalled on the link (s)", title="stall per run")
    out = _verdict_intervals(ax3, t, names)
    title(fig, P, "07 stream-driven engine: demand vs last_step on synthetic streams", legend_columns=3)
    return fig, _figure_data(rows, out)


def _per_run(ax1, ax2, rows: pd.DataFrame, names: list) -> None:
    """Forwards/s (left) and link stall seconds (middle) per stream and policy: each run and the mean."""
    bars = [p for p in ("demand", "last_step", CONTROL) if p in set(rows.policy)]
    what = {"demand": " (LRU)", CONTROL: " (stand-in A/A)"}
    w = 0.8 / len(bars)
    for k, name in enumerate(names):
        for j, p in enumerate(bars):
            g = rows[(rows.task == name) & (rows.policy == p)]
            x = k + (j - (len(bars) - 1) / 2) * w
            for ax, col in ((ax1, "forwards_per_second"), (ax2, "stall_seconds")):
                ax.bar(
                    x,
                    g[col].mean(),
                    width=w * 0.95,
                    color=style(p)["color"],
                    alpha=0.6,
                    label=f"{p}{what.get(p, '')}: mean",
                )
                ax.scatter(np.full(len(g), x), g[col], s=10, color="black", zorder=3, label="one repetition")


def _verdict_intervals(ax3, t: Throughput, names: list) -> list[dict]:
    """Right: per stream, demand over last_step and the A/A, each with the interval it is ruled on, beside the
    paper's band and the A/A's margin; returns the intervals drawn."""
    out = []
    for name, src, color, dx in (
        ("demand over last_step", t.effects, style("last_step")["color"], -0.1),
        (t.aa_label or AA, t.aa, CONTROL_COLOR, 0.1),
    ):
        keys = [(n,) for n in names if (n,) in src]
        if not keys:
            continue
        iv = [src[k].ruled for k in keys]
        ax3.errorbar(
            [names.index(k[0]) + dx for k in keys],
            [i.mean for i in iv],
            yerr=[[i.mean - i.low for i in iv], [i.high - i.mean for i in iv]],
            fmt="o",
            capsize=4,
            color=color,
            ms=5,
            label=name,
        )
        out += [dict(task=k[0], series=name, **interval_fields(i)) for k, i in zip(keys, iv)]
    ax3.axhspan(
        *paper.FASTER_PCT,
        color=PAPER_STYLE["color"],
        alpha=0.15,
        label=f"abstract: +{paper.FASTER_PCT[0]}..+{paper.FASTER_PCT[1]}% (its gain range)",
    )
    mark_margin(ax3, "the equivalence margin")
    ax3.axhline(0, color="black", lw=1, ls=":")
    ax3.set_xlim(-0.6, len(names) - 0.4)
    any_iv = next(iter(t.effects.values()), None)
    basis = INTERVAL_BASIS[any_iv.ruled.unit] if any_iv else ""
    ax3.set(ylabel="A over B (% forwards/s)", title=f"the verdict's 95% intervals\n({basis})")
    ax3.title.set_fontsize(9)
    return out


def _figure_data(rows: pd.DataFrame, out: list[dict]) -> pd.DataFrame:
    """The run's rows with each stream's drawn intervals beside them (the A/A's prefixed control_)."""
    ruled = pd.DataFrame(out, columns=["task", "series", "diff_pct", "low", "high", "interval", "n"])
    effect = ruled.series == "demand over last_step"
    ruled = ruled.drop(columns="series").set_index("task")
    return rows.join(ruled[effect.to_numpy()], on="task").join(
        ruled[~effect.to_numpy()].add_prefix("control_"), on="task"
    )
