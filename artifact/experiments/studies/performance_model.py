"""The performance model: the engine on a virtual clock (offload/stream.run_virtual) priced by a hardware
profile (hardware.py), and its validation against measured runs.

model_grid replays routing traces (recorded or synthetic) through the real engine, cache, policies and
link timeline for every policy x C/W x link priority and returns, per cell, the modelled seconds per step,
tokens/s, stall, link busy / wall, host time per step and the per-phase split, with the physical limit
beside them: max(compute, misses x expert bytes / bandwidth), once with the policy's own link transfers and
once with `min`'s misses (the floor of any C-slot demand paging). Every number is a pure function of the
inputs: two runs give identical bits.

validate_cpu runs the tiny model offloaded on the emulated link (real compute, wall clock), records each
run's routing, and models the same run on its own trace with the cpu-emulated profile (its compute costs
calibrated on the model in the same session): the error of seconds per step per cell, and whether every
measured policy difference whose interval excludes 0 has the modelled difference's sign.
validate_gpu does the same for the runs of a gpu_check report, whose routing traces are committed beside
it (data/gpu_check/), with the h200 profile.

The model-error claim follows the protocol of docs/perf_model.md ("Validation"): `validation` keeps a run's rows,
`model_errors` sets its figure (the median absolute error over its cells) beside every stored run's
(data/results/<profile>/runs/run<k>/validation.csv), and the claim is ruled on the median of the stored runs'
figures when this run is one of them, else on this run's own figure; each validation cell's measured
demand-over-last_step difference is printed beside the virtual clock's, with their sign agreement.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from artifact.errors import SettingError
from artifact.experiments import paper
from artifact.experiments.bench.results import bench_fingerprint
from artifact.experiments.claims import MODELED, PAPER_STYLE, Claim, judged, title
from artifact.experiments.hardware import HARDWARE, committed_gpu_check, hardware, load_gpu_check
from artifact.experiments.replication import Runs, cached_rows, stored_rows
from artifact.experiments.runs import load_model, offload_spec
from artifact.experiments.settings import Settings
from artifact.experiments.stats import paired_table
from artifact.model.config import PRESETS, get_preset
from artifact.model.tasks import prompts
from artifact.offload.costs import Costs, Hardware, Shape
from artifact.offload.policies import check_policy
from artifact.offload.runner import OffloadSpec, run
from artifact.offload.sim import capacity_for, replay
from artifact.offload.stream import Calibration, ExpertShape, calibrate, run_stream, run_virtual
from artifact.offload.synth import SynthParams, synth
from artifact.offload.timeline import CLOCKS, PRIORITIES
from artifact.offload.trace import KINDS, Trace, mean_working_set
from artifact.paths import repo_root

SHAPES = ("llada2-mini", "llada2-flash", "tiny")     # model.config presets; tiny in float32 (the cpu profile)
OUTPUTS = ("seconds_per_step", "tokens_per_second", "stall_per_step", "link_busy_over_wall", "host_per_step",
           "limit_per_step", "floor_per_step")


def shape(name: str) -> Shape:
    if name not in SHAPES:
        raise SettingError(f"unknown shape {name!r}; choose one of {list(SHAPES)}")
    return Shape.of(get_preset(name), dtype_bytes=4 if name == "tiny" else 2)


def tokens_decoded(trace: Trace) -> int:
    """Tokens the traced run decoded: every block round decodes block_length tokens per batch row."""
    first = trace.meta["moe_layers"][0]
    rounds = int(np.sum((trace.kind == KINDS.index("denoise")) & (trace.block_step == 0) & (trace.layer == first)))
    block = int((trace.meta.get("decode") or {}).get("block_length", 32))
    return rounds * block * int(trace.meta.get("batch_size") or 1)


def virtual_spec(costs: Costs, capacity: int, policy: str, priority: str, lookahead: int = 1,
                 tau: int = 4) -> OffloadSpec:
    return OffloadSpec(capacity, policy, "emulated", bandwidth_gbps=costs.link_gbps,
                       latency_us=costs.hw.copy_latency_us, lookahead=lookahead, tau=tau, link_priority=priority)


def model_run(trace: Trace, costs: Costs, capacity: int, policy: str, priority: str = "fifo",
              min_misses: int | None = None) -> dict:
    """One modelled run: run_virtual's stats and the outputs (module docstring), per denoising step."""
    st = run_virtual(trace, virtual_spec(costs, capacity, policy, priority), costs)
    steps = max(st["forwards"], 1)
    t = st["time"]
    tokens = tokens_decoded(trace)
    return {
        "seconds": st["seconds"], "steps": st["forwards"], "prefill_forwards": st["prefill_forwards"],
        "seconds_per_step": st["seconds"] / steps,
        "tokens_per_second": tokens / st["seconds"] if st["seconds"] else float("nan"), "tokens": tokens,
        "stall_per_step": t["stall"] / steps, "host_per_step": t["host"] / steps,
        "compute_per_step": t["compute"] / steps, "experts_per_step": t["experts"] / steps,
        "link_busy_over_wall": st["link_busy_seconds"] / st["seconds"] if st["seconds"] else float("nan"),
        **limits(trace, costs, capacity, st["transfers"], steps, min_misses),
        "demand_misses": st["demand_misses"], "speculative_transfers": st["speculative_transfers"],
        "prefetch_hits": st["prefetch_hits"], "transfers": st["transfers"],
        **{f"{k}_{ph}": v for ph, d in t["by_phase"].items() for k, v in d.items()},
    }


