"""Simulator speed: expert accesses replayed per second for each policy on a trace of at least 1M
accesses (a recorded tiny-model trace tiled), and the time of a full 5-ratio x 5-policy sweep over a
set of traces. Printed, not asserted.

    .venv/bin/python benchmarks/replay_speed.py [--traces data/traces/cpu/*.safetensors]
"""
import argparse
import time

import numpy as np
import torch

from artifact.model.checkpoint import load_checkpoint
from artifact.model.decode import DecodeConfig
from artifact.model.tasks import prompts
from artifact.offload.policies import POLICIES
from artifact.offload.runner import run
from artifact.offload.sim import capacity_for, replay, sweep
from artifact.offload.trace import Trace, mean_working_set


def tiled(t: Trace, times: int) -> Trace:
    """The same routing repeated: forward indices shifted so the stream stays ordered."""
    span = int(t.forward.max()) + 1
    lengths = np.diff(t.offsets)
    arrays = dict(
        forward=np.concatenate([t.forward + i * span for i in range(times)]).astype(np.int32),
        layer=np.tile(t.layer, times), block=np.tile(t.block, times), block_step=np.tile(t.block_step, times),
        kind=np.tile(t.kind, times), experts=np.tile(t.experts, times), counts=np.tile(t.counts, times),
        offsets=np.concatenate([[0], np.cumsum(np.tile(lengths, times))]).astype(np.int64))
    out = Trace(meta=dict(t.meta), **arrays)
    out.validate()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--traces", nargs="*", default=[])
    ap.add_argument("--accesses", type=int, default=1_000_000)
    a = ap.parse_args()
    torch.set_num_threads(1)
    loaded = load_checkpoint("tiny")
    ids, ps = prompts(loaded.tokenizer, "gsm8k", 4, seed=0, max_prompt_tokens=64)
    base = run(loaded, ps, 4, DecodeConfig(gen_length=64), record=True, prompt_ids=ids, task="gsm8k").trace
    big = tiled(base, -(-a.accesses // base.accesses))
    W = mean_working_set(big)
    C = capacity_for(1.0, W, 256)
    print(f"trace: {big.accesses:,} accesses, {len(big):,} demands, W = {W:.1f}, C = {C} (C/W = 1)")
    big.demands                                                     # decode the stream once, untimed
    for p in POLICIES:
        t0 = time.perf_counter()
        r = replay(big, p, C)
        s = time.perf_counter() - t0
        print(f"  {p:>16}: {big.accesses / s:>10,.0f} accesses/s ({s:.2f} s), misses {r['demand_misses']:,}")
    traces = [Trace.load(p) for p in a.traces] or [base]
    t0 = time.perf_counter()
    df = sweep(traces, [0.43, 0.83, 1.0, 1.3, 1.73], list(POLICIES))
    print(f"sweep: {len(traces)} traces x 5 ratios x {len(POLICIES)} policies = {len(df)} replays, "
          f"{sum(t.accesses for t in traces) * 25:,} accesses in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
