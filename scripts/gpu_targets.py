"""The graphs check's targets T1-T6 (docs/host_path.md, "The segmented forward on a GPU"): pure functions of a
report's rows (scripts/gpu_check_graphs.py writes the report; `judge` reads it, `line` prints a verdict).

A segmented row is judged only if its segments replayed as CUDA graphs (hardware.replayed: replays > 0, no
capture error); a row whose segments ran eagerly, or an old row without the counters, measured the eager
path under another name: no target reads it, and a target that has nothing else to go on reads
"not judged: N rows did not replay"."""
from __future__ import annotations

import json

from artifact.experiments.hardware import forward_of, replayed

MET, NOT_MET, UNMEASURED, NOT_JUDGED = "met", "not met", "unmeasured", "not judged"
# The targets (docs/host_path.md, "The segmented forward on a GPU"), each judged on the segmented rows that replayed.
T1_HOST_OVER_H2D, T1_AT_173 = 0.3, 0.5
T2_LAUNCHES = 12
T4_BUSY = 0.85
T5_CAP = 0.1
T6_SHARE = 0.1
RULES = {
    "T1": f"segmented, demand: host / H2D per forward (medians) <= {T1_HOST_OVER_H2D} at C/W 1, batch 1 and 4; "
          f"<= {T1_AT_173} at batch 1, C/W 1.73",
    "T2": f"segmented, C/W 1, demand: host-issued kernel launches (graph launches included) per MoE layer <= "
          f"{T2_LAUNCHES}, the copies counted apart (copies_per_moe_layer)",
    "T3": "segmented, C/W 1, demand, per forward: one event sync per MoE layer, no stream or device sync, no "
          "blocking copy (CPU: SyncCounter's device reads, one per MoE layer)",
    "T4": f"segmented, batch 1, C/W 1, demand: link busy / wall >= {T4_BUSY}",
    "T5": f"every run (eager and segmented): counts equal sim.replay of its trace and tokens equal resident; the "
          f"capped link at 0.5x and 0.25x within {T5_CAP:.0%} of its cap",
    "T6": f"segmented, every batch and C/W with C < E: |host(last_step) - host(demand)| <= {T6_SHARE} x demand's "
          "H2D per forward (C = E copies nothing: no link time to compare against)",
}
NO_GPU_TARGETS = "dry run on the CPU: the tiny model on the emulated link, not an H200"


# --- the targets: pure functions of the report's rows ---------------------------------------------
def _verdict(name: str, figures: dict, ok: bool | None, missing: list[str] | None = None) -> dict:
    if missing:
        return {"status": UNMEASURED, "rule": RULES[name], "figures": figures, "missing": missing}
    return {"status": MET if ok else NOT_MET, "rule": RULES[name], "figures": figures}


def _find(runs: list[dict], **key) -> dict | None:
    """The run (forward, batch, cache_ratio, policy, ...) matching key, if it ran without error."""
    for r in runs:
        if "error" not in r and all((forward_of(r) if k == "forward" else r.get(k)) == v for k, v in key.items()):
            return r
    return None


def _profiled(runs: list[dict]) -> list[dict]:
    """The segmented runs whose profiled run measured its counts."""
    return [r for r in runs if "error" not in r and forward_of(r) == "segmented"
            and "error" not in r.get("profile", {"error": "not profiled"})]


def t1(runs: list[dict]) -> dict:
    need = [(1, 1.0, T1_HOST_OVER_H2D), (4, 1.0, T1_HOST_OVER_H2D), (1, 1.73, T1_AT_173)]
    figures, missing, ok = {}, [], True
    for b, ratio, limit in need:
        r = _find(runs, forward="segmented", batch=b, cache_ratio=ratio, policy="demand")
        label = f"batch {b}, C/W {ratio:g}"
        if r is None or r.get("host_over_h2d") is None:
            missing.append(label)
            continue
        figures[label] = {"host_ms_median": r["host_ms_median"], "h2d_ms_per_forward": r["h2d_ms_per_forward"],
                          "host_over_h2d": r["host_over_h2d"], "limit": limit}
        ok &= r["host_over_h2d"] <= limit
    return _verdict("T1", figures, ok, missing)


def t2(runs: list[dict]) -> dict:
    figures, missing, ok = {}, [], True
    for r in _profiled(runs):
        p = r["profile"]
        figures[f"batch {r['batch']}"] = {k: p[k] for k in ("launches_per_moe_layer", "copies_per_moe_layer",
                                                            "aten_ops_per_moe_layer")}
        ok &= p["launches_per_moe_layer"] <= T2_LAUNCHES
    if not figures:
        missing.append("a profiled segmented run (C/W 1, demand)")
    return _verdict("T2", figures, ok, missing)


def t3(runs: list[dict], cuda: bool) -> dict:
    figures, missing, ok = {}, [], True
    for r in _profiled(runs):
        p = r["profile"]
        if cuda:
            keys = ("event_syncs_per_moe_layer", "stream_syncs_per_moe_layer", "device_syncs_per_moe_layer",
                    "blocking_copies_per_moe_layer")
            good = (p["event_syncs_per_moe_layer"] == 1 and p["stream_syncs_per_moe_layer"] == 0
                    and p["device_syncs_per_moe_layer"] == 0 and p["blocking_copies_per_moe_layer"] == 0)
        else:
            keys = ("device_reads_per_moe_layer",)
            good = p["device_reads_per_moe_layer"] == 1
        figures[f"batch {r['batch']}"] = {k: p[k] for k in keys}
        ok &= good
    if not figures:
        missing.append("a profiled segmented run (C/W 1, demand)")
    return _verdict("T3", figures, ok, missing)


