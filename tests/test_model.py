"""The LLaDA2-MoE forward against the reference facts: router formula, partial RoPE, block-causal mask,
and a combine that does not depend on the order experts were computed in."""

import dataclasses
import math
import random

import numpy as np
import pytest
import torch

from artifact.model.config import PRESETS, ModelConfig, get_preset
from artifact.model.experts import ExpertGroup
from artifact.model.llada2 import apply_rope, block_causal_mask, rope_cos_sin
from artifact.model.routing import Router, StepInfo


def reference_route(h: np.ndarray, W: np.ndarray, bias: np.ndarray, cfg: ModelConfig):
    """The formula of docs/DESIGN.md, one token at a time, in float64 with plain Python."""
    E, G = cfg.num_experts, cfg.n_group
    per = E // G
    out = []
    for x in h:
        s = 1.0 / (1.0 + np.exp(-(W.astype(np.float64) @ x.astype(np.float64))))
        b = s + bias
        gscore = [sum(sorted(b[g * per : (g + 1) * per])[-2:]) for g in range(G)]
        kept = sorted(range(G), key=lambda g: -gscore[g])[: cfg.topk_group]
        cand = [e for g in kept for e in range(g * per, (g + 1) * per)]
        chosen = sorted(cand, key=lambda e: -b[e])[: cfg.num_experts_per_tok]
        w = np.array([s[e] for e in chosen])
        out.append((chosen, w / w.sum() * cfg.routed_scaling_factor))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_router_matches_the_formula(seed):
    cfg = get_preset("tiny")
    torch.manual_seed(seed)
    r = Router(cfg)
    with torch.no_grad():
        r.weight.normal_(0, 0.3)
        r.expert_bias.normal_(0, 0.05)
    h = torch.randn(40, cfg.hidden_size)
    with torch.no_grad():
        idx, w = r(h)
    ref = reference_route(h.numpy(), r.weight.detach().numpy(), r.expert_bias.numpy(), cfg)
    for t, (chosen, rw) in enumerate(ref):
        assert idx[t].tolist() == chosen
        np.testing.assert_allclose(w[t].numpy(), rw, rtol=1e-5)
    assert torch.allclose(w.sum(-1), torch.full((40,), cfg.routed_scaling_factor))


