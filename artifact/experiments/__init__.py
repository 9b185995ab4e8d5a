"""The experiments layer: settings, benchmarks and statistics, one module per claim, notebooks, TIDE."""
