"""RunSpec: everything one run reads, in one frozen object, checked in one place.

A run is made from a profile (Settings.run_spec), from the command line's flags (artifact/cli/engine.py), or
by hand in a script or a test; then it travels whole to the code that uses it:

    profile or flags -> RunSpec -> prepare (checks before the weights) -> decode_prompts / run_stream
                     -> build_engine (policy, link, cache, engine) and forward_options (every forward)

The defaults live here and nowhere else: the profile's Settings reads its run fields' defaults from RunSpec()
(a test keeps them equal), the command line's flags default to them, and the decoder's settings default to
DecodeConfig's (artifact/model/decode.py, whose field names stored traces record).

Validation: RunSpec.check (run by the constructor, so a RunSpec that exists is valid) is the only validator
of these values; the decoding values are checked by DecodeConfig itself, the forward mode and the kernel by
check_forward and check_kernel (artifact/model/options.py), each called from here. A bad value raises a
SpecError naming the field, which the profile reader and the command line turn into their own words (the
key's file, the flag). What needs the model (the capacity against its experts) is `fits`; what needs the
machine (a CUDA device) is checked where the run starts (runner.check_device).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

from artifact.errors import SpecError
from artifact.model.checkpoint import DTYPES
from artifact.model.decode import DecodeConfig
from artifact.model.experts import ExpertBackend
from artifact.model.options import (
    DEFAULT_FORWARD,
    DEFAULT_KERNEL,
    ForwardOptions,
    check_forward,
    check_kernel,
)
from artifact.offload.links.link import LINKS, PCIE_LATENCY_US, emulated_bandwidth_gbps
from artifact.offload.links.link_factory import make_link
from artifact.offload.links.timeline import PRIORITIES
from artifact.offload.policy.policies import POLICIES, check_policy, make_policy
from artifact.validate import check_number

MIN_LINK_GBPS = 1e-4  # 100 KB/s: a 24 MiB LLaDA2.0-flash expert still copies in ~4 minutes
MAX_LATENCY_US = 1e6  # one second of setup per copy (PCIe: ~10 us)
DEVICE_KINDS = ("cpu", "cuda")


@dataclass(frozen=True)
class RunSpec:
    """One run: the model and machine, how it decodes and computes, and (capacity not None) how it offloads.

    Fields named as the profile keys they come from (artifact/experiments/settings.py documents each); the
    ones a profile does not hold: `decode` (built from gen_length, steps, threshold, mode), `capture`,
    `capacity`, `policy` (a profile lists several), `cap_gbps` (the CLI's --cap-gbps), `bandwidth_scale`
    (a bench cell's scale of link_gbps) and `oracle_trace`."""

    model: str | None = (
        "tiny"  # 'tiny' (embedded) or a checkpoint directory; None: not given yet (prepare refuses)
    )
    dtype: str | None = None  # None: float32 for tiny, bfloat16 otherwise (torch_dtype)
    device: str = "cpu"  # cpu | cuda | cuda:N
    decode: DecodeConfig = DecodeConfig()
    forward: str = DEFAULT_FORWARD  # eager | segmented (artifact/model/options.py)
    expert_kernel: str = DEFAULT_KERNEL  # grouped | loop: how a group of experts computes
    # segmented on CUDA: whether a forward may capture a graph. Timed runs keep it on: their warm-up run
    # captures every shape, so the timed repetitions replay graphs and capture nothing mid-measurement
    # (RunResult.segments counts a capture that happens anyway).
    capture: bool = True
    capacity: int | None = None  # C, device slots per MoE layer; None: every expert resident
    policy: str = "demand"  # an engine policy spec (offload/policy/policies.py)
    link: str = "emulated"  # emulated (a modelled PCIe copy engine) | cuda (a copy stream)
    link_gbps: float | None = None  # nominal bandwidth; None: emulated -> PCIe 4 scaled, cuda -> hardware
    cap_gbps: float | None = None  # throttle: cap the link's bandwidth further
    latency_us: float = PCIE_LATENCY_US  # per-copy setup cost of the emulated link
    link_priority: str = "fifo"  # fifo | demand: speculative copies wait while a demand copy is queued
    lookahead: int = 1  # last_step / oracle: prefetch this many MoE layers ahead
    tau: int = 4  # interval_refresh: refresh every tau denoising steps
    bandwidth_scale: float = 1.0  # the link runs at this times its nominal bandwidth (cuda: <= 1, a cap)
    oracle_trace: Path | None = None  # a trace of an identical earlier run (policies that need one)

    def __post_init__(self):
        self.check()

    def check(self) -> None:
        """Every value in its domain, or a SpecError naming the field (no model or machine needed)."""
        if self.model is not None and (not isinstance(self.model, str) or not self.model):
            raise SpecError("model", f"model must be 'tiny' or a checkpoint directory, got {self.model!r}")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise SpecError("dtype", f"dtype {self.dtype!r} unknown; choose one of {sorted(DTYPES)}")
        if not isinstance(self.device, str) or self.device.split(":")[0] not in DEVICE_KINDS:
            raise SpecError("device", f"unknown device {self.device!r}; expected cpu, cuda or cuda:N")
        try:
            torch.device(self.device)
        except (RuntimeError, TypeError):
            raise SpecError(
                "device", f"unknown device {self.device!r}; expected cpu, cuda or cuda:N"
            ) from None
        if not isinstance(self.decode, DecodeConfig):
            raise SpecError("decode", f"decode must be a DecodeConfig, got {type(self.decode).__name__}")
        _field("forward", check_forward, self.forward)
        _field("expert_kernel", check_kernel, self.expert_kernel)
        if self.forward == "segmented" and self.decode.mode != "cached":  # segments run over the KV cache
            raise SpecError(
                "forward",
                f"forward segmented needs mode cached (mode {self.decode.mode} runs every forward eagerly)",
            )
        if not isinstance(self.capture, bool):
            raise SpecError("capture", f"capture must be true or false, got {self.capture!r}")
        self._check_offload()

    def _check_offload(self) -> None:
        if self.capacity is not None and (
            isinstance(self.capacity, bool) or not isinstance(self.capacity, int)
        ):
            raise SpecError(
                "capacity", f"cache capacity must be an integer number of experts, got {self.capacity!r}"
            )
        if self.capacity is not None and self.capacity < 1:
            raise SpecError(
                "capacity", f"cache capacity must be at least 1 expert per layer, got {self.capacity}"
            )
        kind = _field("policy", check_policy, self.policy)
        if not kind.engine_ok:
            raise SpecError(
                "policy", f"policy {self.policy!r} runs in the simulator only (python -m artifact simulate)"
            )
        if self.link not in LINKS:
            raise SpecError("link", f"unknown link {self.link!r}; choose one of {LINKS}")
        if self.link == "cuda" and torch.device(self.device).type != "cuda":
            raise SpecError(
                "link", f"link cuda computes on the GPU, but device is {self.device!r}; use link emulated"
            )
        if self.link_priority not in PRIORITIES:
            raise SpecError(
                "link_priority", f"unknown link priority {self.link_priority!r}; choose one of {PRIORITIES}"
            )
        # Finite is not enough: at 1e-300 GB/s or 1e300 us one copy takes longer than a sleep can express
        # (OverflowError mid-run). Bounds far beyond any real link keep every copy under a few minutes.
        _field("link_gbps", check_number, "link_gbps", self.link_gbps, low=MIN_LINK_GBPS, allow_none=True)
        _field("cap_gbps", check_number, "cap_gbps", self.cap_gbps, low=MIN_LINK_GBPS, allow_none=True)
        _field("latency_us", check_number, "latency_us", self.latency_us, low=0, high=MAX_LATENCY_US)
        _field("lookahead", check_number, "lookahead", self.lookahead, low=1, integer=True)
        _field("tau", check_number, "tau", self.tau, low=1, integer=True)
        high = 1.0 if self.link == "cuda" else None  # a cuda link cannot run faster than its hardware
        _field(
            "bandwidth_scale",
            check_number,
            "bandwidth_scale",
            self.bandwidth_scale,
            low=0,
            low_open=True,
            high=high,
        )
        if self.oracle_trace is not None and not kind.needs_trace:
            readers = sorted(n for n, c in POLICIES.items() if c.needs_trace and c.engine_ok)
            raise SpecError(
                "oracle_trace",
                f"an oracle trace is read only by {readers}; policy {self.policy!r} would ignore it",
            )

    # --- what the run reads ------------------------------------------------------------------------------
    def replace(self, **changes) -> RunSpec:
        """A copy with `changes` (checked, as every RunSpec is)."""
        return dataclasses.replace(self, **changes)

    @property
    def offloaded(self) -> bool:
        return self.capacity is not None

    @property
    def torch_dtype(self) -> str:
        """dtype, with None resolved: float32 for the tiny model, bfloat16 for a real checkpoint."""
        return self.dtype or ("float32" if self.model == "tiny" else "bfloat16")

    def fits(self, num_experts: int) -> None:
        """The capacity against the model's experts per layer (what the values alone cannot tell)."""
        if self.capacity is not None and self.capacity > num_experts:
            want = f"cache capacity must be an integer in [1, {num_experts}] experts per layer"
            raise SpecError("capacity", f"{want}, got {self.capacity!r}")

    def forward_options(
        self, backend: ExpertBackend | None = None, predict_next: bool = False
    ) -> ForwardOptions:
        """What every forward of the run gets (the one place a run makes them): its mode, capture and kernel,
        with the expert backend and whether demands carry the next layer's prediction."""
        return ForwardOptions(
            self.forward,
            predict_next=predict_next,
            backend=backend,
            capture=self.capture,
            expert_kernel=self.expert_kernel,
        )

    def make_policy(self, num_layers: int, num_experts: int, future=None):
        """The run's policy over `num_layers` MoE layers of `num_experts` experts (`future`: an oracle's)."""
        return make_policy(
            self.policy,
            num_layers,
            num_experts,
            future=future,
            engine=True,
            lookahead=self.lookahead,
            tau=self.tau,
        )

    def link_rates(self, expert_bytes: int) -> tuple[float | None, float | None]:
        """(bandwidth_gbps, cap_gbps) of the run's link. emulated: link_gbps, or PCIe 4 scaled to these
        experts (emulated_bandwidth_gbps), times bandwidth_scale. cuda: the hardware's unpaced rate (None) at
        scale 1; below 1 a cap of scale x link_gbps (the bench fills in the measured pinned-copy rate when
        the profile gives none). cap_gbps caps either further."""
        scale = self.bandwidth_scale
        if self.link == "emulated":
            nominal = self.link_gbps if self.link_gbps is not None else emulated_bandwidth_gbps(expert_bytes)
            return nominal * scale, self.cap_gbps
        caps = [self.cap_gbps] if self.cap_gbps is not None else []
        if scale != 1.0:
            if self.link_gbps is None:
                raise SpecError(
                    "link_gbps", "a cuda link below scale 1 needs link_gbps (the hardware's rate)"
                )
            caps.append(self.link_gbps * scale)
        return None, min(caps) if caps else None

    def link_rate(self, expert_bytes: int) -> float | None:
        """The bandwidth the run is limited to, GB/s (None: the cuda link's unpaced hardware rate)."""
        caps = [c for c in self.link_rates(expert_bytes) if c is not None]
        return min(caps) if caps else None

    def make_link(self, expert_bytes: int, clock=None):
        """The run's link on its device (with `clock`: on a virtual clock), each copy `expert_bytes`."""
        bandwidth, cap = self.link_rates(expert_bytes)
        rates = dict(bandwidth_gbps=bandwidth, cap_gbps=cap, latency_us=self.latency_us)
        return make_link(
            self.link,
            device=self.device,
            expert_bytes=expert_bytes,
            priority=self.link_priority,
            clock=clock,
            **rates,
        )


def _field(name: str, check, *args, **kw):
    """check(*args, **kw), its SettingError raised again as a SpecError of field `name`."""
    try:
        return check(*args, **kw)
    except SpecError:
        raise
    except ValueError as e:
        raise SpecError(name, str(e)) from None
