"""The experiments layer: settings, the bench, statistics and verdicts, one study per notebook, TIDE.

run level   submit, notebooks (the runner), doctor, harness (setup, model, traces, grids), timed (a timing
            claim over its cells), verdicts.pooling (the run as the unit: per-cell intervals over runs),
            effects (a run's effect per cell on a claim's basis), rules (the verdict rules), stats,
            claims, settings, hardware
calibration/ the verdict pipeline checked against known truth (synthetic stored runs, python -m artifact
            calibrate)
criteria/   paper (the paper's numbers), thresholds (this artifact's), timing (each timing claim's
definition) outputs/    paths (where a run's outputs go), figures (colours, titles, save), manifest,
rule_history,
            claims_table (the claim records, docs/claims.md's tables); claims_readme (the README's two claims
            tables, the writer of both files' generated blocks)
bench/      grid, model_runner, results, run (run_bench)
tide/       checkout, adapter
studies/    one module per notebook, named after it"""
