"""05 head to head at the same expert budget: our engine (demand vs the TIDE-style interval_refresh policy)
and, where it can run, TIDE's released implementation through its adapter (experiments/tide/adapter.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import matplotlib.pyplot as plt
import pandas as pd
import torch

from artifact.experiments.bench.model_runner import ModelRunner
from artifact.experiments.bench.order import primary
from artifact.experiments.bench.results import bench_fingerprint
from artifact.experiments.criteria import paper, thresholds
from artifact.experiments.criteria.claims import ROW_FILES
from artifact.experiments.criteria.timing import CLAIMS
from artifact.experiments.harness import load_model, run_grid
from artifact.experiments.outputs.figures import CONTROL_LABEL, legend, mean_interval, style, title
from artifact.experiments.paired_table import CELL_KEYS, paired_table
from artifact.experiments.settings import CONTROL, Settings
from artifact.experiments.tide.adapter import JUMP_STEPS, compare_with_engine, speedup_parts
from artifact.experiments.tide.checkout import check_tide
from artifact.experiments.verdicts.judge import claim_compared, judge, timed_claim
from artifact.experiments.verdicts.pooling import Compared, Replicas, gather
from artifact.experiments.verdicts.records import NOT_MEASURABLE, Claim, stated, verdict_of
from artifact.model.tasks import prompts
from artifact.offload.replay.sim import capacity_for

# abstract: "at the same expert budget" and "at half the budget"; the same budget as C = W is our reading
RATIOS = tuple(paper.TIDE_SPEEDUP)
NOTEBOOK = "05_tide_head_to_head"
(STEM,) = ROW_FILES[NOTEBOOK][1]  # data/results/<profile>/tide_style_runs.csv
CELL = list(CELL_KEYS)  # one interval per cell (bench.grid.CellKey): nothing pooled
CLAIM = CLAIMS["05-refresh"]  # interval_refresh over demand, not faster (criteria/timing.py)


# --- our engine at TIDE's budgets -----------------------------------------------------------------
def tide_style_profile(P: Settings) -> Settings:
    """The 05 grid: our engine at the TIDE budget and half of it, demand, interval_refresh, settings.CONTROL,
    batch size 1 (as TIDE decodes), every task, repetitions enough for thresholds.MIN_PAIRS pairs per C/W."""
    return dataclasses.replace(
        P,
        batch_sizes=(1,),
        cache_ratios=RATIOS,
        bandwidth_scales=(1.0,),
        policies=("demand", "interval_refresh", CONTROL),
        repetitions=max(P.repetitions, -(-thresholds.MIN_PAIRS // len(P.tasks))),
    )


def measure(P: Settings, progress: bool = True) -> pd.DataFrame:
    return run_grid(tide_style_profile(P), STEM, progress=progress)


def replicas(P: Settings, rows) -> Replicas:
    """This run's rows with the stored runs' rows of the same grid and settings (verdicts/pooling.py)."""
    return gather(P, rows, NOTEBOOK, bench_fingerprint(tide_style_profile(P)))


def style_table(rows) -> pd.DataFrame:
    """interval_refresh (A) over demand (B) within this run, paired, one row per cell (task, batch, C/W)."""
    return paired_table(rows, "interval_refresh", "demand", CELL)


# --- TIDE's released code -------------------------------------------------------------------------
def tide_unavailable(P: Settings) -> str | None:
    """Why TIDE's released code cannot run on this profile, or None. The profile's reasons come first, alone
    (the cpu profile's answer is the same on every machine); the machine's and the checkout's only after."""
    reasons = []
    if P.tide_path is None:
        reasons.append(f"tide_path is null in profile {P.name!r} (set it to a clone of TIDE's repository)")
    if not P.device.startswith("cuda"):
        reasons.append(f"TIDE's released code runs on CUDA only and the profile's device is {P.device!r}")
    if P.model in (None, "tiny"):
        model = "the tiny random model" if P.model == "tiny" else "null"
        reasons.append(f"it needs a real LLaDA2.0 checkpoint (profile key model), not {model}")
    if not reasons and not torch.cuda.is_available():
        reasons.append("TIDE's released code runs on CUDA only and no GPU is present on this machine")
    elif not reasons:
        try:
            check_tide(P.tide_path, P.device)
        except (ValueError, FileNotFoundError, ImportError, RuntimeError) as e:
            reasons.append(str(e))
    return "; ".join(reasons) or None


def tide_released(P: Settings, progress: bool = True) -> list[dict]:
    """TIDE's released implementation vs our engine at the budget and half of it (compare_with_engine),
    on the bench's prompts of the first task; C from the bench's W for that task at batch size 1."""
    loaded = load_model(P, resident=False)
    task = P.tasks[0]
    W = ModelRunner(P, loaded).working_set(task, 1)
    loaded.model.backend = None  # free the traced run's resident experts: TIDE sizes its budget against
    torch.cuda.empty_cache()  # free GPU memory (empty_cache: a no-op where CUDA never started)
    _, ps = prompts(loaded.tokenizer, task, P.n_prompts, P.seed, P.max_prompt_tokens)
    kw = dict(reps=P.repetitions, task=task, dtype=P.torch_dtype, progress=progress)
    rows = []
    for r in RATIOS:
        C = capacity_for(r, W, loaded.cfg.num_experts)
        rows += compare_with_engine(loaded, P.tide_path, ps, C, JUMP_STEPS, P.run_spec(), cache_ratio=r, **kw)
    return rows


# --- verdicts -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StyleNumbers:
    # {cell: Replicated} interval_refresh over demand, tokens/s, highest C/W first; the A/A, host shares
    timed: Compared
    misses: dict  # {cell: interval_refresh's demand misses / demand's - 1}, this run


def style_numbers(reps: Replicas) -> StyleNumbers:
    """interval_refresh over demand per cell (the direction the claim is about: does it beat demand?)."""
    c = claim_compared(reps, CLAIM)
    order = sorted(c.effects, key=lambda k: (-k.cache_ratio, k[:2], k.bandwidth_scale))  # highest C/W first
    effects = {k: c.effects[k] for k in order}
    m = primary(reps.rows).groupby([*CELL, "policy"]).demand_misses.sum()  # arm A: one demand run per rep
    misses = {k: m[(*k, "interval_refresh")] / m[(*k, "demand")] - 1 for k in effects}
    return StyleNumbers(dataclasses.replace(c, effects=effects), misses)


def label(key) -> str:
    """A cell's name: its C/W (and task, batch size and bandwidth where not the grid's usual ones)."""
    task, b, ratio, scale = key
    return (
        f"C/W {ratio:g}"
        + (f" {task}" if task != "gsm8k" else "")
        + (f" b={b}" if b != 1 else "")
        + (f" x{scale:g}" if scale != 1 else "")
    )


def style_verdict(n: StyleNumbers) -> Claim:
    misses = "; ".join(f"{label(k)} {m:+.0%}" for k, m in n.misses.items())
    return timed_claim(
        CLAIM.key,
        judge(n.timed, CLAIM, label),
        "tokens/s per run, interval_refresh over demand % per pair, one interval per cell (task, C/W)",
        note=f"interval_refresh's demand misses vs demand's, this run: {misses}",
    )


def stored_claims(P: Settings) -> list[Claim]:
    """The timing claim as `--store` rules it, from committed rows alone (tests/test_stored_runs.py)."""
    return [style_verdict(style_numbers(replicas(P, None).last_stored()))]


def released_numbers(rows: list[dict]) -> dict:
    """C/W -> adapter.speedup_parts of the released-code rows at that budget."""
    return {r: speedup_parts([x for x in rows if x["cache_ratio"] == r]) for r in RATIOS}


def released_verdict(parts: dict | None, reason: str | None) -> Claim:
    """parts: released_numbers(rows), or None when TIDE's code did not run (reason says why)."""
    if parts is None:
        return stated("05-tide", "-", NOT_MEASURABLE, reason=reason or "not run")
    measured = "; ".join(
        f"C/W {r:g}: {p['speedup_total']:.1f}x (KV cache {p['speedup_kv_cache']:.1f}x, "
        f"offload {p['speedup_offload']:.1f}x)"
        for r, p in parts.items()
    )
    return stated(
        "05-tide", measured, verdict_of(all(p["speedup_total"] > 1 for p in parts.values())), timing=True
    )


# --- figure ---------------------------------------------------------------------------------------
def _per_budget(r) -> pd.DataFrame:
    """Per C/W and policy, arm A only: mean tokens/s over tasks x repetitions, ci: its 95% half-width."""
    r = primary(r)
    g = r.groupby(["cache_ratio", "policy"], sort=False).agg(
        tokens_per_second=("tokens_per_second", "mean"),
        sd=("tokens_per_second", "std"),
        ci=("tokens_per_second", lambda v: mean_interval(v)[1]),
        runs=("tokens_per_second", "size"),
        cache_experts=("cache_experts", lambda c: "/".join(str(int(x)) for x in dict.fromkeys(c))),
    )
    return g.reset_index()


def plot(rows, P: Settings, released=None):
    """Tokens/s of our engine's policies at the budget and half of it, each bar a mean over tasks x reps with
    its 95% interval; TIDE's released code beside them when it was measured."""
    df = _per_budget(rows).assign(system="engine")
    if released:
        r = pd.DataFrame(released)
        r = r[r.system == "tide_released"].assign(policy="TIDE released")
        df = pd.concat([df, _per_budget(r).assign(system="tide_released")], ignore_index=True)
    fig, ax = plt.subplots(figsize=(7, 3.8))
    budgets = sorted(df.cache_ratio.unique(), reverse=True)
    pols = list(dict.fromkeys(df.policy))
    width = 0.8 / len(pols)
    for k, pol in enumerate(pols):
        g = df[df.policy == pol].set_index("cache_ratio").reindex(budgets)
        name, color = CONTROL_LABEL if pol == CONTROL else pol, style(pol)["color"]
        x = [i + k * width for i in range(len(budgets))]
        ax.bar(x, g.tokens_per_second, width, yerr=g.ci.fillna(0), capsize=3, color=color, label=name)
    ticks = [f"C/W {b:g} (C = {df[df.cache_ratio == b].cache_experts.iloc[0]})" for b in budgets]
    ax.set_xticks([i + width * (len(pols) - 1) / 2 for i in range(len(budgets))], ticks)
    ax.set_xlabel("expert budget per MoE layer (C per task: " + ", ".join(dict.fromkeys(rows.task)) + ")")
    ax.set_ylabel("throughput (tokens/s): mean over\ntasks x reps, bars: its 95% interval")
    said = f"paper: engine {paper.TIDE_SPEEDUP[1.0]}x faster, {paper.TIDE_SPEEDUP[0.5]}x at half"
    note = "" if released else f"TIDE released: not run on this profile ({said})"
    ax.set_title(note, fontsize=8, color="crimson")
    legend(ax, loc="upper right")
    title(fig, P, "05 head to head at the same expert budget")
    return fig, df
