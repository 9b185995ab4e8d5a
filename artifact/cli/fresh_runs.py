"""`fresh-runs`: real fresh runs of ./run_all.sh kept to check the calibration's model of one
(artifact.experiments.fresh_runs): keep a clone's timing rows, or print each kept run's verdicts beside the
stored ones with its noise over the stored runs', and write the summary the README's column reads."""

from __future__ import annotations

from pathlib import Path

from artifact.errors import UserError
from artifact.experiments import fresh_runs
from artifact.paths import atomic_write_text


def cmd_fresh_runs(a) -> int:
    if a.keep:
        src, name = Path(a.keep[0]), a.keep[1]
        try:
            print(f"kept {fresh_runs.keep(src, name, note=a.note, seconds=a.seconds)}")
        except (FileExistsError, FileNotFoundError) as e:
            raise UserError(str(e)) from e
        return 0
    per, summary = fresh_runs.tables()
    if per.empty:
        print("no fresh runs kept (data/results/cpu/fresh_runs/)")
        return 0
    print(per.to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    print(summary.to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    out = fresh_runs.root("cpu") / "decided.csv"
    atomic_write_text(out, summary.round(3).to_csv(index=False))
    print(f"wrote {out} (the README's column 'a fresh run decides' reads it)")
    return 0


def add_cli(subparsers) -> None:
    """Register `fresh-runs`."""
    c = subparsers.add_parser(
        "fresh-runs", help="real fresh runs kept to check the calibration's model of one"
    )
    c.add_argument(
        "--keep", nargs=2, metavar=("SRC", "NAME"), help="copy a clone's data/results/cpu/ rows in as NAME"
    )
    c.add_argument("--note", default="", help="with --keep: how the machine was (quiet, busy)")
    c.add_argument("--seconds", type=float, default=None, help="with --keep: the run's wall seconds")
    c.set_defaults(fn=cmd_fresh_runs)
