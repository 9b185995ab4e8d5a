"""`generate`, `trace`, `simulate` and `export-trace`: the engine's commands. generate and trace turn their
flags into a RunSpec (run_spec_from_args: the flags' defaults are RunSpec's), call
artifact.offload.prepare.prepare (every check that needs no weights), load, run and print; simulate and
export-trace replay recorded traces."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from pathlib import Path

import pandas as pd
import torch

from artifact.cli.args import (
    D,
    add_decode_args,
    add_model_args,
    add_policy_knob_args,
    add_policy_module_arg,
    add_threads_arg,
    floats,
    ints,
    policy_knobs,
)
from artifact.errors import SettingError, SpecError
from artifact.model.decode import MAX_BATCH, DecodeConfig
from artifact.model.experts import EXPERT_KERNELS
from artifact.model.options import FORWARD_MODES
from artifact.model.tasks import TASKS
from artifact.offload.links.link import LINKS
from artifact.offload.links.timeline import PRIORITIES
from artifact.offload.policy.eviction import EVICTIONS
from artifact.offload.policy.policies import POLICIES, split_policies
from artifact.offload.prepare import Output, TaskPrompts, prepare
from artifact.offload.replay.export import FORMATS, export
from artifact.offload.replay.sim import (
    BOUNDS,
    COUNTS,
    PHASES,
    capacity_for,
    check_spec,
    phase_columns,
    replay_capacities,
    sweep,
)
from artifact.offload.replay.trace import Trace, mean_working_set
from artifact.offload.runner import decode_prompts
from artifact.offload.spec import RunSpec
from artifact.paths import atomic_write_text, check_writable
from artifact.validate import check_number

# Flags that only mean something for an offloaded run: their RunSpec field (argparse's default is None, so
# "given explicitly" is known after parsing and such a flag without --offload is refused, not ignored).
OFFLOAD_FLAGS = {
    "cache_experts": "capacity",
    "policy": "policy",
    "link": "link",
    "bandwidth_gbps": "link_gbps",
    "latency_us": "latency_us",
    "link_priority": "link_priority",
    "cap_gbps": "cap_gbps",
    "lookahead": "lookahead",
    "tau": "tau",
    "oracle_trace": "oracle_trace",
}
FLAG_OF = {field: "--" + dest.replace("_", "-") for dest, field in OFFLOAD_FLAGS.items()}
FLAG_OF.update({"decode": "--gen-length", "model": "--model", "dtype": "--dtype", "device": "--device"})
RUN = RunSpec()  # the flags' defaults


def add_offload_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--offload", action="store_true", help="experts live in host memory behind a per-layer cache"
    )
    # Defaults are None here: RunSpec's fill in what is not given (run_spec_from_args).
    p.add_argument(
        "--cache-experts", type=int, default=None, help="C: device slots per MoE layer (with --offload)"
    )
    p.add_argument(
        "--policy",
        default=None,
        help=f"one of {sorted(n for n, s in POLICIES.items() if s.engine_ok)}, optionally +eviction, "
        f"one of {sorted(EVICTIONS)} (e.g. last_step+token_lru; default: {RUN.policy})",
    )
    p.add_argument("--link", default=None, help=f"one of {LINKS} (default: {RUN.link})")
    p.add_argument(
        "--bandwidth-gbps",
        type=float,
        default=None,
        help="emulated link bandwidth (default: PCIe 4 scaled to this model's expert size)",
    )
    p.add_argument("--latency-us", type=float, default=None, help=f"default: {RUN.latency_us}")
    p.add_argument(
        "--link-priority",
        choices=PRIORITIES,
        default=None,
        help="fifo: one copy queue in issue order; demand: "
        "speculative copies never delay a demand copy by more than one expert copy (default: "
        f"{RUN.link_priority})",
    )
    p.add_argument("--cap-gbps", type=float, default=None, help="throttle: cap the link's bandwidth")
    p.add_argument("--lookahead", type=int, default=None, help=f"default: {RUN.lookahead}")
    p.add_argument("--tau", type=int, default=None, help=f"default: {RUN.tau}")
    p.add_argument(
        "--oracle-trace", type=Path, default=None, help="trace of an identical earlier run (oracle)"
    )


def run_spec_from_args(a) -> RunSpec:
    """The command line's RunSpec: the decoding and forward flags, and with --offload the offload flags (a
    flag not given takes RunSpec's default). Offload flags without --offload are refused (they would be
    ignored); a bad value is refused naming its flag."""
    given = {f: getattr(a, d, None) for d, f in OFFLOAD_FLAGS.items() if getattr(a, d, None) is not None}
    offload = getattr(a, "offload", False)  # `trace` has no offload flags: its runs are resident
    if not offload and given:
        flags = [FLAG_OF[f] for f in given]
        raise SettingError(
            f"{', '.join(flags)} {'needs' if len(flags) == 1 else 'need'} --offload (without it every expert "
            "is resident and these flags would be ignored)"
        )
    if offload and a.cache_experts is None:
        raise SettingError("--offload needs --cache-experts C (device slots per MoE layer)")
    with flag_errors():
        return RunSpec(
            model=a.model,
            dtype=a.dtype,
            device=a.device,
            decode=DecodeConfig(gen_length=a.gen_length, steps=a.steps, threshold=a.threshold, mode=a.mode),
            forward=a.forward,
            expert_kernel=a.expert_kernel,
            **given,
        )


@contextlib.contextmanager
def flag_errors():
    """A RunSpec field's error (SpecError) as the error of the flag that set it: '<flag>: <message>'."""
    try:
        yield
    except SpecError as e:
        flag = FLAG_OF.get(e.field, "--" + e.field.replace("_", "-"))
        raise SettingError(f"{flag}: {e}") from None