def limits(trace: Trace, costs: Costs, capacity: int, transfers: int, steps: int,
           min_misses: int | None = None) -> dict:
    """The physical limit per step, max(compute, transfers x expert bytes / bandwidth), and its floor with
    min's misses; compute is the device's (Costs.device_only: no host launch term), every demand's non-expert
    compute and all its experts in one group."""
    first = trace.meta["moe_layers"][0]
    dev = costs.device_only()
    compute = sum(dev.compute(d, d.layer == first) + dev.group(list(d.counts)) for d in trace.demands)
    link_s = costs.expert_bytes / (costs.link_gbps * 1e9)
    if min_misses is None:
        min_misses = replay(trace, "min", capacity)["demand_misses"]
    return {"limit_per_step": max(compute, transfers * link_s) / steps,
            "floor_per_step": max(compute, min_misses * link_s) / steps, "min_misses": min_misses}


WALL_STORE_LIMIT = 2 << 30     # bytes: the wall clock replays real expert tensors on this machine


def wall_run(trace: Trace, costs: Costs, capacity: int, policy: str, priority: str = "fifo",
             min_misses: int | None = None) -> dict:
    """The same cell on the wall clock (clock 'wall'): the stream engine with the emulated link sleeping and
    the calibrated compute spinning on this machine (cpu-emulated), for a check of the virtual clock."""
    hw, s = costs.hw, costs.shape
    check_clock("wall", hw)
    store = len(trace.meta["moe_layers"]) * trace.meta["num_experts"] * s.expert_bytes
    if store > WALL_STORE_LIMIT:
        raise SettingError(f"clock 'wall' would allocate {store / 2**30:.1f} GiB of experts for this shape; "
                           "use shape 'tiny' or clock 'virtual'")
    spec = virtual_spec(costs, capacity, policy, priority)
    st = run_stream(trace, spec, ExpertShape(s.hidden_size, s.moe_intermediate_size),
                    Calibration(hw.expert_us, hw.other_us_per_demand, source=hw.name))
    steps = max(st["forwards"], 1)
    tokens = tokens_decoded(trace)
    return {"seconds": st["seconds"], "steps": st["forwards"], "prefill_forwards": st["prefill_forwards"],
            "seconds_per_step": st["seconds"] / steps, "tokens": tokens,
            "tokens_per_second": tokens / st["seconds"] if st["seconds"] else float("nan"),
            "stall_per_step": st["stall_seconds"] / steps,
            "link_busy_over_wall": st["link_busy_seconds"] / st["seconds"] if st["seconds"] else float("nan"),
            **limits(trace, costs, capacity, st["transfers"], steps, min_misses),
            "demand_misses": st["demand_misses"], "speculative_transfers": st["speculative_transfers"],
            "prefetch_hits": st["prefetch_hits"], "transfers": st["transfers"]}


def check_clock(clock: str, hw: Hardware) -> None:
    if clock not in CLOCKS:
        raise SettingError(f"unknown clock {clock!r}; choose one of {CLOCKS}")
    if clock == "wall" and not hw.calibrated:
        raise SettingError(f"clock 'wall' runs the stream on this machine: it needs a calibrated hardware profile "
                           f"(cpu-emulated), not {hw.name!r}; use clock 'virtual'")


def check_grid(policies, ratios, priorities, batch_sizes=None) -> None:
    """Every bad value fails before a replay."""
    if not policies:
        raise SettingError("--policies is empty; give at least one engine policy, e.g. demand,last_step")
    for p in policies:
        if not check_policy(p).engine_ok:
            raise SettingError(f"policy {p!r} runs in the simulator only; the model runs the engine's policies")
    if not ratios:
        raise SettingError("--cache-ratios is empty; give ratios C/W, e.g. 0.43,1,1.73")
    for r in ratios:
        if not (isinstance(r, (int, float)) and np.isfinite(r) and r > 0):
            raise SettingError(f"--cache-ratios: a ratio C/W must be a finite number > 0, got {r!r}")
    for p in priorities:
        if p not in PRIORITIES:
            raise SettingError(f"--link-priority: unknown {p!r}; choose one of {PRIORITIES}")
    for b in batch_sizes or ():
        if not (isinstance(b, int) and b >= 1):
            raise SettingError(f"--batch-sizes: a batch size is an integer >= 1, got {b!r}")


