"""Simulator speed: expert accesses replayed per second for every policy and every eviction policy
(`demand+<eviction>`), against `reference_lru`, a plain numpy per-demand LRU with the same semantics as
the `demand` policy, and against libCacheSim's C loop (`process_trace`, its LRU) on the same trace exported
with the hits-first feed, all run in the same process on the same trace (a recorded tiny-model trace tiled
to at least 1M accesses); `vs_libcachesim` is each row's rate over libCacheSim's. Printed, not asserted;
the reference's counts are checked against the `demand` replay, so the comparison is like for like.

    .venv/bin/python benchmarks/replay_speed.py [--json] [--accesses N] [--ratio 1.0] [--traces T ...]

--json prints one object per line: {"policy": name, "accesses_per_s": x, "time_vs_demand": t,
"within_2x_of_demand": t <= 2 (the issue's bound, for every policy and eviction), ...}. Without it, a table
and the time of a 5-ratio sweep over every policy on --traces (default: the recorded trace).
"""

import argparse
import functools
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from artifact.cli import OneLineParser
from artifact.cli.args import refused_in_one_line
from artifact.errors import SettingError
from artifact.model.checkpoint import load_checkpoint
from artifact.model.decode import DecodeConfig
from artifact.model.tasks import prompts
from artifact.model.tiny import tiny_checkpoint
from artifact.offload.policy.eviction import EVICTIONS
from artifact.offload.policy.policies import POLICIES
from artifact.offload.replay.sim import capacity_for, replay, sweep
from artifact.offload.replay.trace import ARRAYS, Trace, mean_working_set
from artifact.offload.runner import decode_prompts
from artifact.offload.spec import RunSpec
from artifact.validate import check_number


def tiled(t: Trace, times: int) -> Trace:
    """The same routing repeated: forward indices shifted so the stream stays ordered."""
    span = int(t.forward.max()) + 1
    lengths = np.diff(t.offsets)
    arrays = dict(
        forward=np.concatenate([t.forward + i * span for i in range(times)]).astype(np.int32),
        layer=np.tile(t.layer, times),
        block=np.tile(t.block, times),
        block_step=np.tile(t.block_step, times),
        kind=np.tile(t.kind, times),
        experts=np.tile(t.experts, times),
        counts=np.tile(t.counts, times),
        offsets=np.concatenate([[0], np.cumsum(np.tile(lengths, times))]).astype(np.int64),
    )
    out = Trace(meta=dict(t.meta), **arrays)
    out.validate()
    return out


def with_next_layer_predictions(t: Trace) -> Trace:
    """A copy whose demands carry a cross-layer prediction (for timing cross_layer only): the next MoE
    layer's true demand at the same forward, None at the last MoE layer."""
    pos, same = t.positions, np.r_[t.forward[1:] == t.forward[:-1], False]
    pred = [
        (t.expert_arrays[n + 1], t.count_arrays[n + 1]) if same[n] and pos[n + 1] == pos[n] + 1 else None
        for n in range(len(t))
    ]
    lens = [0 if q is None else len(q[0]) for q in pred]
    given = [q for q in pred if q is not None]
    return Trace(
        meta=dict(t.meta),
        **{a: getattr(t, a) for a in ARRAYS},
        pred_offsets=np.concatenate([[0], np.cumsum(lens)]).astype(np.int64),
        pred_experts=np.concatenate([e for e, _ in given]).astype(np.int16),
        pred_counts=np.concatenate([c for _, c in given]).astype(np.int32),
    )


def stream(t: Trace) -> list[tuple[int, np.ndarray]]:
    """(MoE position, demanded experts) per demand, decoded once outside the timed region."""
    index = {layer: i for i, layer in enumerate(t.meta["moe_layers"])}
    experts = np.split(t.experts.astype(np.int64), t.offsets[1:-1])
    return [(index[int(layer)], e) for layer, e in zip(t.layer, experts)]


def reference_lru(demands: list[tuple[int, np.ndarray]], num_layers: int, num_experts: int, capacity: int):
    """Per-layer LRU over the demand stream, written plainly with numpy; the `demand` policy's rules:
    a hit refreshes recency; misses evict the least recently used non-demanded residents; a demand
    larger than C keeps its last C experts in (hits, then misses) order. Returns (hits, misses)."""
    L, E, C = num_layers, num_experts, capacity
    resident = np.zeros((L, E), dtype=bool)
    stamp = np.zeros((L, E), dtype=np.int64)
    filled = [0] * L
    never = np.iinfo(np.int64).max
    clock = hits = misses = 0
    for i, e in demands:
        res, st = resident[i], stamp[i]
        hit = res[e]
        n = len(e)
        m = n - int(np.count_nonzero(hit))
        hits += n - m
        misses += m
        order = np.concatenate((e[hit], e[~hit])) if m else e  # recency: hits, then misses
        if n > C:
            res[:] = False
            res[order[-C:]] = True
            filled[i] = C
        elif m:
            need = filled[i] + m - C
            if need > 0:
                age = np.where(res, st, never)
                age[e] = never
                res[np.argpartition(age, need - 1)[:need]] = False
            res[order[-m:]] = True
            filled[i] = min(C, filled[i] + m)
        st[order] = np.arange(clock, clock + n)
        clock += n
    return hits, misses


