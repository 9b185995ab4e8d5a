"""The logic behind the notebooks: each notebook is a parameters cell, a few calls here, a plot from
figures.py, and a claim cell that prints Claim lines.

    P = setup("cpu", gen_length=32, ...)          # the profile, rebuilt from a notebook's parameters
    ts = traces(P)                                # routing traces, recorded once per (task, batch size)
    summary = miss_summary(miss_sweep(ts, P))     # exact miss accounting (02)
    report(*miss_claims(summary))                 # claim / paper / measured / verdict lines

Counts (W, misses, transfers) are exact and identical run to run. Anything measured in wall-clock time
is printed on lines tagged `[timing]` (notebooks/nbval_sanitize.cfg masks them for nbval).
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from artifact.experiments.settings import Profile, fingerprint, load_profile
from artifact.offload.runner import OffloadSpec, expert_bytes
from artifact.paths import data_dir, repo_root

if TYPE_CHECKING:
    import pandas as pd

REPRODUCED, NOT_REPRODUCED, NOT_MEASURABLE = "reproduced", "not reproduced", "not measurable on this profile"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, NOT_MEASURABLE)

# The paper's figures (docs/DESIGN.md, "Purpose").
PAPER_ORACLE_CUT = 6.7                  # LRU misses / oracle misses
PAPER_FASTER_RANGE = (0.83, 1.73)       # C/W where demand-async beats async last-step prefetch...
PAPER_FASTER_PCT = (4.9, 11.8)          # ...by this much, CIs excluding zero
PAPER_AT_043 = (0.73, -1.16, 2.63)      # C/W 0.43: +0.73% [-1.16, +2.63]: no difference
PAPER_TIDE_SPEEDUP = {1.0: 14.4, 0.5: 6.1}   # engine / TIDE released, same budget and half of it

# How a qualitative claim is judged (our reading, stated in each claim's verdict rule):
FEW = 0.10          # "few or no misses removed": under 10% of LRU's misses
FACTOR = 1.5        # a paper ratio is reproduced within a factor of 1.5
STABLE = 0.80       # "very stable" routing: >= 80% of D(t, l) was already in D(t-1, l), on every task
TIDE_RATIOS = (1.0, 0.5)   # "the same budget" C = W, and half of it


@dataclass(frozen=True)
class Claim:
    claim: str
    paper: str
    measured: str
    verdict: str
    reason: str = ""
    timing: bool = False     # judged from wall-clock time: may differ run to run

    def __post_init__(self):
        assert self.verdict in VERDICTS, self.verdict

    def lines(self) -> list[str]:
        tag = " [timing]" if self.timing else ""
        verdict = f"{self.verdict} ({self.reason})" if self.reason else self.verdict
        return [f"claim: {self.claim}", f"paper: {self.paper}", f"measured{tag}: {self.measured}",
                f"verdict{tag}: {verdict}"]


def report(*claims: Claim) -> None:
    """The claim cell's output: four lines per claim (the notebook runner parses them)."""
    print("\n\n".join("\n".join(c.lines()) for c in claims))


# ---------------------------------------------------------------------------------------------
# Profile, places, model
# ---------------------------------------------------------------------------------------------
def setup(profile: str, **params) -> Profile:
    """The profile with a notebook's parameters laid over it (so edited parameters take effect),
    and torch's thread count set from it."""
    P = load_profile(profile, params)
    if P.torch_threads is not None:
        import torch
        torch.set_num_threads(P.torch_threads)
    return P


def parameters(namespace: dict) -> dict:
    """The profile keys a notebook's parameters cell set (e.g. parameters(globals()))."""
    from artifact.experiments.settings import PROFILE_KEYS
    return {k: namespace[k] for k in PROFILE_KEYS if k in namespace}


def figures_dir(P: Profile) -> Path:
    return Path(os.environ.get("ARTIFACT_FIGURES", repo_root() / "figures")) / P.name


def results_dir(P: Profile) -> Path:
    return data_dir() / "results" / P.name


def traces_dir(P: Profile) -> Path:
    return data_dir() / "traces" / P.name


def load_model(P: Profile):
    """The profile's checkpoint, loaded once per process (experts resident unless traces are offloaded)."""
    if P.model is None:
        raise ValueError(f"profile {P.name!r} has model: null; set it to a checkpoint directory "
                         "(load_profile(name, {'model': DIR}) or the notebook's `model` parameter)")
    return _load(P.model, P.torch_dtype, P.device, P.trace_capacity is None)


