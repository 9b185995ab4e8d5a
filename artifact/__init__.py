"""Offloaded inference for diffusion mixture-of-experts LMs (LLaDA2.0), and the measurements of when
expert prefetching helps.

Three layers, each importing only the ones below it (an import-linter contract in pyproject.toml):

  artifact.model        config, the LLaDA2-MoE forward (llada2), checkpoint loading, block-diffusion
                        decoding, task prompts
  artifact.offload      the runner that wires a checkpoint to the engine, prepare, trace_engine; replay/
                        (routing traces, the exact simulator), backend/ (host store, per-layer cache, engine),
                        links/ (the host-to-device link), policy/ (prefetch and eviction)
  artifact.experiments  settings (profiles), the paired benchmark and its statistics, one module per
                        claim, the notebook runner, the TIDE adapter

`python -m artifact` is the command line (artifact/cli/); docs/DESIGN.md is the design.
"""

__version__ = "0.2.0"
