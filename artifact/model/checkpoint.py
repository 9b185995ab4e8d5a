"""Hugging Face format checkpoints: load LLaDA2.0 by its real tensor names (writing them: tiny.py).

A checkpoint directory holds config.json, model.safetensors (or shards listed by
model.safetensors.index.json) and tokenizer files. Routed experts are not loaded into the model:
they are packed into one (L_moe, E, 3*I*D) host tensor, which the caller hands to a backend
(all resident, or the offloaded engine's host store).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from artifact.model.config import ModelConfig
from artifact.model.experts import ResidentExperts, pack_expert
from artifact.model.llada2 import LLaDA2MoE
from artifact.model.memory import check_slots_fit, pin_host

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}
EXPERT_PARTS = ("gate_proj", "up_proj", "down_proj")


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; choose one of {sorted(DTYPES)}") from None


def expert_names(cfg: ModelConfig, layer: int, e: int) -> list[str]:
    return [f"model.layers.{layer}.mlp.experts.{e}.{p}.weight" for p in EXPERT_PARTS]


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the loader needs, by its checkpoint name."""
    D, H, Hk, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    I, Ie = cfg.intermediate_size, cfg.moe_intermediate_size
    s = {
        "model.word_embeddings.weight": (cfg.vocab_size, D),
        "model.norm.weight": (D,),
        "lm_head.weight": (cfg.vocab_size, D),
    }
    for L in range(cfg.num_hidden_layers):
        p = f"model.layers.{L}."
        s[p + "input_layernorm.weight"] = (D,)
        s[p + "post_attention_layernorm.weight"] = (D,)
        s[p + "attention.query_key_value.weight"] = ((H + 2 * Hk) * hd, D)
        if cfg.use_qkv_bias:
            s[p + "attention.query_key_value.bias"] = ((H + 2 * Hk) * hd,)
        s[p + "attention.query_layernorm.weight"] = (hd,)
        s[p + "attention.key_layernorm.weight"] = (hd,)
        s[p + "attention.dense.weight"] = (D, H * hd)
        if cfg.use_bias:
            s[p + "attention.dense.bias"] = (D,)
        if L < cfg.first_k_dense_replace:
            s.update(
                {
                    p + "mlp.gate_proj.weight": (I, D),
                    p + "mlp.up_proj.weight": (I, D),
                    p + "mlp.down_proj.weight": (D, I),
                }
            )
            continue
        s[p + "mlp.gate.weight"] = (cfg.num_experts, D)
        s[p + "mlp.gate.expert_bias"] = (cfg.num_experts,)
        if cfg.num_shared_experts:
            Is = Ie * cfg.num_shared_experts
            s.update(
                {
                    p + "mlp.shared_experts.gate_proj.weight": (Is, D),
                    p + "mlp.shared_experts.up_proj.weight": (Is, D),
                    p + "mlp.shared_experts.down_proj.weight": (D, Is),
                }
            )
        for e in range(cfg.num_experts):
            g, u, d = expert_names(cfg, L, e)
            s.update({g: (Ie, D), u: (Ie, D), d: (D, Ie)})
    return s


class CheckpointError(ValueError):
    """A checkpoint file or index that cannot be what it claims to be; the message names the file."""


HEADER_LIMIT = 100 << 20  # safetensors refuses headers over 100 MB; a larger length field is a damaged file