@lru_cache(maxsize=2)
def _load(model, dtype, device, resident):
    from artifact.model.checkpoint import load_checkpoint
    return load_checkpoint(model, dtype, device, resident=resident)


def offload_spec(P: Profile, loaded, capacity: int, policy: str = "demand"):
    return OffloadSpec.from_settings(P, capacity, policy, expert_bytes=expert_bytes(loaded))


# ---------------------------------------------------------------------------------------------
# 00 quickstart
# ---------------------------------------------------------------------------------------------
def quickstart(P: Profile, cache_ratio: float = 0.5) -> dict:
    """One prompt of the first task: resident, then offloaded (demand, C = cache_ratio * W)."""
    from artifact.model.tasks import prompts
    from artifact.offload.runner import run
    from artifact.offload.sim import capacity_for
    from artifact.offload.trace import mean_working_set
    loaded = load_model(P)
    task = P.tasks[0]
    ids, ps = prompts(loaded.tokenizer, task, 1, P.seed, P.max_prompt_tokens)
    dc = P.decode_config()
    resident = run(loaded, ps, 1, dc, device=P.device, record=True, prompt_ids=ids, task=task)
    W = mean_working_set(resident.trace)
    C = capacity_for(cache_ratio, W, loaded.cfg.num_experts)
    offloaded = run(loaded, ps, 1, dc, spec=offload_spec(P, loaded, C), device=P.device, prompt_ids=ids, task=task)
    return {"task": task, "prompt_id": ids[0], "text": loaded.tokenizer.decode(resident.tokens[0]),
            "working_set": W, "cache_ratio": cache_ratio, "cache_experts": C, "num_experts": loaded.cfg.num_experts,
            "resident": resident.stats, "offloaded": offloaded.stats,
            "same_tokens": resident.tokens == offloaded.tokens}


def quickstart_claim(q: dict) -> Claim:
    o = q["offloaded"]
    same = q["same_tokens"]
    return Claim("offloading changes time, never results: the offloaded run decodes the resident run's tokens",
                 "the engine is exact (a design invariant of the paper's system, no figure)",
                 f"C = {q['cache_experts']} of {q['num_experts']} experts per layer (C/W = {q['cache_ratio']:g}), "
                 f"{o['demand_misses'] / (o['demand_hits'] + o['demand_misses']):.0%} of expert uses missed, "
                 f"identical tokens: {'yes' if same else 'no'}",
                 REPRODUCED if same else NOT_REPRODUCED)


# ---------------------------------------------------------------------------------------------
# Routing traces (01, 02)
# ---------------------------------------------------------------------------------------------
# Profile keys that decide what a trace holds; a stored trace made under other values is re-recorded.
TRACE_SETTINGS = ("model", "dtype", "device", "link", "latency_us", "link_gbps", "mode", "gen_length", "steps",
                  "threshold", "trace_n_prompts", "seed", "max_prompt_tokens", "trace_capacity")


def trace_path(P: Profile, task: str, batch_size: int) -> Path:
    return traces_dir(P) / f"{task}-b{batch_size}.safetensors"


def traces(P: Profile, progress: bool = True) -> list:
    """One trace per (trace task, trace batch size), from data/traces/<profile>/ when one there was
    made with this profile's settings, else recorded (resident, or offloaded at trace_capacity) and
    saved atomically. The model is loaded only when something is recorded."""
    from tqdm.auto import tqdm

    from artifact.model.tasks import select
    from artifact.offload.trace import Trace, TraceError
    fp = fingerprint(P, TRACE_SETTINGS)
    jobs = [(t, b) for t in P.trace_tasks for b in P.trace_batch_sizes]
    out: dict[tuple, Trace] = {}
    for task, b in jobs:
        path = trace_path(P, task, b)
        if not path.is_file():
            continue
        try:
            t = Trace.load(path)
        except TraceError:
            continue                    # unreadable: recorded again below
        ids = [r["id"] for r in select(task, P.trace_n_prompts, P.seed)]
        if (t.meta.get("profile_fingerprint"), t.meta.get("prompt_ids"), t.meta.get("batch_size")) == (fp, ids, b):
            out[(task, b)] = t
    todo = [j for j in jobs if j not in out]
    for task, b in tqdm(todo, desc="record traces", disable=not progress or not todo):
        t = record_trace(P, task, b)
        t.meta["profile_fingerprint"] = fp
        out[(task, b)] = Trace.load(t.save(trace_path(P, task, b)))
    return [out[j] for j in jobs]