def cmd_generate(a):
    spec = run_spec_from_args(a)
    with flag_errors():
        r = prepare(
            spec,
            texts=tuple(a.prompt),
            raw=a.raw,
            outputs=(Output(a.record_trace, "--record-trace", a.force),),
        )
    loaded = r.load()
    res = decode_prompts(
        loaded,
        r.prompts,
        r.batch_size,
        spec,
        oracle=r.oracle,
        record=bool(a.record_trace),
        prompt_ids=r.prompt_ids,
    )
    res.stats.threads = torch.get_num_threads()
    text = [r.tokenizer.decode(t, skip_special_tokens=True) for t in res.tokens]
    if a.json:
        out = {"tokens": res.tokens, "text": text, "stats": res.stats.as_dict()}
        if res.segments is not None:  # forward segmented: what its programs did (SegmentCounts)
            out["segments"] = dataclasses.asdict(res.segments)
        print(json.dumps(out))
    else:
        for t in text:
            print(t)
        print(_table(res.stats.as_dict()), file=sys.stderr)
    if a.record_trace:  # after the output: a failing write (disk full) loses the file, not the run
        res.trace.save(a.record_trace)


def cmd_trace(a):
    spec = run_spec_from_args(a)
    task = TaskPrompts(a.task, a.n, a.batch_size, a.seed)
    with flag_errors():
        r = prepare(spec, task=task, outputs=(Output(a.out, "--out", a.force),))
    loaded = r.load()
    res = decode_prompts(
        loaded, r.prompts, r.batch_size, spec, record=True, prompt_ids=r.prompt_ids, task=a.task
    )
    res.trace.save(a.out)
    segmented = f", {res.segments.forwards} forwards as segments" if res.segments is not None else ""
    print(
        f"{a.out}: {len(res.trace)} demands, {res.trace.accesses} expert accesses, "
        f"mean working set W = {mean_working_set(res.trace):.1f} experts/layer/step, "
        f"{res.stats.tokens_per_second:.1f} tokens/s, {torch.get_num_threads()} torch threads{segmented}"
    )


