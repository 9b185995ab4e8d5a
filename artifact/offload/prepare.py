"""Everything a run can check before a checkpoint's weights are read, in one place.

`prepare(spec, ...)` is what `generate`, `trace` and the bench call before they load a model. The RunSpec's
values were checked when it was made (RunSpec.check); here come the checks that need more: the device on
this machine, the prompts, the architecture and the tokenizer read without the weights (the capacity
against the model's experts, RunSpec.fits), every output path probed for writability, the positions the
prompts need against the model's limit, and an oracle trace against the run it is meant for. A bad input
therefore costs seconds, not a long load or a finished run. It returns a `Prepared` run that holds the spec
and what the load and the run need; `Prepared.load()` reads the weights and refuses a checkpoint whose
config differs from the one that was checked.

The checks run in one fixed order, so the first error a user sees does not depend on the command:
device -> prompts -> architecture -> capacity and oracle policy -> outputs -> task prompts -> positions
-> tokenizer -> prompt positions -> oracle trace -> safetensors headers (checked_checkpoint: complete
files, every tensor's shape).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

from artifact.errors import CheckpointError, SettingError, UserError
from artifact.model.checkpoint import (
    Loaded,
    TensorIndex,
    check_checkpoint,
    load_checkpoint,
    load_tokenizer,
    with_token_ids,
)
from artifact.model.config import ModelConfig, get_preset
from artifact.model.decode import MAX_BATCH
from artifact.model.tasks import TASKS, encode, load_task, prompts, tokens_sha
from artifact.model.tiny import checkpoint_dir
from artifact.offload.policy.policies import check_policy
from artifact.offload.replay.trace import Trace
from artifact.offload.runner import check_device, check_oracle_before_load
from artifact.offload.spec import RunSpec
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
class TaskPrompts:
    """n prompts of a bundled task (a seeded sample), decoded in batches of batch_size."""

    task: str
    n: int
    batch_size: int = 1
    seed: int = 0
    max_prompt_tokens: int | None = None


@dataclass
class Prepared:
    """A run checked before its weights are read: its RunSpec, the config and tokenizer, its prompts."""

    spec: RunSpec
    cfg: ModelConfig  # with the tokenizer's mask/eos ids, as the loader will have it
    tokenizer: object
    prompts: list[list[int]] = field(default_factory=list)
    prompt_ids: list[str] = field(default_factory=list)
    batch_size: int = 1
    oracle: Trace | None = None

    def load(self, resident: bool | None = None) -> Loaded:
        """The weights (resident unless the run is offloaded). The loader must arrive at the checked
        config."""
        s = self.spec
        with checkpoint_errors(s.model):
            loaded = load_checkpoint(
                checkpoint_dir(s.model),
                dtype=s.torch_dtype,
                device=s.device,
                resident=(not s.offloaded) if resident is None else resident,
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
            f"{root}: the tokenizer has {len(tok)} tokens but config.json's vocab_size is {cfg.vocab_size}, "
            f"so ids >= {cfg.vocab_size} have no embedding; "
            "use the tokenizer that belongs to this checkpoint"
        )
    return tok, cfg


def check_positions(cfg: ModelConfig, gen_length: int, prompt_lengths: list[int] | None = None) -> None:
    """The decoder's position limit, checked before the model runs (prompt lengths when known, else 1)."""
    n = cfg.block_length
    need = max(-(-(p + gen_length) // n) * n for p in (prompt_lengths or [1]))
    if need > cfg.max_position_embeddings:
        raise SettingError(
            f"--gen-length {gen_length} with these prompts needs {need} positions > the model's "
            f"max_position_embeddings {cfg.max_position_embeddings}"
        )


def prompt_id(tokens: list[int]) -> str:
    """A command-line prompt's identity is its tokens (an oracle trace must be of the same prompts)."""
    return "cli/" + tokens_sha(tokens)


def check_oracle_policy(spec: RunSpec) -> None:
    """An offloaded run whose policy reads the future needs its trace (spec.oracle_trace)."""
    if spec.offloaded and check_policy(spec.policy).needs_trace and spec.oracle_trace is None:
        raise SettingError(
            f"policy {spec.policy!r} needs --oracle-trace FILE (a trace of an identical earlier run)"
        )


def _check_task(t: TaskPrompts) -> None:
    check_number("--batch-size", t.batch_size, low=1, high=MAX_BATCH, integer=True)
    check_number("--seed", t.seed, low=0, integer=True)
    if t.task not in TASKS:
        raise SettingError(f"unknown task {t.task!r}; choose one of {TASKS}")
    check_number("--n", t.n, low=1, high=len(load_task(t.task)), integer=True)
    if t.batch_size > t.n:  # the trace would say batch size B but hold smaller batches
        raise SettingError(f"--batch-size {t.batch_size} needs at least that many prompts; got --n {t.n}")


def prepare(
    spec: RunSpec,
    *,
    texts: tuple[str, ...] | None = None,
    raw: bool = False,
    task: TaskPrompts | None = None,
    outputs: tuple[Output, ...] = (),
) -> Prepared:
    """Check everything that can be checked before the weights are read (the order: see the module doc).
    Prompts come as `texts` (one batch; `raw`: without the chat template), or a bundled `task`, or neither."""
    if not isinstance(spec, RunSpec):
        raise SettingError(f"prepare takes a RunSpec, got {type(spec).__name__}")
    if spec.model is None:
        raise SettingError(
            "no model to run: pass --model DIR (a checkpoint directory) or set the profile's model"
        )
    check_device(spec.device)
    for o in outputs:
        if o.path is None and o.force:
            raise SettingError(f"--force replaces an existing {o.flag} file; give {o.flag} too")
    if texts is not None:
        if not 1 <= len(texts) <= MAX_BATCH:
            raise SettingError(f"give 1-{MAX_BATCH} --prompt values (one batch), got {len(texts)}")
        if any(not p.strip() for p in texts):
            raise SettingError(
                "a --prompt is empty" + (" (--raw)" if raw else "") + "; give the text to answer"
            )
    cfg = model_config(spec.model)
    spec.fits(cfg.num_experts)
    check_oracle_policy(spec)
    for o in outputs:
        check_writable(o.path, o.flag, o.force, o.exists_ok)
    if task is not None:
        _check_task(task)
    dc = spec.decode
    check_positions(cfg, dc.gen_length)
    tok, cfg = tokenizer_and_config(spec.model, cfg)  # the tokenizer only: no weights read yet
    run = Prepared(spec, cfg, tok)
    if texts is not None:
        run.prompts = [tok.encode(p) if raw else encode(tok, p) for p in texts]
        if any(not p for p in run.prompts):
            raise SettingError("a --prompt encodes to no tokens; give the text to answer")
        run.prompt_ids, run.batch_size = [prompt_id(p) for p in run.prompts], len(run.prompts)
    elif task is not None:
        run.prompt_ids, run.prompts = prompts(tok, task.task, task.n, task.seed, task.max_prompt_tokens)
        run.batch_size = task.batch_size
    if run.prompts:
        check_positions(cfg, dc.gen_length, [len(p) for p in run.prompts])
    if spec.oracle_trace is not None:
        run.oracle = Trace.load(spec.oracle_trace, expect_config_hash=cfg.config_hash())
        check_oracle_before_load(run.oracle, cfg, run.prompt_ids, run.batch_size, dc)
    checked_checkpoint(
        spec.model
    )  # last: config.json and every safetensors header, before the load reads one
    return run