def record_trace(P: Profile, task: str, batch_size: int):
    from artifact.model.tasks import prompts
    from artifact.offload.runner import run
    loaded = load_model(P)
    ids, ps = prompts(loaded.tokenizer, task, P.trace_n_prompts, P.seed, P.max_prompt_tokens)
    spec = None
    if P.trace_capacity is not None:
        spec = offload_spec(P, loaded, min(P.trace_capacity, loaded.cfg.num_experts))
    return run(loaded, ps, batch_size, P.decode_config(), spec=spec, device=P.device, record=True,
               prompt_ids=ids, task=task).trace


def _label(t) -> dict:
    return {"task": t.meta.get("task"), "batch_size": int(t.meta.get("batch_size"))}


# ---------------------------------------------------------------------------------------------
# 01 working set and stability
# ---------------------------------------------------------------------------------------------
def working_set_table(ts) -> "pd.DataFrame":
    """W = distinct experts one MoE layer needs in one denoising step: one row per (trace, forward, layer)."""
    import pandas as pd

    from artifact.offload.trace import working_sets
    return pd.concat([working_sets(t).assign(**_label(t)) for t in ts], ignore_index=True)


def stability_table(ts) -> "pd.DataFrame":
    """Step-to-step similarity of D(t, l) and D(t-1, l): one row per (trace, forward, layer)."""
    import pandas as pd

    from artifact.offload.trace import step_similarity
    return pd.concat([step_similarity(t).assign(**_label(t)) for t in ts], ignore_index=True)


def lru_share(ts, ratios) -> "pd.DataFrame":
    """The share of each step's demanded experts already resident under LRU, per trace and C/W: the demand
    hit rate of replaying the trace through the 'demand' policy at C = ratio * W (all demands)."""
    import pandas as pd

    from artifact.offload.sim import capacity_for, replay
    from artifact.offload.trace import mean_working_set
    rows = []
    for t in ts:
        W = mean_working_set(t)
        for r in ratios:
            C = capacity_for(r, W, t.meta["num_experts"])
            c = replay(t, "demand", C)
            rows.append({**_label(t), "cache_ratio": r, "working_set": W, "cache_experts": C,
                         "demand_hits": c["demand_hits"], "demand_misses": c["demand_misses"],
                         "resident_share": c["demand_hits"] / (c["demand_hits"] + c["demand_misses"])})
    return pd.DataFrame(rows)


def stability_claim(ws, sim, share) -> Claim:
    by_task = sim.groupby("task").reuse.mean()
    worst = by_task.idxmin()
    at1 = share.loc[(share.cache_ratio - 1.0).abs().idxmin()].cache_ratio
    s1 = share[share.cache_ratio == at1]
    lru = s1.demand_hits.sum() / (s1.demand_hits.sum() + s1.demand_misses.sum())
    ok = bool((by_task >= STABLE).all())
    return Claim("expert routing is very stable from one denoising step to the next",
                 f"qualitative (no figure); judged: >= {STABLE:.0%} of D(t, l) already in D(t-1, l) on every task",
                 f"mean W {ws.working_set.mean():.0f} experts/layer/step; share of D(t, l) in D(t-1, l) "
                 f"{sim.reuse.mean():.2f} (lowest task {worst}: {by_task[worst]:.2f}), Jaccard {sim.jaccard.mean():.2f}; "
                 f"already resident under LRU at C/W = {at1:g}: {lru:.2f}",
                 REPRODUCED if ok else NOT_REPRODUCED)


# ---------------------------------------------------------------------------------------------
# 02 miss accounting
# ---------------------------------------------------------------------------------------------
def miss_sweep(ts, P: Profile, progress: bool = True) -> "pd.DataFrame":
    """Every trace x C/W x simulator policy, replayed (exact counts; sim.sweep)."""
    from artifact.offload.sim import sweep
    df = sweep(ts, P.cache_ratios, P.sim_policies, progress=progress, lookahead=P.lookahead, tau=P.tau)
    df["trace"] = [Path(p).name for p in df.trace]          # no machine paths in saved data
    return df.drop(columns=["replay_seconds"])