def read_header(path: Path) -> dict[str, dict]:
    """A safetensors file's tensor table {name: {dtype, shape, data_offsets}}, checked against the file's
    size, so a truncated or damaged file is named here rather than failing inside a later read."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n < 2 or n > HEADER_LIMIT or 8 + n > size:
            raise CheckpointError(
                f"{path}: not a complete safetensors file ({size} bytes; "
                f"the header length field reads {n}); the file is truncated or damaged: copy it again"
            )
        try:
            table = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(
                f"{path}: safetensors header is not JSON ({e}); the file is damaged"
            ) from None
    if not isinstance(table, dict):
        raise CheckpointError(f"{path}: safetensors header is not a JSON object; the file is damaged")
    table.pop("__metadata__", None)
    data = size - 8 - n
    for name, info in table.items():
        try:
            start, end = (int(x) for x in info["data_offsets"])
        except (TypeError, KeyError, ValueError):
            raise CheckpointError(f"{path}: tensor {name} has no valid data_offsets in the header") from None
        if not 0 <= start <= end <= data:
            raise CheckpointError(
                f"{path}: tensor {name} needs bytes {start}-{end} of the data section, "
                f"which has {data} bytes; the file is truncated ({size} bytes on disk): copy it again"
            )
    return table


def _shard_path(root: Path, index: Path, shard) -> Path:
    """A shard name from index.json, refused unless it names a file inside the checkpoint directory."""
    name = Path(str(shard))
    if not isinstance(shard, str) or not shard or name.is_absolute() or ".." in name.parts:
        raise CheckpointError(
            f"{index}: shard name {shard!r} is not a file name inside {root} "
            "(absolute paths and '..' would read outside the checkpoint directory)"
        )
    return root / name


def _hashable(shard):
    return shard if isinstance(shard, (str, int, float, bool, type(None))) else json.dumps(shard)


class TensorIndex:
    """Name -> shard file for a checkpoint directory, with errors that name what is missing.
    Every shard's header is read and checked up front (size, names the index promises)."""

    def __init__(self, root: Path):
        self.root = root
        self.tables: dict[Path, dict] = {}  # shard -> its checked header (read_header)
        single, index = root / "model.safetensors", root / "model.safetensors.index.json"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
                if not isinstance(weight_map, dict):
                    raise TypeError("weight_map is not an object")
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
                raise CheckpointError(
                    f"{index}: not a safetensors index (needs a 'weight_map' object "
                    f"{{tensor name: shard file}}): {e}"
                ) from None
            shards = {
                shard: _shard_path(root, index, shard) for shard in set(map(_hashable, weight_map.values()))
            }
            self.where = {name: shards[_hashable(shard)] for name, shard in weight_map.items()}
            by_shard: dict[Path, list[str]] = {}
            for name, shard in self.where.items():
                by_shard.setdefault(shard, []).append(name)
            for shard, names in sorted(by_shard.items()):
                if not shard.is_file():
                    raise FileNotFoundError(
                        f"{shard}: shard listed in {index.name} is missing "
                        f"({len(names)} tensors, e.g. {names[0]})"
                    )
                table = self.tables[shard] = read_header(shard)
                lacks = [n for n in names if n not in table]
                if lacks:
                    raise CheckpointError(
                        f"{index}: names {len(lacks)} tensors in {shard.name} that the shard lacks "
                        f"(e.g. {lacks[0]}); the index and the shard files disagree"
                    )
        elif single.is_file():
            self.tables[single] = read_header(single)
            self.where = {name: single for name in self.tables[single]}
        else:
            raise FileNotFoundError(f"{root}: no model.safetensors or model.safetensors.index.json")
        self._open: dict[Path, object] = {}

    @property
    def files(self) -> list[Path]:
        return sorted(set(self.where.values()))

    def get(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        path = self.where.get(name)
        if path is None:
            raise KeyError(f"{self.root}: tensor {name} (shape {list(shape)}) is missing from the checkpoint")
        try:
            if path not in self._open:
                self._open[path] = safe_open(path, "pt")
            t = self._open[path].get_tensor(name)
        except SafetensorError as e:  # not a ValueError: say which file and tensor
            raise CheckpointError(f"{path}: cannot read tensor {name} ({e}); the file is damaged") from None
        if tuple(t.shape) != tuple(shape):
            raise ValueError(f"{path.name}: tensor {name} has shape {list(t.shape)}, expected {list(shape)}")
        return t


def check_checkpoint(root: Path) -> tuple[ModelConfig, TensorIndex]:
    """The one check of a checkpoint directory before any weight is read, for every entry point (the loader,
    prepare, the doctor): config.json is an object of well-typed keys (ModelConfig.from_hf), every
    safetensors header is complete and agrees with its file's size (TensorIndex), and every tensor the
    loader will read is in the headers with its shape. Errors are ValueErrors (CheckpointError), a KeyError
    (a missing tensor) or FileNotFoundError, each naming the file."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(
            f"{root}: checkpoint directory not found (expected config.json + *.safetensors)"
        )
    cfg = ModelConfig.from_hf(root)
    index = TensorIndex(root)
    for name, shape in expected_shapes(cfg).items():
        path = index.where.get(name)
        if path is None:
            raise KeyError(f"{root}: tensor {name} (shape {list(shape)}) is missing from the checkpoint")
        info = index.tables[path][name]
        have = info.get("shape") if isinstance(info, dict) else None
        if not isinstance(have, list) or tuple(have) != tuple(shape):
            raise CheckpointError(f"{path.name}: tensor {name} has shape {have}, expected {list(shape)}")
    return cfg, index


FULL_HASH_BYTES = 64 << 20  # files up to this size are hashed whole
SAMPLE_BYTES = 64  # from larger files: the first bytes of every tensor


def weights_fingerprint(path: str | Path) -> str:
    """A short hash that tells checkpoints with other weights apart, cheaply enough for 200 GB ones.

    It covers, per weight file (in name order): the file name, its size, its whole safetensors header
    (names, dtypes, shapes, offsets), and content: the whole file up to FULL_HASH_BYTES (the tiny model,
    test checkpoints), else the first SAMPLE_BYTES of every tensor's data (~25k reads of one page for
    LLaDA2.0-flash, under a second on NVMe). Any retrained or fine-tuned tensor changes its first bytes,
    so other weights of the same shapes are told apart; a change confined to the unsampled interior of a
    tensor is not. Modification times are left out on purpose: copying a checkpoint must not change
    its fingerprint, and rewriting one with other weights must."""
    root = Path(path)
    h = hashlib.sha256()
    index = TensorIndex(root)
    for f in index.files:
        size = f.stat().st_size
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = fh.read(n)
            h.update(f"{f.relative_to(root).as_posix()}\0{size}\0".encode() + header)
            if size <= FULL_HASH_BYTES:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
                continue
            for start, end in sorted(
                tuple(int(x) for x in info["data_offsets"]) for info in index.tables[f].values()
            ):
                fh.seek(8 + n + start)
                h.update(fh.read(min(SAMPLE_BYTES, end - start)))
    return h.hexdigest()[:16]


@dataclass
class Loaded:
    model: LLaDA2MoE  # non-expert weights on the device; backend = all experts resident
    experts: torch.Tensor  # (L_moe, E, 3*I*D) packed routed experts on the host, in `dtype`
    tokenizer: object
    cfg: ModelConfig
    path: Path | None


def load_checkpoint(
    path: str | Path, dtype="float32", device="cpu", resident: bool = True, capacity: int | None = None
) -> Loaded:
    """Load a LLaDA2 checkpoint directory (the tiny one: tiny.checkpoint_dir("tiny")).
    resident=True puts all experts on `device` as the model's backend; with False the caller sets one.
    capacity: the offloaded cache's slots per MoE layer, if one will be built; a capacity whose slots do
    not fit in the device's free memory is refused here, before any tensor is read."""
    root = Path(path)
    dtype = parse_dtype(dtype)
    if capacity is not None and root.is_dir():  # the device's memory first: no header read for a refusal
        check_slots_fit(ModelConfig.from_hf(root), capacity, dtype, device)
    cfg, index = check_checkpoint(root)
    tok = load_tokenizer(root)
    cfg = with_token_ids(cfg, tok, root)
    shapes = expected_shapes(cfg)
    model = LLaDA2MoE(cfg)
    state, biases = {}, {}
    for name in model.state_dict():
        t = index.get(name, shapes[name])
        if name.endswith("expert_bias"):
            biases[name] = t.float()  # the router adds it in fp32: kept bit for bit, never via dtype
        state[name] = t.to(dtype)
    model.load_state_dict(state, strict=True)
    model.to(device=device, dtype=dtype)
    restore_expert_bias(model, biases)
    # Page-locked once here when the target is a GPU, so every offloaded run copies by DMA. pin_host
    # registers the tensor in place (no power-of-two rounding; see offload/backend/store.py).
    pin = torch.device(device).type == "cuda" and torch.cuda.is_available()
    experts = torch.empty(len(cfg.moe_layers), cfg.num_experts, cfg.expert_params, dtype=dtype)
    for i, L in enumerate(cfg.moe_layers):
        for e in range(cfg.num_experts):
            g, u, d = (index.get(n, shapes[n]) for n in expert_names(cfg, L, e))
            experts[i, e] = pack_expert(g, u, d).to(dtype)
    if pin:
        pin_host(experts)
    model.eval()
    if resident:
        model.backend = ResidentExperts(experts.to(device), cfg)
    return Loaded(model, experts, tok, cfg, root)


