"""`model`: the performance model (artifact.experiments.studies.performance_model): modelled tokens/s and
seconds per step of every policy x C/W x link priority on routing traces, for a hardware profile and a model
shape, with the physical limit beside each cell."""

from __future__ import annotations

import sys
from pathlib import Path

from artifact.cli.args import (
    D,
    add_policy_knob_args,
    add_policy_module_arg,
    floats,
    ints,
    names,
    policy_knobs,
)
from artifact.errors import SettingError
from artifact.experiments.hardware import HARDWARE, hardware
from artifact.experiments.studies.performance_model import (
    SHAPES,
    TABLE_COLUMNS,
    check_clock,
    check_grid,
    model_grid,
    shape,
    to_json,
)
from artifact.offload.links.timeline import CLOCKS, PRIORITIES
from artifact.offload.policy.policies import split_policies
from artifact.offload.replay.trace import Trace
from artifact.offload.spec import RunSpec
from artifact.paths import atomic_write_text, check_writable

DEFAULT_HARDWARE, DEFAULT_CLOCK = "cpu-emulated", "virtual"
COLUMNS = ["trace", "batch_size", "cache_ratio", "cache_experts", *TABLE_COLUMNS]


def cmd_model(a) -> None:
    hw = hardware(a.hardware, a.gpu_check)  # unknown names and bad reports fail before any replay
    shape(a.shape)
    if a.clock not in CLOCKS:
        raise SettingError(f"--clock: unknown {a.clock!r}; choose one of {CLOCKS}")
    check_clock(a.clock, hw)
    check_grid(a.policies, a.cache_ratios, a.link_priority, a.batch_sizes)
    spec = RunSpec(**policy_knobs(a))  # every cell's run (model_grid sets capacity, policy and priority)
    for flag, values in (
        ("--trace", [str(t.resolve()) for t in a.trace]),
        ("--policies", a.policies),
        ("--cache-ratios", a.cache_ratios),
        ("--link-priority", a.link_priority),
    ):
        twice = sorted({str(v) for v in values if values.count(v) > 1})
        if twice:
            raise SettingError(f"{flag} lists {twice} more than once; give each once")
    check_writable(a.csv, "--csv", a.force)
    traces = [Trace.load(t) for t in a.trace]
    paths = [str(t) for t in a.trace]
    if a.batch_sizes:
        keep = [i for i, t in enumerate(traces) if int(t.meta.get("batch_size") or 1) in a.batch_sizes]
        if not keep:
            raise SettingError(
                f"--batch-sizes {a.batch_sizes}: no --trace was recorded at these batch sizes "
                f"(they hold {sorted({int(t.meta.get('batch_size') or 1) for t in traces})})"
            )
        traces, paths = [traces[i] for i in keep], [paths[i] for i in keep]
    df = model_grid(
        traces,
        hw,
        a.shape,
        spec,
        a.policies,
        a.cache_ratios,
        a.link_priority,
        progress=not a.json,
        names=paths,
        clock=a.clock,
    )
    if a.csv:
        atomic_write_text(a.csv, df.to_csv(index=False))
        print(f"wrote {len(df)} rows to {a.csv}", file=sys.stderr)
    if a.json:
        print(to_json(df))
    elif not a.csv:
        print(
            f"hardware {hw.name}, shape {a.shape}, clock {a.clock}; per denoising step: seconds, stall, the "
            "limit max(compute, transfers x expert bytes / bandwidth) and its floor with min's misses"
        )
        print(df[COLUMNS].to_string(index=False))


def add_cli(sub) -> None:
    """Register `model`."""
    m = sub.add_parser(
        "model",
        help="model tokens/s per policy, C/W and link priority on traces for a GPU profile "
        "(the engine on a virtual clock) with the physical limit",
    )
    m.add_argument(
        "--trace", type=Path, action="append", required=True, help="a routing trace (repeat for more)"
    )
    m.add_argument(
        "--hardware",
        default=DEFAULT_HARDWARE,
        help=f"one of {sorted(HARDWARE)} (default: {DEFAULT_HARDWARE})",
    )
    m.add_argument(
        "--gpu-check",
        type=Path,
        default=None,
        help="a scripts/gpu_check.py JSON report: its measurements replace the profile's defaults",
    )
    m.add_argument(
        "--shape", default="llada2-mini", help=f"model shape, one of {list(SHAPES)} (default: llada2-mini)"
    )
    m.add_argument(
        "--policies",
        type=split_policies,
        default=["demand", "last_step", "oracle"],
        help="engine policy specs, comma-separated (default: demand,last_step,oracle)",
    )
    add_policy_module_arg(m)
    m.add_argument(
        "--cache-ratios",
        type=floats,
        default=list(D.cache_ratios),
        help=f"C/W per trace (default: {','.join(f'{r:g}' for r in D.cache_ratios)})",
    )
    m.add_argument(
        "--batch-sizes",
        type=ints,
        default=None,
        help="keep only the traces recorded at these batch sizes (default: every trace)",
    )
    m.add_argument(
        "--link-priority",
        type=names,
        default=[D.link_priority],
        help=f"one or both of {PRIORITIES}, comma-separated (default: {D.link_priority})",
    )
    m.add_argument(
        "--clock",
        default=DEFAULT_CLOCK,
        help=f"one of {CLOCKS}: virtual = modelled costs, nothing sleeps; wall = the stream on this "
        f"machine (cpu-emulated, shape tiny) (default: {DEFAULT_CLOCK})",
    )
    add_policy_knob_args(m)
    m.add_argument("--json", action="store_true")
    m.add_argument("--csv", type=Path, default=None)
    m.add_argument("--force", action="store_true", help="replace an existing --csv file")
    m.set_defaults(fn=cmd_model)