def miss_summary(sweep_df) -> "pd.DataFrame":
    """Counts pooled over traces per (C/W, policy), relative to LRU ('demand') at the same C/W."""
    g = sweep_df.groupby(["cache_ratio", "policy"], sort=True)[
        ["demand_misses", "speculative_transfers", "prefetch_hits", "wasted_prefetches", "accesses"]].sum()
    g = g.reset_index()
    lru = g[g.policy == "demand"].set_index("cache_ratio").demand_misses
    g["lru_misses"] = g.cache_ratio.map(lru)
    g["misses_vs_lru"] = g.demand_misses / g.lru_misses
    g["transfers"] = g.demand_misses + g.speculative_transfers
    g["transfers_vs_lru"] = g.transfers / g.lru_misses
    g["misses_removed"] = g.lru_misses - g.demand_misses
    return g


def _at(summary, policy: str, ratio: float):
    return summary[(summary.policy == policy) & (summary.cache_ratio == ratio)].iloc[0]


def _nearest(ratios, target: float) -> float:
    return float(min(ratios, key=lambda r: (abs(r - target), r)))


def miss_claims(summary) -> list[Claim]:
    ratios = sorted(summary.cache_ratio.unique())
    policies = set(summary.policy)
    claims = []
    wscale = [r for r in ratios if PAPER_FASTER_RANGE[0] <= r <= PAPER_FASTER_RANGE[1]]
    if "last_step" in policies and wscale:
        parts, ok = [], True
        for r in wscale:
            s = _at(summary, "last_step", r)
            removed = s.misses_removed / s.lru_misses
            ok &= bool(removed < FEW and s.speculative_transfers > s.misses_removed)
            parts.append(f"C/W {r:g}: {removed:.0%} removed, speculative transfers "
                         f"+{s.speculative_transfers / s.lru_misses:.0%} of LRU's misses")
        claims.append(Claim(
            "W-scale caches make last-step prefetch nearly useless: few or no misses removed beyond LRU, "
            "extra speculative transfers",
            f"few or no misses removed; judged: < {FEW:.0%} of LRU's misses removed and more speculative "
            "transfers than misses removed, at every C/W in 0.83-1.73",
            "; ".join(parts), REPRODUCED if ok else NOT_REPRODUCED))
    else:
        claims.append(Claim("W-scale caches make last-step prefetch nearly useless", "few or no misses removed",
                            "-", NOT_MEASURABLE, "no last_step policy or no C/W in 0.83-1.73 in sim_policies/cache_ratios"))
    if "oracle" in policies:
        r1 = _nearest(ratios, 1.0)
        cut = {r: 1 / _at(summary, "oracle", r).misses_vs_lru for r in ratios}
        ok = PAPER_ORACLE_CUT / FACTOR <= cut[r1] <= PAPER_ORACLE_CUT * FACTOR
        claims.append(Claim(
            f"an oracle prefetcher cuts demand misses {PAPER_ORACLE_CUT}x versus LRU",
            f"{PAPER_ORACLE_CUT}x; judged at the W-scale cache C/W = {r1:g}, within a factor {FACTOR}",
            f"LRU/oracle misses at C/W = {r1:g}: {cut[r1]:.1f}x (by C/W: "
            + ", ".join(f"{r:g}: {v:.1f}x" for r, v in cut.items()) + ")",
            REPRODUCED if ok else NOT_REPRODUCED))
    if "interval_refresh" in policies:
        removed = {r: _at(summary, "interval_refresh", r).misses_removed / _at(summary, "interval_refresh", r).lru_misses
                   for r in ratios}
        ok = all(v < FEW for v in removed.values())
        claims.append(Claim(
            "interval refresh (TIDE-style) does not beat LRU",
            f"does not beat LRU; judged: removes < {FEW:.0%} of LRU's misses at every C/W",
            "misses removed beyond LRU by C/W: " + ", ".join(f"{r:g}: {v:+.0%}" for r, v in removed.items()),
            REPRODUCED if ok else NOT_REPRODUCED))
    return claims


