"""The verdict layer (docs/verdicts.md): what a reviewer reads to check a verdict, and applies to their own
numbers (`python -m artifact rule`).

    rules.py         the three outcomes, the rule per kind of claim, the A/A gate, figures against thresholds
    pairs.py         one run's paired effects per cell (the plain effect of A over B) and its A/A
    pooling.py       runs as the unit: pooled over the stored runs, a fresh run alone, leave-one-out
    judge.py         a timing claim over its cells, the Claim it prints with its `cells`, hand-given intervals
    records.py       the Claim record a notebook prints and stores (<notebook>.claims.json)
    stored_runs.py   the stored runs on disk (data/results/<profile>/runs/run<k>/)
    calibration.py   the rules on synthetic runs with a planted truth (`python -m artifact calibrate`)
    claims_table.py  the README's and docs/claims.md's tables, from the records
    rule_history.py  the rule versions and the stored verdicts each flipped

Claim definitions are data under criteria/ (timing.py), with the paper's numbers (paper.py) and this
artifact's thresholds (thresholds.py)."""
