"""The experiments layer: settings, the bench, statistics and verdicts, one study per notebook, TIDE.

    run level   runs, submit, notebooks (the runner), doctor, settings, claims, claims_table, verdicts, stats,
                paper, hardware
    bench/      grid, model_runner, results, run (run_bench)
    tide/       checkout, adapter
    studies/    one module per notebook, named after it

The flat module paths of before the sub-packages (`artifact.experiments.capacity`, `.grid`, `.tide_checkout`, ...)
still import, as the modules they became: `_MOVED` below."""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

_MOVED = {
    "grid": "bench.grid", "results": "bench.results", "model_runner": "bench.model_runner",
    "tide_checkout": "tide.checkout",
    "quickstart": "studies.quickstart", "working_set": "studies.working_set", "misses": "studies.miss_accounting",
    "throttle": "studies.bandwidth_throttling", "capacity": "studies.capacity_sweep",
    "head_to_head": "studies.tide_head_to_head", "beyond": "studies.beyond_the_paper",
    "routing_map": "studies.routing_map", "perf_model": "studies.performance_model",
    "cache_design": "studies.cache_design_space",
}


class _OldPath(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`import artifact.experiments.<old>` gives the module at its new path (one module object, two names)."""

    def find_spec(self, fullname, path=None, target=None):
        prefix, _, name = fullname.rpartition(".")
        if prefix != __name__ or name not in _MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        return None

    def exec_module(self, module):              # the import returns what sys.modules holds after this
        old = module.__name__.rpartition(".")[2]
        sys.modules[module.__name__] = importlib.import_module(f"{__name__}.{_MOVED[old]}")


if not any(isinstance(f, _OldPath) for f in sys.meta_path):
    sys.meta_path.append(_OldPath())