def t4(runs: list[dict]) -> dict:
    r = _find(runs, forward="segmented", batch=1, cache_ratio=1.0, policy="demand")
    if r is None or r.get("link_busy_over_wall") is None:
        return _verdict("T4", {}, None, ["batch 1, C/W 1, demand, segmented"])
    return _verdict("T4", {"link_busy_over_wall": r["link_busy_over_wall"]}, r["link_busy_over_wall"] >= T4_BUSY)


def t5(runs: list[dict], caps: list[dict]) -> dict:
    ok_runs = [r for r in runs if "error" not in r]
    missing = [] if ok_runs else ["an offloaded run"]
    missing += [f"the replay of {forward_of(r)} batch {r['batch']} C/W {r['cache_ratio']:g} {r['policy']}"
                for r in ok_runs if r.get("counts_equal_replay") is None]          # its recorded run raised
    missing += [f"the capped link at {f}x" for f in (0.5, 0.25) if not any(c.get("fraction") == f for c in caps)]
    figures = {"runs": len(ok_runs), "runs_with_errors": len(runs) - len(ok_runs),
               "counts_equal_replay": sum(bool(r.get("counts_equal_replay")) for r in ok_runs),
               "tokens_equal_resident": sum(bool(r.get("tokens_equal_resident")) for r in ok_runs),
               "caps": {f"{c['fraction']}x": c["achieved_over_target"] for c in caps
                        if c.get("fraction") in (0.5, 0.25)}}
    ok = (figures["counts_equal_replay"] == figures["tokens_equal_resident"] == len(ok_runs)
          and figures["runs_with_errors"] == 0
          and all(abs(v - 1) <= T5_CAP for v in figures["caps"].values()))
    return _verdict("T5", figures, ok, missing)


def t6(runs: list[dict]) -> dict:
    figures, ok = {}, True
    cells = sorted({(r["batch"], r["cache_ratio"]) for r in runs if forward_of(r) == "segmented" and "batch" in r})
    for b, ratio in cells:
        d = _find(runs, forward="segmented", batch=b, cache_ratio=ratio, policy="demand")
        s = _find(runs, forward="segmented", batch=b, cache_ratio=ratio, policy="last_step")
        label = f"batch {b}, C/W {ratio:g}"
        if d is None or s is None:
            continue
        if d["cache_experts"] >= d["num_experts"]:
            figures[label] = "excluded: C = E, no copies"
            continue
        diff = abs(s["host_ms_median"] - d["host_ms_median"])
        figures[label] = {"host_diff_ms": diff, "h2d_ms_per_forward": d["h2d_ms_per_forward"],
                          "limit_ms": T6_SHARE * d["h2d_ms_per_forward"]}
        ok &= diff <= T6_SHARE * d["h2d_ms_per_forward"]
    judged = [v for v in figures.values() if isinstance(v, dict)]
    return _verdict("T6", figures, ok, [] if judged else ["a segmented cell with C < E run under both policies"])


def did_not_replay(runs: list[dict]) -> list[dict]:
    """The segmented rows that ran without error but whose segments did not replay (or carry no counters)."""
    return [r for r in runs if isinstance(r, dict) and "error" not in r and forward_of(r) == "segmented"
            and not replayed(r)]


def judge(report: dict) -> dict:
    """T1-T6 from a report's engine and capped_link steps, on its rows less those that did not replay
    (module docstring); on a CPU dry run every target is unmeasured and says what the CPU figures would
    give (would_be)."""
    rows = (report.get("engine") or {}).get("runs", [])
    skipped = did_not_replay(rows)
    runs = [r for r in rows if not any(r is x for x in skipped)]
    caps = (report.get("capped_link") or {}).get("caps", [])
    cuda = not report.get("dry_run_on_cpu")
    out = {"T1": t1(runs), "T2": t2(runs), "T3": t3(runs, cuda), "T4": t4(runs), "T5": t5(runs, caps),
           "T6": t6(runs)}
    if skipped:
        n = len(skipped)
        note = f"{n} row{'s' if n != 1 else ''} did not replay"
        for t in out.values():
            t["did_not_replay"] = n
            if t["status"] == UNMEASURED:
                t["status"], t["not_judged"] = NOT_JUDGED, f"not judged: {note}"
    if not cuda:
        for t in out.values():
            t["would_be"], t["status"], t["why"] = t["status"], UNMEASURED, NO_GPU_TARGETS
    return out


def line(name: str, t: dict) -> str:
    """One printed line per target: its status, why (dry run, rows that did not replay, what is missing),
    its rule and figures."""
    status, why = t["status"], []
    if "would_be" in t:                      # a dry run: what the CPU figures would give
        why += [t["why"], f"would be {t['not_judged'] if t.get('not_judged') else t['would_be']}"]
    elif t.get("not_judged"):
        status = t["not_judged"]
    if t.get("did_not_replay") and not t.get("not_judged"):
        why.append(f"{t['did_not_replay']} rows that did not replay left out")
    if t.get("missing"):
        why.append(f"missing: {'; '.join(t['missing'])}")
    extra = f" ({'; '.join(why)})" if why else ""
    return f"{name}: {status}{extra} -- {t['rule']}; figures: {json.dumps(t['figures'], default=str)}"
