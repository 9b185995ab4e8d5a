"""The verdict layer, docs/verdicts.md in code: rules.py (the rule per kind of claim, the A/A gate), pairs.py
(one run's plain paired effects), pooling.py (runs as the unit), judge.py (a claim over its cells),
records.py, calibration.py. Claims are data in criteria/, stored runs in outputs/; the rule history is
docs/verdicts.md's (tests/test_rule_history.py)."""
