"""Checkpoints by the released tensor names: round trip, sharding, and errors that name what is wrong."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from artifact.model.checkpoint import expected_shapes, load_checkpoint
from artifact.model.config import ModelConfig
from artifact.model.tiny import build_tiny_checkpoint, save_checkpoint, state_tensors


@pytest.fixture(scope="module")
def written(tiny, tmp_path_factory):
    """The tiny model written as a 3-shard checkpoint (config, tokenizer copied along)."""
    root = tmp_path_factory.mktemp("ckpt")
    save_checkpoint(root, tiny.cfg, state_tensors(tiny.model, tiny.experts), shards=3)
    for f in tiny.path.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, root / f.name)
    return root


def logits(loaded, ids):
    return loaded.model(torch.tensor(ids)[None], torch.arange(len(ids))[None])


def test_written_then_loaded_gives_the_same_logits(tiny, written, tiny_prompts):
    again = load_checkpoint(written)
    ids = tiny_prompts[4][:64]
    assert torch.equal(logits(again, ids), logits(tiny, ids))
    assert torch.equal(again.experts, tiny.experts)
    assert again.cfg == tiny.cfg


def test_checkpoint_uses_the_released_tensor_names(tiny):
    with open(tiny.path / "model.safetensors", "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        names = set(json.loads(f.read(n))) - {"__metadata__"}
    assert names == set(expected_shapes(tiny.cfg))
    for name in (
        "model.word_embeddings.weight",
        "lm_head.weight",
        "model.norm.weight",
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.1.attention.query_key_value.weight",
        "model.layers.1.attention.query_layernorm.weight",
        "model.layers.1.mlp.gate.expert_bias",
        "model.layers.4.mlp.experts.255.down_proj.weight",
        "model.layers.2.mlp.shared_experts.up_proj.weight",
    ):
        assert name in names


def copy_of(src, tmp_path):
    dst = tmp_path / "c"
    shutil.copytree(src, dst)
    return dst


def test_missing_shard_names_the_file(written, tmp_path):
    root = copy_of(written, tmp_path)
    (root / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model-00002-of-00003.safetensors.*missing"):
        load_checkpoint(root)


def test_missing_tensor_is_named(tiny, tmp_path):
    root = copy_of(tiny.path, tmp_path)
    t = load_file(root / "model.safetensors")
    del t["model.layers.3.mlp.experts.17.up_proj.weight"]
    save_file(t, root / "model.safetensors")
    with pytest.raises(KeyError, match=r"model.layers.3.mlp.experts.17.up_proj.weight \(shape \[32, 64\]\)"):
        load_checkpoint(root)


def test_wrong_shape_names_tensor_and_shapes(tiny, tmp_path):
    root = copy_of(tiny.path, tmp_path)
    t = load_file(root / "model.safetensors")
    t["model.layers.2.attention.dense.weight"] = torch.zeros(64, 32)
    save_file(t, root / "model.safetensors")
    with pytest.raises(
        ValueError,
        match=r"model.layers.2.attention.dense.weight has shape \[64, 32\], "
        r"expected \[64, 64\]",
    ):
        load_checkpoint(root)


def test_other_model_type_and_missing_files(tiny, tmp_path):
    root = copy_of(tiny.path, tmp_path)
    cfg = json.loads((root / "config.json").read_text())
    (root / "config.json").write_text(json.dumps({**cfg, "model_type": "qwen2_moe"}))
    with pytest.raises(ValueError, match="model_type is 'qwen2_moe', expected 'llada2_moe'"):
        load_checkpoint(root)
    (root / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        ModelConfig.from_hf(root)
    with pytest.raises(FileNotFoundError, match="checkpoint directory not found"):
        load_checkpoint(tmp_path / "nowhere")
    root2 = copy_of(tiny.path, tmp_path / "x")
    (root2 / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no model.safetensors or model.safetensors.index.json"):
        load_checkpoint(root2)


def test_bf16_load(tiny, tiny_prompts):
    b = load_checkpoint(tiny.path, dtype="bfloat16")
    assert b.model.lm_head.weight.dtype == torch.bfloat16 and b.experts.dtype == torch.bfloat16
    assert b.model.model.layers[1].mlp.gate.expert_bias.dtype == torch.float32  # router bias stays fp32
    ids = tiny_prompts[0][:32]
    ref = logits(tiny, ids)
    got = logits(b, ids)
    assert got.dtype == torch.float32 and torch.isfinite(got).all()
    # bf16 keeps the model recognisably the same: most greedy tokens agree
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() > 0.5
    with pytest.raises(ValueError, match="unknown dtype 'int8'"):
        load_checkpoint(tiny.path, dtype="int8")


def test_tokenizer_round_trips_and_knows_the_special_ids(tiny):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny.path))
    for text in [
        "Janet’s ducks lay 16 eggs per day.",
        "def f(x):\n    return x ** 2  # ünïcode ✓",
        "$\\frac{1}{2}$ and 3,000 apples",
    ]:
        assert tok.decode(tok.encode(text)) == text
    assert tok.convert_tokens_to_ids("<|mask|>") == tiny.cfg.mask_token_id
    assert tok.eos_token_id == tiny.cfg.eos_token_id
    assert tok.eos_token == "<|endoftext|>"
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat == "<role>HUMAN</role>hi<|role_end|><role>ASSISTANT</role>"
    assert len(tok) <= tiny.cfg.vocab_size


def test_tiny_checkpoint_is_deterministic(tiny, tmp_path):
    build_tiny_checkpoint(tmp_path / "again")
    a = load_file(tiny.path / "model.safetensors")
    b = load_file(tmp_path / "again" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (tmp_path / "again" / "tokenizer.json").read_text() == (tiny.path / "tokenizer.json").read_text()
