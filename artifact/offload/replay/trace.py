"""Routing traces: every (forward, MoE layer) demand of a run, saved compactly and validated on load.

File format: safetensors (no pickle), flat int arrays plus JSON metadata:
  forward, layer, block, block_step, kind (N,)   one row per demand, in stream order
  offsets (N+1,)                                  experts[offsets[n]:offsets[n+1]] belong to demand n
  experts, counts (M,)                            demanded experts (ascending) and their token counts
  pred_offsets (N+1,), pred_experts, pred_counts  schema 2, present when the run predicted: each demand's
                                                  cross-layer prediction of the next MoE layer's demand
                                                  (Demand.predicted), an empty range where it has none
Metadata: schema version, model config hash, model name, task, prompt ids, batch size, decoding
parameters, MoE layer list, number of experts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from artifact.errors import TraceError  # noqa: F401  (defined with the other user errors; re-exported here)
from artifact.model.routing import Demand, StepInfo
from artifact.offload.backend.plans import PHASES
from artifact.offload.policy.policies import TraceFuture
from artifact.paths import atomic_write_bytes

SCHEMA = 2
READS = ("1", "2")  # schema 1: no prediction arrays; it loads with no predictions
FORMAT = "artifact-routing-trace"
KINDS = ("prefill", "denoise")
ARRAYS = ("forward", "layer", "block", "block_step", "kind", "offsets", "experts", "counts")
PRED_ARRAYS = ("pred_offsets", "pred_experts", "pred_counts")  # schema 2, optional


def offsets_of(sets) -> np.ndarray:
    """(N+1,) offsets into the concatenation of `sets`: sets[n] is flat[offsets[n]:offsets[n + 1]]."""
    lengths = np.array([len(s) for s in sets], dtype=np.int64)
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def demand_columns(rows, sets) -> dict:
    """A trace's per-demand arrays, in its dtypes: the columns of `rows` (forward, layer, block, block_step,
    kind) and the offsets of each demand's experts `sets` in the flat experts and counts arrays."""
    r = np.array(rows, dtype=np.int64).reshape(-1, 5)
    return dict(
        forward=r[:, 0].astype(np.int32),
        layer=r[:, 1].astype(np.int16),
        block=r[:, 2].astype(np.int32),
        block_step=r[:, 3].astype(np.int32),
        kind=r[:, 4].astype(np.uint8),
        offsets=offsets_of(sets),
    )


