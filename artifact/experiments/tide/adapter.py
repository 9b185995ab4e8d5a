"""Head to head with TIDE's released implementation, run from a checkout the user gives.

TIDE (https://github.com/ims-kdks/TIDE) ships a modified LLaDA2 model, model/modeling_llada2_moe.py,
whose LLaDA2MoeModelLM.enable_predictive_expert_offload(max_gpu_experts_per_layer, jump_steps, ...)
keeps a per-layer GPU expert budget, re-places experts every `jump_steps` denoising steps, and
computes non-resident experts on the CPU; its `generate` returns (tokens, per-step stats). This
module never vendors or downloads that code: it reads the interface from the checkout (`check_tide`),
imports the model file from there under a private package name (no sys.path change), loads the
user's safetensors checkpoint, and times TIDE's own `generate` on our prompts and settings. The rows
it returns have the benchmark row format, TIDE's counters under keys prefixed "tide_".

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
                               options=RunOptions(dc, "cuda"))
    parts = speedup_parts(rows)      # speedup_total = speedup_kv_cache x speedup_offload
"""
from __future__ import annotations

import json
import time
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from artifact.experiments.bench.model_runner import usable_cores
from artifact.experiments.bench.results import STAT_COLUMNS
from artifact.experiments.tide.checkout import (
    MODEL_CLASS,
    OFFLOAD_METHOD,
    TideInfo,
    check_checkpoint,
    check_tide,
    load_tide_module,
    require_cuda,
)
from artifact.model.checkpoint import parse_dtype
from artifact.model.config import ModelConfig
from artifact.model.decode import DecodeConfig
from artifact.model.tasks import tokens_sha
from artifact.offload.runner import OffloadSpec, RunOptions, RunSettings, decode_prompts, expert_bytes

JUMP_STEPS = (1, 2, 4)      # TIDE's defaults (enable_predictive_expert_offload: 1, main.py: 2) and our tau
# Per-step counters of TIDE's MoE blocks (summed over layers; summed over steps here).
COUNTERS = ("cpu_tokens", "gpu_tokens", "cpu_calls", "gpu_calls", "cpu_compute_time", "gpu_compute_time",
            "cpu_tokens_move_time", "gpu_tokens_move_time", "experts_move_time", "promotions", "demotions")


def tide_arguments(budget_experts: int, jump_steps: int, gen_length: int, steps: int, threshold: float,
                   block_length: int = 32, *, mask_id: int, eos_id: int, eos_early_stop: bool = True,
                   collect_stats: bool = True) -> dict:
    """Our settings -> TIDE's call arguments: {"offload": enable_predictive_expert_offload kwargs,
    "generate": generate kwargs (less input_ids)}. See the module docstring for each choice."""
    if not isinstance(budget_experts, int) or budget_experts < 1:
        raise ValueError(f"budget_experts must be an integer >= 1 (experts per MoE layer), got {budget_experts!r}")
    if not isinstance(jump_steps, int) or jump_steps < 1:
        raise ValueError(f"jump_steps must be an integer >= 1 (TIDE refreshes at step % jump_steps == 0), "
                         f"got {jump_steps!r}")
    if steps < 1 or block_length < 1:
        raise ValueError(f"steps and block_length must be >= 1, got steps={steps}, block_length={block_length}")
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    eff_steps = min(steps, block_length)           # our schedule's cap; TIDE's is gen_length
    if gen_length < eff_steps:
        raise ValueError(f"gen_length={gen_length} < steps={eff_steps}: TIDE would cap its steps at gen_length "
                         f"and use another transfer schedule than ours; use gen_length >= {eff_steps}")
    if not eos_early_stop:
        raise ValueError("TIDE's generate always stops after the block that holds eos; compare with "
                         "eos_early_stop=True (our engine then stops at the same block)")
    return {
        "offload": {"max_gpu_experts_per_layer": budget_experts, "jump_steps": jump_steps,
                    "collect_stats": collect_stats},
        "generate": {"gen_length": gen_length, "block_length": block_length, "steps": eff_steps,
                     "threshold": threshold, "temperature": 0.0, "do_sample": False, "minimal_topk": 1,
                     "eos_early_stop": False, "eos_id": eos_id, "mask_id": mask_id},
    }


