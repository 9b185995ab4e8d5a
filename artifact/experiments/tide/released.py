"""TIDE's released model, driven as its own code drives it: our settings mapped to its call arguments
(tide_arguments), the model loaded from the user's checkout with offloading on (load_tide, open_tide), one
timed generate (tide_generate), and rows in the benchmark row format summed from its patched per-step
counters (TideRun.measure; TIDE's counters under keys prefixed "tide_"). Why each argument is
what it is, and what differs from our engine, is listed in adapter's docstring; adapter puts these rows
beside the engine's (compare_with_engine).
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from artifact.experiments.bench.model_runner import usable_cores
from artifact.experiments.tide.checkout import (
    MODEL_CLASS,
    OFFLOAD_METHOD,
    TideInfo,
    check_checkpoint,
    check_tide,
    load_tide_module,
)
from artifact.model.checkpoint import parse_dtype
from artifact.model.config import ModelConfig
from artifact.model.decode import DecodeConfig
from artifact.model.tasks import tokens_sha

# Per-step counters of TIDE's MoE blocks (summed over layers; summed over steps here).
COUNTERS = (
    "cpu_tokens",
    "gpu_tokens",
    "cpu_calls",
    "gpu_calls",
    "cpu_compute_time",
    "gpu_compute_time",
    "cpu_tokens_move_time",
    "gpu_tokens_move_time",
    "experts_move_time",
    "promotions",
    "demotions",
)


def tide_arguments(
    budget_experts: int,
    jump_steps: int,
    gen_length: int,
    steps: int,
    threshold: float,
    block_length: int = 32,
    *,
    mask_id: int,
    eos_id: int,
    eos_early_stop: bool = True,
    collect_stats: bool = True,
) -> dict:
    """Our settings -> TIDE's call arguments: {"offload": enable_predictive_expert_offload kwargs,
    "generate": generate kwargs (less input_ids)}. See adapter's docstring for each choice."""
    if not isinstance(budget_experts, int) or budget_experts < 1:
        raise ValueError(
            f"budget_experts must be an integer >= 1 (experts per MoE layer), got {budget_experts!r}"
        )
    if not isinstance(jump_steps, int) or jump_steps < 1:
        raise ValueError(
            f"jump_steps must be an integer >= 1 (TIDE refreshes at step % jump_steps == 0), "
            f"got {jump_steps!r}"
        )
    if steps < 1 or block_length < 1:
        raise ValueError(
            f"steps and block_length must be >= 1, got steps={steps}, block_length={block_length}"
        )
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    eff_steps = min(steps, block_length)  # our schedule's cap; TIDE's is gen_length
    if gen_length < eff_steps:
        raise ValueError(
            f"gen_length={gen_length} < steps={eff_steps}: "
            "TIDE would cap its steps at gen_length and use another transfer schedule than ours; "
            f"use gen_length >= {eff_steps}"
        )
    if not eos_early_stop:
        raise ValueError(
            "TIDE's generate always stops after the block that holds eos; compare with "
            "eos_early_stop=True (our engine then stops at the same block)"
        )
    return {
        "offload": {
            "max_gpu_experts_per_layer": budget_experts,
            "jump_steps": jump_steps,
            "collect_stats": collect_stats,
        },
        "generate": {
            "gen_length": gen_length,
            "block_length": block_length,
            "steps": eff_steps,
            "threshold": threshold,
            "temperature": 0.0,
            "do_sample": False,
            "minimal_topk": 1,
            "eos_early_stop": False,
            "eos_id": eos_id,
            "mask_id": mask_id,
        },
    }


def load_tide(info: TideInfo, checkpoint, args: dict, dtype: str = "bfloat16"):
    """TIDE's model on the checkpoint with offloading enabled: (model, TIDE's offload info dict)."""
    cls = getattr(load_tide_module(info), MODEL_CLASS)
    # safetensors only (never a pickle), never the network: the user's directory as it is
    model = cls.from_pretrained(
        str(checkpoint), dtype=parse_dtype(dtype), local_files_only=True, use_safetensors=True
    ).eval()
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


def tide_generate(
    model, prompt: list[int], gen_args: dict, device: str
) -> tuple[list[int], int, list, float]:
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
    return (flat[: flat.index(eos)] if eos in flat else flat), len(flat), list(stats), seconds


