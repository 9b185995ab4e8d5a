"""A bench grid's GPU time from the performance model (`python -m artifact doctor`), as a range.

Every cell of the grid (batch size, C/W, bandwidth scale) and every policy run in it is priced by model_run on
a synthetic routing stream shaped like the cell: the checkpoint's MoE layers, experts and top-k, one block of
the profile's steps at the cell's batch size (tokens = batch x block), its W, and the novelty and W spread
of the 'paper point' (notebook 07's committed record, as notebook 08's stream). The stream starts with an
empty cache, so a block's first steps miss more than in a long run: the model's seconds per forward lean
high. W is the profile's trace's where one is current, else the committed H200 traces' (mini's shapes,
random weights, batch sizes 1 and 4), through W = W1 x batch^a at other batch sizes, capped where the
generator can still draw a new block's experts.

The costs are the hardware profile's (hardware.py: the h200 profile calibrated on the committed H200 gpu_check
report; the a5000 profile's link and device from datasheets, its host costs the H200 machine's). The range
multiplies the model's time by the least and the largest ratio of measured to modelled seconds per denoising
forward over the runs of the committed H200 reports (validate_gpu with the h200 profile): what the model
missed on measured runs, carried over to the grid. Those runs had 5 MoE layers and batch sizes 1 and 4; the
estimate names what it extrapolates beyond them.
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


class _Pricer:
    """Seconds per denoising forward of (batch, W, C, policy, bandwidth scale), each modelled once."""

    def __init__(self, P: Settings, cfg, hw: Hardware, nbytes: int):
        self.P, self.cfg, self.hw = P, cfg, hw
        self.shape = Shape.of(cfg, nbytes)
        self.novelty, self.w_spread = paper_point_stats(P)
        self.streams: dict[tuple[int, float], Trace] = {}
        self.seconds: dict[tuple, float] = {}

    def stream(self, batch: int, W: float) -> Trace:
        key = (batch, round(W, 6))
        if key not in self.streams:
            c = self.cfg
            self.streams[key] = synth(
                SynthParams(
                    layers=len(c.moe_layers),
                    experts=c.num_experts,
                    top_k=c.num_experts_per_tok,
                    tokens=batch * c.block_length,
                    blocks=1,
                    steps=self.P.steps,
                    batch_size=batch,
                    w=W,
                    novelty=self.novelty,
                    w_spread=self.w_spread,
                )
            )
        return self.streams[key]

    def __call__(self, batch: int, W: float, C: int, policy: str, scale: float) -> float:
        key = (batch, round(W, 6), C, policy, scale)
        if key not in self.seconds:
            hw = dataclasses.replace(self.hw, h2d_gbps=self.hw.h2d_gbps * scale)
            spec = self.P.run_spec(C, policy).replace(link_gbps=None)
            m = model_run(self.stream(batch, W), Costs(hw, self.shape), spec, min_misses=0)
            self.seconds[key] = (m["seconds"] - m["seconds_prefill"]) / m["steps"]
        return self.seconds[key]


def estimate(P: Settings, cfg, nbytes: int, working_sets: dict[int, tuple[float, bool]]) -> TimeEstimate:
    """P's bench grid on one GPU: every run of every cell, as run_bench runs them (the `warmup` runs of each
    policy, R repetitions of every slot, the A/A arm among them), and one traced run per (task, batch size)
    priced as demand at trace_capacity (or every expert: resident); `working_sets` is {batch: (W, measured)}
    where the profile's traces measured it."""
    hw_name = gpu_hardware(P)
    price = _Pricer(P, cfg, HARDWARE[hw_name], nbytes)
    blocks = P.gen_length // cfg.block_length
    per_run = dict(warmup=P.warmup, slots=slots(P.policies, has_aa_pair(P)))
    seconds, forwards, runs = 0.0, 0, 0
    for _task in P.tasks:
        for b in P.batch_sizes:
            W, measured = working_sets.get(b, (None, False))
            W = W if measured else stated_working_set(b, cfg, price.novelty)
            n = -(-P.n_prompts // b) * (blocks * P.steps + 1)  # forwards of one run, as doctor counts them
            trace_C = min(P.trace_capacity or cfg.num_experts, cfg.num_experts)
            seconds += n * price(b, W, trace_C, "demand", 1.0)
            forwards += n
            for scale in P.bandwidth_scales:
                for r in P.cache_ratios:
                    C = capacity_for(r, W, cfg.num_experts)
                    pols = list(P.policies) * per_run["warmup"]
                    pols += [slot_run(s)[0] for s in per_run["slots"]] * P.repetitions
                    seconds += sum(n * price(b, W, C, p, scale) for p in pols)
                    forwards += n * len(pols)
                    runs += len(pols)
    lo, hi, compared = error_ratios()
    hours = seconds / 3600
    traced = len(P.tasks) * len(P.batch_sizes)
    notes = _extrapolated(P, cfg, working_sets, hw_name)
    return TimeEstimate(
        hw_name, hours, hours * lo, hours * hi, (lo, hi), compared, forwards, runs, traced, notes
    )


def _extrapolated(P: Settings, cfg, working_sets: dict, hw_name: str) -> list[str]:
    """What the estimate carries beyond the committed H200 measurements, each in a few words."""
    layers = len(committed_moe_layers())
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


@lru_cache(maxsize=None)
def committed_moe_layers() -> tuple[int, ...]:
    """The MoE layers of the committed H200 runs (their traces' metadata)."""
    t = Trace.load(committed(GPU_CHECK_TRACES[1]))
    return tuple(t.meta["moe_layers"])