def load_tide(info: TideInfo, checkpoint, args: dict, dtype: str = "bfloat16"):
    """TIDE's model on the checkpoint with offloading enabled: (model, TIDE's offload info dict)."""
    cls = getattr(load_tide_module(info), MODEL_CLASS)
    # safetensors only (never a pickle), never the network: the user's directory as it is
    model = cls.from_pretrained(str(checkpoint), dtype=parse_dtype(dtype), local_files_only=True,
                                use_safetensors=True).eval()
    try:
        offload_info = getattr(model, OFFLOAD_METHOD)(**args["offload"])
    except RuntimeError as e:
        raise RuntimeError(f"TIDE's {OFFLOAD_METHOD} failed: {e}") from e
    return model, dict(offload_info or {})


@contextmanager
def tide_threads(n: int | None = None):
    """torch's intra-op threads at `n` (default: usable_cores()) for TIDE's CPU expert compute, restored
    afterwards so the bench's own setting (often 1 thread) holds again for our engine."""
    before = torch.get_num_threads()
    torch.set_num_threads(n or usable_cores())
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def tide_generate(model, prompt: list[int], gen_args: dict, device: str) -> tuple[list[int], int, list, float]:
    """One timed TIDE generate: (tokens before eos, TIDE's own token count, its per-step stats, seconds)."""
    ids = torch.tensor([prompt], dtype=torch.long)
    _sync(device)
    t0 = time.perf_counter()
    out = model.generate(input_ids=ids, **gen_args)
    _sync(device)
    seconds = time.perf_counter() - t0
    tokens, stats = out if isinstance(out, tuple) else (out, [])
    flat = tokens[0].tolist()
    eos = gen_args["eos_id"]
    return (flat[:flat.index(eos)] if eos in flat else flat), len(flat), list(stats), seconds


@dataclass
class TideRun:
    """TIDE loaded once with offloading on; `measure` times one repetition over a list of prompts."""
    info: TideInfo
    model: object
    args: dict
    offload_info: dict
    budget_experts: int
    device: str
    threads: int | None = None             # torch threads while TIDE runs (None: usable_cores())

    def set_jump_steps(self, jump_steps: int) -> None:
        """Re-enable offloading with another refresh interval. TIDE's public call re-places the experts as
        a fresh load does and resets its counters, so each setting starts from the same state."""
        if jump_steps == self.args["offload"]["jump_steps"]:
            return
        args = tide_arguments(self.budget_experts, jump_steps, self.args["generate"]["gen_length"],
                              self.args["generate"]["steps"], self.args["generate"]["threshold"],
                              self.args["generate"]["block_length"], mask_id=self.args["generate"]["mask_id"],
                              eos_id=self.args["generate"]["eos_id"],
                              collect_stats=self.args["offload"]["collect_stats"])
        try:
            info = getattr(self.model, OFFLOAD_METHOD)(**args["offload"])
        except RuntimeError as e:
            raise RuntimeError(f"TIDE's {OFFLOAD_METHOD} failed: {e}") from e
        self.args, self.offload_info = args, dict(info or {})

    def measure(self, prompts: list[list[int]], rep: int = 0, task: str | None = None,
                cache_ratio: float | None = None) -> tuple[dict, list[list[int]]]:
        g = self.args["generate"]
        collect = self.args["offload"]["collect_stats"]
        totals = dict.fromkeys(COUNTERS, 0)
        tokens = seconds = with_eos = forwards = 0
        outs = []
        with tide_threads(self.threads) as threads:
            for p in prompts:
                toks, n_eos, stats, s = tide_generate(self.model, p, g, self.device)
                outs.append(toks)
                tokens, with_eos, seconds = tokens + len(toks), with_eos + n_eos, seconds + s
                forwards += len(stats)                 # one stats entry per denoising forward
                for step in stats:
                    for k in COUNTERS:
                        totals[k] += step.get("offload_stats", {}).get(k, 0)
        budget = int(self.offload_info.get("gpu_expert_budget_per_layer", self.budget_experts))
        routed = totals["cpu_tokens"] + totals["gpu_tokens"]
        row = {"system": "tide_released", "policy": "tide_released", "mode": "full", "task": task,
               "batch_size": 1, "cache_ratio": cache_ratio, "cache_experts": budget, "rep": rep,
               "prompts": len(prompts), "seconds": seconds, "tokens": tokens,
               "tokens_per_second": tokens / seconds if seconds > 0 else float("nan"),
               "forwards": forwards if collect else None,
               "tokens_per_forward": tokens / forwards if collect and forwards else None,
               "seconds_per_forward": seconds / forwards if collect and forwards else None, "threads": threads,
               "jump_steps": self.args["offload"]["jump_steps"], "gen_length": g["gen_length"],
               "steps": g["steps"], "threshold": g["threshold"], "budget_experts": self.budget_experts,
               "tide_budget_capped": budget < self.budget_experts, "tide_tokens_with_eos": with_eos,
               "tide_hit_ratio": totals["gpu_tokens"] / routed if routed else None, "tide_commit": self.info.commit,
               "tide_modeling_sha": self.info.modeling_sha, "tide_pinned": self.info.pinned,
               "tokens_sha": tokens_sha(outs)}
        row.update({f"tide_{k}": v for k, v in totals.items()})
        row.update({f"tide_{k}": v for k, v in self.offload_info.items() if isinstance(v, (int, float, bool, str))})
        return row, outs