def test_router_group_masking_excludes_a_strong_expert_in_a_weak_group():
    cfg = get_preset("tiny")
    r = Router(cfg)
    per = cfg.num_experts // cfg.n_group
    with torch.no_grad():
        r.weight.zero_()  # every score is sigmoid(0) = 0.5
        bias = torch.full((cfg.num_experts,), -0.4)
        bias[3] = 0.45  # group 0: one expert at 0.95, the rest at 0.1 -> group 1.05
        for g in range(1, cfg.n_group):  # other groups: two experts at 0.6 -> group 1.2
            bias[g * per] = bias[g * per + 1] = 0.1
        r.expert_bias.copy_(bias)
    idx, _ = r(torch.zeros(1, cfg.hidden_size))
    assert 3 not in idx[0].tolist(), "expert 3 scores highest but its group is not among the top 4"
    groups = {e // per for e in idx[0].tolist()}
    assert len(groups) <= cfg.topk_group and 0 not in groups


def test_partial_rope_rotates_only_the_first_dims_and_keeps_norms():
    cfg = get_preset("tiny")
    pos = torch.arange(7)[None]
    cos, sin = rope_cos_sin(pos, cfg, torch.float32)
    x = torch.randn(1, 2, 7, cfg.head_dim)
    y = apply_rope(x, cos, sin)
    r = cfg.rope_dim
    assert torch.equal(y[..., r:], x[..., r:])
    torch.testing.assert_close(y[..., :r].norm(dim=-1), x[..., :r].norm(dim=-1))
    assert torch.equal(y[:, :, 0], x[:, :, 0])  # position 0 is the identity
    # rotate-half form: dim j pairs with j + r/2, angle pos * theta^(-2j/r)
    j, p = 1, 5
    ang = p * cfg.rope_theta ** (-2 * j / r)
    a, b = x[0, 0, p, j].item(), x[0, 0, p, j + r // 2].item()
    assert y[0, 0, p, j].item() == pytest.approx(a * math.cos(ang) - b * math.sin(ang), abs=1e-5)


def test_block_causal_mask():
    pos = torch.arange(96)[None]
    m = block_causal_mask(pos, pos, torch.ones(1, 96, dtype=torch.bool), 32)[0, 0]
    assert m[0, 31] and m[31, 0]  # bidirectional inside a block
    assert not m[31, 32] and m[32, 31] and m[63, 0] and not m[40, 70]
    assert m[95].all()


def test_presets_hold_the_reference_facts():
    mini, flash = PRESETS["llada2-mini"], PRESETS["llada2-flash"]
    assert (mini.hidden_size, mini.num_hidden_layers, mini.num_attention_heads, mini.num_key_value_heads) == (
        2048,
        20,
        16,
        4,
    )
    assert (flash.hidden_size, flash.num_hidden_layers, flash.num_attention_heads) == (4096, 32, 32)
    assert mini.expert_bytes(2) == 6 * 2**20 and flash.expert_bytes(2) == 24 * 2**20
    assert mini.expert_bytes(2) * mini.num_experts == 1.5 * 2**30
    tiny = PRESETS["tiny"]
    for k in (
        "num_experts",
        "num_experts_per_tok",
        "n_group",
        "topk_group",
        "num_shared_experts",
        "first_k_dense_replace",
        "block_length",
        "routed_scaling_factor",
    ):
        assert getattr(tiny, k) == getattr(mini, k), k
    assert mini.rope_dim == 64


def test_config_rejects_inconsistent_values():
    with pytest.raises(ValueError, match="n_group"):
        dataclasses.replace(get_preset("tiny"), n_group=7)
    with pytest.raises(KeyError, match="tiny"):
        get_preset("llada3")
    with pytest.raises(ValueError, match="model_type"):
        ModelConfig.from_hf({"model_type": "llama", "hidden_size": 8})


class ShuffledBackend:
    """Serves the demanded experts in random groups, in a random order: the output must not change by a
    single bit."""

    def __init__(self, inner, seed):
        self.inner, self.rng = inner, random.Random(seed)

    def groups(self, demand):
        (whole,) = list(self.inner.groups(demand))
        experts = list(whole.experts)
        self.rng.shuffle(experts)
        cuts = sorted(self.rng.sample(range(1, len(experts)), min(3, len(experts) - 1)))
        parts = [experts[a:b] for a, b in zip([0] + cuts, cuts + [len(experts)])]
        for part in parts:
            part = sorted(part)
            yield ExpertGroup(tuple(part), tuple(part), whole.gate_up, whole.down)


def test_combine_is_independent_of_expert_order(tiny, tiny_prompts):
    model = tiny.model
    ids = torch.tensor(tiny_prompts[2][:32])[None]
    pos = torch.arange(32)[None]
    base = model(ids, pos)
    resident = model.backend
    try:
        for seed in range(3):
            model.backend = ShuffledBackend(resident, seed)
            assert torch.equal(model(ids, pos), base)
    finally:
        model.backend = resident


def test_every_moe_layer_reports_its_demand(tiny, tiny_prompts):
    model, cfg = tiny.model, tiny.cfg
    seen = []
    with model.listening(seen.append):
        model(
            torch.tensor(tiny_prompts[0][:32])[None],
            torch.arange(32)[None],
            step=StepInfo(7, 0, 3, "denoise"),
        )
    assert [d.layer for d in seen] == cfg.moe_layers
    for d in seen:
        assert d.step.forward == 7 and list(d.experts) == sorted(set(d.experts))
        assert sum(d.counts) == 32 * cfg.num_experts_per_tok  # every (token, slot) once
