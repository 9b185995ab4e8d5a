"""The experiments layer: settings, the bench, the verdicts, one study per notebook, TIDE (its order:
docs/DESIGN.md, "The experiments layer"; every module: docs/layout.md).

run level   submit/, notebooks/ (the runner), doctor/, fresh_runs, harness (setup, model, traces, grids),
            recording (the stored runs written), paired_table (a run's paired table, a display), counting,
            claims_readme and claims_table (the claims tables, rendered from the records), settings, hardware
criteria/   claims (every claim, once), paper (the abstract's phrases and numbers), thresholds, timing
verdicts/   the rules and what applies them: pairs, pooling, judge, records, calibration
bench/      run, model_runner, results, locks, grid, order (the run order and the A/A vocabulary)
outputs/    stored_runs, figures, manifest, provenance, figure_check, paths
tide/       checkout, released, adapter
studies/    one module per notebook, named after it"""