def open_tide(tide_path, checkpoint, budget_experts: int, jump_steps: int = 1, dc: DecodeConfig = DecodeConfig(),
              *, device: str = "cuda", dtype: str = "bfloat16", mask_id: int | None = None,
              eos_id: int | None = None, block_length: int = 32, collect_stats: bool = True,
              warmup_prompt: list[int] | None = None, threads: int | None = None) -> TideRun:
    """Check everything, then load TIDE on the checkpoint (slow: the whole model is read once).
    TIDE runs with `threads` torch threads (default: the machine's cores; see tide_threads)."""
    if dtype not in ("bfloat16", "bf16", torch.bfloat16):
        raise ValueError(f"dtype {dtype!r}: TIDE's generate builds its attention mask in bfloat16, so its model "
                         "runs in bfloat16 only (compare with our engine in bfloat16 too)")
    info = check_tide(tide_path, device)
    root = check_checkpoint(checkpoint)
    ids = _checkpoint_ids(root)
    args = tide_arguments(budget_experts, jump_steps, dc.gen_length, dc.steps, dc.threshold, block_length,
                          mask_id=ids["mask_token_id"] if mask_id is None else mask_id,
                          eos_id=ids["eos_token_id"] if eos_id is None else eos_id,
                          eos_early_stop=dc.eos_early_stop, collect_stats=collect_stats)
    with tide_threads(threads):
        model, offload_info = load_tide(info, root, args, dtype)
        if warmup_prompt:                          # CUDA context, allocator, kernels: not TIDE's speed
            tide_generate(model, warmup_prompt, {**args["generate"], "gen_length": block_length}, device)
    return TideRun(info, model, args, offload_info, budget_experts, device, threads)


def run_tide(tide_path, checkpoint, prompts: list[list[int]], budget_experts: int, jump_steps: int = 1,
             dc: DecodeConfig = DecodeConfig(), *, reps: int = 1, warmup: bool = True, task: str | None = None,
             cache_ratio: float | None = None, device: str = "cuda", dtype: str = "bfloat16",
             mask_id: int | None = None, eos_id: int | None = None, block_length: int = 32,
             collect_stats: bool = True, threads: int | None = None) -> list[dict]:
    """Time TIDE's released generate on `prompts` (token lists): one row per repetition over all prompts.
    jump_steps=1 is TIDE's own default (its main.py uses 2, eval.sh sweeps 1-31). mask/eos ids default to
    the checkpoint's config.json, else LLaDA2.0's. device="cpu" only serves a stand-in TIDE (the tests')."""
    _check_prompts(prompts, reps)
    run = open_tide(tide_path, checkpoint, budget_experts, jump_steps, dc, device=device, dtype=dtype,
                    mask_id=mask_id, eos_id=eos_id, block_length=block_length, collect_stats=collect_stats,
                    warmup_prompt=prompts[0] if warmup else None, threads=threads)
    return [run.measure(prompts, rep, task, cache_ratio)[0] for rep in range(reps)]