@dataclass
class TideRun:
    """TIDE loaded once with offloading on; `measure` times one repetition over a list of prompts."""

    info: TideInfo
    model: object
    args: dict
    offload_info: dict
    budget_experts: int
    device: str
    threads: int | None = None  # torch threads while TIDE runs (None: usable_cores())

    def set_jump_steps(self, jump_steps: int) -> None:
        """Re-enable offloading with another refresh interval. TIDE's public call re-places the experts as
        a fresh load does and resets its counters, so each setting starts from the same state."""
        if jump_steps == self.args["offload"]["jump_steps"]:
            return
        args = tide_arguments(
            self.budget_experts,
            jump_steps,
            self.args["generate"]["gen_length"],
            self.args["generate"]["steps"],
            self.args["generate"]["threshold"],
            self.args["generate"]["block_length"],
            mask_id=self.args["generate"]["mask_id"],
            eos_id=self.args["generate"]["eos_id"],
            collect_stats=self.args["offload"]["collect_stats"],
        )
        try:
            info = getattr(self.model, OFFLOAD_METHOD)(**args["offload"])
        except RuntimeError as e:
            raise RuntimeError(f"TIDE's {OFFLOAD_METHOD} failed: {e}") from e
        self.args, self.offload_info = args, dict(info or {})

    def measure(
        self,
        prompts: list[list[int]],
        rep: int = 0,
        task: str | None = None,
        cache_ratio: float | None = None,
    ) -> tuple[dict, list[list[int]]]:
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
                forwards += len(stats)  # one stats entry per denoising forward
                for step in stats:
                    for k in COUNTERS:
                        totals[k] += step.get("offload_stats", {}).get(k, 0)
        budget = int(self.offload_info.get("gpu_expert_budget_per_layer", self.budget_experts))
        routed = totals["cpu_tokens"] + totals["gpu_tokens"]
        row = {
            "system": "tide_released",
            "policy": "tide_released",
            "mode": "full",
            "task": task,
            "batch_size": 1,
            "cache_ratio": cache_ratio,
            "cache_experts": budget,
            "rep": rep,
            "prompts": len(prompts),
            "seconds": seconds,
            "tokens": tokens,
            "tokens_per_second": tokens / seconds if seconds > 0 else float("nan"),
            "forwards": forwards if collect else None,
            "tokens_per_forward": tokens / forwards if collect and forwards else None,
            "seconds_per_forward": seconds / forwards if collect and forwards else None,
            "threads": threads,
            "jump_steps": self.args["offload"]["jump_steps"],
            "gen_length": g["gen_length"],
            "steps": g["steps"],
            "threshold": g["threshold"],
            "budget_experts": self.budget_experts,
            "tide_budget_capped": budget < self.budget_experts,
            "tide_tokens_with_eos": with_eos,
            "tide_hit_ratio": totals["gpu_tokens"] / routed if routed else None,
            "tide_commit": self.info.commit,
            "tide_modeling_sha": self.info.modeling_sha,
            "tide_pinned": self.info.pinned,
            "tokens_sha": tokens_sha(outs),
        }
        row.update({f"tide_{k}": v for k, v in totals.items()})
        row.update(
            {f"tide_{k}": v for k, v in self.offload_info.items() if isinstance(v, (int, float, bool, str))}
        )
        return row, outs


def open_tide(
    tide_path,
    checkpoint,
    budget_experts: int,
    jump_steps: int = 1,
    dc: DecodeConfig = DecodeConfig(),
    *,
    device: str = "cuda",
    dtype: str = "bfloat16",
    mask_id: int | None = None,
    eos_id: int | None = None,
    block_length: int = 32,
    collect_stats: bool = True,
    warmup_prompt: list[int] | None = None,
    threads: int | None = None,
) -> TideRun:
    """Check everything, then load TIDE on the checkpoint (slow: the whole model is read once).
    TIDE runs with `threads` torch threads (default: the machine's cores; see tide_threads)."""
    if dtype not in ("bfloat16", "bf16", torch.bfloat16):
        raise ValueError(
            f"dtype {dtype!r}: TIDE's generate builds its attention mask in bfloat16, "
            "so its model runs in bfloat16 only (compare with our engine in bfloat16 too)"
        )
    info = check_tide(tide_path, device)
    root = check_checkpoint(checkpoint)
    ids = _checkpoint_ids(root)
    args = tide_arguments(
        budget_experts,
        jump_steps,
        dc.gen_length,
        dc.steps,
        dc.threshold,
        block_length,
        mask_id=ids["mask_token_id"] if mask_id is None else mask_id,
        eos_id=ids["eos_token_id"] if eos_id is None else eos_id,
        eos_early_stop=dc.eos_early_stop,
        collect_stats=collect_stats,
    )
    with tide_threads(threads):
        model, offload_info = load_tide(info, root, args, dtype)
        if warmup_prompt:  # CUDA context, allocator, kernels: not TIDE's speed
            tide_generate(model, warmup_prompt, {**args["generate"], "gen_length": block_length}, device)
    return TideRun(info, model, args, offload_info, budget_experts, device, threads)


def check_prompts(prompts, reps: int) -> None:
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
        out[key] = int(v[0] if isinstance(v, list) else v)  # HF allows a list of eos ids
    return out


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
