"""The experiments layer: settings, the bench, statistics and verdicts, one study per notebook, TIDE.

    run level   submit, notebooks (the runner), doctor, harness (setup, model, traces, grids), replication,
                rules (the verdict rules), claims_table, stats, claims, settings, hardware
    criteria/   paper (the paper's numbers), thresholds (this artifact's)
    outputs/    paths (where a run's outputs go), figures (colours, titles, save)
    bench/      grid, model_runner, results, run (run_bench)
    tide/       checkout, adapter
    studies/    one module per notebook, named after it"""
