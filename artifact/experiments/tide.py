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
    rows = compare_with_engine(loaded, profile["tide_path"], prompts, budget_experts=C, jump_steps=tau, dc=dc)
    parts = speedup_parts(rows)      # speedup_total = speedup_kv_cache x speedup_offload
"""
from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import time
import types
import warnings
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from artifact.experiments.bench import STAT_COLUMNS
from artifact.model.checkpoint import parse_dtype
from artifact.model.config import ModelConfig
from artifact.model.decode import DecodeConfig
from artifact.offload.runner import OffloadSpec, RunSettings, expert_bytes, run

TIDE_REPO = "https://github.com/ims-kdks/TIDE"
TIDE_REVISION = "5611ace31501230f6dece29307b29a9a554a5a01"       # the commit the adapter was written against
WRITTEN_AGAINST = f"ims-kdks/TIDE@{TIDE_REVISION[:7]}"
# git's blob id of model/modeling_llada2_moe.py at TIDE_REVISION (last changed in 76d3dad): a checkout, or
# a copy without .git, holds the pinned model file exactly when its blob id is this one.
PINNED_MODELING_BLOB = "2dc9efdced9508694057e04ee372a1abc43c81ff"
JUMP_STEPS = (1, 2, 4)      # TIDE's defaults (enable_predictive_expert_offload: 1, main.py: 2) and our tau
MODELING = "model/modeling_llada2_moe.py"
CONFIGURATION = "model/configuration_llada2_moe.py"
MODEL_CLASS = "LLaDA2MoeModelLM"
OFFLOAD_METHOD = "enable_predictive_expert_offload"
# Arguments the adapter passes; check_tide refuses a checkout whose signatures lack any of them.
OFFLOAD_ARGS = ("max_gpu_experts_per_layer", "collect_stats", "jump_steps")
GENERATE_ARGS = ("input_ids", "temperature", "block_length", "steps", "gen_length", "eos_early_stop",
                 "minimal_topk", "threshold", "eos_id", "mask_id", "do_sample")
# Per-step counters of TIDE's MoE blocks (summed over layers; summed over steps here).
COUNTERS = ("cpu_tokens", "gpu_tokens", "cpu_calls", "gpu_calls", "cpu_compute_time", "gpu_compute_time",
            "cpu_tokens_move_time", "gpu_tokens_move_time", "experts_move_time", "promotions", "demotions")


@dataclass(frozen=True)
class TideInfo:
    path: Path
    modeling_file: Path
    commit: str | None                     # git HEAD of the checkout, when it is a git clone
    offload_defaults: dict                 # enable_predictive_expert_offload's parameters -> defaults
    generate_defaults: dict                # generate's parameters -> defaults
    imports: tuple[str, ...]               # third-party modules the model files import
    pins: dict = field(default_factory=dict)   # requirements.txt: name -> line
    modeling_sha: str = ""                 # git blob id of the model file (works without .git)

    @property
    def pinned(self) -> bool:
        return self.modeling_sha == PINNED_MODELING_BLOB


def require_cuda() -> None:
    if not torch.cuda.is_available():
        raise RuntimeError("TIDE's released code runs on CUDA only (enable_predictive_expert_offload raises "
                           "without a GPU), and torch.cuda.is_available() is False on this machine")


def check_tide(path, device: str = "cuda", import_module: bool = True) -> TideInfo:
    """Validate a TIDE checkout: files and interface (read, not run), requirements installed, CUDA, and
    finally that its model file imports here (a transformers unlike TIDE's pin fails at this point)."""
    if path is None or str(path).strip() == "":
        raise ValueError(f"no TIDE checkout given: set the profile key tide_path to a clone of {TIDE_REPO} "
                         "(the artifact never downloads it)")
    root = Path(path).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: TIDE checkout not found (tide_path must be a clone of {TIDE_REPO})")
    missing = [f for f in (MODELING, CONFIGURATION) if not (root / f).is_file()]
    if missing:
        raise FileNotFoundError(f"{root}: not a TIDE checkout, missing {missing} (expected the layout of "
                                f"{WRITTEN_AGAINST})")
    modeling = root / MODELING
    tree = _parse(modeling)
    methods = _class_methods(tree, MODEL_CLASS, modeling)
    sigs = {}
    for name, needed in ((OFFLOAD_METHOD, OFFLOAD_ARGS), ("generate", GENERATE_ARGS)):
        if name not in methods:
            raise ValueError(f"{modeling}: class {MODEL_CLASS} has no method {name}(); this adapter was "
                             f"written against {WRITTEN_AGAINST}")
        sigs[name] = _defaults(methods[name])
        lacking = [a for a in needed if a not in sigs[name]]
        if lacking:
            raise ValueError(f"{modeling}: {MODEL_CLASS}.{name}() lacks arguments {lacking}; this adapter was "
                             f"written against {WRITTEN_AGAINST}")
    _check_sampling(methods, modeling)
    imports = sorted(set(_third_party_imports(tree)) | set(_third_party_imports(_parse(root / CONFIGURATION))))
    pins = _pins(root / "requirements.txt")
    absent = [m for m in imports if importlib.util.find_spec(m) is None]
    if absent:
        wanted = ", ".join(pins.get(m.replace("_", "-"), pins.get(m, m)) for m in absent)
        raise ModuleNotFoundError(f"TIDE's model ({modeling}) imports {absent}, not installed in this Python "
                                  f"({sys.executable}); install {wanted} (pinned in {root / 'requirements.txt'})",
                                  name=absent[0])
    if torch.device(device).type == "cuda":
        require_cuda()
    info = TideInfo(root, modeling, _git_head(root), sigs[OFFLOAD_METHOD], sigs["generate"], tuple(imports), pins,
                    _blob_sha(modeling))
    if not info.pinned:
        warnings.warn(f"{modeling} is not the model file of {WRITTEN_AGAINST} (git blob {info.modeling_sha[:12]}, "
                      f"pinned {PINNED_MODELING_BLOB[:12]}); its interface checks passed, but results may differ "
                      f"from the pinned revision's (git -C {root} checkout {TIDE_REVISION[:7]})", stacklevel=2)
    if import_module:
        load_tide_module(info)
    return info


def check_checkpoint(path) -> Path:
    """The user's Hugging Face directory of safetensors (TIDE loads it with from_pretrained)."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: checkpoint directory not found (expected a LLaDA2.0 Hugging Face "
                                "directory: config.json + *.safetensors)")
    ModelConfig.from_hf(root)                      # names a missing config.json or a wrong model_type
    if not ((root / "model.safetensors").is_file() or (root / "model.safetensors.index.json").is_file()):
        pickled = sorted(p.name for p in root.glob("*.bin")) + sorted(p.name for p in root.glob("*.pt"))
        extra = f"; found pickled weights {pickled[:3]}, which are never loaded" if pickled else ""
        raise FileNotFoundError(f"{root}: no model.safetensors or model.safetensors.index.json{extra}")
    return root


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


def load_tide_module(info: TideInfo) -> types.ModuleType:
    """Import TIDE's model file from the checkout as package `_tide_<hash>` (its relative import of the
    configuration needs a package); nothing is added to sys.path."""
    pkg = "_tide_" + hashlib.sha1(str(info.path.resolve()).encode()).hexdigest()[:10]
    if pkg not in sys.modules:
        mod = types.ModuleType(pkg)
        mod.__path__ = [str(info.modeling_file.parent)]
        sys.modules[pkg] = mod
    try:
        return importlib.import_module(f"{pkg}.{Path(MODELING).stem}")
    except ImportError as e:
        have = {m: _version(m) for m in info.imports}
        sys.modules.pop(pkg, None)                # a later call (after a fix) tries afresh
        raise type(e)(f"{info.modeling_file}: importing TIDE's model failed ({e}); TIDE pins "
                      f"{sorted(info.pins.values())}, this Python has {have}. Run TIDE in an environment "
                      f"made with pip install -r {info.path / 'requirements.txt'}") from e


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


def machine_threads() -> int:
    """The CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@contextmanager
