"""How one forward runs: the options a caller passes down the call (LLaDA2MoE.forward(..., options=...)).

Nothing here is kept on the model: a run makes one ForwardOptions (artifact.offload.runner.RunOptions
.forward_options, the one place a run makes them) and every forward of the run gets it; the decoder passes
each forward's step beside it (LLaDA2MoE.forward(..., step=...)).

  forward        "eager": the reference path, one module call after another (LLaDA2MoE.forward).
                 "segmented": a denoising forward over a prefix KV cache is cut into segments between the
                 router syncs (artifact/model/segments.py); on a CUDA device each segment and expert stage is
                 captured once as a CUDA graph and replayed, on the CPU the same segments run eagerly (under
                 the capture linter). Prefill and the full (uncached) decoding run eagerly in either mode.
  predict_next   each MoE layer's Demand also carries the next MoE layer's predicted demand (Demand.predicted)
  backend        the expert backend of the forward; None: the model's own (LLaDA2MoE.backend)
  capture        segmented on CUDA: whether this forward may capture a graph. A timed or profiled forward
                 passes False: a shape not captured in a warm-up then runs eagerly, counted (Program.eager).
  expert_kernel  how a group of experts computes (EXPERT_KERNELS): "grouped", one grouped GEMM
                 (torch._grouped_mm); "loop", one call per expert, kept to compare the two

The forward mode and the kernel are checked here, and only here (check_forward, check_kernel): RunOptions and
the profile's settings reach them through a ForwardOptions.
"""

from __future__ import annotations

from dataclasses import dataclass

from artifact.errors import SettingError
from artifact.model.experts import EXPERT_KERNELS, ExpertBackend

FORWARD_MODES = ("eager", "segmented")
DEFAULT_FORWARD = "eager"  # the one default: Settings.forward, RunOptions and the CLI read it from here
DEFAULT_KERNEL = EXPERT_KERNELS[0]  # "grouped"


def check_forward(forward: str) -> str:
    """forward, if one of FORWARD_MODES; else a one-line SettingError (a ValueError) naming the choices."""
    if forward not in FORWARD_MODES:
        raise SettingError(f"unknown forward mode {forward!r}; choose one of {FORWARD_MODES}")
    return forward


def check_kernel(kernel: str) -> str:
    """kernel, if one of EXPERT_KERNELS; else a one-line SettingError naming the choices."""
    if kernel not in EXPERT_KERNELS:
        raise SettingError(f"unknown expert_kernel {kernel!r}; choose one of {EXPERT_KERNELS}")
    return kernel


@dataclass(frozen=True)
class ForwardOptions:
    forward: str = DEFAULT_FORWARD
    predict_next: bool = False
    backend: ExpertBackend | None = None
    capture: bool = True
    expert_kernel: str = DEFAULT_KERNEL

    def __post_init__(self):
        check_forward(self.forward)
        check_kernel(self.expert_kernel)


EAGER = ForwardOptions()
