"""The cross-layer prediction: the model fills Demand.predicted when asked, without changing its
outputs; traces record it (schema 2) and give back exactly the live prediction; schema-1 traces load."""

import json

import numpy as np
import pytest
import torch

from artifact.cli import main
from artifact.model.decode import DecodeConfig, generate
from artifact.model.options import ForwardOptions
from artifact.offload.replay.trace import PRED_ARRAYS, SCHEMA, Trace, TraceError
from artifact.offload.runner import decode_prompts
from artifact.offload.spec import RunSpec
from artifact.paths import atomic_write_bytes

DC = DecodeConfig(gen_length=32)


def live_demands(model, prompts, predict: bool):
    seen = []
    with model.listening(seen.append):
        gen = generate(model, prompts, DC, record_logits=True, options=ForwardOptions(predict_next=predict))
    return seen, gen


def test_prediction_does_not_change_the_model_and_is_the_next_router_on_this_layers_moe_input(
    tiny, tiny_prompts
):
    cfg, model = tiny.cfg, tiny.model
    off, g0 = live_demands(model, tiny_prompts[:2], False)
    on, g1 = live_demands(model, tiny_prompts[:2], True)
    assert g1.tokens == g0.tokens
    assert g0.step_logits and g0.step_logits.keys() == g1.step_logits.keys()
    assert all(torch.equal(g0.step_logits[k], g1.step_logits[k]) for k in g0.step_logits), (
        "fp32 logits bit-identical"
    )
    assert [(d.layer, d.experts, d.counts) for d in on] == [(d.layer, d.experts, d.counts) for d in off]
    assert all(d.predicted is None for d in off)
    last = cfg.moe_layers[-1]
    assert all((d.predicted is None) == (d.layer == last) for d in on)
    for d in on:
        if d.predicted is not None:
            e, c = d.predicted
            assert list(e) == sorted(set(e)) and sum(c) == sum(d.counts), "same tokens, k experts each"

    # Independently: capture each MoE layer's input with a hook and apply the next layer's router.
    inputs = {}
    hooks = [
        model.model.layers[i].mlp.register_forward_hook(
            lambda m, args, out, i=i: inputs.__setitem__(i, (args[0], args[1]))
        )
        for i in cfg.moe_layers
    ]
    B, T = 1, 8
    ids = torch.tensor([tiny_prompts[0][:T]])
    pos = torch.arange(T)[None]
    rows = torch.zeros(B, T, dtype=torch.bool)
    rows[0, 2:] = True  # only some tokens route
    seen = []
    try:
        with model.listening(seen.append):
            model(ids, pos, rows=rows, options=ForwardOptions(predict_next=True))
    finally:
        for h in hooks:
            h.remove()
    for d in seen[:-1]:
        nxt = cfg.moe_layers[cfg.moe_layers.index(d.layer) + 1]
        x, r = inputs[d.layer]
        xs = x.reshape(-1, cfg.hidden_size)[r.reshape(-1)]  # (N, D) the routed tokens' MoE input
        idx, _ = model.model.layers[nxt].mlp.gate(xs)
        e, c = np.unique(idx.numpy().ravel(), return_counts=True)
        assert d.predicted == (tuple(e.tolist()), tuple(c.tolist())), d.layer


def test_recorded_prediction_equals_the_live_prediction(tiny, tiny_prompts, tmp_path):
    live, _ = live_demands(tiny.model, tiny_prompts[:2], True)
    rec = decode_prompts(tiny, tiny_prompts[:2], 2, RunSpec(decode=DC), record=True, prompt_ids=["a", "b"])
    t = rec.trace
    assert t.has_predictions and len(t) == len(live)
    assert [d.predicted for d in t.demands] == [d.predicted for d in live]
    loaded = Trace.load(t.save(tmp_path / "t.safetensors"))
    assert SCHEMA == 2 and loaded.has_predictions
    assert [d.predicted for d in loaded.demands] == [d.predicted for d in live]
    assert [(d.experts, d.counts) for d in loaded.demands] == [(d.experts, d.counts) for d in live]


