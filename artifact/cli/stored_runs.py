"""`stored-runs`: the stored runs of a profile (data/results/PROFILE/runs/run<k>/: the timing notebooks' raw rows and
run.json) and the coverage of the A/A control's intervals over them (artifact.experiments.replication)."""
from __future__ import annotations

from artifact.errors import UserError
from artifact.experiments.replication import RunsError, coverage_text, stored_runs
from artifact.experiments.settings import load_profile


def cmd_stored_runs(a) -> int:
    P = load_profile(a.profile)
    found = stored_runs(P.name)
    if not found:
        raise UserError(f"profile {P.name}: no stored runs under data/results/{P.name}/runs/ (record them with "
                        f"`PYTHONPATH=. python scripts/record_runs.py --profile {P.name} --runs 3`)")
    try:
        print(coverage_text(P))
    except RunsError as e:
        raise UserError(str(e)) from e
    return 0


def add_cli(subparsers) -> None:
    """Register `stored-runs`."""
    c = subparsers.add_parser("stored-runs", help="the stored runs of a profile and how often the A/A control's "
                                           "intervals contain 0 over them")
    c.add_argument("--profile", default="cpu", help="the profile whose stored runs to read (default: cpu)")
    c.set_defaults(fn=cmd_stored_runs)