def model_grid(traces: list[Trace], hw: Hardware, shape_name: str, policies, ratios, priorities=("fifo",),
               progress: bool = False, names: list[str] | None = None, clock: str = "virtual",
               floors: dict | None = None) -> pd.DataFrame:
    """One row per trace x C/W x link priority x policy (module docstring); clock 'wall' runs each cell on
    this machine instead (wall_run)."""
    check_grid(policies, ratios, priorities)
    check_clock(clock, hw)
    one = model_run if clock == "virtual" else wall_run
    costs = Costs(hw, shape(shape_name))
    rows = []
    jobs = [(i, r) for i in range(len(traces)) for r in ratios]
    for i, ratio in tqdm(jobs, desc="model", disable=not progress):
        t = traces[i]
        C = capacity_for(ratio, mean_working_set(t), t.meta["num_experts"])
        key = (id(t), C)
        floor = floors.get(key) if floors is not None else None
        if floor is None:
            floor = replay(t, "min", C)["demand_misses"]
            if floors is not None:
                floors[key] = floor
        for priority in priorities:
            for policy in policies:
                out = one(t, costs, C, policy, priority, min_misses=floor)
                rows.append({"trace": names[i] if names else str(t.path or i), "task": t.meta.get("task"),
                             "batch_size": int(t.meta.get("batch_size") or 1), "hardware": hw.name,
                             "shape": shape_name, "clock": clock, "cache_ratio": ratio, "cache_experts": C,
                             "link_priority": priority, "policy": policy, **out})
    return pd.DataFrame(rows)


def to_json(df: pd.DataFrame) -> str:
    """Rows as JSON, floats written by Python's repr (shortest round-trip): identical bits give identical text."""
    return json.dumps(df.to_dict("records"), sort_keys=False)


# --- validation on the cpu profile -----------------------------------------------------------------
VALIDATION_RATIOS = (0.43, 1.0, 1.73)
VALIDATION_POLICIES = ("demand", "last_step")


FAST_LINK = dict(link="emulated", bandwidth_gbps=1e6, latency_us=0.0)     # a link no compute ever waits on


def cpu_emulated(P: Settings, loaded, ps: list[list[int]], batch_size: int = 1, reps: int = 1,
                 trace: Trace | None = None) -> tuple[Hardware, str]:
    """The cpu-emulated profile with its costs measured now, on this machine, on the offloaded engine:
    runs on a link too fast to wait on at two C (demand) give the host time per copy (the slope of time on
    copies) and the compute; stream.calibrate's resident run splits that compute between the experts and
    the rest (its share of expert time)."""
    dc = P.decode_config()
    cal = calibrate(loaded, ps, dc, batch_size)
    if trace is None:
        trace = run(loaded, ps, batch_size, dc, device=P.device, record=True).trace
    W = mean_working_set(trace)
    points = []
    for ratio in (0.43, 3.0):
        C = capacity_for(ratio, W, loaded.cfg.num_experts)
        spec = OffloadSpec(C, "demand", **FAST_LINK)
        res = [run(loaded, ps, batch_size, dc, spec=spec, device=P.device) for _ in range(reps + 1)][1:]
        best = min(res, key=lambda r: r.stats["seconds"]).stats
        points.append((best["transfers"], best["seconds"], best["demand_hits"] + best["demand_misses"]))
    (x1, t1, accesses), (x2, t2, _) = points
    copy_s = max(0.0, (t1 - t2) / (x1 - x2)) if x1 != x2 else 0.0
    compute = t2 - x2 * copy_s
    demands = len(trace)
    share = cal.compute_us_per_expert * 1e-6 * accesses / compute if compute > 0 else 0.0
    share = min(max(share, 0.0), 1.0)
    hw = dataclasses.replace(HARDWARE["cpu-emulated"], expert_us=1e6 * compute * share / accesses,
                             other_us_per_demand=1e6 * compute * (1 - share) / demands, plan_us=0.0,
                             copy_host_us=1e6 * copy_s)
    source = (f"{hw.expert_us:.1f} us per expert, {hw.other_us_per_demand:.0f} us other per demand, "
              f"{hw.copy_host_us:.1f} us host per copy")
    return hw, source


def validate_cpu(P: Settings, ratios=VALIDATION_RATIOS, policies=VALIDATION_POLICIES, batch_sizes=(1, 4),
                 repetitions: int = 2, n_prompts: int = 2, progress: bool = True) -> tuple[pd.DataFrame, str]:
    """Measured (wall clock, real compute, emulated link) against modelled seconds per step, one row per run.
    Returns the rows and the calibration's description."""
    loaded = load_model(P)
    task = P.tasks[0]
    _, ps = prompts(loaded.tokenizer, task, n_prompts, P.seed, P.max_prompt_tokens)
    dc = P.decode_config()
    shp = shape("tiny") if loaded.cfg.name == "tiny" else Shape.of(loaded.cfg, 4)
    costs, sources = {}, []
    traces: dict[int, Trace] = {}
    for b in batch_sizes:                  # compute per demand grows with the batch: calibrated per batch size
        # The routing of every run of this batch size (offloading changes time, never results); measured runs
        # do not record, since recording also computes each layer's cross-layer prediction.
        traces[b] = run(loaded, ps, b, dc, device=P.device, record=True, task=task).trace
        hw, source = cpu_emulated(P, loaded, ps, b, trace=traces[b])
        costs[b] = Costs(hw, shp)
        sources.append(f"batch {b}: {source}")
    source = "; ".join(sources)
    rows = []
    jobs = [(b, r, rep) for b in batch_sizes for r in ratios for rep in range(repetitions)]
    for b, ratio, rep in tqdm(jobs, desc="validate", disable=not progress):
        t = traces[b]
        C = capacity_for(ratio, mean_working_set(t), loaded.cfg.num_experts)
        order = policies if rep % 2 == 0 else tuple(reversed(policies))
        for policy in order:
            spec = offload_spec(P, loaded, C, policy)
            res = run(loaded, ps, b, dc, spec=spec, device=P.device, task=task)
            m = model_run(t, costs[b], C, policy, P.link_priority)
            s = res.stats
            rows.append({"task": task, "batch_size": b, "cache_ratio": ratio, "bandwidth_scale": 1.0,
                         "cache_experts": C, "rep": rep,
                         "policy": policy, "measured_seconds_per_step": s["seconds"] / s["forwards"],
                         "modeled_seconds_per_step": m["seconds_per_step"],
                         "measured_stall": s["stall_seconds"], "modeled_stall": m["stall_per_step"] * m["steps"],
                         "demand_misses": s["demand_misses"], "modeled_demand_misses": m["demand_misses"],
                         "forwards": s["forwards"]})
    df = pd.DataFrame(rows)
    df["error"] = df.modeled_seconds_per_step / df.measured_seconds_per_step - 1
    return df, source