def cmd_simulate(a):
    if not a.policies:
        raise SettingError("--policies is empty; give at least one of " + ", ".join([*POLICIES, *BOUNDS]))
    for p in a.policies:
        check_spec(p)  # a policy spec, or the bound `min`
    knobs = policy_knobs(a)
    if a.cache_experts is not None:
        if not a.cache_experts:
            raise SettingError("--cache-experts is empty; give capacities C, e.g. --cache-experts 40")
    else:
        ratios = a.cache_ratios if a.cache_ratios is not None else list(D.cache_ratios)
        if not ratios:
            raise SettingError("--cache-ratios is empty; give ratios C/W, e.g. --cache-ratios 0.5,1")
        for r in ratios:
            check_number("--cache-ratios", r, low=0, low_open=True)
    for flag, values in (
        ("--trace", [str(t.resolve()) for t in a.trace]),
        ("--policies", a.policies),
        ("--cache-ratios", a.cache_ratios or []),
        ("--cache-experts", a.cache_experts or []),
    ):
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:
            raise SettingError(f"{flag} lists {twice} more than once; give each once")
    check_writable(a.csv, "--csv", a.force)
    traces = [Trace.load(t) for t in a.trace]
    if a.cache_experts is not None:
        for t in traces:
            for C in a.cache_experts:
                check_number(
                    f"--cache-experts (trace {t.path})", C, low=1, high=t.meta["num_experts"], integer=True
                )
        df = replay_capacities(traces, a.cache_experts, a.policies, by_phase=a.by_phase, **knobs)
    else:
        df = sweep(
            traces,
            ratios,
            a.policies,
            progress=not a.json,
            by_phase=a.by_phase,
            **knobs,
        )
    if a.csv:  # a CSV holds flat columns: <count>_<phase> beside the totals
        atomic_write_text(a.csv, (phase_columns(df) if a.by_phase else df).to_csv(index=False))
        print(f"wrote {len(df)} rows to {a.csv}", file=sys.stderr)
    if a.json:  # rows keep "by_phase": {"prefill": {...}, "first": {...}, "later": {...}}
        print(df.to_json(orient="records"))
    elif not a.csv:
        cols = ["task", "batch_size", "cache_ratio", "cache_experts", "policy", *COUNTS[1:5], "misses_vs_lru"]
        if a.by_phase:
            print(_phase_table(df, cols[:5], COUNTS[1:5]))
        else:
            print(df[cols].to_string(index=False))


def cmd_export_trace(a):
    check_spec(a.policy)
    if a.policy.strip() in BOUNDS:
        raise SettingError(f"--policy {a.policy!r} is a bound, not a cache: give a policy spec, e.g. demand")
    knobs = policy_knobs(a)
    t = Trace.load(a.trace)
    E = t.meta["num_experts"]
    if a.cache_experts is not None:
        check_number("--cache-experts", a.cache_experts, low=1, high=E, integer=True)
        C = a.cache_experts
    else:
        check_number("--cache-ratio", a.cache_ratio, low=0, low_open=True)
        C = capacity_for(a.cache_ratio, mean_working_set(t), E)
    for layer in t.meta["moe_layers"]:
        check_writable(a.out / f"layer{layer}.{a.format}", "--out", a.force)
    paths = export(t, a.out, a.format, a.policy, C, **knobs)
    print(
        f"wrote {len(paths)} per-layer {a.format} streams ({t.accesses} requests, hits-first feed of "
        f"{a.policy} at C = {C}) to {a.out}/layer<L>.{a.format}"
    )


def _phase_table(df, keys: list[str], counts) -> str:
    """One line per (row, phase) and the row's total: the per-phase table of `simulate --by-phase`."""
    rows = []
    for r in df.to_dict("records"):
        for phase in (*PHASES, "total"):
            got = r if phase == "total" else r["by_phase"][phase]
            rows.append({**{k: r[k] for k in keys}, "phase": phase, **{c: got[c] for c in counts}})
    return pd.DataFrame(rows).to_string(index=False)


def _table(stats: dict) -> str:
    lines = []
    for k, v in stats.items():
        if isinstance(v, dict):  # by_phase: one line per phase
            lines += [
                f"{k + '.' + p:>24}: " + ", ".join(f"{c}={n}" for c, n in d.items()) for p, d in v.items()
            ]
        else:
            lines.append(f"{k:>24}: {v:.4g}" if isinstance(v, float) else f"{k:>24}: {v}")
    return "\n".join(lines)


def add_forward_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--forward",
        choices=FORWARD_MODES,
        default=RUN.forward,
        help="segmented: denoising forwards run as segments between the router syncs, "
        "captured as CUDA graphs on a GPU (eager on the CPU); eager: "
        f"the reference forward (default: {RUN.forward})",
    )
    p.add_argument(
        "--expert-kernel",
        choices=EXPERT_KERNELS,
        default=RUN.expert_kernel,
        help="how a group of experts computes: grouped, one grouped GEMM (torch._grouped_mm where torch has "
        f"one); loop, one call per expert (same results, other time; default: {RUN.expert_kernel})",
    )