# ---------------------------------------------------------------------------------------------
# Benchmarks (03, 04, 05): the bench machinery, one resumable CSV per grid
# ---------------------------------------------------------------------------------------------
def bench_file(P: Profile, stem: str = "bench") -> Path:
    """data/results/<profile>/<stem>.csv, or <stem>-<fingerprint>.csv when that file holds runs made
    under other settings (so an old result file is never mixed with, nor blocks, this one)."""
    from artifact.experiments.bench import bench_fingerprint, read_rows
    path = results_dir(P) / f"{stem}.csv"
    if path.is_file():
        try:
            fps = set(read_rows(path).fingerprint)
        except ValueError:
            fps = {None}
        if fps and fps != {bench_fingerprint(P)}:
            return results_dir(P) / f"{stem}-{bench_fingerprint(P)}.csv"
    return path


def run_grid(P: Profile, stem: str = "bench", progress: bool = True, log=print):
    """run_bench on the profile's grid into bench_file(P, stem): resumes, skips finished cells."""
    from artifact.experiments.bench import CELL_KEYS, grid, run_bench
    loaded = _load(P.model, P.torch_dtype, P.device, P.trace_capacity is None) if P.model else None
    rows = run_bench(P, bench_file(P, stem), loaded=loaded, progress=progress, log=log)
    cells = {c.key for c in grid(P)}                # the file may also hold cells of another grid
    keep = [(str(t), int(b), float(r), float(s)) in cells for t, b, r, s in zip(*(rows[k] for k in CELL_KEYS))]
    return rows[keep].reset_index(drop=True)


def same_tokens(rows) -> tuple[int, int]:
    """(cells where every policy and repetition decoded the same tokens, cells)."""
    from artifact.experiments.bench import CELL_KEYS
    g = rows.groupby(list(CELL_KEYS)).tokens_sha.nunique()
    return int((g == 1).sum()), int(len(g))


def throttle_profile(P: Profile) -> Profile:
    """The 03 grid: the first task, the largest batch size, C/W = throttle_ratio, demand and last_step,
    one cell per bandwidth in throttle_scales."""
    return dataclasses.replace(P, tasks=P.tasks[:1], batch_sizes=(max(P.batch_sizes),),
                               cache_ratios=(P.throttle_ratio,), bandwidth_scales=tuple(P.throttle_scales),
                               policies=("demand", "last_step"))


def throttle_summary(rows) -> "pd.DataFrame":
    """Mean over repetitions per (bandwidth, policy): tokens/s, stall and link-busy seconds, transfers.
    On the cuda link the unpaced scale 1 has no link_gbps in the rows: it is filled in from the others."""
    rows = rows.assign(transfers=rows.demand_misses + rows.speculative_transfers)
    nominal = (rows.link_gbps / rows.bandwidth_scale).dropna()
    if len(nominal):
        rows = rows.assign(link_gbps=rows.link_gbps.fillna(rows.bandwidth_scale * nominal.median()))
    g = rows.groupby(["bandwidth_scale", "link_gbps", "policy"], sort=True, dropna=False).agg(
        runs=("seconds", "size"), tokens_per_second=("tokens_per_second", "mean"),
        stall_seconds=("stall_seconds", "mean"), link_busy_seconds=("link_busy_seconds", "mean"),
        seconds=("seconds", "mean"), demand_misses=("demand_misses", "first"),
        speculative_transfers=("speculative_transfers", "first"), transfers=("transfers", "first"))
    return g.reset_index()


def throttle_claims(summary) -> list[Claim]:
    d = summary[summary.policy == "demand"].set_index("bandwidth_scale")
    s = summary[summary.policy == "last_step"].set_index("bandwidth_scale")
    scales = sorted(d.index, reverse=True)
    extra = s.transfers.iloc[0] / d.transfers.iloc[0] - 1
    fewer = 1 - s.demand_misses.iloc[0] / d.demand_misses.iloc[0]
    counts = Claim(
        "last-step prefetch puts more transfers on the link than demand loading serves misses",
        "speculative transfers compete with demand transfers for host-to-device bandwidth",
        f"per run, last_step vs demand: {fewer:.0%} fewer demand loads, "
        f"{s.speculative_transfers.iloc[0] / d.transfers.iloc[0]:.0%} more speculative ones, {extra:+.0%} link "
        "transfers in all",
        REPRODUCED if extra > 0 else NOT_REPRODUCED)
    gap = [s.stall_seconds[x] - d.stall_seconds[x] for x in scales]
    ok = all(g > 0 for g in gap) and gap[-1] > gap[0]
    stall = Claim(
        "speculative transfers delay demand transfers: last_step stalls longer, more so as bandwidth falls",
        "speculative loads queue ahead of demand loads on the copy engine (qualitative)",
        "; ".join(f"{d.link_gbps[x]:.3g} GB/s: stall {d.stall_seconds[x]:.2f} s vs {s.stall_seconds[x]:.2f} s, "
                  f"{d.tokens_per_second[x]:.1f} vs {s.tokens_per_second[x]:.1f} tokens/s" for x in scales),
        REPRODUCED if ok else NOT_REPRODUCED, timing=True)
    return [counts, stall]


