"""Routing traces: every (forward, MoE layer) demand of a run, saved compactly and validated on load.

File format: safetensors (no pickle), flat int arrays plus JSON metadata:
  forward, layer, block, block_step, kind (N,)   one row per demand, in stream order
  offsets (N+1,)                                  experts[offsets[n]:offsets[n+1]] belong to demand n
  experts, counts (M,)                            demanded experts (ascending) and their token counts
Metadata: schema version, model config hash, model name, task, prompt ids, batch size, decoding
parameters, MoE layer list, number of experts.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from artifact.model.llada2 import Demand, StepInfo
from artifact.paths import atomic_write_bytes

SCHEMA = 1
FORMAT = "artifact-routing-trace"
KINDS = ("prefill", "denoise")
ARRAYS = ("forward", "layer", "block", "block_step", "kind", "offsets", "experts", "counts")


class TraceError(ValueError):
    pass


class TraceRecorder:
    """A demand listener (model.listening(recorder)). Forward indices run on across generate calls,
    so one trace can hold a whole task of several batches."""

    def __init__(self):
        self.rows: list[tuple[int, int, int, int, int]] = []
        self.experts: list[tuple[int, ...]] = []
        self.counts: list[tuple[int, ...]] = []
        self._base = 0
        self._last = -1

    def __call__(self, d: Demand) -> None:
        if d.step.forward + self._base < self._last:     # a new generate call restarted at forward 0
            self._base = self._last + 1
        f = d.step.forward + self._base
        self._last = f
        self.rows.append((f, d.layer, d.step.block, d.step.block_step, KINDS.index(d.step.kind)))
        self.experts.append(d.experts)
        self.counts.append(d.counts)

    def trace(self, meta: dict) -> "Trace":
        rows = np.array(self.rows, dtype=np.int64).reshape(-1, 5)
        lengths = np.array([len(e) for e in self.experts], dtype=np.int64)
        return Trace(
            meta=dict(meta),
            forward=rows[:, 0].astype(np.int32), layer=rows[:, 1].astype(np.int16),
            block=rows[:, 2].astype(np.int32), block_step=rows[:, 3].astype(np.int32),
            kind=rows[:, 4].astype(np.uint8),
            offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
            experts=np.fromiter((x for e in self.experts for x in e), dtype=np.int16),
            counts=np.fromiter((x for c in self.counts for x in c), dtype=np.int32))


@dataclass(eq=False)
class Trace:
    meta: dict
    forward: np.ndarray
    layer: np.ndarray
    block: np.ndarray
    block_step: np.ndarray
    kind: np.ndarray
    offsets: np.ndarray
    experts: np.ndarray
    counts: np.ndarray
    path: Path | None = field(default=None, compare=False)

    def __len__(self) -> int:
        return len(self.forward)

    @property
    def accesses(self) -> int:
        return int(len(self.experts))

    @cached_property
    def demands(self) -> list[Demand]:
        """The stream as the model emitted it (forward indices run on across batches)."""
        out = []
        o = self.offsets
        for n in range(len(self)):
            step = StepInfo(int(self.forward[n]), int(self.block[n]), int(self.block_step[n]), KINDS[self.kind[n]])
            out.append(Demand(step, int(self.layer[n]), tuple(self.experts[o[n]:o[n + 1]].tolist()),
                              tuple(self.counts[o[n]:o[n + 1]].tolist())))
        return out

    def future(self):
        """Future knowledge for the oracle and Belady: (forward, layer index, experts, counts) per demand."""
        from artifact.offload.policies import TraceFuture
        index = {layer: i for i, layer in enumerate(self.meta["moe_layers"])}
        o = self.offsets
        return TraceFuture([(int(self.forward[n]), index[int(self.layer[n])],
                             self.experts[o[n]:o[n + 1]].astype(np.int64), self.counts[o[n]:o[n + 1]].astype(np.int64))
                            for n in range(len(self))])

    def equal_routing(self, other: "Trace") -> bool:
        return all(np.array_equal(getattr(self, a), getattr(other, a)) for a in ARRAYS)

    # --- file ---------------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        from safetensors.numpy import save
        meta = {"format": FORMAT, "schema": str(SCHEMA), "meta": json.dumps(self.meta, sort_keys=True)}
        data = save({a: np.ascontiguousarray(getattr(self, a)) for a in ARRAYS}, metadata=meta)
        return atomic_write_bytes(path, data)

    @classmethod
    def load(cls, path: str | Path, expect_config_hash: str | None = None) -> "Trace":
        from safetensors import SafetensorError
        from safetensors.numpy import load
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: trace file not found")
        raw = path.read_bytes()
        try:
            arrays = load(raw)
            header = _header(raw)
        except (SafetensorError, ValueError, OSError) as e:
            raise TraceError(f"{path}: not a readable trace file (corrupt or truncated safetensors: {e})") from None
        if header.get("format") != FORMAT:
            raise TraceError(f"{path}: not a routing trace (format {header.get('format')!r}, expected {FORMAT!r})")
        if header.get("schema") != str(SCHEMA):
            raise TraceError(f"{path}: trace schema {header.get('schema')!r}, this code reads schema {SCHEMA}; "
                             "re-record it with `python -m artifact trace`")
        missing = [a for a in ARRAYS if a not in arrays]
        if missing:
            raise TraceError(f"{path}: trace lacks arrays {missing}")
        try:
            meta = json.loads(header["meta"])
        except KeyError:
            raise TraceError(f"{path}: trace header lacks its 'meta' entry (a JSON object)") from None
        except (json.JSONDecodeError, TypeError) as e:
            raise TraceError(f"{path}: trace metadata is not JSON ({e}); expected a JSON object") from None
        if not isinstance(meta, dict):
            raise TraceError(f"{path}: trace metadata is JSON {type(meta).__name__}, expected a JSON object")
        t = cls(meta=meta, path=path, **{a: arrays[a] for a in ARRAYS})
        t.validate(str(path))
        if expect_config_hash is not None and meta.get("config_hash") != expect_config_hash:
            raise TraceError(f"{path}: trace was recorded on model {meta.get('model')!r} (config hash "
                             f"{meta.get('config_hash')}), not on this model (config hash {expect_config_hash})")
        return t

    def validate(self, where: str = "trace") -> None:
        bad = {a: str(getattr(self, a).dtype) for a in ARRAYS if getattr(self, a).dtype.kind not in "iu"}
        if bad:
            raise TraceError(f"{where}: arrays hold {bad}, expected integers (expert ids, layers, steps, counts "
                             "and offsets are whole numbers)")
        flat = [a for a in ARRAYS if getattr(self, a).ndim != 1]
        if flat:
            raise TraceError(f"{where}: arrays {flat} are not one-dimensional")
        E, layers = self.meta.get("num_experts"), self.meta.get("moe_layers")
        if not _is_int(E) or not isinstance(layers, list) or not all(_is_int(x) for x in layers):
            raise TraceError(f"{where}: metadata needs num_experts (an integer) and moe_layers (a list of integers), "
                             f"got {E!r} and {layers!r}")
        n = len(self.forward)
        for a in ("layer", "block", "block_step", "kind"):
            if len(getattr(self, a)) != n:
                raise TraceError(f"{where}: array {a} has {len(getattr(self, a))} rows, expected {n}")
        o = self.offsets
        if len(o) != n + 1 or o[0] != 0 or o[-1] != len(self.experts) or (np.diff(o) < 0).any():
            raise TraceError(f"{where}: offsets do not index the experts array")
        if len(self.counts) != len(self.experts):
            raise TraceError(f"{where}: {len(self.counts)} counts for {len(self.experts)} experts")
        if len(self.experts) and (self.experts.min() < 0 or self.experts.max() >= E):
            raise TraceError(f"{where}: expert ids outside [0, {E})")
        if not set(np.unique(self.layer).tolist()) <= set(self.meta["moe_layers"]):
            raise TraceError(f"{where}: layers {sorted(set(self.layer.tolist()))} are not MoE layers "
                             f"{self.meta['moe_layers']}")
        if (self.counts <= 0).any() or (self.kind >= len(KINDS)).any():
            raise TraceError(f"{where}: non-positive token counts or unknown event kinds")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _header(raw: bytes) -> dict:
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n]).get("__metadata__") or {}
    if not isinstance(header, dict):
        raise ValueError("__metadata__ is not a JSON object")
    return header


# ---------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------
def working_sets(trace: Trace, denoise_only: bool = True):
    """One row per (forward, layer): W = distinct experts demanded. A pandas DataFrame."""
    import pandas as pd
    df = pd.DataFrame({"forward": trace.forward, "layer": trace.layer, "block": trace.block,
                       "block_step": trace.block_step, "kind": [KINDS[k] for k in trace.kind],
                       "working_set": np.diff(trace.offsets)})
    return df[df.kind == "denoise"].reset_index(drop=True) if denoise_only else df


def mean_working_set(trace: Trace) -> float:
    """Mean W over denoising demands: the unit of cache capacity (C/W)."""
    w = np.diff(trace.offsets)[trace.kind == KINDS.index("denoise")]
    if len(w) == 0:
        raise TraceError("trace has no denoising demands: cannot measure the working set")
    return float(w.mean())


def step_similarity(trace: Trace):
    """Jaccard similarity of D(t, l) and D(t-1, l) for consecutive denoising steps of the same block
    round, one row per (forward, layer), with the share of D(t, l) already in D(t-1, l)."""
    import pandas as pd
    o, rows = trace.offsets, []
    prev: dict[int, tuple[int, int, set]] = {}
    for n in range(len(trace)):
        if trace.kind[n] != 1:
            continue
        layer, block, step = int(trace.layer[n]), int(trace.block[n]), int(trace.block_step[n])
        cur = set(trace.experts[o[n]:o[n + 1]].tolist())
        p = prev.get(layer)
        if p is not None and p[0] == block and p[1] == step - 1:
            inter = len(cur & p[2])
            rows.append({"forward": int(trace.forward[n]), "layer": layer, "block": block, "block_step": step,
                         "jaccard": inter / len(cur | p[2]), "reuse": inter / len(cur)})
        prev[layer] = (block, step, cur)
    return pd.DataFrame(rows, columns=["forward", "layer", "block", "block_step", "jaccard", "reuse"])
