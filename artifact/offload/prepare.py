"""Everything a run can check before a checkpoint's weights are read, in one place.

`prepare(RunRequest(...))` is what `generate`, `trace` and the bench call before they load a model: it
checks the values (decoding, device, dtype, prompts), reads the architecture and the tokenizer without the
weights, builds the offload spec through OffloadSpec.from_settings and checks it, probes every output path
for writability, checks the positions the prompts need against the model's limit, and checks an oracle
trace against the run it is meant for. A bad input therefore costs seconds, not a long load or a finished
run. It returns a `Prepared` run that holds what the load and the run need; `Prepared.load()` reads the
weights and refuses a checkpoint whose config differs from the one that was checked.

The checks run in one fixed order, so the first error a user sees does not depend on the command:
values -> architecture -> offload spec -> outputs -> task prompts -> positions -> tokenizer -> prompt
positions -> oracle trace -> safetensors headers (checked_checkpoint: complete files, every tensor's shape).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

from artifact.errors import CheckpointError, SettingError, UserError
from artifact.model.checkpoint import (
    DTYPES,
    Loaded,
    TensorIndex,
    check_checkpoint,
    load_checkpoint,
    load_tokenizer,
    with_token_ids,
)
from artifact.model.config import ModelConfig, get_preset
from artifact.model.decode import MAX_BATCH, DecodeConfig
from artifact.model.tasks import TASKS, encode, load_task, prompts, tokens_sha
from artifact.model.tiny import checkpoint_dir
from artifact.offload.policy.policies import POLICIES, check_policy
from artifact.offload.replay.trace import Trace
from artifact.offload.runner import LinkSettings, OffloadSpec, check_device, check_oracle_before_load
from artifact.paths import check_writable
from artifact.validate import check_number


@dataclass(frozen=True)
class Output:
    """A file the run will write, probed before the load. `force` replaces an existing one; `exists_ok`
    accepts one (a resumable result file)."""

    path: Path | None
    flag: str
    force: bool = False
    exists_ok: bool = False


@dataclass(frozen=True)
class Offload:
    """An offloaded run's knobs: capacity C, the policy, the link settings (a Settings or RunSettings) and
    an optional extra cap; `oracle_trace` is read by the policies that need one."""

    capacity: int | None
    policy: str
    settings: LinkSettings
    cap_gbps: float | None = None
    oracle_trace: Path | None = None


@dataclass(frozen=True)
class TaskPrompts:
    """n prompts of a bundled task (a seeded sample), decoded in batches of batch_size."""

    task: str
    n: int
    batch_size: int = 1
    seed: int = 0
    max_prompt_tokens: int | None = None


@dataclass(frozen=True)
class RunRequest:
    model: str  # 'tiny' or a checkpoint directory
    device: str = "cpu"
    dtype: str | None = None  # None: float32 for tiny, bfloat16 otherwise
    gen_length: int = 64
    steps: int = 32
    threshold: float = 0.95
    mode: str = "cached"
    texts: tuple[str, ...] | None = None  # prompts given as text (one batch); or `task`, or neither
    raw: bool = False  # texts encoded as they are, without the chat template
    task: TaskPrompts | None = None
    offload: Offload | None = None
    outputs: tuple[Output, ...] = ()


@dataclass
class Prepared:
    request: RunRequest
    dc: DecodeConfig
    dtype: str
    cfg: ModelConfig  # with the tokenizer's mask/eos ids, as the loader will have it
    tokenizer: object
    spec: OffloadSpec | None = None
    prompts: list[list[int]] = field(default_factory=list)
    prompt_ids: list[str] = field(default_factory=list)
    batch_size: int = 1
    oracle: Trace | None = None

    def load(self, resident: bool | None = None) -> Loaded:
        """The weights (resident unless the run is offloaded). The loader must arrive at the checked
        config."""
        r = self.request
        with checkpoint_errors(r.model):
            loaded = load_checkpoint(
                checkpoint_dir(r.model),
                dtype=self.dtype,
                device=r.device,
                resident=(r.offload is None) if resident is None else resident,
            )
        assert loaded.cfg.config_hash() == self.cfg.config_hash(), "checked another config than loaded"
        return loaded


@contextlib.contextmanager
def checkpoint_errors(model: str):
    """The core reports a damaged checkpoint (bad config, missing or misshapen tensor) as a ValueError or
    KeyError that names the file. Here the only input is the user's checkpoint directory, so such an error
    is about it: it becomes a CheckpointError (one line). The tiny model is built by the artifact itself,
    so an error there is a bug and keeps its traceback."""
    if model == "tiny":
        yield
        return
    try:
        yield
    except (ValueError, KeyError) as e:
        if isinstance(e, UserError):
            raise
        raise CheckpointError(e.args[0] if isinstance(e, KeyError) and e.args else str(e)) from e


def checked_checkpoint(model: str) -> tuple[ModelConfig, TensorIndex]:
    """The architecture and the safetensors headers, checked without reading a weight (check_checkpoint,
    the model layer's one check of config.json and the headers); a damaged checkpoint is a CheckpointError."""
    with checkpoint_errors(model):
        return check_checkpoint(checkpoint_dir(model))


def model_config(model: str) -> ModelConfig:
    """The architecture, read without loading weights (so arguments are checked first); the safetensors
    headers are checked last in prepare (checked_checkpoint), before the load."""
    if model == "tiny":
        return get_preset("tiny")
    with checkpoint_errors(model):
        return ModelConfig.from_hf(Path(model))


def resolve_dtype(model: str, dtype: str | None) -> str:
    dtype = dtype or ("float32" if model == "tiny" else "bfloat16")
    if dtype not in DTYPES:
        raise SettingError(f"--dtype {dtype!r} unknown; choose one of {sorted(DTYPES)}")
    return dtype


def decode_config(gen_length: int, steps: int, threshold: float, mode: str) -> DecodeConfig:
    check_number("--gen-length", gen_length, low=1, integer=True)
    check_number("--steps", steps, low=1, integer=True)
    check_number("--threshold", threshold, low=0, low_open=True, high=1)
    return DecodeConfig(gen_length=gen_length, steps=steps, threshold=threshold, mode=mode)


def tokenizer_and_config(model: str, cfg: ModelConfig):
    """The tokenizer and the config with the tokenizer's mask/eos ids (what the loader will use), read
    without the weights: prompt lengths, the oracle trace's prompt ids and config hash, and the tokenizer's
    fit to vocab_size are checked before a long load."""
    root = checkpoint_dir(model)
    with checkpoint_errors(model):
        tok = load_tokenizer(root)
        cfg = with_token_ids(cfg, tok, root)
    if len(tok) > cfg.vocab_size:
        raise CheckpointError(
            f"{root}: the tokenizer has {len(tok)} tokens but config.json's vocab_size is "
            f"{cfg.vocab_size}, so ids >= {cfg.vocab_size} have no embedding; use the "
            "tokenizer "
            "that belongs to this checkpoint"
        )
    return tok, cfg


def check_positions(cfg: ModelConfig, gen_length: int, prompt_lengths: list[int] | None = None) -> None:
    """The decoder's position limit, checked before the model runs (prompt lengths when known, else 1)."""
    n = cfg.block_length
    need = max(-(-(p + gen_length) // n) * n for p in (prompt_lengths or [1]))
    if need > cfg.max_position_embeddings:
        raise SettingError(
            f"--gen-length {gen_length} with these prompts needs {need} positions > the "
            "model's "
            f"max_position_embeddings {cfg.max_position_embeddings}"
        )


def prompt_id(tokens: list[int]) -> str:
    """A command-line prompt's identity is its tokens (an oracle trace must be of the same prompts)."""
    return "cli/" + tokens_sha(tokens)


def offload_spec(o: Offload, cfg: ModelConfig, dtype: str, device: str) -> OffloadSpec:
    """The offloaded run's spec (OffloadSpec.from_settings), checked against the model and the device."""
    if o.capacity is None:
        raise SettingError("--offload needs --cache-experts C (device slots per MoE layer)")
    check_number("--bandwidth-gbps", o.settings.link_gbps, low=0, low_open=True, allow_none=True)
    check_number("--cap-gbps", o.cap_gbps, low=0, low_open=True, allow_none=True)
    eb = cfg.expert_params * DTYPES[dtype].itemsize  # what one expert transfer moves once loaded
    spec = OffloadSpec.from_settings(o.settings, o.capacity, o.policy, expert_bytes=eb, cap_gbps=o.cap_gbps)
    spec.check(cfg.num_experts, device)
    if check_policy(spec.policy).needs_trace and o.oracle_trace is None:
        raise SettingError(
            f"policy {spec.policy!r} needs --oracle-trace FILE (a trace of an identical earlier run)"
        )
    if o.oracle_trace is not None and not check_policy(spec.policy).needs_trace:
        users = sorted(n for n, c in POLICIES.items() if c.needs_trace and c.engine_ok)
        raise SettingError(f"--oracle-trace is read only by {users}; policy {spec.policy!r} would ignore it")
    return spec


def _check_task(t: TaskPrompts) -> None:
    check_number("--batch-size", t.batch_size, low=1, high=MAX_BATCH, integer=True)
    check_number("--seed", t.seed, low=0, integer=True)
    if t.task not in TASKS:
        raise SettingError(f"unknown task {t.task!r}; choose one of {TASKS}")
    check_number("--n", t.n, low=1, high=len(load_task(t.task)), integer=True)
    if t.batch_size > t.n:  # the trace would say batch size B but hold smaller batches
        raise SettingError(f"--batch-size {t.batch_size} needs at least that many prompts; got --n {t.n}")


def prepare(r: RunRequest) -> Prepared:
    """Check everything that can be checked before the weights are read (the order: see the module doc)."""
    dc = decode_config(r.gen_length, r.steps, r.threshold, r.mode)
    check_device(r.device)
    dtype = resolve_dtype(r.model, r.dtype)
    for o in r.outputs:
        if o.path is None and o.force:
            raise SettingError(f"--force replaces an existing {o.flag} file; give {o.flag} too")
    if r.texts is not None:
        if not 1 <= len(r.texts) <= MAX_BATCH:
            raise SettingError(f"give 1-{MAX_BATCH} --prompt values (one batch), got {len(r.texts)}")
        if any(not p.strip() for p in r.texts):
            raise SettingError(
                "a --prompt is empty" + (" (--raw)" if r.raw else "") + "; give the text to answer"
            )
    cfg = model_config(r.model)
    spec = offload_spec(r.offload, cfg, dtype, r.device) if r.offload is not None else None
    for o in r.outputs:
        check_writable(o.path, o.flag, o.force, o.exists_ok)
    if r.task is not None:
        _check_task(r.task)
    check_positions(cfg, dc.gen_length)
    tok, cfg = tokenizer_and_config(r.model, cfg)  # the tokenizer only: no weights read yet
    run = Prepared(r, dc, dtype, cfg, tok, spec)
    if r.texts is not None:
        run.prompts = [tok.encode(p) if r.raw else encode(tok, p) for p in r.texts]
        if any(not p for p in run.prompts):
            raise SettingError("a --prompt encodes to no tokens; give the text to answer")
        run.prompt_ids, run.batch_size = [prompt_id(p) for p in run.prompts], len(run.prompts)
    elif r.task is not None:
        t = r.task
        run.prompt_ids, run.prompts = prompts(tok, t.task, t.n, t.seed, t.max_prompt_tokens)
        run.batch_size = t.batch_size
    if run.prompts:
        check_positions(cfg, dc.gen_length, [len(p) for p in run.prompts])
    if r.offload is not None and r.offload.oracle_trace is not None:
        run.oracle = Trace.load(r.offload.oracle_trace, expect_config_hash=cfg.config_hash())
        check_oracle_before_load(run.oracle, cfg, run.prompt_ids, run.batch_size, dc)
    checked_checkpoint(r.model)  # last: config.json and every safetensors header, before the load reads one
    return run