def tide_threads(n: int | None = None):
    """torch's intra-op threads at `n` (default: machine_threads()) for TIDE's CPU expert compute, restored
    afterwards so the bench's own setting (often 1 thread) holds again for our engine."""
    before = torch.get_num_threads()
    torch.set_num_threads(n or machine_threads())
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
    threads: int | None = None             # torch threads while TIDE runs (None: machine_threads())

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


def engine_row(loaded, prompts: list[list[int]], budget_experts: int, dc: DecodeConfig, *, policy: str = "demand",
               tau: int = 4, device: str = "cuda", rep: int = 0, task: str | None = None,
               cache_ratio: float | None = None) -> tuple[dict, list[list[int]]]:
    """Our engine at the same budget, batch size 1, in the benchmark row format (CUDA link on a GPU,
    the emulated link on the CPU)."""
    link = "cuda" if torch.device(device).type == "cuda" else "emulated"
    spec = OffloadSpec.from_settings(RunSettings(link=link, tau=tau), budget_experts, policy,
                                     expert_bytes=expert_bytes(loaded))
    res = run(loaded, prompts, 1, dc, spec=spec, device=device, task=task)
    row = {"system": "engine", "policy": policy, "mode": dc.mode, "task": task, "batch_size": 1,
           "cache_ratio": cache_ratio, "cache_experts": budget_experts, "rep": rep, "prompts": len(prompts),
           "gen_length": dc.gen_length, "steps": dc.steps, "threshold": dc.threshold}
    row.update({k: res.stats.get(k) for k in STAT_COLUMNS})               # bench.py's columns
    row.update(tokens=res.stats["tokens_generated"], tokens_sha=tokens_sha(res.tokens),
               threads=torch.get_num_threads())
    row["seconds_per_forward"] = row["seconds"] / row["forwards"] if row.get("forwards") else None
    return row, res.tokens


