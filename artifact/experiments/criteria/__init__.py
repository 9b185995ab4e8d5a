"""What a claim is judged against: the paper's numbers (paper) and this artifact's thresholds (thresholds).

A rule file is a file whose change can change a verdict on data already recorded: the verdict rules
(rules.py), a run's effect per cell on a claim's basis and its net of the A/A control (effects.py), the
pooling of stored runs into per-cell intervals (replication.py) and the stored runs it reads (stored_runs/), a
claim over its cells (timed.py), the pairing of runs and the within-run intervals (stats.py), and everything
in this package (the thresholds, the paper's numbers, and each timing claim's definition: A, B, question,
basis, metric and cells, timing.py). RULE_FILES names them as git pathspecs relative to the repository root (a
directory covers every file under it), with the names they had before a rename, so that `git log --
RULE_FILES` follows them across it; tests/test_rule_history.py checks that every commit touching one after the
stored runs has its row in
docs/verdicts.md ("Rule changes after the stored runs")."""

RULE_FILES = (
    "artifact/experiments/rules.py",
    "artifact/experiments/effects.py",  # rules.py's pairs-to-effects half before it was split out
    "artifact/experiments/timed.py",  # replication.py's claim-over-cells half before it was split out
    "artifact/experiments/replication.py",
    "artifact/experiments/stored_runs/",  # replication.py's stored-runs-on-disk half, split out after 0a2396f
    "artifact/experiments/stats.py",
    "artifact/experiments/criteria/",
    "artifact/experiments/verdicts.py",  # rules.py's name before cd09e15
    "artifact/experiments/paper.py",  # criteria/thresholds.py's and criteria/paper.py's before 9210fa6
)
