"""What a claim is and is judged against: every claim once (claims.py), the abstract's phrases and the
paper's numbers (paper.py), this artifact's thresholds (thresholds.py) and each timing claim's rule
(timing.py). A change here that changes a verdict is a rule change: it bumps verdicts.records.RULES_VERSION
and gets a row in docs/verdicts.md's rule history (tests/test_rule_history.py)."""