def capacity_tables(rows):
    """demand vs last_step, paired per C/W (with the paper's figures), and per (task, batch size)."""
    from artifact.experiments.stats import paired_table, with_paper
    return (with_paper(paired_table(rows, "demand", "last_step", ["cache_ratio"])),
            paired_table(rows, "demand", "last_step", ["task", "batch_size"]))


def capacity_claims(by_ratio, rows) -> list[Claim]:
    def fmt(r):
        return f"C/W {r.cache_ratio:g}: {r.diff_pct:+.1f}% [{r.ci_low:+.1f}, {r.ci_high:+.1f}]"
    n_same, n_cells = same_tokens(rows)
    lo, hi = PAPER_FASTER_RANGE
    inside = by_ratio[(by_ratio.cache_ratio >= lo) & (by_ratio.cache_ratio <= hi)]
    claims = [Claim("offloading changes time, never results: every policy decoded the same tokens in every cell",
                    "the engine is exact (design invariant)", f"{n_same} of {n_cells} cells identical",
                    REPRODUCED if n_same == n_cells else NOT_REPRODUCED)]
    if len(inside):
        bad = inside[inside.verdict != "A faster"]
        claims.append(Claim(
            "demand-async is faster than async last-step prefetch at C/W 0.83-1.73 (95% CIs exclude zero)",
            f"+{PAPER_FASTER_PCT[0]} to +{PAPER_FASTER_PCT[1]}%, CIs exclude zero",
            "; ".join(fmt(r) for r in inside.itertuples()) + f" ({int(inside.n_pairs.min())} pairs each)",
            REPRODUCED if bad.empty else NOT_REPRODUCED,
            "" if bad.empty else "not faster with a CI excluding zero at C/W " + ", ".join(f"{x:g}" for x in bad.cache_ratio),
            timing=True))
    low = by_ratio[by_ratio.cache_ratio == 0.43]
    if len(low):
        r = low.iloc[0]
        claims.append(Claim(
            "at C/W 0.43 demand-async and async last-step prefetch do not differ",
            f"{PAPER_AT_043[0]:+.2f}% [{PAPER_AT_043[1]:+.2f}, {PAPER_AT_043[2]:+.2f}]",
            fmt(r) + f" ({int(r.n_pairs)} pairs)", REPRODUCED if r.verdict == "no difference" else NOT_REPRODUCED,
            "" if r.verdict == "no difference" else f"measured: {'demand' if r.diff_pct > 0 else 'last_step'} faster",
            timing=True))
    return claims


def tide_style_profile(P: Profile) -> Profile:
    """The 05 grid: our engine at the TIDE budget and half of it, demand vs interval_refresh, batch size 1
    (TIDE decodes one prompt at a time), every task."""
    return dataclasses.replace(P, batch_sizes=(1,), cache_ratios=TIDE_RATIOS, bandwidth_scales=(1.0,),
                               policies=("demand", "interval_refresh"))


def tide_style_claim(rows) -> tuple["pd.DataFrame", Claim]:
    from artifact.experiments.stats import paired_table
    t = paired_table(rows, "demand", "interval_refresh", ["cache_ratio"])
    slower = t[t.verdict == "B faster"]
    return t, Claim(
        "a TIDE-style interval refresh does not beat demand loading (LRU) in our engine, at the budget and half",
        "interval refresh does not beat LRU",
        "; ".join(f"C/W {r.cache_ratio:g}: demand {r.diff_pct:+.1f}% [{r.ci_low:+.1f}, {r.ci_high:+.1f}] "
                  f"vs interval_refresh ({r.n_pairs} pairs), " + _misses_vs(rows, r.cache_ratio)
                  for r in t.sort_values("cache_ratio", ascending=False).itertuples()),
        REPRODUCED if slower.empty else NOT_REPRODUCED, "" if slower.empty else "interval_refresh faster", timing=True)