def restore_expert_bias(model: LLaDA2MoE, biases: dict[str, torch.Tensor]) -> None:
    """Put the fp32 router biases back after model.to(dtype), which would have rounded them."""
    for name, buf in model.named_buffers():
        if name.endswith("expert_bias"):
            owner = model.get_submodule(name.rsplit(".", 1)[0])
            owner.expert_bias = biases[name].to(device=buf.device, dtype=torch.float32)


def load_tokenizer(root: Path):
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # config.json's model_type is unknown to transformers: expected
    try:
        return AutoTokenizer.from_pretrained(str(root), local_files_only=True)
    except (OSError, ValueError) as e:
        raise FileNotFoundError(
            f"{root}: no loadable tokenizer (tokenizer.json + tokenizer_config.json): {e}"
        ) from None
    finally:
        hf_logging.set_verbosity(level)


def with_token_ids(cfg: ModelConfig, tok, root: Path) -> ModelConfig:
    """mask/eos ids come from the tokenizer when it knows <|mask|> (they are not in config.json)."""
    import dataclasses

    mask = tok.convert_tokens_to_ids("<|mask|>")
    if mask is None or mask == tok.unk_token_id:
        return cfg
    eos = tok.eos_token_id if tok.eos_token_id is not None else cfg.eos_token_id
    if mask >= cfg.vocab_size or eos >= cfg.vocab_size:
        raise ValueError(f"{root}: tokenizer ids (mask {mask}, eos {eos}) exceed vocab_size {cfg.vocab_size}")
    return dataclasses.replace(cfg, mask_token_id=mask, eos_token_id=eos)
