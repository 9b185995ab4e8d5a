"""`doctor`: a profile's run before it starts (artifact.experiments.doctor): first what a verdict costs (the
runs it pools x one run's time), which cells the verdict rules would call host-bound, the design's power under
assumed noise, then device and host memory per batch size and C/W, disk and the grid's time. `--shape NAME`
prices a published model from its public shapes (a header-only checkpoint in a temporary folder: nothing
downloaded, no weight read). Exit 2 with one line on the first problem that blocks the run."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

from artifact.cli.args import add_profile_args, profile_from_args
from artifact.errors import SettingError
from artifact.experiments.criteria import thresholds
from artifact.experiments.doctor import SHAPES, check
from artifact.experiments.doctor.shapes import header_only_checkpoint, shape_config
from artifact.validate import check_number


def cmd_doctor(a) -> int:
    check_number("--gpu-memory-gb", a.gpu_memory_gb, low=0, low_open=True, allow_none=True)
    check_number("--runs", a.runs, low=1, integer=True)
    if a.shape is None:
        print(check(profile_from_args(a), a.gpu_memory_gb, a.runs).table())
        return 0
    if a.model is not None:
        raise SettingError(
            "--shape and --model are exclusive: --shape prices a model's shapes without its files"
        )
    cfg = shape_config(a.shape)
    P = profile_from_args(a)
    with tempfile.TemporaryDirectory(prefix="doctor-shape-") as tmp:
        root = header_only_checkpoint(Path(tmp) / a.shape, cfg)
        print(check(dataclasses.replace(P, model=str(root)), a.gpu_memory_gb, a.runs, a.shape).table())
    return 0


def add_cli(subparsers) -> None:
    """Register `doctor`."""
    d = subparsers.add_parser(
        "doctor",
        help="preflight: what a verdict costs in GPU-hours, which cells will be host-bound, whether the grid "
        "fits in GPU and host memory and on disk (reads no weights)",
    )
    add_profile_args(d)
    d.add_argument(
        "--shape",
        default=None,
        metavar="NAME",
        help="price a published model from its public shapes, nothing downloaded (instead of --model; one of "
        f"{', '.join(SHAPES)})",
    )
    d.add_argument(
        "--gpu-memory-gb",
        type=float,
        default=None,
        help="plan for a GPU of this much memory (default: this machine's GPU; with --shape, the profile's)",
    )
    d.add_argument(
        "--runs",
        type=int,
        default=thresholds.MIN_RUNS,
        help=f"the runs a verdict pools (default thresholds.MIN_RUNS = {thresholds.MIN_RUNS})",
    )
    d.set_defaults(fn=cmd_doctor)
