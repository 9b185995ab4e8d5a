"""What a claim is judged against: the paper's numbers (paper.py, each with the statement of the abstract it
comes from), this artifact's thresholds (thresholds.py) and each timing claim's definition (timing.py). A
change here that changes a verdict is a rule change: it bumps verdicts.records.RULES_VERSION and gets a row in
docs/verdicts.md's rule history (verdicts/rule_history.py)."""
