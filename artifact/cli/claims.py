"""`claims`: the claims tables for a profile, rendered from its stored claim records
(artifact.experiments.claims_table, artifact.experiments.claims_readme): the README's two tables, or
with --full docs/claims.md's. It first checks the stored runs the records were ruled on
(stored_runs.check_stored_runs) and refuses damaged or missing ones. `--update-readme` rewrites the blocks
between its markers in the README (its two tables) and docs/claims.md (the full table and the agreement of
repeated runs)."""

from __future__ import annotations

import sys
from pathlib import Path

from artifact.errors import UserError
from artifact.experiments import claims_readme as readme
from artifact.experiments import claims_table as table
from artifact.experiments.outputs.stored_runs import check_stored_runs
from artifact.experiments.settings import load_profile


def cmd_claims(a) -> int:
    name = load_profile(a.profile).name  # a bad profile name fails with the known ones
    ruled_on = max((len(c.get("per_run") or []) for r in table.records(name) for c in r["claims"]), default=0)
    check_stored_runs(name, ruled_on=ruled_on)  # the runs behind the records: whole, at one commit, all there
    if a.update_readme:
        changed = readme.update_readme(a.readme, name)
        print(
            f"{a.readme or 'README.md'}: the {name} claims table "
            f"{'rewritten' if changed else 'already current'}",
            file=sys.stderr,
        )
        return 0
    if a.agreement:
        print(table.render_agreement(name))
        return 0
    if a.this_run is not None:
        if not a.this_run.is_dir():
            raise UserError(
                f"--this-run {a.this_run}: no such directory (expected a run's claim records, "
                f"e.g. results/{name}/data/)"
            )
        print(table.render_this_run(name, a.this_run))
        return 0
    # docs/claims.md's table, or the README's
    print(table.render(name) if a.full else readme.render_compact(name))
    return 0


def add_cli(subparsers) -> None:
    """Register `claims`."""
    c = subparsers.add_parser(
        "claims",
        help="the claims table (Markdown) generated from a profile's stored claim records under "
        "data/results/PROFILE/",
    )
    c.add_argument("--profile", default="cpu", help="the profile whose records to render (default: cpu)")
    c.add_argument(
        "--update-readme",
        action="store_true",
        help="rewrite the blocks between <!-- claims:PROFILE:begin/end --> in the README and "
        "docs/claims.md instead of printing",
    )
    c.add_argument(
        "--full",
        action="store_true",
        help="print the full table (docs/claims.md's) instead of the README's compact one",
    )
    c.add_argument("--readme", type=Path, default=None, help="the README to update (default: the checkout's)")
    c.add_argument(
        "--this-run",
        type=Path,
        default=None,
        metavar="DIR",
        help="compare a run's timing verdicts (DIR: its claim records, e.g. "
        "results/PROFILE/data/) with "
        "the stored pooled ones: is each the pooled verdict or inconclusive?",
    )
    c.add_argument(
        "--agreement",
        action="store_true",
        help="per timing claim, the verdict each stored run gets on its own beside the pooled one "
        "(data/results/PROFILE/runs/)",
    )
    c.set_defaults(fn=cmd_claims)