def engine_row(loaded, prompts: list[list[int]], budget_experts: int, options: RunOptions, *,
               policy: str = "demand", tau: int = 4, rep: int = 0, task: str | None = None,
               cache_ratio: float | None = None) -> tuple[dict, list[list[int]]]:
    """Our engine at the same budget, batch size 1, decoding as `options` say (RunOptions: decoding, device,
    forward mode), in the benchmark row format (CUDA link on a GPU, the emulated link on the CPU)."""
    dc = options.decode
    link = "cuda" if torch.device(options.device).type == "cuda" else "emulated"
    spec = OffloadSpec.from_settings(RunSettings(link=link, tau=tau), budget_experts, policy,
                                     expert_bytes=expert_bytes(loaded))
    res = decode_prompts(loaded, prompts, 1, options, spec=spec, task=task)
    row = {"system": "engine", "policy": policy, "mode": dc.mode, "task": task, "batch_size": 1,
           "cache_ratio": cache_ratio, "cache_experts": budget_experts, "rep": rep, "prompts": len(prompts),
           "gen_length": dc.gen_length, "steps": dc.steps, "threshold": dc.threshold}
    row.update({k: getattr(res.stats, k, None) for k in STAT_COLUMNS})    # the bench's columns
    row.update(tokens=res.stats.tokens_generated, tokens_sha=tokens_sha(res.tokens),
               threads=torch.get_num_threads())
    row["seconds_per_forward"] = row["seconds"] / row["forwards"] if row.get("forwards") else None
    return row, res.tokens


ON_CUDA = RunOptions(device="cuda")          # compare_with_engine's default: the paper's decoding, on the GPU