class TraceRecorder:
    """A demand listener (model.listening(recorder)). Forward indices run on across generate calls,
    so one trace can hold a whole task of several batches."""

    def __init__(self):
        self.rows: list[tuple[int, int, int, int, int]] = []
        self.experts: list[tuple[int, ...]] = []
        self.counts: list[tuple[int, ...]] = []
        self.predicted: list[tuple[tuple[int, ...], tuple[int, ...]] | None] = []
        self._base = 0
        self._last = -1

    def __call__(self, d: Demand) -> None:
        if d.step.forward + self._base < self._last:  # a new generate call restarted at forward 0
            self._base = self._last + 1
        f = d.step.forward + self._base
        self._last = f
        self.rows.append((f, d.layer, d.step.block, d.step.block_step, KINDS.index(d.step.kind)))
        self.experts.append(d.experts)
        self.counts.append(d.counts)
        self.predicted.append(d.predicted)

    def trace(self, meta: dict) -> "Trace":
        pred = {}
        if any(p is not None for p in self.predicted):
            preds = [p or ((), ()) for p in self.predicted]
            pred = dict(
                pred_offsets=offsets_of([e for e, _ in preds]),
                pred_experts=np.fromiter((x for e, _ in preds for x in e), dtype=np.int16),
                pred_counts=np.fromiter((x for _, c in preds for x in c), dtype=np.int32),
            )
        return Trace(
            meta=dict(meta),
            **demand_columns(self.rows, self.experts),
            experts=np.fromiter((x for e in self.experts for x in e), dtype=np.int16),
            counts=np.fromiter((x for c in self.counts for x in c), dtype=np.int32),
            **pred,
        )


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
    pred_offsets: np.ndarray | None = None  # cross-layer predictions (schema 2), None if not recorded
    pred_experts: np.ndarray | None = None
    pred_counts: np.ndarray | None = None

    @property
    def has_predictions(self) -> bool:
        return self.pred_offsets is not None

    def require_predictions(self, who: str) -> None:
        """For a consumer of Demand.predicted (the cross_layer policy): a clear error when they are
        missing."""
        if not self.has_predictions:
            raise TraceError(
                f"{self.path or 'trace'}: {who} needs the cross-layer predictions "
                "(Demand.predicted), "
                "and this trace has none (a schema-1 trace, or a run that did not predict); "
                "re-record it with `python -m artifact trace`, which records them (schema 2)"
            )

    @cached_property
    def predicted(self) -> list | None:
        """Per demand, the recorded cross-layer prediction as (experts, counts) int64 arrays, None where the
        demand has none (the last MoE layer); None for a trace without predictions. The cross_layer policy
        replays it."""
        if not self.has_predictions:
            return None
        cut = self.pred_offsets[1:-1]
        experts = np.split(self.pred_experts.astype(np.int64), cut)
        counts = np.split(self.pred_counts.astype(np.int64), cut)
        return [None if len(e) == 0 else (e, c) for e, c in zip(experts, counts)]

    def __len__(self) -> int:
        return len(self.forward)

    @property
    def accesses(self) -> int:
        return int(len(self.experts))

    # --- in-memory accessors (decoded once per Trace object, shared by the simulator and policies) ---
    @cached_property
    def positions(self) -> list[int]:
        """MoE position i (0..L_moe-1) of each demand: the layer convention inside offload/."""
        lookup = np.full(int(max(self.meta["moe_layers"])) + 1, -1, dtype=np.int64)
        lookup[self.meta["moe_layers"]] = np.arange(len(self.meta["moe_layers"]))
        return lookup[self.layer].tolist()

    @cached_property
    def phases(self) -> list[int]:
        """Phase of each demand: 0 prefill, 1 first denoising step of a block round, 2 later
        (plans.PHASES)."""
        return np.where(self.kind == KINDS.index("prefill"), 0, np.where(self.block_step == 0, 1, 2)).tolist()

    @cached_property
    def expert_arrays(self) -> list[np.ndarray]:
        """Each demand's experts (ascending, int64): views into one decoded copy."""
        return np.split(self.experts.astype(np.int64), self.offsets[1:-1])

    @cached_property
    def count_arrays(self) -> list[np.ndarray]:
        """Each demand's token counts (int64), aligned with expert_arrays."""
        return np.split(self.counts.astype(np.int64), self.offsets[1:-1])

    @cached_property
    def steps(self) -> list[StepInfo]:
        """Each demand's StepInfo; demands of one forward share one object."""
        rows = np.stack([self.forward, self.block, self.block_step, self.kind], axis=1).tolist()
        out, last, info = [], None, None
        for r in rows:
            if r != last:
                info, last = StepInfo(r[0], r[1], r[2], KINDS[r[3]]), r
            out.append(info)
        return out

    @cached_property
    def demands(self) -> list[Demand]:
        """The stream as the model emitted it (forward indices run on across batches), as Demand objects.
        For the engine-facing view and tests; the simulator reads the arrays above."""
        pred = self.predicted or [None] * len(self)
        return [
            Demand(
                s,
                int(layer),
                tuple(e.tolist()),
                tuple(c.tolist()),
                None if q is None else (tuple(q[0].tolist()), tuple(q[1].tolist())),
            )
            for s, layer, e, c, q in zip(self.steps, self.layer, self.expert_arrays, self.count_arrays, pred)
        ]

    def future(self) -> TraceFuture:
        """Future knowledge for the oracle and Belady over this trace's arrays (no copy)."""
        return TraceFuture.from_arrays(
            self.forward.tolist(), self.positions, self.expert_arrays, self.count_arrays
        )

    def equal_routing(self, other: "Trace") -> bool:
        return all(np.array_equal(getattr(self, a), getattr(other, a)) for a in ARRAYS)

    # --- file ---------------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        from safetensors.numpy import save

        meta = {"format": FORMAT, "schema": str(SCHEMA), "meta": json.dumps(self.meta, sort_keys=True)}
        names = ARRAYS + (PRED_ARRAYS if self.has_predictions else ())
        data = save({a: np.ascontiguousarray(getattr(self, a)) for a in names}, metadata=meta)
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
            raise TraceError(
                f"{path}: not a readable trace file (corrupt or truncated safetensors: {e})"
            ) from None
        if header.get("format") != FORMAT:
            raise TraceError(
                f"{path}: not a routing trace (format {header.get('format')!r}, expected {FORMAT!r})"
            )
        if header.get("schema") not in READS:
            raise TraceError(
                f"{path}: trace schema {header.get('schema')!r}, this code reads schemas "
                f"{', '.join(READS)}; re-record it with `python -m artifact trace`"
            )
        missing = [a for a in ARRAYS if a not in arrays]
        if missing:
            raise TraceError(f"{path}: trace lacks arrays {missing}")
        present = [a for a in PRED_ARRAYS if a in arrays]
        if present and (header["schema"] == "1" or len(present) != len(PRED_ARRAYS)):
            raise TraceError(
                f"{path}: prediction arrays {present} in a schema-{header['schema']} trace; "
                f"expected all of {list(PRED_ARRAYS)} in a schema-2 trace, or none"
            )
        try:
            meta = json.loads(header["meta"])
        except KeyError:
            raise TraceError(f"{path}: trace header lacks its 'meta' entry (a JSON object)") from None
        except (json.JSONDecodeError, TypeError) as e:
            raise TraceError(f"{path}: trace metadata is not JSON ({e}); expected a JSON object") from None
        if not isinstance(meta, dict):
            raise TraceError(f"{path}: trace metadata is JSON {type(meta).__name__}, expected a JSON object")
        t = cls(meta=meta, path=path, **{a: arrays[a] for a in ARRAYS + tuple(present)})
        t.validate(str(path))
        if expect_config_hash is not None and meta.get("config_hash") != expect_config_hash:
            raise TraceError(
                f"{path}: trace was recorded on model {meta.get('model')!r} (config hash "
                f"{meta.get('config_hash')}), not on this model (config hash "
                f"{expect_config_hash})"
            )
        return t

    def validate(self, where: str = "trace") -> None:
        bad = {a: str(getattr(self, a).dtype) for a in ARRAYS if getattr(self, a).dtype.kind not in "iu"}
        if bad:
            raise TraceError(
                f"{where}: arrays hold {bad}, expected integers (expert ids, layers, steps, "
                "counts and offsets are whole numbers)"
            )
        flat = [a for a in ARRAYS if getattr(self, a).ndim != 1]
        if flat:
            raise TraceError(f"{where}: arrays {flat} are not one-dimensional")
        E, layers = self.meta.get("num_experts"), self.meta.get("moe_layers")
        if not _is_int(E) or not isinstance(layers, list) or not all(_is_int(x) for x in layers):
            raise TraceError(
                f"{where}: metadata needs num_experts (an integer) and moe_layers (a list of integers), "
                f"got {E!r} and {layers!r}"
            )
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
            raise TraceError(
                f"{where}: layers {sorted(set(self.layer.tolist()))} are not MoE layers "
                f"{self.meta['moe_layers']}"
            )
        if (self.counts <= 0).any() or (self.kind >= len(KINDS)).any():
            raise TraceError(f"{where}: non-positive token counts or unknown event kinds")
        if self.has_predictions:
            po, pe, pc = self.pred_offsets, self.pred_experts, self.pred_counts
            if (
                len(po) != n + 1
                or po[0] != 0
                or po[-1] != len(pe)
                or (np.diff(po) < 0).any()
                or len(pc) != len(pe)
            ):
                raise TraceError(f"{where}: pred_offsets do not index the pred_experts / pred_counts arrays")
            if len(pe) and (pe.min() < 0 or pe.max() >= E or (pc <= 0).any()):
                raise TraceError(
                    f"{where}: predicted expert ids outside [0, {E}) or non-positive predicted counts"
                )


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _header(raw: bytes) -> dict:
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n]).get("__metadata__") or {}
    if not isinstance(header, dict):
        raise ValueError("__metadata__ is not a JSON object")
    return header


