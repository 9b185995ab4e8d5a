"""How one forward runs: the options a caller passes down the call (LLaDA2MoE.forward(..., options=...)).

Nothing here is kept on the model: a run makes one ForwardOptions and every forward of the run gets it.

  forward       "eager": the reference path, one module call after another (LLaDA2MoE.forward).
                "segmented": a denoising forward over a prefix KV cache is cut into segments between the
                router syncs (artifact/model/segments.py); on a CUDA device each segment and expert stage is
                captured once as a CUDA graph and replayed, on the CPU the same segments run eagerly (under
                the capture linter). Prefill and the full (uncached) mode run eagerly in either mode.
  predict_next  each MoE layer's Demand also carries the next MoE layer's predicted demand (Demand.predicted)
  backend       the expert backend of the forward; None: the model's own (LLaDA2MoE.backend)
  capture       segmented on CUDA: whether this forward may capture a graph. A timed or profiled forward
                passes False: a shape not captured in a warm-up then runs eagerly, counted (Program.eager).
"""
from __future__ import annotations

from dataclasses import dataclass

from artifact.model.experts import ExpertBackend

FORWARD_MODES = ("eager", "segmented")
DEFAULT_FORWARD = "eager"        # the one default: Settings.forward, run() and the CLI read it from here or Settings


def check_forward(forward: str) -> str:
    """forward, if one of FORWARD_MODES; else a one-line ValueError naming the choices."""
    if forward not in FORWARD_MODES:
        raise ValueError(f"unknown forward mode {forward!r}; choose one of {FORWARD_MODES}")
    return forward


@dataclass(frozen=True)
class ForwardOptions:
    forward: str = DEFAULT_FORWARD
    predict_next: bool = False
    backend: ExpertBackend | None = None
    capture: bool = True

    def __post_init__(self):
        check_forward(self.forward)


EAGER = ForwardOptions()
