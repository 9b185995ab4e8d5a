"""00 quickstart: one prompt decoded resident, then offloaded (demand, C = cache_ratio x W); offloading
changes time, never results."""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import pandas as pd

from artifact.experiments.counting import EXACT
from artifact.experiments.harness import load_model
from artifact.experiments.outputs.figures import grey, legend, title
from artifact.experiments.settings import Settings
from artifact.experiments.verdicts.records import Claim, stated, verdict_of
from artifact.model.tasks import prompts
from artifact.offload.replay.sim import capacity_for
from artifact.offload.replay.trace import mean_working_set
from artifact.offload.runner import decode_prompts

STAT_KEYS = (
    "tokens_generated",
    "forwards",
    "tokens_per_second",
    "demand_hits",
    "demand_misses",
    "stall_seconds",
    "link_busy_seconds",
    "achieved_gbps",
)


def quickstart(P: Settings, cache_ratio: float = 0.5) -> dict:
    """One prompt of the first task: resident, then offloaded (demand, C = cache_ratio * W)."""
    loaded = load_model(P)
    task = P.tasks[0]
    ids, ps = prompts(loaded.tokenizer, task, 1, P.seed, P.max_prompt_tokens)
    resident = decode_prompts(loaded, ps, 1, P.run_spec(), record=True, prompt_ids=ids, task=task)
    W = mean_working_set(resident.trace)
    C = capacity_for(cache_ratio, W, loaded.cfg.num_experts)
    offloaded = decode_prompts(loaded, ps, 1, P.run_spec(C, "demand"), prompt_ids=ids, task=task)
    return {
        "task": task,
        "prompt_id": ids[0],
        "text": loaded.tokenizer.decode(resident.tokens[0]),
        "working_set": W,
        "cache_ratio": cache_ratio,
        "cache_experts": C,
        "num_experts": loaded.cfg.num_experts,
        "resident": resident.stats.as_dict(),
        "offloaded": offloaded.stats.as_dict(),
        "same_tokens": resident.tokens == offloaded.tokens,
        "segments": (resident.segments, offloaded.segments),
    }


def generated(q: dict, P: Settings) -> str:
    """The decoded text (its first 200 characters) and, for the tiny checkpoint, why it reads as gibberish."""
    why = (
        "\n(the tiny checkpoint has seeded random weights, so this text is gibberish by design; "
        "a real checkpoint, --model DIR, writes words)"
        if P.model == "tiny"
        else ""
    )
    return "generated: " + repr(q["text"][:200]) + why


def stats_table(q: dict) -> pd.DataFrame:
    """The two runs' headline counters side by side."""
    return pd.DataFrame({"resident": q["resident"], "offloaded": q["offloaded"]}).reindex(list(STAT_KEYS))


# --- verdict --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Numbers:
    cache_experts: int
    num_experts: int
    cache_ratio: float
    miss_share: float  # demand misses / expert uses, offloaded run
    same_tokens: bool


def numbers(q: dict) -> Numbers:
    o = q["offloaded"]
    miss_share = o["demand_misses"] / (o["demand_hits"] + o["demand_misses"])
    return Numbers(q["cache_experts"], q["num_experts"], q["cache_ratio"], miss_share, bool(q["same_tokens"]))


def verdicts(n: Numbers) -> list[Claim]:
    measured = (
        f"C = {n.cache_experts} of {n.num_experts} experts per layer (C/W = {n.cache_ratio:g}), "
        f"{n.miss_share:.0%} of expert uses missed, identical tokens: {'yes' if n.same_tokens else 'no'}"
    )
    return [
        stated(
            "00-exact",
            measured,
            verdict_of(n.same_tokens),
            counting="the decoded tokens of one prompt, two runs",
            interval=EXACT,
            margin="exact: tokens equal or not",
        )
    ]


def reading(q: dict) -> str:
    """What the figure shows, in this run's numbers (printed by notebook 00)."""
    r, o = q["resident"], q["offloaded"]
    extra = o["seconds"] - r["seconds"]
    share = f", {o['stall_seconds'] / extra:.0%} of the {extra:.2f} s it adds" if extra > 0 else ""
    return (
        f"The offloaded run took {o['seconds']:.2f} s against {r['seconds']:.2f} s resident; "
        f"its stall (compute waiting on the link) was {o['stall_seconds']:.2f} s{share}."
    )


# --- figure ---------------------------------------------------------------------------------------
def plot(q: dict, P: Settings):
    """Wall-clock time of the two runs, the offloaded one split into compute and stall."""
    r, o = q["resident"], q["offloaded"]
    off = f"offloaded C={q['cache_experts']}"
    df = pd.DataFrame(
        [
            {"run": "resident", "part": "compute", "seconds": r["seconds"]},
            {"run": off, "part": "compute", "seconds": o["seconds"] - o["stall_seconds"]},
            {"run": off, "part": "stall (waiting on the link)", "seconds": o["stall_seconds"]},
        ]
    )
    fig, ax = plt.subplots(figsize=(6, 3.2))
    left = df.groupby("run", sort=False).seconds.cumsum() - df.seconds  # where each bar starts
    for row, x0 in zip(df.itertuples(), left):
        stall = "stall" in row.part
        label = row.part if stall else "compute (offloaded: with the engine's work)"
        ax.barh(row.run, row.seconds, left=x0, color=grey(0.9 if stall else 0.1), label=label)
    ax.set_xlabel("wall-clock time for one prompt (seconds)")
    legend(ax, loc="lower right")
    title(fig, P, "00 quickstart: resident vs offloaded (demand, LRU)")
    return fig, df
