"""Writing checkpoints in the released format: a model's tensors under the checkpoint names, config and
shards; seeded random weights of any shape; the deterministic tiny checkpoint (weights and a byte-level BPE
tokenizer trained on the bundled task prompts), built once into the cache. Reading them is checkpoint.py.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from artifact.model.checkpoint import Loaded, expert_names, parse_dtype, restore_expert_bias
from artifact.model.config import ModelConfig, get_preset
from artifact.model.experts import ResidentExperts, pack_expert
from artifact.model.llada2 import LLaDA2MoE
from artifact.paths import cache_dir, data_dir

TINY_FORMAT = 2  # bump when build_tiny_checkpoint writes something different: old caches are rebuilt
SPECIAL_TOKENS = ["<|startoftext|>", "<|endoftext|>", "<|mask|>", "<role>", "</role>", "<|role_end|>"]
# LLaDA2 / Ling style turns: <role>HUMAN</role>text<|role_end|><role>ASSISTANT</role>
CHAT_TEMPLATE = (
    "{% set names = {'user': 'HUMAN', 'assistant': 'ASSISTANT', 'system': 'SYSTEM'} %}"
    "{% for m in messages %}<role>{{ names.get(m['role'], m['role'] | upper) }}</role>{{ m['content'] }}"
    "<|role_end|>{% endfor %}{% if add_generation_prompt %}<role>ASSISTANT</role>{% endif %}"
)


def state_tensors(model: LLaDA2MoE, experts: torch.Tensor) -> dict[str, torch.Tensor]:
    """All tensors of a model + packed experts under the released checkpoint names."""
    cfg = model.cfg
    out = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    I, D = cfg.moe_intermediate_size, cfg.hidden_size
    for i, L in enumerate(cfg.moe_layers):
        for e in range(cfg.num_experts):
            flat = experts[i, e]
            g, u, d = expert_names(cfg, L, e)
            out[g] = flat[: I * D].view(I, D).clone()
            out[u] = flat[I * D : 2 * I * D].view(I, D).clone()
            out[d] = flat[2 * I * D :].view(D, I).clone()
    return out


def save_checkpoint(root: Path, cfg: ModelConfig, tensors: dict[str, torch.Tensor], shards: int = 1) -> Path:
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(cfg.to_hf(), indent=2))
    names = sorted(tensors)
    if shards == 1:
        save_file({n: tensors[n] for n in names}, str(root / "model.safetensors"), metadata={"format": "pt"})
        return root
    per = -(-len(names) // shards)
    weight_map = {}
    for s in range(shards):
        part = names[s * per : (s + 1) * per]
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n] for n in part}, str(root / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in part})
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return root


def train_tiny_tokenizer(vocab_size: int):
    """A byte-level BPE trained on the bundled task prompts, with LLaDA2's special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = []
    for f in sorted((data_dir() / "tasks").glob("*.jsonl")):
        texts += [json.loads(line)["prompt"] for line in f.read_text().splitlines() if line.strip()]
    if not texts:
        raise FileNotFoundError(
            f"{data_dir() / 'tasks'}: no *.jsonl task prompts to train the tiny tokenizer on"
        )
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|startoftext|>",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        mask_token="<|mask|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def init_random_weights(cfg: ModelConfig, seed: int, dtype=torch.float32) -> tuple[LLaDA2MoE, torch.Tensor]:
    """Seeded random weights. Scales keep activations O(1); the LM head is sharpened so that some
    positions pass the 0.95 confidence threshold and a step can accept several tokens."""
    g = torch.Generator().manual_seed(seed)
    model = LLaDA2MoE(cfg)

    def normal(shape, std):
        return torch.randn(shape, generator=g) * std

    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
                p.copy_(1.0 + normal(p.shape, 0.1))
            elif name == "lm_head.weight":
                p.copy_(normal(p.shape, 1.0))
            elif name.endswith("word_embeddings.weight"):
                p.copy_(normal(p.shape, 1.0))
            else:
                p.copy_(normal(p.shape, p.shape[-1] ** -0.5))
        for m in model.modules():
            if hasattr(m, "expert_bias"):
                m.expert_bias.copy_(normal(m.expert_bias.shape, 0.02))
    D, I = cfg.hidden_size, cfg.moe_intermediate_size
    experts = torch.empty(len(cfg.moe_layers), cfg.num_experts, cfg.expert_params, dtype=dtype)
    for i in range(len(cfg.moe_layers)):
        for e in range(cfg.num_experts):
            experts[i, e] = pack_expert(
                normal((I, D), D**-0.5), normal((I, D), D**-0.5), normal((D, I), I**-0.5)
            ).to(dtype)
    return model, experts


def random_model(
    cfg: ModelConfig, seed: int = 0, dtype="float32", device="cpu", resident: bool = True
) -> Loaded:
    """A model of any shape with seeded random weights and no tokenizer (GPU checks, benchmarks of
    real-model shapes where no checkpoint is at hand). Random weights route unlike a trained model."""
    dtype = parse_dtype(dtype)
    model, experts = init_random_weights(cfg, seed, dtype)
    biases = {n: b.clone() for n, b in model.named_buffers() if n.endswith("expert_bias")}
    model.to(device=device, dtype=dtype).eval()
    restore_expert_bias(model, biases)
    if resident:
        model.backend = ResidentExperts(experts.to(device), cfg)
    return Loaded(model, experts, None, cfg, None)


def build_tiny_checkpoint(root: str | Path, seed: int = 0, shards: int = 1) -> Path:
    """Write the deterministic tiny checkpoint (weights, config.json, tokenizer) to `root`."""
    root = Path(root)
    cfg = get_preset("tiny")
    tok = train_tiny_tokenizer(cfg.vocab_size)
    if len(tok) > cfg.vocab_size:
        raise RuntimeError(f"tiny tokenizer has {len(tok)} tokens > vocab_size {cfg.vocab_size}")
    ids = (tok.convert_tokens_to_ids("<|mask|>"), tok.eos_token_id)
    if ids != (cfg.mask_token_id, cfg.eos_token_id):
        raise RuntimeError(
            f"tiny tokenizer mask/eos ids {ids} differ from the preset's "
            f"{(cfg.mask_token_id, cfg.eos_token_id)}"
        )
    model, experts = init_random_weights(cfg, seed)
    save_checkpoint(root, cfg, state_tensors(model, experts), shards=shards)
    tok.save_pretrained(str(root))
    # Name the class every transformers version knows (v5 writes "TokenizersBackend", unknown to v4,
    # which TIDE pins) and keep the chat template in tokenizer_config.json, where v4 looks for it.
    tc_path = root / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text())
    tc.update(tokenizer_class="PreTrainedTokenizerFast", chat_template=CHAT_TEMPLATE)
    tc_path.write_text(json.dumps(tc, indent=2))
    return root


def tiny_checkpoint(seed: int = 0) -> Path:
    """The tiny checkpoint's directory, built on first use (atomically, so concurrent users are safe)."""
    root = cache_dir() / "checkpoints" / f"tiny-v{TINY_FORMAT}-seed{seed}"
    if (root / "config.json").is_file():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root.parent, prefix=".tiny-build-"))
    try:
        build_tiny_checkpoint(tmp, seed)
        try:
            tmp.rename(root)
        except OSError:  # another process won the race
            if not (root / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def checkpoint_dir(model: str | Path) -> Path:
    """A model name as a checkpoint directory: "tiny" is the tiny checkpoint (built on first use), anything
    else the directory it names."""
    return tiny_checkpoint() if str(model) == "tiny" else Path(model)
