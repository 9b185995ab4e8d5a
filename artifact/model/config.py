"""Model configuration: parsed from a Hugging Face config.json of model_type llada2_moe, or a preset."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

MODEL_TYPE = "llada2_moe"


def expert_params_of(hidden_size: int, moe_intermediate_size: int) -> int:
    """Parameters of one routed expert of width D = hidden_size and I = moe_intermediate_size: gate, up
    (I x D each) and down (D x I), packed as one row [gate | up | down] (experts.expert_views). The one place
    this size is computed: every expert size in the artifact comes from here."""
    return 3 * moe_intermediate_size * hidden_size


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 157184
    hidden_size: int = 2048
    intermediate_size: int = 5120  # dense MLP of the first (non-MoE) layers
    moe_intermediate_size: int = 512  # one routed expert; the shared expert is num_shared_experts x this
    num_hidden_layers: int = 20
    num_attention_heads: int = 16
    num_key_value_heads: int = 4
    head_dim: int = 128
    num_experts: int = 256
    num_experts_per_tok: int = 8
    num_shared_experts: int = 1
    n_group: int = 8  # experts are routed in groups of num_experts / n_group ...
    topk_group: int = 4  # ... and a token may only pick experts from its best topk_group groups
    first_k_dense_replace: int = 1  # layers [0, k) use a dense MLP, the rest are MoE
    routed_scaling_factor: float = 2.5
    partial_rotary_factor: float = 0.5  # RoPE rotates the first head_dim * this dims of each head
    rope_theta: float = 600000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32768
    use_qkv_bias: bool = False
    use_bias: bool = False
    tie_word_embeddings: bool = False
    # Decoding ids: not in the released config.json, they come from the tokenizer / generation config.
    mask_token_id: int = 156895
    eos_token_id: int = 156892
    block_length: int = 32  # diffusion block; the attention mask is block-causal in these units
    name: str = field(default="custom", compare=False)

    def __post_init__(self):
        problems = []
        if self.num_attention_heads % self.num_key_value_heads:
            problems.append(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.num_experts % self.n_group:
            problems.append(f"num_experts={self.num_experts} is not a multiple of n_group={self.n_group}")
        if not 1 <= self.topk_group <= self.n_group:
            problems.append(f"topk_group={self.topk_group} must be in [1, n_group={self.n_group}]")
        if self.num_experts_per_tok > self.topk_group * (self.num_experts // self.n_group):
            problems.append("num_experts_per_tok exceeds the experts reachable in topk_group groups")
        if self.rope_dim % 2 or self.rope_dim > self.head_dim:
            problems.append(f"rotary dims {self.rope_dim} must be even and <= head_dim {self.head_dim}")
        if not 0 <= self.first_k_dense_replace <= self.num_hidden_layers:
            problems.append(f"first_k_dense_replace={self.first_k_dense_replace} out of range")
        if problems:
            raise ValueError(f"invalid {MODEL_TYPE} config '{self.name}': " + "; ".join(problems))

    # --- derived sizes -------------------------------------------------------------------------
    @property
    def rope_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def moe_layers(self) -> list[int]:
        return list(range(self.first_k_dense_replace, self.num_hidden_layers))

    @property
    def expert_params(self) -> int:
        """Parameters of one routed expert (expert_params_of)."""
        return expert_params_of(self.hidden_size, self.moe_intermediate_size)

    def expert_bytes(self, dtype_bytes: int = 2) -> int:
        return self.expert_params * dtype_bytes

    def config_hash(self) -> str:
        """Identity of the architecture (not the name): traces recorded on one model refuse another."""
        d = dataclasses.asdict(self)
        d.pop("name")
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]

    # --- Hugging Face config.json --------------------------------------------------------------
    @classmethod
    def from_hf(cls, source: dict | str | Path, name: str | None = None) -> "ModelConfig":
        """Parse a HF config (dict, config.json path, or checkpoint directory)."""
        where = "config dict"
        if not isinstance(source, dict):
            path = Path(source)
            if path.is_dir():
                path = path / "config.json"
            if not path.is_file():
                raise FileNotFoundError(
                    f"{path}: no config.json (expected a Hugging Face checkpoint directory)"
                )
            where = str(path)
            try:
                source = json.loads(path.read_text())
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: not valid JSON ({e})") from None
            name = name or path.parent.name
        if not isinstance(source, dict):
            raise ValueError(f"{where}: not a JSON object of config keys (got a {type(source).__name__})")
        mt = source.get("model_type")
        if mt != MODEL_TYPE:
            raise ValueError(f"{where}: model_type is {mt!r}, expected {MODEL_TYPE!r} (LLaDA2.0-mini/flash)")
        sf = source.get("score_function", "sigmoid")
        if sf != "sigmoid":
            raise ValueError(
                f"{where}: score_function {sf!r} is not supported (LLaDA2 routes with 'sigmoid')"
            )
        known = {f.name for f in dataclasses.fields(cls)} - {"name"}
        kw = {k: v for k, v in source.items() if k in known}
        if source.get("num_shared_experts", 0) is None:
            kw["num_shared_experts"] = 0
        for k, v in kw.items():
            _check_value(where, k, v, cls.__dataclass_fields__[k].default)
        if "head_dim" not in kw:
            for k in ("hidden_size", "num_attention_heads"):
                if k not in kw:
                    raise ValueError(f"{where}: has no head_dim and no {k} to derive it from")
            kw["head_dim"] = source["hidden_size"] // source["num_attention_heads"]
        return cls(**kw, name=name or source.get("_name_or_path", "custom"))

    def to_hf(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("name")
        d.update(
            model_type=MODEL_TYPE,
            architectures=["LLaDA2MoeModelLM"],
            hidden_act="silu",
            score_function="sigmoid",
            norm_topk_prob=True,
            use_qk_norm=True,
            moe_router_enable_expert_bias=True,
            pad_token_id=self.eos_token_id,
        )
        return d


# Keys that may be 0; every other integer key is a size or a count of at least 1.
MAY_BE_ZERO = {"first_k_dense_replace", "num_shared_experts", "mask_token_id", "eos_token_id"}


def _check_value(where: str, key: str, value, default) -> None:
    """A config.json value of the type (and sign) ModelConfig's field has, or a ValueError naming it."""
    if isinstance(default, bool):
        ok, want = isinstance(value, bool), "true or false"
    elif isinstance(default, int):
        low = 0 if key in MAY_BE_ZERO else 1
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= low
        want = f"an integer >= {low}"
    else:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        ok, want = ok and value > 0, "a number > 0"
    if not ok:
        raise ValueError(f"{where}: {key} is {value!r}, expected {want}")


PRESETS: dict[str, ModelConfig] = {
    "llada2-mini": ModelConfig(name="llada2-mini"),
    "llada2-flash": ModelConfig(
        name="llada2-flash",
        hidden_size=4096,
        intermediate_size=9216,
        moe_intermediate_size=1024,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=4,
    ),
    # Real routing structure (256 experts, top-8, 8 groups keep 4, 1 shared, dense layer 0, block 32);
    # only widths and depth shrink so a denoising step takes milliseconds on one CPU core.
    # vocab/mask/eos are those of the tokenizer that build_tiny_checkpoint trains.
    "tiny": ModelConfig(
        name="tiny",
        vocab_size=2048,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=5,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        mask_token_id=2,
        eos_token_id=1,
    ),
}


def get_preset(name: str) -> ModelConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise KeyError(f"unknown model preset {name!r}; choose one of {sorted(PRESETS)}") from None
