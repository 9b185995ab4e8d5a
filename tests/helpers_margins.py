"""Router margins: how far each routed token is from a different top-k choice (tests comparing two paths
whose floats may differ in the last bits, on CUDA: a choice may flip only where the margin is that small)."""

from __future__ import annotations

import torch


@torch.no_grad()
def router_margin(router, x: torch.Tensor) -> float:
    """The smallest, over the tokens x (N, D), of the score gap that decides the router's choice: between the
    topk_group-th and next group, and between the k-th and next allowed expert (biased scores, fp32). inf for
    no token."""
    c = router.cfg
    N = x.shape[0]
    if N == 0:
        return float("inf")
    scores = torch.sigmoid(torch.nn.functional.linear(x.float(), router.weight.float()))
    biased = scores + router.expert_bias
    gaps = []
    group = biased.view(N, c.n_group, -1).topk(2, dim=-1).values.sum(-1)  # (N, n_group)
    if c.topk_group < c.n_group:
        g = group.sort(dim=-1, descending=True).values
        gaps.append(g[:, c.topk_group - 1] - g[:, c.topk_group])
    keep = torch.zeros_like(group).scatter_(1, group.topk(c.topk_group, dim=-1).indices, 1.0)
    allowed = keep.bool().repeat_interleave(c.num_experts // c.n_group, dim=1)
    s = biased.masked_fill(~allowed, float("-inf")).sort(dim=-1, descending=True).values
    k = c.num_experts_per_tok
    if k < int(allowed[0].sum()):
        gaps.append(s[:, k - 1] - s[:, k])
    return float(torch.stack(gaps).min()) if gaps else float("inf")


class RouterMargins:
    """with RouterMargins(model) as m: ... -> m.calls: (layer, margin) per router call, in call order."""

    def __init__(self, model):
        self.model, self.calls, self.hooks = model, [], []

    def __enter__(self) -> RouterMargins:
        for i, layer in enumerate(self.model.model.layers):
            if layer.is_moe:
                self.hooks.append(
                    layer.mlp.gate.register_forward_hook(
                        lambda mod, args, out, i=i: self.calls.append((i, router_margin(mod, args[0])))
                    )
                )
        return self

    def __exit__(self, *exc) -> None:
        for h in self.hooks:
            h.remove()
