"""A bench grid's GPU time from the performance model (`python -m artifact doctor`), as a range.

Every run of every cell (batch size, C/W, bandwidth scale) is priced by model_run on one block of a synthetic
stream shaped like the cell (block_stream: the checkpoint's MoE layers, experts and top-k, the profile's
steps, the cell's batch size and W, the 'paper point''s novelty and W spread): from an empty cache, it leans
high. W is the profile's trace's where one is current, else the committed H200 traces' (mini's shapes,
random weights, batch sizes 1 and 4) through W = W1 x batch^a. The costs are the hardware profile's
(hardware.py); the range multiplies the model's time by the least and the largest measured / modelled seconds
per denoising forward over the committed H200 reports' runs (validate_gpu: 5 MoE layers, batch sizes 1 and
4), and the estimate names what it extrapolates beyond them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from functools import lru_cache

import pandas as pd

from artifact.experiments.bench.order import slot_run, slots
from artifact.experiments.bench.results import has_aa_pair
from artifact.experiments.hardware import GPU_CHECK_H200, HARDWARE
from artifact.experiments.settings import Settings
from artifact.experiments.studies.performance_model.validation import validate_gpu
from artifact.experiments.studies.performance_model.virtual import model_run
from artifact.offload.links.costs import Costs, Hardware, Shape
from artifact.offload.replay.sim import capacity_for
from artifact.offload.replay.synth import SynthParams, synth
from artifact.offload.replay.trace import Trace, mean_working_set
from artifact.paths import repo_root

# under data/: the committed H200 gpu_check reports whose runs size the model's error, and their traces
GPU_CHECK_RUNS = (GPU_CHECK_H200, "gpu_check/h200_run2.json")
GPU_CHECK_TRACES = {1: "gpu_check/h200_trace_b1.safetensors", 4: "gpu_check/h200_trace_b4.safetensors"}
BLOCK_NOVELTY = SynthParams.block_novelty  # a new block's share of new experts (the generator's default)


@dataclass
class TimeEstimate:
    """A grid's GPU time: the model's figure and the range the measured error puts around it."""

    hardware: str
    model_hours: float
    low_hours: float
    high_hours: float
    ratios: tuple[float, float]  # least and largest measured / modelled seconds per denoising forward
    runs_compared: int  # measured runs behind `ratios`
    forwards: int
    runs: int  # bench runs: warm-ups, repetitions, the A/A arm, every policy and cell
    traced_runs: int  # one traced run per (task, batch size): W and the warm-up
    extrapolated: list[str] = field(default_factory=list)

    def text(self) -> str:
        lo, hi = self.ratios
        return (
            f"{self.low_hours:.2f}-{self.high_hours:.2f} h on one GPU (performance model, {self.hardware} "
            f"profile: {self.model_hours:.2f} h, times measured/modelled {lo:.2f}-{hi:.2f} over "
            f"{self.runs_compared} committed H200 runs)"
        )


def committed(name: str):
    """A committed input under the checkout's data/ (whatever ARTIFACT_DATA says)."""
    return repo_root() / "data" / name


def paper_point_stats(P: Settings) -> tuple[float, float]:
    """(novelty, W spread) of the 'paper point': the profile's committed 07 record, else the cpu profile's."""
    path = committed(f"results/{P.name}/07_routing_map_throughput.csv")
    if not path.is_file():
        path = committed("results/cpu/07_routing_map_throughput.csv")
    row = pd.read_csv(path).query("task == 'paper point'").iloc[0]
    return float(row.novelty), float(row.w_spread)


def block_stream(P: Settings, cfg, batch: int, W: float, novelty: float, spread: float) -> Trace:
    """One block of the synthetic stream the time estimate prices for this batch size and W: the config's
    MoE layers, experts and top-k, P.steps steps, the paper point's `novelty` and W `spread`."""
    return synth(
        SynthParams(
            layers=len(cfg.moe_layers),
            experts=cfg.num_experts,
            top_k=cfg.num_experts_per_tok,
            tokens=batch * cfg.block_length,
            blocks=1,
            steps=P.steps,
            batch_size=batch,
            w=W,
            novelty=novelty,
            w_spread=spread,
        )
    )


@lru_cache(maxsize=None)
def measured_working_sets() -> dict[int, float]:
    """{batch size: mean W} of the committed H200 traces (mini's shapes, random weights)."""
    return {b: mean_working_set(Trace.load(committed(p))) for b, p in GPU_CHECK_TRACES.items()}


def stated_working_set(batch: int, cfg, novelty: float) -> float:
    """W at `batch` from the committed H200 traces (W1 x batch^a through batch sizes 1 and 4), scaled to the
    config's experts and capped at what the stream generator can draw (a new block's experts fit in E)."""
    ws = measured_working_sets()
    (b1, w1), (b2, w2) = sorted(ws.items())
    a = math.log(w2 / w1) / math.log(b2 / b1)
    w = w1 * (batch / b1) ** a * cfg.num_experts / 256
    bound = min(cfg.num_experts, batch * cfg.block_length * cfg.num_experts_per_tok)
    return max(1.0, min(w, bound, cfg.num_experts / (1 + max(novelty, BLOCK_NOVELTY))))


