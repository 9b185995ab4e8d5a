"""libCacheSim as the test oracle of the eviction policies (artifact/offload/policy/eviction.py, export.py).

Each stored trace is exported as per-layer request streams with the hits-first feed and served by
libCacheSim's own implementations, request by request; the hit or miss of every request is compared.

- LRU: libCacheSim's LRU equals `demand` on every request of every trace, at every capacity tried (also
  below the largest demand: with the hits-first feed LRU's request order is the cache's keep order).
- LFU, ARC, S3-FIFO: the rules coincide when a demand is one expert, so on the same routing served one
  expert per demand the project's policies equal libCacheSim's on every request. With whole demands they
  differ by one rule, which the last test shows: a request-level cache may evict an expert that the
  current demand still needs (a miss early in the demand evicts a resident the demand has already used,
  or one of its own earlier misses), and this cache never does (a demanded expert stays until computed).
"""

from pathlib import Path

import numpy as np
import pytest

from artifact.offload.replay.export import FORMATS, export, next_access, request_streams
from artifact.offload.replay.sim import capacity_for, replay
from artifact.offload.replay.trace import Trace, mean_working_set

lcs = pytest.importorskip("libcachesim", reason="libcachesim is a dev dependency: pip install -e .[dev]")

FIXTURES = Path(__file__).parent / "fixtures"
TRACES = sorted(FIXTURES.glob("*.safetensors"))
LIBCACHESIM = {"lru": lcs.LRU, "lfu": lcs.LFU, "arc": lcs.ARC, "s3fifo": lcs.S3FIFO}


def spec(eviction: str) -> str:
    return "demand" if eviction == "lru" else f"demand+{eviction}"


def served(eviction: str, capacity: int, obj_ids) -> np.ndarray:
    """libCacheSim's hit (True) or miss for each request of one layer's stream."""
    cache = LIBCACHESIM[eviction](capacity)
    req = lcs.Request()
    req.obj_size = 1
    out = np.zeros(len(obj_ids), dtype=bool)
    for k, o in enumerate(obj_ids.tolist()):
        req.obj_id = o
        out[k] = cache.get(req)
    return out


def one_per_demand(t: Trace) -> Trace:
    """The same routing with every (demand, expert) pair its own demand, in the trace's order."""
    lens = np.diff(t.offsets)
    rows = {k: np.repeat(getattr(t, k), lens) for k in ("forward", "layer", "block", "block_step", "kind")}
    return Trace(
        meta=dict(t.meta),
        offsets=np.arange(len(t.experts) + 1, dtype=np.int64),
        experts=t.experts,
        counts=t.counts,
        **rows,
    )


def capacities(t: Trace) -> list[int]:
    W, E = mean_working_set(t), t.meta["num_experts"]
    return sorted({capacity_for(r, W, E) for r in (0.43, 0.83, 1.0, 1.73)})


def agree(t: Trace, eviction: str, C: int) -> tuple[int, int, int]:
    """(requests, requests on which libCacheSim and the project disagree, project misses)."""
    streams = request_streams(t, spec(eviction), C)
    n = bad = misses = 0
    for s in streams.values():
        got = served(eviction, C, s["obj_id"])
        n, bad, misses = (
            n + len(got),
            bad + int(np.count_nonzero(got != s["hit"])),
            misses + int((~s["hit"]).sum()),
        )
    return n, bad, misses


@pytest.mark.parametrize("path", TRACES, ids=[p.stem for p in TRACES])
def test_libcachesim_lru_equals_demand_request_by_request(path):
    t = Trace.load(path)
    for C in capacities(t):
        n, bad, misses = agree(t, "lru", C)
        assert n == t.accesses and bad == 0, f"C={C}: {bad} of {n} requests differ"
        assert misses == replay(t, "demand", C)["demand_misses"]


RECORDED = [FIXTURES / "tiny-gsm8k-b1.safetensors", FIXTURES / "tiny-mbpp-b4.safetensors"]


@pytest.mark.slow  # 3-8 s a case: every request of a recorded trace at four capacities, one by one
@pytest.mark.parametrize("eviction", ["lfu", "arc", "s3fifo"])
@pytest.mark.parametrize("path", RECORDED, ids=[p.stem for p in RECORDED])
def test_lfu_arc_s3fifo_equal_libcachesim_where_the_rules_coincide(path, eviction):
    """(The recorded traces: their C >= 25 gives S3-FIFO a small queue of >= 2 slots; libCacheSim 0.3.5's
    S3FIFO aborts when the small queue rounds to 0 slots, at C < 10.)"""
    t = one_per_demand(Trace.load(path))
    for C in capacities(Trace.load(path)):
        n, bad, misses = agree(t, eviction, C)
        assert bad == 0, f"{eviction} C={C}: {bad} of {n} requests differ"
        assert misses == replay(t, spec(eviction), C)["demand_misses"]