# ---------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------
def working_sets(trace: Trace, denoise_only: bool = True):
    """One row per (forward, layer): W = distinct experts demanded, and the demand's phase (PHASES).
    A pandas DataFrame."""
    import pandas as pd

    df = pd.DataFrame(
        {
            "forward": trace.forward,
            "layer": trace.layer,
            "block": trace.block,
            "block_step": trace.block_step,
            "kind": [KINDS[k] for k in trace.kind],
            "phase": [PHASES[p] for p in trace.phases],
            "working_set": np.diff(trace.offsets),
        }
    )
    return df[df.kind == "denoise"].reset_index(drop=True) if denoise_only else df


def working_set_by_phase(trace: Trace):
    """W per phase: one row per phase present (prefill, first, later) with its demands and the mean,
    std and max of W. The denoising phases' demand-weighted mean is mean_working_set (the C/W unit)."""
    ws = working_sets(trace, denoise_only=False)
    g = ws.groupby("phase", sort=False).working_set
    out = g.agg(demands="size", mean_working_set="mean", std_working_set="std", max_working_set="max")
    return out.reindex([p for p in PHASES if p in out.index]).reset_index()


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
        cur = set(trace.experts[o[n] : o[n + 1]].tolist())
        p = prev.get(layer)
        if p is not None and p[0] == block and p[1] == step - 1:
            inter = len(cur & p[2])
            rows.append(
                {
                    "forward": int(trace.forward[n]),
                    "layer": layer,
                    "block": block,
                    "block_step": step,
                    "jaccard": inter / len(cur | p[2]),
                    "reuse": inter / len(cur),
                }
            )
        prev[layer] = (block, step, cur)
    return pd.DataFrame(rows, columns=["forward", "layer", "block", "block_step", "jaccard", "reuse"])
