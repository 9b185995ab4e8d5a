"""Link priority on the tiny model (printed, not asserted): demand loading against last_step, each under
the fifo and the demand-priority link, across C/W, on the emulated link (PCIe 4 scaled to the tiny
experts).

Default: virtual time. The real engine, cache, policy and emulated link run, but on a virtual clock
that advances by a fixed compute model (per layer, per expert, per routed token; fitted once from a
timed resident run and printed) and by the link's waits. Every number is then a deterministic function
of the routing, the policy and the priority, so the comparison is exact and immune to a busy machine;
what it does not show is how real compute time varies. `--wall`: real clock, R repetitions per
(policy, priority), order reversed on odd repetitions, medians (noisy on a shared machine).
Counts (misses, transfers) are exact and the same under both priorities.

    .venv/bin/python benchmarks/link_priority.py [--batch 1] [--n 2] [--ratios 0.43,0.83,1,1.73] [--wall
    --reps 3]

A bad flag or value is refused in one line naming it, exit 2, before anything runs.
"""

import statistics
import time

import numpy as np
import torch

from artifact.cli import OneLineParser
from artifact.cli.args import add_run_spec_args, floats, positive_floats, refused_in_one_line, run_spec_of
from artifact.errors import SettingError
from artifact.model.checkpoint import load_checkpoint
from artifact.model.decode import MAX_BATCH, DecodeConfig, generate
from artifact.model.tasks import load_task, prompts
from artifact.model.tiny import tiny_checkpoint
from artifact.offload.backend.engine import install, offload
from artifact.offload.links.link import EmulatedLink, emulated_bandwidth_gbps, scaled_chunk_bytes
from artifact.offload.links.timeline import ManualClock
from artifact.offload.replay.sim import capacity_for
from artifact.offload.replay.trace import mean_working_set
from artifact.offload.runner import decode_prompts
from artifact.validate import check_number

CONFIGS = [(p, q) for p in ("demand", "last_step") for q in ("fifo", "demand")]


VirtualClock = ManualClock  # virtual time: the clock moves only when slept on


class Timed:
    """Expert backend wrapper (the model's ExpertBackend: groups of experts): after each group the caller
    computed, advance the virtual clock by the compute model, per expert and per routed token of the group
    (without a clock: measure the caller's real compute time of each group, for the fit)."""

    def __init__(self, inner, clock=None, per_expert=0.0, per_token=0.0):
        self.inner, self.clock = inner, clock
        self.per_expert, self.per_token = per_expert, per_token
        self.samples: list[tuple[int, int, float]] = []  # per group: (experts, routed tokens, seconds)

    def groups(self, demand):
        counts = dict(zip(demand.experts, demand.counts, strict=True))
        for group in self.inner.groups(demand):
            t0 = time.perf_counter()
            yield group  # the model computes this group before asking for the next
            seconds = time.perf_counter() - t0
            experts, tokens = len(group.experts), sum(counts[e] for e in group.experts)
            if self.clock is None:
                self.samples.append((experts, tokens, seconds))
            else:
                self.clock.t += self.per_expert * experts + self.per_token * tokens


def fit_compute(loaded, ps, batch, run):
    """(per layer, per expert, per token) seconds from one timed resident run of RunSpec `run`."""
    model = loaded.model
    dc = run.decode
    decode_prompts(loaded, ps[:1], 1, run)  # makes the resident backend, warms up
    timer = Timed(model.backend)
    saved = install(model, timer)
    demands = []
    try:
        with model.listening(demands.append):
            t0 = time.perf_counter()
            for i in range(0, len(ps), batch):
                generate(model, ps[i : i + batch], dc, options=run.forward_options())
            total = time.perf_counter() - t0
    finally:
        install(model, saved)
    g, n, t = np.array(timer.samples, dtype=float).T
    # a group's time: per_expert x its experts + per_token x its routed tokens (least squares, no intercept)
    (per_expert, per_token), *_ = np.linalg.lstsq(np.c_[g, n], t, rcond=None)
    per_layer = (total - t.sum()) / len(demands)
    return per_layer, max(per_expert, 0.0), max(per_token, 0.0)


def run_virtual(loaded, ps, batch, spec, costs, chunk_bytes=None):
    """RunSpec `spec` (its capacity, policy, link priority, lookahead, tau, forward mode and kernel) on a
    virtual clock: the emulated link timed by it, compute charged by the fitted `costs`."""
    cfg, dc, prio = loaded.cfg, spec.decode, spec.link_priority
    per_layer, per_expert, per_token = costs
    expert_bytes = cfg.expert_params * loaded.experts.element_size()
    vc = VirtualClock()
    link = EmulatedLink(
        emulated_bandwidth_gbps(expert_bytes),
        clock=vc,
        sleep=vc.sleep,
        priority=prio,
        chunk_bytes=(chunk_bytes or scaled_chunk_bytes(expert_bytes)) if prio == "demand" else None,
    )
    pol = spec.make_policy(len(cfg.moe_layers), cfg.num_experts)
    model = loaded.model
    engine = offload(model, loaded.experts, spec.capacity, pol, link)
    saved = install(model, Timed(engine, vc, per_expert, per_token))
    tokens = []
    try:
        with model.listening(lambda d: setattr(vc, "t", vc.t + per_layer)):  # attention etc. before routing
            for i in range(0, len(ps), batch):
                tokens += generate(model, ps[i : i + batch], dc, options=spec.forward_options()).tokens
        stats = engine.finish()
    finally:
        install(model, saved)
    n = sum(len(t) for t in tokens)
    return tokens, {**stats, "tokens_per_second": n / vc.t, "seconds": vc.t}