def add_cli(sub) -> None:
    """Register `generate`, `trace`, `simulate` and `export-trace`."""
    for register in (_add_generate, _add_trace, _add_simulate, _add_export_trace):
        register(sub)


def _add_generate(sub) -> None:
    g = sub.add_parser("generate", help="decode prompts (resident or offloaded) and print tokens and stats")
    add_model_args(g)
    add_decode_args(g)
    add_offload_args(g)
    add_policy_module_arg(g)
    g.add_argument("--prompt", action="append", required=True, help=f"repeat for a batch (1-{MAX_BATCH})")
    g.add_argument("--raw", action="store_true", help="encode prompts as is, without the chat template")
    g.add_argument("--record-trace", type=Path, default=None)
    g.add_argument("--force", action="store_true", help="replace an existing --record-trace file")
    g.add_argument("--json", action="store_true")
    add_forward_arg(g)
    add_threads_arg(g)
    g.set_defaults(fn=cmd_generate)


def _add_trace(sub) -> None:
    t = sub.add_parser("trace", help="record the routing trace of a task run")
    add_model_args(t)
    add_decode_args(t)
    t.add_argument("--task", required=True, help=f"one of {TASKS}")
    t.add_argument("--n", type=int, default=D.trace_n_prompts, help="prompts")
    t.add_argument("--batch-size", type=int, default=1)
    t.add_argument("--seed", type=int, default=D.seed)
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--force", action="store_true")
    add_forward_arg(t)
    add_threads_arg(t)
    t.set_defaults(fn=cmd_trace)


def _add_simulate(sub) -> None:
    s = sub.add_parser("simulate", help="replay traces through policies and capacities (exact miss counts)")
    s.add_argument("--trace", type=Path, action="append", required=True)
    cap = s.add_mutually_exclusive_group()
    cap.add_argument(
        "--cache-ratios",
        type=floats,
        default=None,
        help=f"C/W per trace (default: {','.join(f'{r:g}' for r in D.cache_ratios)})",
    )
    cap.add_argument(
        "--cache-experts",
        type=ints,
        default=None,
        help="absolute capacities C (slots per MoE layer), e.g. to replay an engine run by hand",
    )
    s.add_argument(
        "--policies",
        type=split_policies,
        default=list(D.sim_policies),
        help="policy specs name[:key=value,...][+eviction[:key=value,...]], comma-separated (e.g. "
        "demand,demand+token_lru,last_step+lrfu:lam=0.25); also the bound min "
        "(relaxed MIN, the floor of any C-slot demand paging; belady is this cache's floor)",
    )
    add_policy_module_arg(s)
    add_policy_knob_args(s)
    s.add_argument(
        "--by-phase",
        action="store_true",
        help="also count per phase (prefill, first = a block's step 0, later): "
        "a by_phase object per JSON row, <count>_<phase> CSV columns, or a per-phase table",
    )
    s.add_argument("--json", action="store_true")
    s.add_argument("--csv", type=Path, default=None)
    s.add_argument("--force", action="store_true", help="replace an existing --csv file")
    add_threads_arg(s)
    s.set_defaults(fn=cmd_simulate)


def _add_export_trace(sub) -> None:
    x = sub.add_parser(
        "export-trace", help="write a trace as per-layer request streams for libCacheSim (hits-first feed)"
    )
    x.add_argument("--trace", type=Path, required=True)
    x.add_argument(
        "--out", type=Path, required=True, help="folder for layer<L>.<format>, one file per MoE layer"
    )
    x.add_argument(
        "--format",
        choices=FORMATS,
        default="oracleGeneral",
        help="oracleGeneral (libCacheSim's binary format) or csv (time,obj_id,layer)",
    )
    x.add_argument(
        "--policy",
        default="demand",
        help="the policy spec whose residency orders each demand: its hits first, then its misses",
    )
    xc = x.add_mutually_exclusive_group()
    xc.add_argument("--cache-experts", type=int, default=None, help="C, slots per MoE layer")
    xc.add_argument("--cache-ratio", type=float, default=1.0, help="C/W (default: 1)")
    add_policy_module_arg(x)
    add_policy_knob_args(x)
    x.add_argument("--force", action="store_true", help="replace existing files")
    x.set_defaults(fn=cmd_export_trace)
