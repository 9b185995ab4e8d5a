"""The offload layer: host store, per-layer cache, policies, link, engine, traces and the exact simulator."""
