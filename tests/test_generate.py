"""Block-diffusion decoding: cached == full, batch == alone, the acceptance rule, eos, events."""

import dataclasses

import pytest
import torch

from artifact.model.decode import DecodeConfig, accept, generate, transfer_schedule


@pytest.mark.parametrize("gen_length", [40, 64])
def test_cached_and_full_modes_agree(tiny, tiny_prompts, gen_length):
    """float32 cached and full attention differ in the last bits (other matmul shapes), so a confidence
    within ~1e-6 of the 0.95 threshold could flip a decision; these prompts and lengths have none."""
    prompts = [tiny_prompts[1], tiny_prompts[2], tiny_prompts[4]]  # 25, 45, 78 tokens: prefill 0-2 blocks
    cached = generate(
        tiny.model, prompts, DecodeConfig(gen_length=gen_length, mode="cached"), record_logits=True
    )
    full = generate(tiny.model, prompts, DecodeConfig(gen_length=gen_length, mode="full"), record_logits=True)
    assert cached.tokens == full.tokens
    assert all(len(t) == gen_length for t in cached.tokens)
    assert cached.step_logits.keys() == full.step_logits.keys() and len(full.step_logits) > 10
    for k, v in full.step_logits.items():
        torch.testing.assert_close(cached.step_logits[k], v, rtol=1e-4, atol=1e-4)
    assert cached.stats.forwards == full.stats.forwards
    assert cached.stats.prefill_forwards == 2 and full.stats.prefill_forwards == 0


def test_batch_decoding_equals_decoding_alone(tiny, tiny_prompts):
    dc = DecodeConfig(gen_length=40)
    batch = generate(tiny.model, tiny_prompts, dc)
    alone = [generate(tiny.model, [p], dc).tokens[0] for p in tiny_prompts]
    assert batch.tokens == alone
    assert batch.stats.batch_size == 5 and batch.stats.tokens_generated == 5 * 40


def test_fewer_steps_accept_more_tokens_per_step(tiny, tiny_prompts):
    many = generate(tiny.model, [tiny_prompts[1]], DecodeConfig(gen_length=64, steps=32))
    few = generate(tiny.model, [tiny_prompts[1]], DecodeConfig(gen_length=64, steps=4))
    assert few.stats.forwards <= 4 * few.stats.blocks < many.stats.forwards
    assert len(few.tokens[0]) == 64


def test_transfer_schedule():
    assert transfer_schedule(32, 32) == [1] * 32
    assert transfer_schedule(32, 5) == [7, 7, 6, 6, 6]
    assert transfer_schedule(32, 64) == [1] * 32
    assert sum(transfer_schedule(32, 7)) == 32


def test_accept_rule():
    mask = 9
    block = torch.tensor([mask, 3, mask, mask, mask])
    logits = torch.zeros(5, 10)
    logits[0, 4] = 10.0  # confident (> 0.95)
    logits[2, 5] = 10.0  # confident
    logits[3, 6] = 1.0  # unsure (~0.23)
    logits[4, 7] = 2.0  # unsure but more so (~0.45)
    b = block.clone()
    accept(b, logits, mask, 0.95, quota=1)  # two pass the threshold: both accepted
    assert b.tolist() == [4, 3, 5, mask, mask]
    accept(b, logits, mask, 0.95, quota=1)  # none pass: the single most confident one
    assert b.tolist() == [4, 3, 5, mask, 7]
    b = block.clone()
    accept(b, logits, mask, 0.95, quota=3)  # quota above the confident count: top-3 by confidence
    assert b.tolist() == [4, 3, 5, mask, 7]
    assert int((b == 3).sum()) == 1  # an unmasked position is never rewritten


def test_eos_stops_a_row_early(tiny, tiny_prompts):
    dc = DecodeConfig(gen_length=64)
    first = generate(tiny.model, [tiny_prompts[0], tiny_prompts[1]], dc)
    eos = first.tokens[0][35]  # pretend a token of the second decoded block is eos
    model = tiny.model
    saved = model.cfg
    model.cfg = dataclasses.replace(saved, eos_token_id=eos)
    try:
        again = generate(model, [tiny_prompts[0], tiny_prompts[1]], dc)
    finally:
        model.cfg = saved
    cut = first.tokens[0].index(eos)
    assert again.tokens[0] == first.tokens[0][:cut]
    assert eos not in again.tokens[1]
    assert again.stats.tokens_generated == sum(map(len, again.tokens)) < 2 * 64


def test_events_per_forward(tiny, tiny_prompts):
    seen = []
    with tiny.model.listening(seen.append):
        g = generate(tiny.model, [tiny_prompts[4], tiny_prompts[1]], DecodeConfig(gen_length=64))
    cfg = tiny.cfg
    denoise = [d for d in seen if d.step.kind == "denoise"]
    prefill = [d for d in seen if d.step.kind == "prefill"]
    assert len(denoise) == g.stats.forwards * len(cfg.moe_layers)
    # only the 78-token prompt has whole blocks before its first decoded block: one prefill forward
    assert len(prefill) == g.stats.prefill_forwards * len(cfg.moe_layers) == len(cfg.moe_layers)
    forwards = [d.step.forward for d in seen]
    assert forwards == sorted(forwards)
    first_step = [d for d in denoise if d.step.block == 1 and d.step.block_step == 0]
    # the first step of a later block also commits the previous block: 2 rows x 64 tokens route
    assert all(sum(d.counts) == 2 * 64 * cfg.num_experts_per_tok for d in first_step)


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(prompts=[]), "batch size must be 1-8"),
        (dict(prompts=[[5]] * 9), "batch size must be 1-8"),
        (dict(prompts=[[]]), "prompt 0 is empty"),
        (dict(prompts=[[5, 99999]]), "outside"),
    ],
)
def test_bad_input(tiny, bad, match):
    with pytest.raises(ValueError, match=match):
        generate(tiny.model, bad["prompts"], DecodeConfig(gen_length=8))


def test_bad_decode_config():
    from artifact.errors import SpecError

    for bad, field, match in (
        (dict(mode="fast"), "mode", "unknown decoding mode 'fast'"),
        (dict(gen_length=0), "gen_length", "gen_length must be >= 1, got 0"),
        (dict(steps=0), "steps", "steps must be >= 1, got 0"),
        (dict(threshold=1.5), "threshold", "threshold"),
    ):
        with pytest.raises(SpecError, match=match) as e:  # a ValueError too (SettingError)
            DecodeConfig(**bad)
        assert e.value.field == field and isinstance(e.value, ValueError)