def _misses_vs(rows, ratio) -> str:
    m = rows[rows.cache_ratio == ratio].groupby("policy").demand_misses.sum()
    return f"interval_refresh misses {m['interval_refresh'] / m['demand'] - 1:+.0%} vs demand"


def tide_unavailable(P: Profile) -> str | None:
    """Why TIDE's released code cannot run on this profile, or None when it can. The profile's own reasons
    come first and alone (so the cpu profile's answer is the same on every machine); the machine's and the
    checkout's only when the profile asks for TIDE."""
    reasons = []
    if P.tide_path is None:
        reasons.append(f"tide_path is null in profile {P.name!r} (set it to a clone of TIDE's repository)")
    if not P.device.startswith("cuda"):
        reasons.append(f"TIDE's released code runs on CUDA only and the profile's device is {P.device!r}")
    if P.model in (None, "tiny"):
        reasons.append("it needs a real LLaDA2.0 checkpoint (profile key model), not "
                       + ("the tiny random model" if P.model == "tiny" else "null"))
    if not reasons:
        import torch
        if not torch.cuda.is_available():
            reasons.append("TIDE's released code runs on CUDA only and no GPU is present on this machine")
        else:
            from artifact.experiments.tide import check_tide
            try:
                check_tide(P.tide_path, P.device)
            except (ValueError, FileNotFoundError, ImportError, RuntimeError) as e:
                reasons.append(str(e))
    return "; ".join(reasons) or None


def tide_released(P: Profile, progress: bool = True) -> list[dict]:
    """TIDE's released implementation vs our engine at the budget and half of it (tide.compare_with_engine),
    on the bench's prompts of the first task; C from the bench's W for that task at batch size 1."""
    import torch

    from artifact.experiments.bench import ModelRunner
    from artifact.experiments.tide import compare_with_engine
    from artifact.model.checkpoint import load_checkpoint
    from artifact.model.tasks import prompts
    from artifact.offload.sim import capacity_for
    loaded = load_checkpoint(P.model, P.torch_dtype, P.device, resident=False)
    task = P.tasks[0]
    W = ModelRunner(P, loaded).working_set(task, 1)
    loaded.model.backend = None                  # drop the traced run's resident experts from the GPU ...
    if torch.cuda.is_available():
        torch.cuda.empty_cache()                 # ... since TIDE sizes its budget against free GPU memory
    _, ps = prompts(loaded.tokenizer, task, P.n_prompts, P.seed, P.max_prompt_tokens)
    rows = []
    for r in TIDE_RATIOS:
        C = capacity_for(r, W, loaded.cfg.num_experts)
        rows += compare_with_engine(loaded, P.tide_path, ps, C, P.tau, P.decode_config(), reps=P.repetitions,
                                    task=task, cache_ratio=r, device=P.device, dtype=P.torch_dtype, progress=progress)
    return rows


def tide_claims(P: Profile, rows: list[dict] | None, reason: str | None) -> list[Claim]:
    paper = f"{PAPER_TIDE_SPEEDUP[1.0]}x at the same budget, {PAPER_TIDE_SPEEDUP[0.5]}x at half of it"
    claim = "this engine is faster than TIDE's released implementation at the same expert budget"
    if rows is None:
        return [Claim(claim, paper, "-", NOT_MEASURABLE, reason or "not run")]
    from artifact.experiments.tide import speedup_parts
    parts = {r: speedup_parts([x for x in rows if x["cache_ratio"] == r]) for r in TIDE_RATIOS}
    ok = all(parts[r]["speedup_total"] > 1 for r in TIDE_RATIOS)
    return [Claim(claim, paper, "; ".join(
        f"C/W {r:g}: {p['speedup_total']:.1f}x (KV cache {p['speedup_kv_cache']:.1f}x, offload {p['speedup_offload']:.1f}x)"
        for r, p in parts.items()), REPRODUCED if ok else NOT_REPRODUCED, timing=True)]