VALIDATION = "validation"    # data/results/<profile>/validation.csv: the timed validation rows (replication.py)


def validation(P: Settings, progress: bool = True) -> tuple[pd.DataFrame, str]:
    """The validation protocol of docs/perf_model.md: validate_cpu at batch sizes 1 and 4 and every C/W of the
    profile's grid, 2 repetitions, reused from data/results/<profile>/validation.csv when made under these settings
    (replication.cached_rows). Returns the rows and the calibration's description."""
    def measure():
        df, source = validate_cpu(P, ratios=tuple(P.cache_ratios), batch_sizes=(1, 4), repetitions=2,
                                  progress=progress)
        return df.assign(calibration=source)
    rows = cached_rows(P, VALIDATION, bench_fingerprint(P), measure)
    return rows, str(rows.calibration.iloc[0]) if len(rows) else ""


def validate_gpu(report: str | Path | None = None, traces: dict[int, str | Path] | None = None) -> pd.DataFrame:
    """The runs of a gpu_check report against the model on their recorded routing (h200 profile with the
    report's measurements). One row per run: measured and modelled seconds per forward (prefill included,
    as gpu_check's ms_per_forward)."""
    report = Path(report) if report else committed_gpu_check()
    r = load_gpu_check(report)
    hw = hardware("h200", report)
    traces = traces or {b: report.parent / f"h200_trace_b{b}.safetensors" for b in (1, 4)}
    eng = r["engine"]
    cfg = dataclasses.replace(PRESETS["llada2-mini"], num_hidden_layers=eng["layers"], vocab_size=32768)
    costs = Costs(hw, Shape.of(cfg, 2))
    rows = []
    loaded = {b: Trace.load(p) for b, p in traces.items()}
    for run_ in eng["runs"]:
        t = loaded.get(run_["batch"])
        if t is None:
            continue
        m = model_run(t, costs, run_["cache_experts"], run_["policy"], "fifo")
        forwards = m["steps"] + m["prefill_forwards"]
        rows.append({"batch_size": run_["batch"], "cache_ratio": run_["cache_ratio"],
                     "cache_experts": run_["cache_experts"], "policy": run_["policy"],
                     "measured_seconds_per_step": run_["ms_per_forward"] / 1e3,
                     "modeled_seconds_per_step": m["seconds"] / m["steps"],
                     "measured_demand_misses": run_["demand_misses"], "modeled_demand_misses": m["demand_misses"],
                     "forwards": forwards})
    df = pd.DataFrame(rows)
    df["error"] = df.modeled_seconds_per_step / df.measured_seconds_per_step - 1
    return df


def validation_summary(rows: pd.DataFrame, a: str = "demand", b: str = "last_step") -> dict:
    """Median and worst absolute error of seconds per step over cells (a cell: batch x C/W x policy, its
    repetitions' mean), and sign agreement: every cell pair whose measured a-vs-b difference has an interval
    excluding 0 (paired t, stats.paired_table; needs repetitions) must have the modelled difference's sign."""
    keys = ["batch_size", "cache_ratio", "policy"]
    cells = rows.groupby(keys, as_index=False)[["measured_seconds_per_step", "modeled_seconds_per_step"]].mean()
    err = (cells.modeled_seconds_per_step / cells.measured_seconds_per_step - 1).abs()
    out = {"cells": len(cells), "median_abs_error": float(err.median()), "worst_abs_error": float(err.max()),
           "signs": []}
    if "rep" in rows and rows.rep.nunique() >= 2:
        tab = paired_table(rows, a, b, ["batch_size", "cache_ratio"], metric="measured_seconds_per_step")
        for r in tab.itertuples():
            if not r.excludes_zero:
                continue
            mod = cells.set_index(keys).modeled_seconds_per_step
            d_mod = mod[(r.batch_size, r.cache_ratio, a)] - mod[(r.batch_size, r.cache_ratio, b)]
            out["signs"].append({"batch_size": r.batch_size, "cache_ratio": r.cache_ratio,
                                 "measured_diff_pct": r.diff_pct, "modeled_sign_agrees":
                                 bool(np.sign(d_mod) == np.sign(r.diff_pct))})
    out["all_signs_agree"] = all(s["modeled_sign_agrees"] for s in out["signs"])
    return out


# --- the model's error, run by run (docs/perf_model.md, "Validation") ----------------------------------
VALIDATION_CELL = ["batch_size", "cache_ratio"]     # a measured demand-vs-last_step comparison: one per cell


