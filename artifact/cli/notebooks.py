"""`notebooks`: run the numbered notebooks for a profile (artifact.experiments.notebooks) and print every
claim's verdict; the exit code counts failed notebooks."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from artifact.cli.args import add_profile_args, names, overrides_from_args
from artifact.errors import CheckpointError, DeviceError
from artifact.experiments.notebooks import CELL_TIMEOUT_S, NotebookError, run_notebooks, summary_table
from artifact.experiments.notebooks.store import store_outputs
from artifact.experiments.settings import ProfileError, load_profile
from artifact.offload.prepare import checked_checkpoint
from artifact.offload.runner import check_device
from artifact.validate import check_number

MAX_TIMEOUT_S = 7 * 24 * 3600  # a cell's limit: a week at most (a longer or over-long integer is a typo)


def check_machine_and_model(profile: str, overrides: dict) -> None:
    """What the profile's notebooks need of this machine and its model, checked before any notebook runs
    (else the first notebook that loads the model fails, exit 1): the device first (a CUDA profile on a
    machine without CUDA), then the checkpoint (config.json and every weight file's header, no weight read).
    A profile with model: null is refused by run_notebooks, which names --model."""
    P = load_profile(profile, overrides)
    try:
        check_device(P.device)
    except DeviceError:
        raise DeviceError(
            f"profile {P.name!r} runs on device {P.device}, and this machine has no CUDA device "
            "(torch.cuda.is_available() is False): run it on a GPU machine, or choose a CPU profile "
            "(--profile cpu)"
        ) from None
    if P.model not in (None, "tiny"):
        checked_checkpoint(P.model)


def cmd_notebooks(a) -> int:
    """Returns the number of failed notebooks. A refusal before any notebook runs (a bad flag, profile,
    override or notebook name, a device this machine lacks, a model folder that is not a checkpoint) is one
    line and exit 2."""
    log = lambda s: print(s, file=sys.stderr)  # noqa: E731
    check_number("--timeout", a.timeout, low=1, high=MAX_TIMEOUT_S, integer=True)
    try:
        overrides = overrides_from_args(a)
        check_machine_and_model(a.profile, overrides)
        outcomes = run_notebooks(
            a.profile,
            overrides,
            a.force,
            a.only,
            a.notebook_dir,
            a.results,
            a.timeout,
            progress=not a.quiet,
            log=log,
        )
    except (NotebookError, ProfileError, DeviceError, CheckpointError, FileNotFoundError) as e:
        print(f"error: {e}; nothing was run", file=sys.stderr)
        return 2
    print(summary_table(outcomes))
    if a.store:
        store_outputs(a.profile, overrides, outcomes, a.notebook_dir, a.results, log=log)
    return sum(o.status == "FAILED" for o in outcomes)


def add_cli(subparsers) -> None:
    """Register `notebooks`."""
    n = subparsers.add_parser(
        "notebooks",
        help="run the numbered notebooks for a profile (papermill) and print every claim's verdict",
    )
    add_profile_args(n)
    n.add_argument("--force", action="store_true", help="rerun notebooks whose executed copy is complete")
    n.add_argument("--only", type=names, default=None, help="comma-separated numbers or names, e.g. 02,04")
    n.add_argument("--timeout", type=int, default=CELL_TIMEOUT_S, help="seconds per cell")
    n.add_argument("--quiet", action="store_true", help="no progress bar")
    n.add_argument(
        "--store",
        action="store_true",
        help="make this run the committed reference: its figures, "
        "their data and its claim records into figures/PROFILE/ and data/results/PROFILE/, "
        "the claim cells' outputs into notebooks/ (cpu: what nbval checks), "
        "and the claims tables (README, docs/claims.md)",
    )
    n.add_argument("--notebook-dir", type=Path, default=None, help=argparse.SUPPRESS)
    n.add_argument("--results", type=Path, default=None, help=argparse.SUPPRESS)
    n.set_defaults(fn=cmd_notebooks)