def test_where_the_rules_differ_libcachesim_evicts_what_the_demand_still_needs():
    """On whole demands a request-level LFU loses: each miss of a demand enters with frequency 1, the lowest,
    so the demand's next miss evicts it, and the expert is missed again at the next step. The project's LFU
    never evicts an expert of the current demand. The same feed that makes LRU agree exactly."""
    t = Trace.load(FIXTURES / "tiny-gsm8k-b1.safetensors")
    C = capacity_for(1.0, mean_working_set(t), 256)
    n, bad, ours = agree(t, "lfu", C)
    theirs = ours + sum(
        int(np.count_nonzero(s["hit"])) - int(np.count_nonzero(served("lfu", C, s["obj_id"])))
        for s in request_streams(t, "demand+lfu", C).values()
    )
    assert bad > 0 and theirs > 1.5 * ours


def test_the_feed_order_matters():
    """Fed in ascending expert order instead of hits first, libCacheSim's LRU misses more: a miss early in a
    demand evicts an expert that the same demand still needs."""
    t = Trace.load(FIXTURES / "tiny-gsm8k-b1.safetensors")
    C = capacity_for(0.83, mean_working_set(t), 256)
    streams = request_streams(t, "demand", C)
    ascending = misses = 0
    for s in streams.values():
        order = np.lexsort((s["obj_id"], s["time"]))
        ascending += int(np.count_nonzero(~served("lru", C, s["obj_id"][order])))
        misses += int(np.count_nonzero(~s["hit"]))
    assert ascending > 1.2 * misses


def test_export_writes_what_libcachesim_reads(tmp_path):
    t = Trace.load(FIXTURES / "tiny-gsm8k-b1.safetensors")
    C = capacity_for(1.0, mean_working_set(t), 256)
    paths = export(t, tmp_path, "oracleGeneral", "demand", C)
    assert [p.name for p in paths] == [f"layer{layer}.oracleGeneral" for layer in t.meta["moe_layers"]]
    total = 0
    for p in paths:
        reader = lcs.TraceReader(str(p), lcs.TraceType.ORACLE_GENERAL_TRACE)
        miss_ratio, _ = lcs.LRU(C).process_trace(reader)
        n = p.stat().st_size // 24
        total += round(miss_ratio * n)
    assert total == replay(t, "demand", C)["demand_misses"]
    csv = export(t, tmp_path, "csv", "demand", C)[0].read_text().splitlines()
    assert csv[0] == "time,obj_id,layer" and len(csv) == 1 + (paths[0].stat().st_size // 24)
    assert FORMATS == ("oracleGeneral", "csv")
    assert next_access(np.array([3, 1, 3, 3, 1])).tolist() == [2, 4, 3, -1, -1]
    with pytest.raises(ValueError, match="unknown export format 'txt'"):
        export(t, tmp_path, "txt")


def test_the_export_trace_command(tmp_path, capsys):
    from artifact.cli import main

    path = FIXTURES / "tiny-gsm8k-b1.safetensors"
    assert (
        main(
            [
                "export-trace",
                "--trace",
                str(path),
                "--out",
                str(tmp_path),
                "--format",
                "csv",
                "--cache-experts",
                "40",
                "--policy",
                "demand+token_lru",
            ]
        )
        == 0
    )
    assert (
        "wrote 4 per-layer csv streams (23324 requests, hits-first feed of demand+token_lru at C = 40)"
        in capsys.readouterr().out
    )
    rows = sum(len((tmp_path / f"layer{layer}.csv").read_text().splitlines()) - 1 for layer in range(1, 5))
    assert rows == 23324
    assert main(["export-trace", "--trace", str(path), "--out", str(tmp_path), "--format", "csv"]) == 2
    assert "exists; pass --force" in capsys.readouterr().err
    assert main(["export-trace", "--trace", str(path), "--out", str(tmp_path), "--policy", "min"]) == 2
    assert "is a bound, not a cache" in capsys.readouterr().err
    assert main(["export-trace", "--trace", str(path), "--out", str(tmp_path), "--cache-experts", "999"]) == 2
    assert "--cache-experts" in capsys.readouterr().err