def same_rows(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    """Two runs' validation rows are the same rows (a run compared with its stored copy): same cells, repetitions
    and policies, same measured and modelled seconds per step."""
    keys = ["batch_size", "cache_ratio", "policy", "rep"]
    vals = ["measured_seconds_per_step", "modeled_seconds_per_step"]
    if len(a) != len(b) or not set(keys + vals) <= set(a.columns) & set(b.columns):
        return False
    a, b = (x.sort_values(keys)[keys + vals].reset_index(drop=True) for x in (a, b))
    return bool((a[keys].astype(str).to_numpy() == b[keys].astype(str).to_numpy()).all()
                and np.allclose(a[vals].to_numpy(float), b[vals].to_numpy(float), rtol=1e-9, atol=0))


@dataclass(frozen=True)
class CellSign:
    """One validation cell's demand over last_step (% steps per second): the measured interval it is ruled on
    (replication.py) beside the virtual clock's modelled value, and whether their signs agree."""
    batch_size: int
    cache_ratio: float
    measured: object             # verdicts.Interval: the ruled interval (pooled, one run widened, or within)
    modeled: float               # this run's modelled difference, %

    @property
    def agrees(self) -> bool | None:
        """None when the measured interval has no sign (it crosses 0, or is unusable)."""
        if not self.measured.excludes_zero:
            return None
        return bool(np.sign(self.measured.mean) == np.sign(self.modeled))

    def text(self) -> str:
        if self.agrees is None:
            why = "too few pairs for a sign" if not self.measured.usable else "crosses 0: no sign to agree with"
        else:
            why = "signs agree" if self.agrees else "signs DISAGREE"
        return (f"b={self.batch_size} C/W {self.cache_ratio:g}: measured {self.measured.text()}, modelled "
                f"{self.modeled:+.1f}% ({why})")


@dataclass(frozen=True)
class ModelErrors:
    """The model-error figure of every run: this run's and each stored run's validation_summary (docs/perf_model.md,
    "Validation": a run's figure is the median absolute error over its cells; the claim is ruled on the median of
    the stored runs' figures when this run is one of them, else on this run's own figure)."""
    this: dict                                  # validation_summary of this run's rows
    runs: tuple[tuple[str, dict], ...] = ()     # (stored run, its validation_summary), in run order
    stored: str = ""                            # the stored run whose rows this run's rows are ("" when none)
    cells: tuple[CellSign, ...] = ()            # measured vs modelled demand over last_step per cell

    @property
    def figures(self) -> list[float]:
        return [s["median_abs_error"] for _, s in self.runs]

    @property
    def pooled(self) -> float | None:
        """The median over the stored runs' figures (None with fewer than 2 stored runs)."""
        return float(np.median(self.figures)) if len(self.runs) >= 2 else None

    @property
    def is_pooled(self) -> bool:
        return bool(self.stored) and self.pooled is not None

    @property
    def ruled(self) -> float:
        return self.pooled if self.is_pooled else self.this["median_abs_error"]


def steps_per_second(rows: pd.DataFrame) -> pd.DataFrame:
    """Validation rows with measured and modelled steps per second (higher is faster, as tokens/s)."""
    return rows.assign(measured_steps_per_second=1.0 / rows.measured_seconds_per_step,
                       modeled_steps_per_second=1.0 / rows.modeled_seconds_per_step)


def cell_signs(rows: pd.DataFrame, stored: list[tuple[str, pd.DataFrame]], a: str = "demand",
               b: str = "last_step") -> tuple[CellSign, ...]:
    """Per validation cell, a over b in measured steps per second on the interval replication.py rules on (the
    stored runs' rows give the between-run spread), beside the modelled difference of this run."""
    if not {a, b} <= set(rows.policy):
        return ()
    runs_ = Runs(steps_per_second(rows), tuple((n, steps_per_second(r)) for n, r in stored),
                 metric="measured_steps_per_second")
    effects = runs_.effects(a, b, VALIDATION_CELL)
    mod = rows.groupby([*VALIDATION_CELL, "policy"]).modeled_seconds_per_step.mean()
    out = []
    for (bs, ratio), r in effects.items():
        modeled = 100.0 * (mod[(bs, ratio, b)] / mod[(bs, ratio, a)] - 1)     # steps/s: a over b
        out.append(CellSign(int(bs), float(ratio), r.ruled, float(modeled)))
    return tuple(out)


def errors_of(rows: pd.DataFrame, stored: list[tuple[str, pd.DataFrame]]) -> ModelErrors:
    """ModelErrors of this run's validation rows beside the stored runs' rows (each [(run name, rows)])."""
    same = next((name for name, r in stored if same_rows(rows, r)), "")
    return ModelErrors(validation_summary(rows), tuple((name, validation_summary(r)) for name, r in stored), same,
                       cell_signs(rows, stored))


def model_errors(P: Settings, rows: pd.DataFrame) -> ModelErrors:
    """errors_of this run's rows (performance_model.validation) and the stored runs' rows of the same settings
    (data/results/<profile>/runs/run<k>/validation.csv, replication.stored_rows)."""
    return errors_of(rows, stored_rows(P, VALIDATION, bench_fingerprint(P)))


def stored_claims(P: Settings) -> list[Claim]:
    """The model-error claim as a `--store` run of the stored runs' last one rules it, from the committed rows
    alone (tests/test_stored_runs.py recomputes the committed record with it)."""
    stored = stored_rows(P, VALIDATION, bench_fingerprint(P))
    if not stored:
        raise ValueError(f"profile {P.name}: no stored validation rows (data/results/{P.name}/runs/run<k>/)")
    rows = stored[-1][1]
    return [model_error_claim(errors_of(rows, stored), validation_summary(validate_gpu()),
                              str(rows.calibration.iloc[0]))]


def summary_text(s: dict) -> str:
    """A run's figure: its median absolute error, the worst cell, and its sign agreement (validation_summary)."""
    signs = s["signs"]
    return (f"{100 * s['median_abs_error']:.1f}% (worst {100 * s['worst_abs_error']:.1f}%, {s['cells']} cells, signs "
            f"{sum(x['modeled_sign_agrees'] for x in signs)} of {len(signs)})")


def errors_table(e: ModelErrors) -> pd.DataFrame:
    """One row per run (every stored run, then this run): its median and worst absolute error, its cells, its
    sign agreement and its own verdict against paper.MODEL_ERROR."""
    rows = [(name, s) for name, s in e.runs] + [(f"this run{f' (= {e.stored})' if e.stored else ''}", e.this)]
    return pd.DataFrame([{"run": name, "median_abs_error": s["median_abs_error"],
                          "worst_abs_error": s["worst_abs_error"], "cells": s["cells"],
                          "signs_agree": f"{sum(x['modeled_sign_agrees'] for x in s['signs'])} of {len(s['signs'])}",
                          "verdict": judged(s["median_abs_error"] <= paper.MODEL_ERROR)} for name, s in rows])


def model_error_claim(e: ModelErrors, gpu_summary: dict, source: str) -> Claim:
    """The model-error claim (docs/perf_model.md, "Validation"): every run's figure printed, ruled on the median of
    the stored runs' figures when this run is one of them, else on this run's own figure (one run); each stored
    run's own verdict beside it. The measured demand-over-last_step difference of every validation cell is printed
    beside the virtual clock's, with their sign agreement."""
    limit = paper.MODEL_ERROR
    per_run = tuple(judged(f <= limit) for f in e.figures)
    pooled = judged(e.pooled <= limit) if e.pooled is not None else ""
    this_run = judged(e.this["median_abs_error"] <= limit)
    n = len(e.runs)
    if e.is_pooled:
        verdict, ruled = pooled, "pooled"
        on = f"the median over N = {n} stored runs of each run's median absolute error (runs are the unit)"
        reason = f"median of the {n} runs' figures"
    else:
        verdict, ruled = this_run, "this run"
        on = (f"one run: its own median absolute error ({n} stored runs beside it)" if n else
              "one run: its own median absolute error (no stored runs to compare)")
        reason = ("one run: this run is not one of the stored runs, so its own figure rules" if n else
                  "one run: no stored runs")
    runs_text = "; ".join(f"{name} {summary_text(s)}" for name, s in e.runs)
    this_text = f"this run{f' (it is {e.stored})' if e.stored else ''}: {summary_text(e.this)}"
    cells = e.cells
    signed = [c for c in cells if c.agrees is not None]
    cell_text = ("; ".join(c.text() for c in cells) + f"; the modelled sign agrees in {sum(c.agrees for c in signed)} "
                 f"of {len(signed)} cells whose measured interval excludes 0") if cells else "no paired cells"
    measured = ("cpu, each run's median absolute error of seconds per step (signs: the modelled sign agrees with k "
                "of the n measured demand-vs-last_step differences whose interval over the run's pairs excludes 0): "
                + (f"{runs_text}; median of the {n} runs {100 * e.pooled:.1f}%; " if n >= 2 else
                   f"{runs_text}; " if n else "")
                + f"{this_text}; demand over last_step per cell (steps/s), measured on the ruled interval vs "
                f"modelled (virtual clock): {cell_text}; h200 (gpu_check runs, host costs fitted on them): median "
                f"{100 * gpu_summary['median_abs_error']:.1f}%, worst {100 * gpu_summary['worst_abs_error']:.1f}%; "
                f"calibration (this run): {source}")
    value = e.ruled
    side = f"{(limit - value) * 100:.1f} points under" if value <= limit else f"{(value - limit) * 100:.1f} points over"
    margin = (f"{'median over runs' if e.is_pooled else 'this run'} {100 * value:.1f}% vs <= {100 * limit:.0f}%: "
              f"{side}")
    return Claim(
        "[own result] the performance model predicts measured seconds per step within 10% (median absolute error "
        "over cells; cpu: the tiny model on the emulated link against the model with cpu-emulated costs)",
        "not a claim of the paper: this artifact's own result; judged: median absolute error <= "
        f"{100 * limit:.0f}% (docs/perf_model.md, Validation: the median over the stored runs' figures)",
        measured, verdict, reason, timing=True,
        counting="seconds per denoising step, modelled against measured (a cell: the mean of its 2 repetitions)",
        interval=on, margin=margin, per_run=per_run, pooled=pooled, this_run=this_run, ruled=ruled)


# --- notebook 08: the modelled grid, the figure and the claims ----------------------------------------
GRID_RATIOS = (0.43, 0.83, 1.0, 1.73)
GRID_POLICIES = ("demand", "last_step", "last_step_conservative", "cross_layer", "oracle")
GPUS = ("a5000", "h200")
GPU_SHAPES = ("llada2-mini", "llada2-flash")


def paper_point(P: Settings) -> Trace:
    """A synthetic stream at the routing point the paper implies (notebook 07's 'paper point': its novelty
    and W spread, from the profile's committed 07 record, else the cpu profile's), 4 MoE layers, one block of
    16 steps, no prefill (short: the grid replays it 128 times)."""
    committed = repo_root() / "data" / "results"         # inputs from the checkout, whatever ARTIFACT_DATA says
    path = committed / P.name / "07_stream_throughput.csv"
    if not path.is_file():
        path = committed / "cpu" / "07_stream_throughput.csv"
    row = pd.read_csv(path).query("task == 'paper point'").iloc[0]
    return synth(SynthParams(layers=4, blocks=1, steps=16, novelty=float(row.novelty),
                             w_spread=float(row.w_spread), prefill=0.0))


def gpu_grid(streams: dict[str, Trace], full: str = "paper point", progress: bool = True) -> pd.DataFrame:
    """Every GPU x C/W x policy on every stream (cross_layer only where the trace carries its predictions):
    on `full` for both shapes and both link priorities, on the others (recorded traces, longer) for
    llada2-mini under fifo (what the claims read), to keep the notebook's run time."""
    frames, floors = [], {}
    jobs = [(hw, s, name) for hw in GPUS for s in GPU_SHAPES for name in streams
            if name == full or s == "llada2-mini"]
    for hw, s, name in tqdm(jobs, desc="model grid", disable=not progress):
        t = streams[name]
        pols = [p for p in GRID_POLICIES if t.has_predictions or not check_policy(p).needs_prediction]
        prios = PRIORITIES if name == full else ("fifo",)
        frames.append(model_grid([t], HARDWARE[hw], s, pols, GRID_RATIOS, prios, names=[name], floors=floors))
    df = pd.concat(frames, ignore_index=True)
    df["floor_tokens_per_second"] = df.tokens / (df.floor_per_step * df.steps)
    return df


def diffs(grid: pd.DataFrame, a: str = "demand", b: str = "last_step", priority: str = "fifo") -> pd.DataFrame:
    """Modelled tokens/s of a over b, %, per hardware x shape x stream x C/W."""
    g = grid[grid.link_priority == priority].pivot_table(index=["hardware", "shape", "trace", "cache_ratio"],
                                                         columns="policy", values="tokens_per_second")
    return (100 * (g[a] / g[b] - 1)).rename("diff_pct").reset_index()


CLAIM_SHAPE = "llada2-mini"     # the shape the modelled claims rule on (every stream of the grid, fifo)


def plot(grid: pd.DataFrame, rows: pd.DataFrame, P: Settings, full: str = "paper point"):
    """Left: modelled vs measured seconds per step (cpu validation, one dot per cell). Right: modelled tokens/s
    per GPU on every stream the claims rule on (CLAIM_SHAPE, each stream of the grid: `full` with both link
    priorities, fifo solid and demand priority dashed, the others fifo), the physical floor dotted, and at each
    C/W the modelled demand-over-last_step difference (fifo) the claims read."""
    streams = list(dict.fromkeys(grid.trace))
    streams = [full] + [s for s in streams if s != full] if full in streams else streams
    panels = [(hw, st) for hw in GPUS for st in streams]
    fig, axes = plt.subplots(1, 1 + len(panels), figsize=(4.4 * (1 + len(panels)), 4.4), squeeze=False,
                             layout="constrained")
    axes = axes[0]
    ax = axes[0]
    cells = rows.groupby(["batch_size", "cache_ratio", "policy"], as_index=False)[
        ["measured_seconds_per_step", "modeled_seconds_per_step"]].mean()
    for pol, g in cells.groupby("policy"):
        ax.scatter(1e3 * g.measured_seconds_per_step, 1e3 * g.modeled_seconds_per_step, label=pol)
    hi = 1e3 * float(cells[["measured_seconds_per_step", "modeled_seconds_per_step"]].max().max()) * 1.05
    ax.plot([0, hi], [0, hi], "k:", label="modelled = measured")
    ax.set(xlabel="measured ms per step (cpu, wall clock)", ylabel="modelled ms per step (cpu-emulated)",
           title="validation (cpu, this run)", xlim=(0, hi), ylim=(0, hi))
    ax.legend(fontsize=7)
    d = diffs(grid)
    for ax, (hw, st) in zip(axes[1:], panels):
        sel = grid[(grid.hardware == hw) & (grid["shape"] == CLAIM_SHAPE) & (grid.trace == st)]
        for i, (pol, g) in enumerate(sel.groupby("policy", sort=False)):
            for pr, style in (("fifo", "-"), ("demand", "--")):
                gg = g[g.link_priority == pr].sort_values("cache_ratio")
                ax.plot(gg.cache_ratio, gg.tokens_per_second, style, color=f"C{i}", marker="o", ms=3,
                        label=pol if pr == "fifo" else None)
        fl = sel[sel.policy == "demand"].drop_duplicates("cache_ratio").sort_values("cache_ratio")
        ax.plot(fl.cache_ratio, fl.floor_tokens_per_second, "k:", label="physical limit (min's misses)")
        here = d[(d.hardware == hw) & (d["shape"] == CLAIM_SHAPE) & (d.trace == st)]
        for r in here.itertuples():
            ax.annotate(f"{r.diff_pct:+.1f}%", (r.cache_ratio, 0), xytext=(0, 4), textcoords="offset points",
                        xycoords=("data", "axes fraction"), ha="center", fontsize=7)
        ax.axvspan(*paper.FASTER_RANGE, color=PAPER_STYLE["color"], alpha=0.06)
        ax.set(xlabel="cache ratio C/W (bottom: demand over last_step, fifo)", ylabel="modelled tokens/s",
               title=f"{hw}, {CLAIM_SHAPE}: {st}")
        ax.title.set_fontsize(9)
    axes[1].legend(fontsize=7)
    title(fig, P, f"08 performance model: validation, and modelled tokens/s on the streams the claims rule on "
                  f"({CLAIM_SHAPE}; dashed: demand priority; shaded: C/W {paper.FASTER_RANGE[0]}-"
                  f"{paper.FASTER_RANGE[1]})")
    cols = ["hardware", "shape", "trace", "cache_ratio", "link_priority", "policy", "tokens_per_second",
            "seconds_per_step", "stall_per_step", "limit_per_step", "floor_per_step"]
    return fig, grid[cols]


def _model_claim(d: pd.DataFrame, lo: float, hi: float, text: str, paper_text: str, ok, judged_on: str) -> Claim:
    sel = d[(d.cache_ratio >= lo - 1e-9) & (d.cache_ratio <= hi + 1e-9) & (d["shape"] == CLAIM_SHAPE)]
    parts = [f"{r.hardware} {r.trace} C/W {r.cache_ratio:g}: {r.diff_pct:+.1f}%" for r in sel.itertuples()]
    good = bool(ok(sel.diff_pct).all())
    return Claim(f"[modeled: {', '.join(GPUS)}, {CLAIM_SHAPE}] {text}", paper_text,
                 "demand over last_step, modelled tokens/s, fifo: " + "; ".join(parts), judged(good),
                 counting="modelled tokens/s (virtual clock)", interval=MODELED,
                 margin=f"range {sel.diff_pct.min():+.1f}..{sel.diff_pct.max():+.1f}% vs {judged_on}")


def verdicts(grid: pd.DataFrame, errors: ModelErrors, gpu_summary: dict, source: str) -> list[Claim]:
    d = diffs(grid)
    lo, hi = paper.FASTER_RANGE
    claims = [
        _model_claim(d, lo, hi, "demand-async is faster than async last-step prefetch at C/W 0.83-1.73",
                     f"{paper.FASTER_PCT[0]:+.1f} to {paper.FASTER_PCT[1]:+.1f}%, CIs exclude zero; judged on the "
                     "model: demand faster at every C/W 0.83-1.73 on both streams and both GPUs",
                     lambda x: x > 0, "> 0"),
        _model_claim(d, paper.AT_LOW.cache_ratio, paper.AT_LOW.cache_ratio,
                     "at C/W 0.43 demand-async and async last-step prefetch do not differ (within +-3%)",
                     f"{paper.paired_text(paper.AT_LOW)}; judged on the model: |difference| <= "
                     f"{paper.EQUIV_MARGIN:g}% on both streams and both GPUs",
                     lambda x: x.abs() <= paper.EQUIV_MARGIN, f"+-{paper.EQUIV_MARGIN:g}%"),
    ]
    h = grid[(grid.hardware == "h200") & (grid["shape"] == CLAIM_SHAPE) & (grid.cache_ratio == 1.0)
             & (grid.link_priority == "fifo")].set_index(["trace", "policy"])
    parts, shares = [], []
    for tr in h.index.get_level_values(0).unique():
        dem, ora, floor = (h.loc[(tr, "demand"), "seconds_per_step"], h.loc[(tr, "oracle"), "seconds_per_step"],
                           h.loc[(tr, "demand"), "floor_per_step"])
        share = (dem - ora) / (dem - floor) if dem > floor else 1.0
        shares.append(share)
        far = "; ".join(f"{p} {100 * (h.loc[(tr, p), 'seconds_per_step'] / floor - 1):+.0f}%"
                        for p in h.loc[tr].index)
        parts.append(f"{tr}: over the floor {far}; the oracle closes {100 * share:.0f}% of demand's gap")
    claims.append(Claim("[own result, modeled: h200, llada2-mini] most of demand's distance to the physical "
                        "floor is beyond prediction: the oracle closes less than half of it at C/W 1",
                        "not a claim of the paper: this artifact's own result; floor = max(compute, "
                        "min's misses x expert bytes / bandwidth) per step",
                        "; ".join(parts), judged(max(shares) < paper.GAP_LEFT),
                        counting="modelled seconds per step (virtual clock)",
                        interval=MODELED,
                        margin=f"largest share closed {100 * max(shares):.0f}% vs < {100 * paper.GAP_LEFT:.0f}%"))
    claims.append(model_error_claim(errors, gpu_summary, source))
    return claims