def libcachesim_lru(trace: Trace, capacity: int, folder: str):
    """libCacheSim's C loop (`process_trace`) running its LRU over the trace exported as per-layer
    oracleGeneral streams with the hits-first feed (artifact.offload.replay.export), one cache per layer, as
    libCacheSim users would run it. Returns a job for best_of (its result: the misses) or None when
    libcachesim is not installed."""
    try:
        import libcachesim as lcs
    except ImportError:
        return None
    from artifact.offload.replay.export import export

    paths = [str(p) for p in export(trace, folder, "oracleGeneral", "demand", capacity)]
    sizes = [Path(p).stat().st_size // 24 for p in paths]

    def job():
        misses = 0
        for p, n in zip(paths, sizes):
            ratio, _ = lcs.LRU(capacity).process_trace(lcs.TraceReader(p, lcs.TraceType.ORACLE_GENERAL_TRACE))
            misses += round(ratio * n)
        return misses

    return job


def best_of(jobs: dict, rounds: int) -> dict:
    """Each job's best time over `rounds` rounds, the jobs taking turns within a round, so that a
    change in the load of a shared machine reaches every job alike: name -> (seconds, result)."""
    best = {name: (float("inf"), None) for name in jobs}
    for _ in range(rounds):
        for name, fn in jobs.items():
            t0 = time.perf_counter()
            out = fn()
            s = time.perf_counter() - t0
            if s < best[name][0]:
                best[name] = (s, out)
    return best


def parse_args(argv=None):
    """The flags, every value checked (refused in one line, exit 2) before anything is measured."""
    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", nargs="*", default=[])
    ap.add_argument("--accesses", type=int, default=1_000_000)
    ap.add_argument("--ratio", type=float, default=1.0, help="C/W of the timed replays")
    ap.add_argument("--repeat", type=int, default=3, help="rounds; each policy's best round counts")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    with refused_in_one_line(ap):  # every value, before anything is measured
        check_number("--accesses", a.accesses, low=1, integer=True)
        check_number("--ratio", a.ratio, low=0, low_open=True)
        check_number("--repeat", a.repeat, low=1, integer=True)
        for p in a.traces:  # loaded after the timings: a typo would cost them
            if not Path(p).is_file():
                raise SettingError(f"--traces: {p}: no such file")
    return a


def recorded_trace() -> Trace:
    """The tiny model's routing trace of 4 gsm8k prompts decoded together (gen_length 64)."""
    loaded = load_checkpoint(tiny_checkpoint())
    ids, ps = prompts(loaded.tokenizer, "gsm8k", 4, seed=0, max_prompt_tokens=64)
    return decode_prompts(
        loaded, ps, 4, RunSpec(decode=DecodeConfig(gen_length=64)), record=True, prompt_ids=ids, task="gsm8k"
    ).trace


def timed_jobs(big: Trace, C: int, folder: str) -> dict:
    """The jobs best_of times on the trace at capacity C, by name: reference_lru, libcachesim_lru (when
    libcachesim is installed; its exported streams under `folder`), every policy (a policy that needs a
    prediction on the trace with next-layer predictions) and demand+<eviction>. The streams are decoded
    first, untimed."""
    E = big.meta["num_experts"]
    replay(big, "demand", E)  # decode the stream once, untimed
    predicted = with_next_layer_predictions(big)
    replay(predicted, "demand", E)
    demands = stream(big)
    L = len(big.meta["moe_layers"])
    jobs = {"reference_lru": lambda: reference_lru(demands, L, E, C)}
    lcs_job = libcachesim_lru(big, C, folder)
    if lcs_job is not None:
        jobs["libcachesim_lru"] = lcs_job
    for p in [*POLICIES, *(f"demand+{e}" for e in EVICTIONS if e != "lru")]:
        name = p.partition("+")[0]
        jobs[p] = functools.partial(replay, predicted if POLICIES[name].needs_prediction else big, p, C)
    return jobs


def rows_of(best: dict, accesses: int) -> tuple[list[dict], dict | None]:
    """The rows of best_of's timings (reference_lru first, then the replays) and libCacheSim's row apart
    (None when it did not run); reference_lru and libCacheSim taken out of `best`. Exits when either's
    counts differ from the demand replay's (not the same semantics)."""
    lcs_row = None
    if "libcachesim_lru" in best:
        s, lcs_misses = best.pop("libcachesim_lru")
        lcs_row = {
            "policy": "libcachesim_lru (process_trace)",
            "accesses_per_s": accesses / s,
            "seconds": s,
            "demand_misses": lcs_misses,
        }
    s, (hits, misses) = best.pop("reference_lru")
    rows = [
        {"policy": "reference_lru", "accesses_per_s": accesses / s, "seconds": s, "demand_misses": misses}
    ]
    for p, (s, r) in best.items():
        rows.append(
            {
                "policy": p,
                "accesses_per_s": accesses / s,
                "seconds": s,
                "demand_misses": r["demand_misses"],
            }
        )
    lru = best["demand"][1]
    if (lru["demand_hits"], lru["demand_misses"]) != (hits, misses):
        raise SystemExit(
            f"reference_lru counts ({hits}, {misses}) differ from the demand replay's "
            f"({lru['demand_hits']}, {lru['demand_misses']}): not the same semantics"
        )
    if lcs_row is not None and lcs_row["demand_misses"] != lru["demand_misses"]:
        raise SystemExit(
            f"libCacheSim's LRU misses ({lcs_row['demand_misses']}) differ from the demand "
            f"replay's ({lru['demand_misses']}): not the same semantics"
        )
    return rows, lcs_row


def compared(rows: list[dict], lcs_row: dict | None, replays: dict, **fields) -> list[dict]:
    """The rows with libCacheSim's second when it ran, each with its rate against reference_lru's (the
    first row), its time against the demand replay's (the second, the first policy), `fields`,
    within_2x_of_demand for the replays (`replays`: their names) and vs_libcachesim when it ran."""
    ref, lru_rate = rows[0]["accesses_per_s"], rows[1]["accesses_per_s"]
    if lcs_row is not None:
        rows.insert(1, lcs_row)
    for r in rows:
        r.update(
            vs_reference=r["accesses_per_s"] / ref, time_vs_demand=lru_rate / r["accesses_per_s"], **fields
        )
        if r["policy"] in replays:  # the bound: every policy within 2x demand's time
            r["within_2x_of_demand"] = r["time_vs_demand"] <= 2.0
        if lcs_row is not None:
            r["vs_libcachesim"] = r["accesses_per_s"] / lcs_row["accesses_per_s"]
    return rows


def print_table(rows: list[dict], big: Trace, W: float, C: int, ratio: float) -> None:
    print(f"trace: {big.accesses:,} accesses, {len(big):,} demands, W = {W:.1f}, C = {C} (C/W = {ratio})")
    for r in rows:
        print(
            f"  {r['policy']:>24}: {r['accesses_per_s']:>12,.0f} accesses/s ({r['seconds']:.2f} s, "
            f"{r['vs_reference']:.2f}x reference, {r['time_vs_demand']:.2f}x demand's time"
            f"{'' if r.get('within_2x_of_demand', True) else ', NOT within 2x'}), "
            f"misses {r['demand_misses']:,}"
        )


def print_sweep(traces: list[Trace]) -> None:
    """The time of a 5-ratio sweep over every policy that needs no prediction, on `traces`."""
    t0 = time.perf_counter()
    names = [p for p, c in POLICIES.items() if not c.needs_prediction]
    df = sweep(traces, [0.43, 0.83, 1.0, 1.3, 1.73], names)
    print(
        f"sweep: {len(traces)} traces x 5 ratios x {len(names)} policies = {len(df)} replays, "
        f"{sum(t.accesses for t in traces) * 25:,} accesses in {time.perf_counter() - t0:.1f} s"
    )


def main(argv=None):
    a = parse_args(argv)
    torch.set_num_threads(1)
    base = recorded_trace()
    big = tiled(base, -(-a.accesses // base.accesses))
    W = mean_working_set(big)
    C = capacity_for(a.ratio, W, big.meta["num_experts"])
    folder = tempfile.mkdtemp(prefix="replay-speed-")
    best = best_of(timed_jobs(big, C, folder), a.repeat)
    shutil.rmtree(folder, ignore_errors=True)
    rows, lcs_row = rows_of(best, big.accesses)
    rows = compared(rows, lcs_row, best, accesses=big.accesses, cache_experts=C, cache_ratio=a.ratio)
    if a.json:
        for r in rows:
            print(json.dumps(r))
        return
    print_table(rows, big, W, C, a.ratio)
    print_sweep([Trace.load(p) for p in a.traces] or [base])


if __name__ == "__main__":
    main()
