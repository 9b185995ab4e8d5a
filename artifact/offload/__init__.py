"""The offload layer. At the top: runner (checkpoint -> engine), prepare (the checks before a run),
trace_engine (the engine driven by a trace); below, in this order (import-linter): replay/ (routing traces,
the exact simulator) > backend/ (host store, slot cache, engine) > links/ (the host-to-device link) | policy/
(prefetch and eviction). Nothing is re-exported: import from the sub-packages."""
