"""The offloaded expert backend: the host store, the per-layer slot cache, the engine that runs its plans."""