@lru_cache(maxsize=8)
def error_ratios(hw: Hardware = HARDWARE["h200"]) -> tuple[float, float, int]:
    """(least, largest, runs) of measured / modelled seconds per denoising forward over the committed H200
    reports' runs, each modelled on its recorded routing with `hw`."""
    ratios = []
    for name in GPU_CHECK_RUNS:
        df = validate_gpu(committed(name), hw=hw)
        ratios += list(df.measured_seconds_per_denoise / df.modeled_seconds_per_denoise)
    return min(ratios), max(ratios), len(ratios)


def gpu_hardware(P: Settings) -> str:
    """The hardware profile a GPU profile is priced with: a5000 for the a5000 profiles, else h200."""
    return "a5000" if P.name.startswith("a5000") else "h200"


def estimate(P: Settings, cfg, nbytes: int, working_sets: dict[int, tuple[float, bool]]) -> TimeEstimate:
    """P's bench grid on one GPU: every run of every cell, as run_bench runs them (the `warmup` runs of each
    policy, R repetitions of every slot, the A/A arm among them), and one traced run per (task, batch size)
    priced as demand at trace_capacity (or every expert: resident); `working_sets` is {batch: (W, measured)}
    where the profile's traces measured it."""
    hw_name = gpu_hardware(P)
    hw, shp = HARDWARE[hw_name], Shape.of(cfg, nbytes)
    novelty, spread = paper_point_stats(P)
    stream = lru_cache(maxsize=None)(lambda b, W: block_stream(P, cfg, b, W, novelty, spread))

    @lru_cache(maxsize=None)
    def price(b: int, W: float, C: int, policy: str, scale: float) -> float:
        """Seconds per denoising forward of one run, each modelled once."""
        costs = Costs(dataclasses.replace(hw, h2d_gbps=hw.h2d_gbps * scale), shp)
        m = model_run(stream(b, W), costs, P.run_spec(C, policy).replace(link_gbps=None), min_misses=0)
        return (m["seconds"] - m["seconds_prefill"]) / m["steps"]

    blocks = P.gen_length // cfg.block_length
    pols = list(P.policies) * P.warmup
    pols += [slot_run(s)[0] for s in slots(P.policies, has_aa_pair(P))] * P.repetitions
    trace_C = min(P.trace_capacity or cfg.num_experts, cfg.num_experts)
    seconds, forwards = 0.0, 0
    for _task in P.tasks:
        for b in P.batch_sizes:
            W, measured = working_sets.get(b, (None, False))
            W = W if measured else stated_working_set(b, cfg, novelty)
            n = -(-P.n_prompts // b) * (blocks * P.steps + 1)  # forwards of one run, as doctor counts them
            seconds += n * price(b, W, trace_C, "demand", 1.0)
            for scale in P.bandwidth_scales:
                for r in P.cache_ratios:
                    C = capacity_for(r, W, cfg.num_experts)
                    seconds += sum(n * price(b, W, C, p, scale) for p in pols)
            forwards += n * (1 + len(P.bandwidth_scales) * len(P.cache_ratios) * len(pols))
    lo, hi, compared = error_ratios()
    hours = seconds / 3600
    traced = len(P.tasks) * len(P.batch_sizes)
    runs = traced * len(P.bandwidth_scales) * len(P.cache_ratios) * len(pols)
    notes = _extrapolated(P, cfg, working_sets, hw_name)
    return TimeEstimate(
        hw_name, hours, hours * lo, hours * hi, (lo, hi), compared, forwards, runs, traced, notes
    )


def _extrapolated(P: Settings, cfg, working_sets: dict, hw_name: str) -> list[str]:
    """What the estimate carries beyond the committed H200 measurements, each in a few words."""
    layers = len(Trace.load(committed(GPU_CHECK_TRACES[1])).meta["moe_layers"])
    notes = [
        f"the model's error measured with {layers} MoE layers, carried to {len(cfg.moe_layers)}",
        "prefill forwards priced as denoising ones",
    ]
    big = [b for b in P.batch_sizes if b > max(GPU_CHECK_TRACES)]
    if big:
        notes.append(f"batch sizes above {max(GPU_CHECK_TRACES)} not measured ({', '.join(map(str, big))})")
    stated = [b for b in P.batch_sizes if not working_sets.get(b, (0, False))[1]]
    if stated:
        notes.append(
            "W from the committed H200 traces (random weights), not this checkpoint's, at batch "
            + ", ".join(map(str, stated))
        )
    if hw_name != "h200":
        notes.append(f"the {hw_name} profile's link and device are datasheet figures (not measured)")
    if any(s != 1.0 for s in P.bandwidth_scales):
        notes.append("capped links priced as a slower link (the cap's pacing not modelled)")
    return notes