def compare_with_engine(loaded, tide_path, prompts: list[list[int]], budget_experts: int,
                        jump_steps: int | Sequence[int] = JUMP_STEPS, dc: DecodeConfig = DecodeConfig(), *,
                        checkpoint=None, reps: int = 3, policies: tuple[str, ...] = ("demand",), tau: int = 4,
                        task: str | None = None, cache_ratio: float | None = None, device: str = "cuda",
                        dtype: str = "bfloat16", threads: int | None = None, progress: bool = True) -> list[dict]:
    """Engine cached, engine full and TIDE released at each of `jump_steps` (default JUMP_STEPS), at one
    budget, interleaved by repetition (the order rotates each rep, so drift hits all alike). `loaded` is
    our model (load_checkpoint(..., resident=False)); both models sit in host memory at once. `tau` is the
    engine's interval_refresh period (only that policy reads it). TIDE runs with `threads` torch threads
    (default: the machine's cores), the engine with the caller's setting. TIDE rows get
    same_tokens_as_engine: the share of prompts where TIDE decoded exactly the engine's full-mode tokens
    (bf16 numerics may differ)."""
    _check_prompts(prompts, reps)
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
        if not loaded.experts.is_pinned():       # once, not in every run's HostStore (as bench.py does)
            loaded.experts = loaded.experts.pin_memory()
    if checkpoint is None:
        raise ValueError("loaded has no checkpoint directory (random_model?): pass checkpoint=PATH for TIDE")
    for j in sweep:                                # refuse a bad value before the slow load
        tide_arguments(budget_experts, j, dc.gen_length, dc.steps, dc.threshold, loaded.cfg.block_length,
                       mask_id=loaded.cfg.mask_token_id, eos_id=loaded.cfg.eos_token_id)
    run = open_tide(tide_path, checkpoint, budget_experts, sweep[0], dc, device=device, dtype=dtype,
                    mask_id=loaded.cfg.mask_token_id, eos_id=loaded.cfg.eos_token_id,
                    block_length=loaded.cfg.block_length, warmup_prompt=prompts[0], threads=threads)
    engine_row(loaded, prompts[:1], budget_experts, replace(dc, gen_length=loaded.cfg.block_length),
               device=device)                                           # warm-up, as for TIDE
    jobs = [("engine", mode, p) for p in policies for mode in ("cached", "full")]
    jobs += [("tide_released", "full", j) for j in sweep]
    rows = []
    for rep in tqdm(range(reps), desc="tide vs engine", disable=not progress):
        shift = rep % len(jobs)
        engine_tokens, tide_rows = None, []
        for order, (system, mode, arg) in enumerate(jobs[shift:] + jobs[:shift]):
            if system == "engine":
                row, toks = engine_row(loaded, prompts, budget_experts, replace(dc, mode=mode),
                                       policy=arg, tau=tau, device=device, rep=rep, task=task,
                                       cache_ratio=cache_ratio)
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


