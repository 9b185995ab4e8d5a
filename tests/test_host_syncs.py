"""One host sync per MoE layer: a dispatch-mode counter (artifact.model.syncs.SyncCounter) counts the host
reads of device data inside every MoE layer's forward, offloaded (every engine policy's path through the
link and the cache) and resident, with and without routed-row selection. On the CPU nothing syncs, but the
counter sees the same calls a CUDA run would wait for (aten._local_scalar_dense, data-sized ops, copies to
the host, tolist)."""

from __future__ import annotations

import pytest
import torch

from artifact.model.capture import Linter, LintError
from artifact.model.llada2 import MoE
from artifact.model.options import ForwardOptions
from artifact.model.syncs import UPLOADS, SyncCounter
from artifact.offload.backend.engine import offload
from artifact.offload.links.link_factory import make_link
from artifact.offload.policy.policies import make_policy


def count_per_moe_layer(model, *calls):
    """Run model(*args, **kw) for each (args, kw) in calls under a SyncCounter keyed by MoE layer."""
    layers = [m for m in model.modules() if isinstance(m, MoE)]
    counter = SyncCounter()
    hooks = [
        m.register_forward_pre_hook(lambda mod, args: setattr(counter, "key", mod.layer)) for m in layers
    ]
    hooks += [m.register_forward_hook(lambda mod, args, out: setattr(counter, "key", None)) for m in layers]
    try:
        with counter:
            for args, kw in calls:
                model(*args, **kw)
    finally:
        for h in hooks:
            h.remove()
    return counter, len(layers) * len(calls)


def without_uploads(kinds) -> dict:
    return {k: n for k, n in kinds.items() if k not in UPLOADS}


def inputs(cfg, batch=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(8, cfg.vocab_size - 8, (batch, cfg.block_length), generator=g)  # (B, 32)
    pos = torch.arange(cfg.block_length).expand(batch, -1)
    rows = torch.ones(batch, cfg.block_length, dtype=torch.bool)
    rows[1] = False  # a finished row: not routed
    return ids, pos, rows


def test_the_counter_sees_what_would_sync_on_cuda():
    x = torch.arange(6)
    with SyncCounter() as c:
        x.tolist()
        int(x[2])
        torch.bincount(x)
        x.nonzero()
        x + 1  # no host read
    assert c.total == 4 and c.kinds == {"tolist": 1, "_local_scalar_dense": 1, "bincount": 1, "nonzero": 1}


def test_the_counter_sees_host_data_reaching_a_tensor_unless_staged_in_pinned_memory():
    with SyncCounter() as c:
        torch.tensor([1, 2, 3])
        torch.as_tensor([4.0])
        torch.as_tensor(torch.arange(3))  # a tensor: no host data
        torch.zeros(3)  # a factory: no host data
    assert c.kinds == {"tensor from host data": 2} and c.uploads == 2 and c.reads == 0, c.kinds
    if torch.cuda.is_available():
        with SyncCounter() as c:
            torch.tensor([1, 2], pin_memory=True).to("cuda", non_blocking=True)  # staged: not blocking
            torch.ones(2).to("cuda")  # pageable, blocking
        assert c.kinds == {"blocking copy to device": 1}, c.kinds


@pytest.mark.parametrize("policy", ["demand", "last_step", "interval_refresh", "cross_layer"])
@pytest.mark.parametrize("capacity", [4, 12])
def test_one_host_sync_per_moe_layer_on_the_offloaded_path(tiny, policy, capacity):
    cfg = tiny.cfg
    ids, pos, rows = inputs(cfg)
    pol = make_policy(policy, len(cfg.moe_layers), cfg.num_experts, engine=True)
    engine = offload(tiny.model, tiny.experts, capacity, pol, make_link("emulated", bandwidth_gbps=1000.0))
    # cross_layer: the prediction rides
    opts = ForwardOptions(predict_next=pol.needs_prediction, backend=engine)
    c, n_layers = count_per_moe_layer(
        tiny.model,
        ((ids, pos), {"options": opts}),
        ((ids, pos), {"options": opts}),
        ((ids, pos), {"rows": rows, "options": opts}),
    )
    reads = without_uploads(c.kinds)
    assert reads == {"tolist": n_layers, "nonzero": 1}, c.kinds  # 3 forwards: one read per MoE layer each
    assert c.by_key[None] == 1  # the routed rows: once per forward, outside the layers
    # graphs "off" builds each group's index tensors from host lists (staged in pinned memory on CUDA):
    # the counter sees them on the CPU, which is what graphs "on" removes (tests/test_segments.py)
    assert c.kinds["tensor from host data"] >= n_layers


def test_one_host_sync_per_moe_layer_resident(tiny):
    ids, pos, rows = inputs(tiny.cfg, seed=1)
    c, n_layers = count_per_moe_layer(tiny.model, ((ids, pos), {}), ((ids, pos), {"rows": rows}))
    assert without_uploads(c.kinds) == {"tolist": n_layers, "nonzero": 1}, c.kinds  # 2 forwards
    assert c.by_key[None] == 1


def test_router_weight_is_cast_once_and_recast_when_it_changes():
    import dataclasses

    from artifact.model.config import get_preset
    from artifact.model.tiny import random_model

    cfg = dataclasses.replace(get_preset("tiny"), num_hidden_layers=2)
    gate = random_model(cfg, seed=0, dtype="bfloat16", resident=True).model.model.layers[1].mlp.gate
    a = gate.weight_fp32()
    assert a.dtype == torch.float32 and torch.equal(a, gate.weight.float())
    assert gate.weight_fp32() is a  # cached
    with torch.no_grad():
        gate.weight.mul_(2)  # in place: the version moves
    b = gate.weight_fp32()
    assert b is not a and torch.equal(b, gate.weight.float())


HOST_READS = {
    "item": lambda x: x.sum().item(),
    "nonzero": lambda x: x.nonzero(),
    "unique": lambda x: torch.unique(x),
    "bincount": lambda x: x.long().bincount(),
    "masked_select": lambda x: x.masked_select(x > 2),
    "tolist": lambda x: x.tolist(),
    "numpy": lambda x: x.numpy(),
    "tensor of a list": lambda x: torch.tensor([1, 2]),
    "as_tensor of a list": lambda x: torch.as_tensor([1]),
}


@pytest.mark.parametrize("what", HOST_READS)
def test_what_the_counter_counts_once_the_capture_linter_refuses(what):
    """The two watchers read one list of host-read and data-sized ops (artifact/model/op_watch.py)."""
    x = torch.arange(6.0)
    with SyncCounter() as c:
        HOST_READS[what](x)
    assert c.total == 1, c.kinds
    with pytest.raises(LintError, match="cannot be captured"), Linter("test"):
        HOST_READS[what](x)
    with SyncCounter() as c, Linter("test"):  # and neither sees anything in plain arithmetic
        (x * 2 + 1).sum()
    assert c.total == 0
