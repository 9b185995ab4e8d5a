"""Head to head with TIDE's released implementation, run from a checkout the user gives.

TIDE (https://github.com/ims-kdks/TIDE) ships a modified LLaDA2 model, model/modeling_llada2_moe.py,
whose LLaDA2MoeModelLM.enable_predictive_expert_offload(max_gpu_experts_per_layer, jump_steps, ...)
keeps a per-layer GPU expert budget, re-places experts every `jump_steps` denoising steps, and
computes non-resident experts on the CPU; its `generate` returns (tokens, per-step stats). tide/
never vendors or downloads that code: it reads the interface from the checkout (checkout.check_tide),
imports the model file from there under a private package name (no sys.path change), loads the
user's safetensors checkpoint, and times TIDE's own `generate` on our prompts and settings (released).
This module puts those rows, in the benchmark row format with TIDE's counters under keys prefixed
"tide_", beside our engine's (compare_with_engine) and splits the speedup (speedup_parts).

Differences that matter for a fair reading (each handled or recorded):
  prefix     TIDE re-runs the whole prefix (prompt + earlier blocks) every denoising step; our engine's
             `cached` mode feeds only the current block. Our `full` mode does what TIDE does, so
             compare_with_engine runs both and splits the speedup: total = kv_cache x offload.
  experts    TIDE computes non-resident experts on the CPU and moves whole experts with blocking
             module.to() calls at each refresh; ours copies missed experts asynchronously to the GPU.
  refresh    TIDE re-places experts at every step of the first decoded block, then at steps
             0, jump_steps, 2*jump_steps ... of each block.
  batch      TIDE's generate decodes one prompt at a time: rows are batch size 1, compare at 1.
  steps      TIDE caps steps at gen_length, ours at the block length: we pass min(steps, block) and
             refuse gen_length below it (the two schedules would differ).
  eos        TIDE always stops after the block that holds eos (= our eos_early_stop=True); its own
             eos_early_stop=True would stop mid-block, so we pass False.
  tokens     TIDE's evaluation counts the eos token; rows count tokens before eos, as our engine does
             (TIDE's count is kept as tide_tokens_with_eos).
  budget     TIDE lowers the budget when free GPU memory is short (reserve: max(1.5 GiB, 10%));
             rows carry the effective budget and tide_budget_capped.
  jump_steps compare_with_engine sweeps TIDE's refresh interval over JUMP_STEPS = (1, 2, 4): its own
             defaults (1 in enable_predictive_expert_offload, 2 in main.py) and 4 (our tau), so TIDE is
             judged at its best setting (speedup_parts picks it), not at one we chose.
  threads    TIDE computes non-resident experts on the CPU, so it runs with torch's intra-op threads at
             the cores this process may use (tide_threads), not the bench's own setting (often 1); the
             previous count is restored afterwards. Rows carry `threads`.
  revision   written against TIDE_REVISION. check_tide refuses a checkout whose sampler ignores
             do_sample (TIDE before 0d8c547 "add deterministic method" always drew with multinomial, so
             do_sample=False would still sample); another revision that passes is used with a warning,
             and rows carry tide_modeling_sha / tide_pinned.
  speed      rows report seconds_per_forward beside tokens_per_second: TIDE re-runs the prefix, so a
             forward costs more, and the two measures separate "more forwards" from "slower forwards".

Use (notebook 05; the profile key tide_path names the checkout, run where TIDE's requirements are met):
    loaded = load_checkpoint(profile["model"], dtype="bfloat16", device="cuda", resident=False)
    rows = compare_with_engine(loaded, profile["tide_path"], prompts, budget_experts=C, jump_steps=tau,
                               spec=RunSpec(device="cuda", link="cuda", decode=dc))
    parts = speedup_parts(rows)      # speedup_total = speedup_kv_cache x speedup_offload
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
from tqdm.auto import tqdm

from artifact.errors import SettingError
from artifact.experiments.bench.results import STAT_COLUMNS
from artifact.experiments.tide.checkout import require_cuda
from artifact.experiments.tide.released import TideRun, check_prompts, open_tide, tide_arguments
from artifact.model.tasks import tokens_sha
from artifact.offload.runner import decode_prompts
from artifact.offload.spec import RunSpec

JUMP_STEPS = (1, 2, 4)  # TIDE's defaults (enable_predictive_expert_offload: 1, main.py: 2) and our tau


def engine_row(
    loaded,
    prompts: list[list[int]],
    budget_experts: int,
    spec: RunSpec,
    *,
    policy: str = "demand",
    rep: int = 0,
    task: str | None = None,
    cache_ratio: float | None = None,
) -> tuple[dict, list[list[int]]]:
    """Our engine at the same budget, batch size 1, run as `spec` says (RunSpec: decoding, device, forward
    mode, kernel, link and its priority, lookahead, tau) with `policy` at `budget_experts` slots, in the
    benchmark row format."""
    dc = spec.decode
    spec = spec.replace(capacity=budget_experts, policy=policy)
    res = decode_prompts(loaded, prompts, 1, spec, task=task)
    row = {
        "system": "engine",
        "policy": policy,
        "mode": dc.mode,
        "task": task,
        "batch_size": 1,
        "cache_ratio": cache_ratio,
        "cache_experts": budget_experts,
        "rep": rep,
        "prompts": len(prompts),
        "gen_length": dc.gen_length,
        "steps": dc.steps,
        "threshold": dc.threshold,
        "forward": spec.forward,
        "expert_kernel": spec.expert_kernel,
        "link_priority": spec.link_priority,
        "lookahead": spec.lookahead,
        "tau": spec.tau,
    }
    row.update({k: getattr(res.stats, k, None) for k in STAT_COLUMNS})  # the bench's columns
    row.update(
        tokens=res.stats.tokens_generated, tokens_sha=tokens_sha(res.tokens), threads=torch.get_num_threads()
    )
    row["seconds_per_forward"] = row["seconds"] / row["forwards"] if row.get("forwards") else None
    return row, res.tokens


ON_CUDA = RunSpec(device="cuda", link="cuda")  # compare_with_engine's default: the paper's decoding on a GPU


def compare_with_engine(
    loaded,
    tide_path,
    prompts: list[list[int]],
    budget_experts: int,
    jump_steps: int | Sequence[int] = JUMP_STEPS,
    spec: RunSpec = ON_CUDA,
    *,
    checkpoint=None,
    reps: int = 3,
    policies: tuple[str, ...] = ("demand",),
    task: str | None = None,
    cache_ratio: float | None = None,
    dtype: str = "bfloat16",
    threads: int | None = None,
    progress: bool = True,
) -> list[dict]:
    """Engine cached, engine full and TIDE released at each of `jump_steps` (default JUMP_STEPS), at one
    budget, interleaved by repetition (the order rotates each rep, so drift hits all alike). `loaded` is
    our model (load_checkpoint(..., resident=False)); both models sit in host memory at once. TIDE runs with
    `threads` torch threads
    (default: the machine's cores), the engine with the caller's setting. TIDE rows get
    same_tokens_as_engine: the share of prompts where TIDE decoded exactly the engine's full-mode tokens
    (bf16 numerics may differ). `spec` (RunSpec) is our engine's run: TIDE decodes with its decoding
    settings on its device; the engine also with its forward mode, kernel, link, link priority, lookahead
    and tau (each decoding mode in turn).
    """
    check_prompts(prompts, reps)
    sweep = (jump_steps,) if isinstance(jump_steps, int) else tuple(jump_steps)
    checkpoint = checkpoint if checkpoint is not None else loaded.path
    _refuse_unfair_setup(loaded, budget_experts, sweep, spec, checkpoint)
    dc, cfg = spec.decode, loaded.cfg
    if torch.device(spec.device).type == "cuda" and not loaded.experts.is_pinned():
        # once, not in every run's HostStore (as ModelRunner does)
        loaded.experts = loaded.experts.pin_memory()
    run = open_tide(
        tide_path,
        checkpoint,
        budget_experts,
        sweep[0],
        dc,
        device=spec.device,
        dtype=dtype,
        mask_id=cfg.mask_token_id,
        eos_id=cfg.eos_token_id,
        block_length=cfg.block_length,
        warmup_prompt=prompts[0],
        threads=threads,
    )
    warm = spec.replace(decode=replace(dc, gen_length=cfg.block_length))
    engine_row(loaded, prompts[:1], budget_experts, warm)  # warm-up, as for TIDE
    jobs = [("engine", mode, p) for p in policies for mode in ("cached", "full")]
    jobs += [("tide_released", "full", j) for j in sweep]
    rows = []
    for rep in tqdm(range(reps), desc="tide vs engine", disable=not progress):
        rows += _one_rep(
            loaded,
            run,
            prompts,
            budget_experts,
            spec,
            jobs,
            rep,
            task=task,
            cache_ratio=cache_ratio,
        )
    return rows


def _refuse_unfair_setup(loaded, budget_experts: int, sweep: tuple, spec: RunSpec, checkpoint) -> None:
    """compare_with_engine's checks, before the slow load: a usable sweep, on CUDA a like-for-like model
    (bfloat16, experts in host memory), a checkpoint directory for TIDE, and settings TIDE accepts."""
    if not sweep or len(set(sweep)) != len(sweep):
        raise ValueError(f"jump_steps must be one integer or distinct integers, got {sweep!r}")
    if spec.forward != "eager":  # the engine's full-mode rows re-run the prefix: eager only
        raise SettingError(
            f"the comparison runs our engine in mode full too, which forward {spec.forward!r} cannot: "
            "give forward eager"
        )
    if torch.device(spec.device).type == "cuda":
        require_cuda()
        if loaded.experts.dtype != torch.bfloat16:
            raise ValueError(
                f"our model is in {loaded.experts.dtype}; TIDE runs in bfloat16 only, "
                "so load ours with dtype='bfloat16' for a like-for-like comparison"
            )
        if loaded.model.backend is not None:
            raise ValueError(
                "our model's experts are resident on the GPU (load_checkpoint(..., "
                "resident=False), or "
                "set loaded.model.backend = None after a resident run): TIDE sizes its budget "
                "against the free GPU memory"
            )
    if checkpoint is None:
        raise ValueError("loaded has no checkpoint directory (random_model?): pass checkpoint=PATH for TIDE")
    dc, cfg = spec.decode, loaded.cfg
    for j in sweep:
        tide_arguments(
            budget_experts,
            j,
            dc.gen_length,
            dc.steps,
            dc.threshold,
            cfg.block_length,
            mask_id=cfg.mask_token_id,
            eos_id=cfg.eos_token_id,
        )


def _one_rep(
    loaded,
    run: TideRun,
    prompts: list[list[int]],
    budget_experts: int,
    spec: RunSpec,
    jobs: list[tuple],
    rep: int,
    *,
    task: str | None,
    cache_ratio: float | None,
) -> list[dict]:
    """One repetition: each job once, in `jobs` rotated by `rep` (so drift hits all alike). TIDE rows get
    same_tokens_as_engine against the engine's first full-mode tokens of this rep."""
    shift = rep % len(jobs)
    rows, engine_tokens, tide_rows = [], None, []
    for order, (system, mode, arg) in enumerate(jobs[shift:] + jobs[:shift]):
        if system == "engine":
            mode_spec = spec.replace(decode=replace(spec.decode, mode=mode))
            row, toks = engine_row(
                loaded,
                prompts,
                budget_experts,
                mode_spec,
                policy=arg,
                rep=rep,
                task=task,
                cache_ratio=cache_ratio,
            )
            if mode == "full" and engine_tokens is None:
                engine_tokens = toks
        else:
            run.set_jump_steps(arg)
            row, toks = run.measure(prompts, rep, task, cache_ratio)
            tide_rows.append((row, toks))
        row["order"] = order  # position in this rep's rotated order
        rows.append(row)
    for row, toks in tide_rows:
        row["same_tokens_as_engine"] = sum(a == b for a, b in zip(toks, engine_tokens)) / len(prompts)
    return rows


def speedup_parts(rows: list[dict], policy: str = "demand", jump_steps: int | None = None) -> dict:
    """Split engine-vs-TIDE into its parts from mean tokens/s over reps:
    total = engine cached / TIDE = (engine cached / engine full) x (engine full / TIDE)
          = kv_cache (prefix KV cache)                           x offload (the offloading design).
    TIDE is taken at `jump_steps`, or by default at its fastest jump_steps among the rows (the fair
    reading of a sweep: TIDE at its best setting); the choice is returned as tide_jump_steps."""

    def mean(system, mode, pol, key="tokens_per_second", j=None):
        v = [
            r[key]
            for r in rows
            if r["system"] == system
            and r["mode"] == mode
            and (pol is None or r["policy"] == pol)
            and (j is None or r.get("jump_steps") == j)
            and r.get(key) is not None
        ]
        if not v:
            raise ValueError(
                f"no rows for system={system!r} mode={mode!r} policy={pol!r}"
                + (f" jump_steps={j}" if j is not None else "")
            )
        return sum(v) / len(v)

    cached, full = mean("engine", "cached", policy), mean("engine", "full", policy)
    if jump_steps is None:
        swept = sorted({r.get("jump_steps") for r in rows if r["system"] == "tide_released"}, key=str)
        jump_steps = max(swept, key=lambda j: mean("tide_released", "full", None, j=j)) if swept else None
    tide = mean("tide_released", "full", None, j=jump_steps)
    out = {
        "engine_cached_tps": cached,
        "engine_full_tps": full,
        "tide_tps": tide,
        "tide_jump_steps": jump_steps,
        "speedup_total": cached / tide,
        "speedup_kv_cache": cached / full,
        "speedup_offload": full / tide,
    }
    for name, system, mode, pol, j in (
        ("engine_cached", "engine", "cached", policy, None),
        ("engine_full", "engine", "full", policy, None),
        ("tide", "tide_released", "full", None, jump_steps),
    ):
        try:
            out[f"{name}_seconds_per_forward"] = mean(system, mode, pol, "seconds_per_forward", j)
        except ValueError:  # rows without forward counts (collect_stats=False)
            out[f"{name}_seconds_per_forward"] = None
    return out
