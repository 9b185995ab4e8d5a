"""Engine overhead and overlap on the tiny model (printed, not asserted).

overhead  offloaded with C = 256 once every expert is resident (nothing left to move) vs the
          resident model: seconds per step, as a ratio (target <= 1.10).
overlap   emulated link with C near the working set: measured seconds against the lower bound
          max(compute seconds, link busy seconds) (target <= 1.15). Compute seconds come from the
          resident run of the same prompts (same tokens, same forwards). Demand loading cannot start
          a layer's loads before that layer's router has run, so a second, causal bound is printed
          too: non-MoE time + the sum over (step, layer) of max(that layer's compute, its link time).

  .venv/bin/python benchmarks/offload_overhead.py [--reps 3]

A bad flag or value (--lookahead 0, --batch 9) is refused in one line naming it, exit 2, before anything runs.
"""

import statistics
import time

import torch

from artifact.cli import OneLineParser
from artifact.cli.args import add_run_spec_args, refused_in_one_line, run_spec_of
from artifact.model.checkpoint import load_checkpoint
from artifact.model.decode import MAX_BATCH, DecodeConfig, generate
from artifact.model.tasks import prompts
from artifact.model.tiny import tiny_checkpoint
from artifact.offload.backend.engine import offload
from artifact.offload.replay.sim import capacity_for
from artifact.offload.replay.trace import mean_working_set
from artifact.offload.runner import decode_prompts
from artifact.validate import check_number


def per_step(gen):
    return gen.stats.seconds / gen.stats.forwards


def main(argv=None):
    ap = OneLineParser(description=__doc__)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=2, help=f"prompts decoded together (1-{MAX_BATCH})")
    ap.add_argument("--gen-length", type=int, default=64)
    add_run_spec_args(ap)
    a = ap.parse_args(argv)
    with refused_in_one_line(ap):  # every value, before the checkpoint is loaded
        check_number("--reps", a.reps, low=1, integer=True)
        check_number("--batch", a.batch, low=1, high=MAX_BATCH, integer=True)
        options = run_spec_of(a, decode=DecodeConfig(gen_length=a.gen_length))
    torch.set_num_threads(1)
    loaded = load_checkpoint(tiny_checkpoint())
    _, ps = prompts(loaded.tokenizer, "gsm8k", a.batch, seed=0, max_prompt_tokens=64)
    base = decode_prompts(loaded, ps, a.batch, options, record=True)
    W = mean_working_set(base.trace)

    # overhead: the same batch twice through one engine; the second pass finds every expert resident
    res, off = [], []
    for _ in range(a.reps):
        res.append(per_step(decode_prompts(loaded, ps, a.batch, options).generations[0]))
        second = decode_prompts(loaded, ps + ps, a.batch, options.replace(capacity=256)).generations[1]
        off.append(per_step(second))
    r, o = statistics.median(res), statistics.median(off)
    print(
        f"overhead: resident {r * 1e3:.2f} ms/step, offloaded C=256 warm {o * 1e3:.2f} ms/step, "
        f"ratio {o / r:.3f} (target <= 1.10)"
    )

    # overlap: C near W on the emulated link (PCIe 4 scaled to the tiny experts)
    for ratio in (0.83, 1.0, 1.3):
        C = capacity_for(ratio, W, 256)
        rows = []
        for _ in range(a.reps):
            compute = decode_prompts(loaded, ps, a.batch, options).stats.seconds
            rows.append((compute, *timed_layers(loaded, ps, options.replace(capacity=C))))
        compute, total, busy, stall, causal = sorted(rows, key=lambda r: r[1] / max(r[0], r[2]))[
            len(rows) // 2
        ]
        print(
            f"overlap C/W={ratio} (C={C}, W={W:.1f}): {total:.3f} s; bound max(compute {compute:.3f}, "
            f"link {busy:.3f}) -> ratio {total / max(compute, busy):.3f} (target <= 1.15); "
            f"causal per-layer bound {causal:.3f} -> ratio {total / causal:.3f}; stall {stall:.3f} s"
        )
    loaded.model.backend = None


def timed_layers(loaded, ps, spec):
    """One offloaded run of RunSpec `spec` with every MoE layer's wall time, link time and stall recorded."""
    cfg, dc = loaded.cfg, spec.decode
    link = spec.make_link(cfg.expert_bytes(loaded.experts.element_size()))
    policy = spec.make_policy(len(cfg.moe_layers), cfg.num_experts)
    eng = offload(loaded.model, loaded.experts, spec.capacity, policy, link)
    serve, layers = eng.groups, []

    def timed(d):
        t0, b0, s0 = time.perf_counter(), link.stats.busy_seconds, link.stats.stall_seconds
        yield from serve(d)
        layers.append((time.perf_counter() - t0, link.stats.busy_seconds - b0, link.stats.stall_seconds - s0))

    eng.groups = timed
    t0 = time.perf_counter()
    generate(loaded.model, ps, dc, options=spec.forward_options(backend=eng))
    total = time.perf_counter() - t0
    eng.finish()
    moe = sum(w for w, _, _ in layers)
    causal = (total - moe) + sum(max(w - s, b) for w, b, s in layers)
    return total, link.stats.busy_seconds, link.stats.stall_seconds, causal


if __name__ == "__main__":
    main()
