"""The paired benchmark: the grid of cells (grid), one measured cell (model_runner), the result files and
their locks (results), and the run over a grid that resumes and shards (run). It never imports a study."""

from artifact.experiments.bench.run import run_bench

__all__ = ["run_bench"]