def compare_with_engine(loaded, tide_path, prompts: list[list[int]], budget_experts: int,
                        jump_steps: int | Sequence[int] = JUMP_STEPS, options: RunOptions = ON_CUDA,
                        *, checkpoint=None, reps: int = 3, policies: tuple[str, ...] = ("demand",), tau: int = 4,
                        task: str | None = None, cache_ratio: float | None = None, dtype: str = "bfloat16",
                        threads: int | None = None, progress: bool = True) -> list[dict]:
    """Engine cached, engine full and TIDE released at each of `jump_steps` (default JUMP_STEPS), at one
    budget, interleaved by repetition (the order rotates each rep, so drift hits all alike). `loaded` is
    our model (load_checkpoint(..., resident=False)); both models sit in host memory at once. `tau` is the
    engine's interval_refresh period (only that policy reads it). TIDE runs with `threads` torch threads
    (default: the machine's cores), the engine with the caller's setting. TIDE rows get
    same_tokens_as_engine: the share of prompts where TIDE decoded exactly the engine's full-mode tokens
    (bf16 numerics may differ). `options` (RunOptions) are our engine's: TIDE decodes with their decoding
    settings on their device; the engine also with their forward mode (each decoding mode in turn).
    """
    _check_prompts(prompts, reps)
    dc, device = options.decode, options.device
    sweep = (jump_steps,) if isinstance(jump_steps, int) else tuple(jump_steps)
    if not sweep or len(set(sweep)) != len(sweep):
        raise ValueError(f"jump_steps must be one integer or distinct integers, got {jump_steps!r}")
    checkpoint = checkpoint if checkpoint is not None else loaded.path
    if torch.device(device).type == "cuda":
        require_cuda()
        if loaded.experts.dtype != torch.bfloat16:
            raise ValueError(f"our model is in {loaded.experts.dtype}; TIDE runs in bfloat16 only, so load ours "
                             "with dtype='bfloat16' for a like-for-like comparison")
        if loaded.model.backend is not None:
            raise ValueError("our model's experts are resident on the GPU (load_checkpoint(..., resident=False), or "
                             "set loaded.model.backend = None after a resident run): TIDE sizes its budget "
                             "against the free GPU memory")
        if not loaded.experts.is_pinned():       # once, not in every run's HostStore (as the bench's ModelRunner does)
            loaded.experts = loaded.experts.pin_memory()
    if checkpoint is None:
        raise ValueError("loaded has no checkpoint directory (random_model?): pass checkpoint=PATH for TIDE")
    for j in sweep:                                # refuse a bad value before the slow load
        tide_arguments(budget_experts, j, dc.gen_length, dc.steps, dc.threshold, loaded.cfg.block_length,
                       mask_id=loaded.cfg.mask_token_id, eos_id=loaded.cfg.eos_token_id)
    run = open_tide(tide_path, checkpoint, budget_experts, sweep[0], dc, device=device, dtype=dtype,
                    mask_id=loaded.cfg.mask_token_id, eos_id=loaded.cfg.eos_token_id,
                    block_length=loaded.cfg.block_length, warmup_prompt=prompts[0], threads=threads)
    warm = replace(options, decode=replace(dc, gen_length=loaded.cfg.block_length))
    engine_row(loaded, prompts[:1], budget_experts, warm)             # warm-up, as for TIDE
    jobs = [("engine", mode, p) for p in policies for mode in ("cached", "full")]
    jobs += [("tide_released", "full", j) for j in sweep]
    rows = []
    for rep in tqdm(range(reps), desc="tide vs engine", disable=not progress):
        shift = rep % len(jobs)
        engine_tokens, tide_rows = None, []
        for order, (system, mode, arg) in enumerate(jobs[shift:] + jobs[:shift]):
            if system == "engine":
                row, toks = engine_row(loaded, prompts, budget_experts,
                                       replace(options, decode=replace(dc, mode=mode)), policy=arg, tau=tau,
                                       rep=rep, task=task, cache_ratio=cache_ratio)
                if mode == "full" and engine_tokens is None:
                    engine_tokens = toks
            else:
                run.set_jump_steps(arg)
                row, toks = run.measure(prompts, rep, task, cache_ratio)
                tide_rows.append((row, toks))
            row["order"] = order                   # position in this rep's rotated order
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
        v = [r[key] for r in rows if r["system"] == system and r["mode"] == mode
             and (pol is None or r["policy"] == pol) and (j is None or r.get("jump_steps") == j)
             and r.get(key) is not None]
        if not v:
            raise ValueError(f"no rows for system={system!r} mode={mode!r} policy={pol!r}"
                             + (f" jump_steps={j}" if j is not None else ""))
        return sum(v) / len(v)
    cached, full = mean("engine", "cached", policy), mean("engine", "full", policy)
    if jump_steps is None:
        swept = sorted({r.get("jump_steps") for r in rows if r["system"] == "tide_released"}, key=str)
        jump_steps = max(swept, key=lambda j: mean("tide_released", "full", None, j=j)) if swept else None
    tide = mean("tide_released", "full", None, j=jump_steps)
    out = {"engine_cached_tps": cached, "engine_full_tps": full, "tide_tps": tide, "tide_jump_steps": jump_steps,
           "speedup_total": cached / tide, "speedup_kv_cache": cached / full, "speedup_offload": full / tide}
    for name, system, mode, pol, j in (("engine_cached", "engine", "cached", policy, None),
                                       ("engine_full", "engine", "full", policy, None),
                                       ("tide", "tide_released", "full", None, jump_steps)):
        try:
            out[f"{name}_seconds_per_forward"] = mean(system, mode, pol, "seconds_per_forward", j)
        except ValueError:                         # rows without forward counts (collect_stats=False)
            out[f"{name}_seconds_per_forward"] = None
    return out


def _check_prompts(prompts, reps: int) -> None:
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("need at least one prompt, and no empty prompt")
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")


def _checkpoint_ids(root: Path) -> dict:
    """mask/eos ids: config.json when it carries them, else the LLaDA2.0 ones (TIDE's defaults too)."""
    raw = json.loads((root / "config.json").read_text())
    base = ModelConfig()
    out = {}
    for key in ("mask_token_id", "eos_token_id"):
        v = raw.get(key, getattr(base, key))
        out[key] = int(v[0] if isinstance(v, list) else v)          # HF allows a list of eos ids
    return out


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
