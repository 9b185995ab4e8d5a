"""A user policy, defined outside the package: prefetch the target layer's most used experts so far.

Run it with `--policy-module examples/top_count_policy.py --policy top_count` (docs/policies.md).
"""

import numpy as np

from artifact.offload.policy.policies import Policy, Prediction, register


@register
class TopCount(Policy):
    """Prefetch the target layer's most used experts so far."""

    name = "top_count"
    summary = "prefetch the most used experts"

    def __init__(self, num_layers, num_experts, lookahead=1):
        super().__init__(num_layers, num_experts)
        self.uses = np.zeros((num_layers, num_experts), dtype=np.int64)
        self.lookahead = lookahead

    def predict(self, i, experts, counts, step):
        self.uses[i, experts] += counts
        target = (i + self.lookahead) % self.num_layers
        return Prediction(target, np.argsort(-self.uses[target], kind="stable"))  # ranked, most wanted first
