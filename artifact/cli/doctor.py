"""`doctor`: a preflight of a profile's run (artifact.experiments.doctor): device and host memory per
batch size and C/W, disk, the grid's size and an estimated time. Exit 2 with one line on the first problem
that blocks the run; the whole table otherwise."""

from __future__ import annotations

from artifact.cli.args import add_profile_args, profile_from_args
from artifact.experiments.doctor import check
from artifact.validate import check_number


def cmd_doctor(a) -> int:
    check_number("--gpu-memory-gb", a.gpu_memory_gb, low=0, low_open=True, allow_none=True)
    print(check(profile_from_args(a), a.gpu_memory_gb).table())
    return 0


def add_cli(subparsers) -> None:
    """Register `doctor`."""
    d = subparsers.add_parser(
        "doctor",
        help="preflight: will the profile's grid fit in GPU and host memory and on disk, "
        "and how long will it take (reads no weights)",
    )
    add_profile_args(d)
    d.add_argument(
        "--gpu-memory-gb",
        type=float,
        default=None,
        help="plan for a GPU with this much memory (default: this machine's GPU; needed without one)",
    )
    d.set_defaults(fn=cmd_doctor)