def write_raw(path, arrays: dict, schema: str, meta: dict):
    from safetensors.numpy import save

    header = {"format": "artifact-routing-trace", "schema": schema, "meta": json.dumps(meta)}
    atomic_write_bytes(path, save({k: np.ascontiguousarray(v) for k, v in arrays.items()}, metadata=header))
    return path


def test_schema_1_traces_load_without_predictions_and_a_consumer_says_so(tiny, tiny_prompts, tmp_path):
    rec = decode_prompts(tiny, tiny_prompts[:1], 1, RunSpec(decode=DC), record=True, prompt_ids=["a"]).trace
    base = {
        a: getattr(rec, a)
        for a in ("forward", "layer", "block", "block_step", "kind", "offsets", "experts", "counts")
    }
    old = Trace.load(write_raw(tmp_path / "v1.safetensors", base, "1", rec.meta))
    assert not old.has_predictions and old.equal_routing(rec)
    assert all(d.predicted is None for d in old.demands)
    with pytest.raises(TraceError, match=r"cross_layer needs the cross-layer predictions.*re-record it"):
        old.require_predictions("cross_layer")
    rec.require_predictions("cross_layer")  # a schema-2 recording has them

    preds = {a: getattr(rec, a) for a in PRED_ARRAYS}
    with pytest.raises(TraceError, match="prediction arrays .* in a schema-1 trace"):
        Trace.load(write_raw(tmp_path / "bad1.safetensors", {**base, **preds}, "1", rec.meta))
    with pytest.raises(TraceError, match="expected all of"):
        Trace.load(
            write_raw(
                tmp_path / "bad2.safetensors", {**base, "pred_offsets": rec.pred_offsets}, "2", rec.meta
            )
        )
    wrong = {**preds, "pred_experts": np.full_like(rec.pred_experts, 300)}
    with pytest.raises(TraceError, match="predicted expert ids outside"):
        Trace.load(write_raw(tmp_path / "bad3.safetensors", {**base, **wrong}, "2", rec.meta))
    short = {**preds, "pred_offsets": rec.pred_offsets[:-1]}
    with pytest.raises(TraceError, match="pred_offsets do not index"):
        Trace.load(write_raw(tmp_path / "bad4.safetensors", {**base, **short}, "2", rec.meta))
    with pytest.raises(TraceError, match="reads schemas 1, 2"):
        Trace.load(write_raw(tmp_path / "v3.safetensors", base, "3", rec.meta))


def test_cli_trace_records_the_predictions(tmp_path, capsys):
    out = tmp_path / "t.safetensors"
    assert main(["trace", "--task", "gsm8k", "--n", "1", "--gen-length", "32", "--out", str(out)]) == 0
    t = Trace.load(out)
    assert t.has_predictions
    last = t.meta["moe_layers"][-1]
    assert all((d.predicted is None) == (d.layer == last) for d in t.demands)


def test_a_policy_that_needs_predictions_refuses_a_trace_without_them(
    tiny, tiny_prompts, tmp_path, monkeypatch
):
    from artifact.offload.replay.sim import replay

    rec = decode_prompts(tiny, tiny_prompts[:1], 1, RunSpec(decode=DC), record=True, prompt_ids=["a"]).trace
    assert rec.has_predictions  # recording turns the prediction on
    assert replay(rec, "cross_layer", 20)["speculative_transfers"] > 0
    base = {
        a: getattr(rec, a)
        for a in ("forward", "layer", "block", "block_step", "kind", "offsets", "experts", "counts")
    }
    old = Trace.load(write_raw(tmp_path / "v1.safetensors", base, "1", rec.meta))
    with pytest.raises(TraceError, match="policy 'cross_layer' needs the cross-layer predictions"):
        replay(old, "cross_layer", 20)
