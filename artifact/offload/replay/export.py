"""A trace as per-layer request streams, for request-level cache simulators such as libCacheSim.

Each MoE layer has its own C slots, so each layer is one stream of requests (one per demanded expert,
object id = expert id, size 1). The order inside one demand matters: a request-level simulator serves one
request at a time, and a miss early in a demand may evict an expert that the same demand still needs,
which this cache never does. The feed that makes the two agree is "hits first": each demand's resident
experts (ascending), then its misses in the order the cache loads them, with residency taken from a
replay of the same policy at the same capacity (ExpertCache's plans). Fed so, libCacheSim's LRU has the
`demand` policy's counts exactly wherever no demand is larger than C (tests/test_oracle.py).

Formats:
  csv            `time,obj_id,layer` rows (time = the demand's stream position), one file per layer
  oracleGeneral  libCacheSim's binary format, 24 bytes per request: uint32 clock_time, uint64 obj_id,
                 uint32 obj_size, int64 next_access_vtime (the request index of the object's next request
                 in this layer's stream, -1 for none), one file per layer
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from artifact.errors import SettingError
from artifact.offload.replay.sim import build_cache
from artifact.paths import atomic_write_bytes

FORMATS = ("oracleGeneral", "csv")
ORACLE_GENERAL = np.dtype(
    [("clock_time", "<u4"), ("obj_id", "<u8"), ("obj_size", "<u4"), ("next_access_vtime", "<i8")]
)


def request_streams(trace, policy: str, capacity: int, **settings) -> dict[int, dict[str, np.ndarray]]:
    """Per model layer: `obj_id` (expert ids in feed order), `time` (each request's demand position) and
    `hit` (resident when its demand was planned, by the replay of `policy` at `capacity`)."""
    cache = build_cache(trace, policy, capacity, **settings)
    parts: dict[int, list] = {layer: [] for layer in trace.meta["moe_layers"]}
    layers = trace.meta["moe_layers"]
    for n, (i, e, c, s, p) in enumerate(
        zip(trace.positions, trace.expert_arrays, trace.count_arrays, trace.steps, trace.phases)
    ):
        plan, _ = cache.plan(i, e, c, s, p)
        parts[layers[i]].append((n, plan.hit_experts, plan.load_experts))
    out = {}
    for layer, rows in parts.items():
        ids = [np.concatenate((h, m)) for _, h, m in rows]
        out[layer] = {
            "obj_id": np.concatenate(ids) if ids else np.zeros(0, np.int64),
            "time": np.repeat([n for n, _, _ in rows], [len(x) for x in ids]).astype(np.int64),
            "hit": np.concatenate([np.r_[np.ones(len(h), bool), np.zeros(len(m), bool)] for _, h, m in rows])
            if rows
            else np.zeros(0, bool),
        }
    return out


def next_access(obj_id: np.ndarray) -> np.ndarray:
    """For each request, the index of the same object's next request (-1: none)."""
    nxt = np.full(len(obj_id), -1, dtype=np.int64)
    last: dict[int, int] = {}
    for k in range(len(obj_id) - 1, -1, -1):
        o = int(obj_id[k])
        nxt[k] = last.get(o, -1)
        last[o] = k
    return nxt


def oracle_general(stream: dict[str, np.ndarray]) -> bytes:
    rec = np.zeros(len(stream["obj_id"]), dtype=ORACLE_GENERAL)
    rec["clock_time"] = stream["time"]
    rec["obj_id"] = stream["obj_id"]
    rec["obj_size"] = 1
    rec["next_access_vtime"] = next_access(stream["obj_id"])
    return rec.tobytes()


def export(
    trace, out_dir: Path, fmt: str, policy: str = "demand", capacity: int | None = None, **settings
) -> list[Path]:
    """Write one file per MoE layer into out_dir (layer<L>.csv or layer<L>.oracleGeneral); returns them."""
    if fmt not in FORMATS:
        raise SettingError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    E = trace.meta["num_experts"]
    C = E if capacity is None else capacity
    if not 1 <= C <= E:
        raise SettingError(f"capacity must be in [1, {E}] experts per layer, got {C}")
    paths = []
    for layer, s in request_streams(trace, policy, C, **settings).items():
        if fmt == "csv":
            body = "time,obj_id,layer\n" + "".join(
                f"{t},{o},{layer}\n" for t, o in zip(s["time"].tolist(), s["obj_id"].tolist())
            )
            data = body.encode()
        else:
            data = oracle_general(s)
        paths.append(atomic_write_bytes(Path(out_dir) / f"layer{layer}.{fmt}", data))
    return paths