def parse_args(argv=None):
    """The flags, every value checked (refused in one line, exit 2) before the checkpoint is loaded: the
    namespace and the run's RunSpec (its decoding and run options)."""
    ap = OneLineParser(description=__doc__)
    ap.add_argument("--wall", action="store_true", help="real clock instead of virtual time")
    ap.add_argument("--reps", type=int, default=3, help="--wall: repetitions")
    ap.add_argument("--batch", type=int, default=1, help=f"prompts decoded together (1-{MAX_BATCH})")
    ap.add_argument("--n", type=int, default=2, help="prompts (gsm8k)")
    ap.add_argument("--gen-length", type=int, default=32)
    ap.add_argument("--ratios", type=floats, default=[0.43, 0.83, 1, 1.73], help="C/W ratios")
    ap.add_argument(
        "--costs",
        type=floats,
        default=None,
        help="virtual time: compute model 'layer,expert,token' in us "
        "(default: fitted from a timed resident run); pin it to compare two runs of this script",
    )
    ap.add_argument(
        "--chunk-bytes",
        type=int,
        default=None,
        help="demand priority: speculative chunk size (default: scaled_chunk_bytes, a sixth of an expert)",
    )
    add_run_spec_args(ap, sweeps=("link_priority",))  # the link priority: both, per configuration
    a = ap.parse_args(argv)
    with refused_in_one_line(ap):  # every value, before the checkpoint is loaded
        check_number("--reps", a.reps, low=1, integer=True)
        check_number("--batch", a.batch, low=1, high=MAX_BATCH, integer=True)
        check_number("--n", a.n, low=1, high=len(load_task("gsm8k")), integer=True)
        positive_floats("--ratios", a.ratios)
        if a.costs is not None and len(a.costs) != 3:
            raise SettingError(f"--costs: expected three numbers 'layer,expert,token' (us), got {a.costs}")
        for c in a.costs or ():
            check_number("--costs", c, low=0)
        check_number("--chunk-bytes", a.chunk_bytes, low=1, integer=True, allow_none=True)
        options = run_spec_of(a, decode=DecodeConfig(gen_length=a.gen_length))
    return a, options


def measure(a, loaded, ps, options, base, C: int, costs) -> dict:
    """(policy, priority) -> the stats of its runs at capacity C: one run each on the virtual clock
    (compute charged by `costs`), or a.reps under --wall, the order reversed on odd repetitions. Every
    run's tokens must equal the resident run's (`base`)."""
    rows = {c: [] for c in CONFIGS}
    for rep in range(a.reps if a.wall else 1):
        for policy, prio in CONFIGS if rep % 2 == 0 else CONFIGS[::-1]:
            if a.wall:
                spec = options.replace(capacity=C, policy=policy, link_priority=prio)
                r = decode_prompts(loaded, ps, a.batch, spec)
                tokens, stats = r.tokens, r.stats.as_dict()
            else:
                spec = options.replace(capacity=C, policy=policy, link_priority=prio)
                tokens, stats = run_virtual(loaded, ps, a.batch, spec, costs, a.chunk_bytes)
            assert tokens == base.tokens, "offloaded tokens differ from resident ones"
            rows[(policy, prio)].append(stats)
    return rows


def print_ratio(ratio: float, C: int, rows: dict) -> None:
    """One C/W's table rows (medians over the repetitions, the counts of the first) and, per priority,
    last_step's tokens/s over demand's."""
    med = {
        c: {
            k: statistics.median(s[k] for s in v)
            for k in ("tokens_per_second", "stall_seconds", "link_busy_seconds")
        }
        for c, v in rows.items()
    }
    for (policy, prio), m in med.items():
        s = rows[(policy, prio)][0]
        print(
            f"{ratio:>5g} {C:>3} {policy:>10} {prio:>8} {m['tokens_per_second']:>7.1f} "
            f"{m['stall_seconds']:>8.3f} {m['link_busy_seconds']:>7.3f} {s['demand_misses']:>6} "
            f"{s['speculative_transfers']:>5}"
        )
    for prio in dict.fromkeys(q for _, q in CONFIGS):
        rel = med[("last_step", prio)]["tokens_per_second"] / med[("demand", prio)]["tokens_per_second"]
        print(f"{'':>5} last_step / demand tokens/s under {prio}: {rel:.3f}")


def main(argv=None):
    a, options = parse_args(argv)
    torch.set_num_threads(1)
    loaded = load_checkpoint(tiny_checkpoint())
    _, ps = prompts(loaded.tokenizer, "gsm8k", a.n, seed=0, max_prompt_tokens=64)
    base = decode_prompts(loaded, ps, a.batch, options, record=True)
    W = mean_working_set(base.trace)
    print(
        f"W = {W:.1f} experts/layer/step; {a.n} prompts, batch {a.batch}, "
        + ("wall clock, %d repetitions" % a.reps if a.wall else "virtual time")
    )
    costs = None  # the compute model of virtual time (--wall: none)
    if not a.wall:
        costs = tuple(c * 1e-6 for c in a.costs) if a.costs else fit_compute(loaded, ps, a.batch, options)
        print(
            "compute model (--costs): %.1f,%.2f,%.3f us per layer, per expert, per routed token"
            % tuple(c * 1e6 for c in costs)
        )
    print(
        f"{'C/W':>5} {'C':>3} {'policy':>10} {'priority':>8} {'tok/s':>7} {'stall s':>8} {'busy s':>7} "
        f"{'misses':>6} {'spec':>5}"
    )
    for ratio in a.ratios:
        C = capacity_for(ratio, W, loaded.cfg.num_experts)
        print_ratio(ratio, C, measure(a, loaded, ps, options, base, C, costs))


if __name__ == "__main__":
    main()
