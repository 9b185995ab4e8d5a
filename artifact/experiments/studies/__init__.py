"""One module per notebook, named after it (notebooks/04_capacity_sweep.ipynb -> studies/capacity_sweep.py):
what the notebook runs, the frame behind each figure, and its claims with their verdicts. A study imports the
run-level modules (runs, claims, verdicts, stats, settings, paper), the bench and TIDE's adapter, never
another study (an import-linter contract in pyproject.toml)."""