def tokens_sha(tokens: list[list[int]]) -> str:
    """The generated tokens' fingerprint, computed as bench.py does: equal hashes, equal outputs."""
    return hashlib.sha1(json.dumps(tokens).encode()).hexdigest()[:12]


def _check_prompts(prompts, reps: int) -> None:
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("need at least one prompt, and no empty prompt")
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")


# --- helpers -------------------------------------------------------------------------------------
def _parse(path: Path) -> ast.Module:
    try:
        return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except SyntaxError as e:
        raise ValueError(f"{path}: not valid Python ({e})") from None


def _class_methods(tree: ast.Module, cls: str, where: Path) -> dict[str, ast.FunctionDef]:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return {f.name: f for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    raise ValueError(f"{where}: no class {cls}; this adapter was written against {WRITTEN_AGAINST}")


def _defaults(fn: ast.FunctionDef) -> dict:
    """Parameter -> literal default (None when there is none or it is not a literal)."""
    a = fn.args
    pos = a.posonlyargs + a.args
    out = {p.arg: None for p in pos + a.kwonlyargs}
    for p, d in zip(pos[len(pos) - len(a.defaults):], a.defaults):
        out[p.arg] = _literal(d)
    for p, d in zip(a.kwonlyargs, a.kw_defaults):
        out[p.arg] = _literal(d) if d is not None else None
    out.pop("self", None)
    return out


def _check_sampling(methods: dict[str, ast.FunctionDef], where: Path) -> None:
    """Refuse a TIDE whose generate accepts do_sample but samples whatever it says: the greedy decoding
    the comparison needs (do_sample=False) must reach a sampler that branches on it. TIDE before 0d8c547
    ("add deterministic method") passed no do_sample on and always drew with torch.multinomial."""
    def passes_do_sample(call: ast.Call) -> str | None:
        f = call.func
        if (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self"
                and any(k.arg == "do_sample" for k in call.keywords)):
            return f.attr
        return None

    samplers = {passes_do_sample(n) for n in ast.walk(methods["generate"]) if isinstance(n, ast.Call)} - {None}
    for name in samplers:
        fn = methods.get(name)
        if fn is None or "do_sample" not in _defaults(fn):
            continue
        if any(isinstance(n, (ast.If, ast.IfExp)) and any(isinstance(x, ast.Name) and x.id == "do_sample"
                                                           for x in ast.walk(n.test)) for n in ast.walk(fn)):
            return
    raise ValueError(f"{where}: {MODEL_CLASS}.generate() accepts do_sample but no sampler it calls branches on it, "
                     "so do_sample=False would still sample (TIDE before commit 0d8c547, 'add deterministic "
                     f"method', always drew with torch.multinomial); check out {WRITTEN_AGAINST} "
                     f"(git checkout {TIDE_REVISION[:7]}), the revision this adapter was written against")


def _blob_sha(path: Path) -> str:
    """git's blob id of a file (sha1 of 'blob <size>\\0' + bytes): the same as `git hash-object`."""
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _literal(node):
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


def _third_party_imports(tree: ast.Module) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module.split(".")[0])
    return [n for n in names if n not in sys.stdlib_module_names]


def _pins(path: Path) -> dict:
    if not path.is_file():
        return {}
    lines = [ln.split("#")[0].strip() for ln in path.read_text().splitlines()]
    return {ln.split("=")[0].split("<")[0].split(">")[0].strip().lower(): ln for ln in lines if ln}


def _version(module: str) -> str | None:
    try:
        return importlib.metadata.version(module)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git_head(root: Path) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


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
