"""The graphs check's targets T1-T7 (docs/host_path.md, "The segmented forward on a GPU"): pure functions of a
report's rows (scripts/gpu_check_graphs.py writes the report; `judge` reads it, `line` prints a verdict).

A segmented row is judged only if its segments replayed as CUDA graphs (hardware.replayed: replays > 0, no
capture error); a row whose segments ran eagerly, or an old row without the counters, measured the eager
path under another name: no target reads it, and a target that has nothing else to go on reads
"not judged: N rows did not replay". A profiled run is read only if its own segment counters show it
replayed (gpu_profile.replay_counters). Tokens are judged equal only in float32 (T5): in bf16 the segmented
and eager forwards may legitimately diverge after the first step; the capped link's accuracy is judged apart
(T5b)."""

from __future__ import annotations

import json

from artifact.experiments.hardware import forward_of, replayed

MET, NOT_MET, UNMEASURED, NOT_JUDGED = "met", "not met", "unmeasured", "not judged"
# The targets (docs/host_path.md, "The segmented forward on a GPU"), each judged on the segmented rows that
# replayed.
T1_HOST_OVER_H2D, T1_AT_173 = 0.3, 0.5
T2_LAUNCHES = 12
T4_BUSY = 0.85
T5_CAP = 0.1
T6_SHARE = 0.1
T7_OVER_LIMIT = 1.15
T7_COMPUTE = (
    "compute is the resident segmented run's wall ms per denoising forward (median, same batch): "
    "it overstates the GPU's compute by the router syncs' bubbles (the GPU idles while the host reads each "
    "MoE layer's counts), so the limit is loose by that much"
)
RULES = {
    "T1": f"segmented, demand: host / H2D per forward (medians) <= {T1_HOST_OVER_H2D} at C/W 1, "
    f"batch 1 and 4; <= {T1_AT_173} at batch 1, C/W 1.73",
    "T2": f"segmented, C/W 1, demand: host-issued kernel launches (graph launches included) per MoE layer <= "
    f"{T2_LAUNCHES}, the copies counted apart (copies_per_moe_layer)",
    "T3": "segmented, C/W 1, demand, per forward: one event sync per MoE layer, no stream or device sync, no "
    "blocking copy (CPU: SyncCounter's device reads, one per MoE layer)",
    "T4": f"segmented, batch 1, C/W 1, demand: link busy / wall >= {T4_BUSY}",
    "T5": "every run (eager and segmented): counts equal sim.replay of its trace; "
    "every float32 run (the CPU's rows, the fp32_tokens step on a GPU): "
    "tokens equal resident (bf16 rows' tokens are shown, not judged)",
    "T5b": f"the capped link at 0.5x and 0.25x within {T5_CAP:.0%} of its cap",
    "T6": "segmented, every batch and C/W with C < E: "
    f"|host(last_step) - host(demand)| <= {T6_SHARE} x demand's H2D per forward "
    "(C = E copies nothing: no link time to compare against)",
    "T7": "segmented, C/W 1, demand: wall ms per denoising forward (median) "
    f"<= {T7_OVER_LIMIT} x max(compute, demand misses per forward x expert bytes / the peak pinned H2D "
    "measured in the same run); " + T7_COMPUTE,
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
        if "error" not in r and all(
            (forward_of(r) if k == "forward" else r.get(k)) == v for k, v in key.items()
        ):
            return r
    return None


def _profiled(runs: list[dict]) -> list[dict]:
    """The segmented runs whose profiled run measured its counts and, by its own segment counters, replayed
    (a profile without the counters, from before they were recorded, is read as it was)."""
    return [
        r
        for r in runs
        if "error" not in r
        and forward_of(r) == "segmented"
        and "error" not in r.get("profile", {"error": "not profiled"})
        and r["profile"].get("replayed", True)
    ]


def _profile_missing(runs: list[dict]) -> list[str]:
    """What T2 and T3 lack when no profile is read: a profiled run, and how many profiled runs did not
    replay."""
    bad = [
        r
        for r in runs
        if "error" not in r
        and forward_of(r) == "segmented"
        and (r.get("profile") or {}).get("replayed") is False
    ]
    return [
        "a profiled segmented run (C/W 1, demand)"
        + (
            f" whose own segment counters show a replay ({len(bad)} profiled "
            f"run{'s' if len(bad) != 1 else ''} did not: "
            f"{bad[0]['profile'].get('not_replayed', 'no replays')})"
            if bad
            else ""
        )
    ]


def t1(runs: list[dict]) -> dict:
    need = [(1, 1.0, T1_HOST_OVER_H2D), (4, 1.0, T1_HOST_OVER_H2D), (1, 1.73, T1_AT_173)]
    figures, missing, ok = {}, [], True
    for b, ratio, limit in need:
        r = _find(runs, forward="segmented", batch=b, cache_ratio=ratio, policy="demand")
        label = f"batch {b}, C/W {ratio:g}"
        if r is None or r.get("host_over_h2d") is None:
            missing.append(label)
            continue
        figures[label] = {
            "host_ms_median": r["host_ms_median"],
            "h2d_ms_per_forward": r["h2d_ms_per_forward"],
            "host_over_h2d": r["host_over_h2d"],
            "limit": limit,
        }
        ok &= r["host_over_h2d"] <= limit
    return _verdict("T1", figures, ok, missing)


def t2(runs: list[dict]) -> dict:
    figures, missing, ok = {}, [], True
    for r in _profiled(runs):
        p = r["profile"]
        figures[f"batch {r['batch']}"] = {
            k: p[k] for k in ("launches_per_moe_layer", "copies_per_moe_layer", "aten_ops_per_moe_layer")
        }
        ok &= p["launches_per_moe_layer"] <= T2_LAUNCHES
    if not figures:
        missing += _profile_missing(runs)
    return _verdict("T2", figures, ok, missing)


def t3(runs: list[dict], cuda: bool) -> dict:
    figures, missing, ok = {}, [], True
    for r in _profiled(runs):
        p = r["profile"]
        if cuda:
            keys = (
                "event_syncs_per_moe_layer",
                "stream_syncs_per_moe_layer",
                "device_syncs_per_moe_layer",
                "blocking_copies_per_moe_layer",
            )
            good = (
                p["event_syncs_per_moe_layer"] == 1
                and p["stream_syncs_per_moe_layer"] == 0
                and p["device_syncs_per_moe_layer"] == 0
                and p["blocking_copies_per_moe_layer"] == 0
            )
        else:
            keys = ("device_reads_per_moe_layer",)
            good = p["device_reads_per_moe_layer"] == 1
        figures[f"batch {r['batch']}"] = {k: p[k] for k in keys}
        ok &= good
    if not figures:
        missing += _profile_missing(runs)
    return _verdict("T3", figures, ok, missing)


def t4(runs: list[dict]) -> dict:
    r = _find(runs, forward="segmented", batch=1, cache_ratio=1.0, policy="demand")
    if r is None or r.get("link_busy_over_wall") is None:
        return _verdict("T4", {}, None, ["batch 1, C/W 1, demand, segmented"])
    return _verdict(
        "T4", {"link_busy_over_wall": r["link_busy_over_wall"]}, r["link_busy_over_wall"] >= T4_BUSY
    )


def t5(runs: list[dict], fp32: list[dict] | None = None) -> dict:
    """Counts on every run; tokens on the float32 runs: `fp32` (the fp32_tokens step's rows, and the engine
    rows that ran in float32), or where not given the runs whose dtype is float32 (a row without one:
    float32)."""
    ok_runs = [r for r in runs if "error" not in r]
    tok = [
        r
        for r in (fp32 if fp32 is not None else [r for r in runs if r.get("dtype", "float32") == "float32"])
        if "error" not in r
    ]
    missing = [] if ok_runs else ["an offloaded run"]
    missing += [
        f"the replay of {forward_of(r)} batch {r['batch']} C/W {r['cache_ratio']:g} {r['policy']}"
        for r in ok_runs
        if r.get("counts_equal_replay") is None
    ]  # its recorded run raised
    missing += [] if tok else ["a float32 run's tokens (on a GPU: the graphs check's fp32_tokens step)"]
    other = [r for r in ok_runs if r.get("dtype", "float32") != "float32"]
    figures = {
        "runs": len(ok_runs),
        "runs_with_errors": len(runs) - len(ok_runs),
        "counts_equal_replay": sum(bool(r.get("counts_equal_replay")) for r in ok_runs),
        "float32_runs": len(tok),
        "tokens_equal_resident": sum(bool(r.get("tokens_equal_resident")) for r in tok),
    }
    if other:
        figures["not_judged_bf16_tokens_equal_resident"] = (
            f"{sum(bool(r.get('tokens_equal_resident')) for r in other)} of {len(other)}"
        )
    ok = (
        figures["counts_equal_replay"] == len(ok_runs)
        and figures["tokens_equal_resident"] == len(tok)
        and figures["runs_with_errors"] == 0
    )
    return _verdict("T5", figures, ok, missing)


def t5b(caps: list[dict]) -> dict:
    missing = [
        f"the capped link at {f}x" for f in (0.5, 0.25) if not any(c.get("fraction") == f for c in caps)
    ]
    figures = {
        f"{c['fraction']}x": c["achieved_over_target"] for c in caps if c.get("fraction") in (0.5, 0.25)
    }
    return _verdict("T5b", figures, all(abs(v - 1) <= T5_CAP for v in figures.values()), missing)


def t6(runs: list[dict]) -> dict:
    figures, ok = {}, True
    cells = sorted(
        {(r["batch"], r["cache_ratio"]) for r in runs if forward_of(r) == "segmented" and "batch" in r}
    )
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
        figures[label] = {
            "host_diff_ms": diff,
            "h2d_ms_per_forward": d["h2d_ms_per_forward"],
            "limit_ms": T6_SHARE * d["h2d_ms_per_forward"],
        }
        ok &= diff <= T6_SHARE * d["h2d_ms_per_forward"]
    judged = [v for v in figures.values() if isinstance(v, dict)]
    return _verdict(
        "T6", figures, ok, [] if judged else ["a segmented cell with C < E run under both policies"]
    )


def peak_h2d_gbps(pinned_peak: dict | None) -> float | None:
    """The peak pinned H2D GB/s of a run's pinned_peak step: the best of its measured bandwidths (the 256 MiB
    copy and the expert-sized copies, from a fresh pinned buffer and from the registered store); None if it
    measured none (a dry run on the CPU, a step that failed)."""
    vals = [
        v for k, v in (pinned_peak or {}).items() if "gbps" in k and isinstance(v, (int, float)) and v > 0
    ]
    return max(vals) if vals else None


def t7(runs: list[dict], resident: list[dict], peak_gbps: float | None, expert_bytes: int | None) -> dict:
    """Step wall time against the physical limit at C/W 1, demand, per batch with both rows (batch 1 needed):
    max(compute, misses per forward x expert bytes / peak pinned H2D), all from the same run (T7_COMPUTE)."""
    missing = [] if peak_gbps else ["the peak pinned H2D of this run (pinned_peak)"]
    missing += [] if expert_bytes else ["the expert bytes (engine.expert_bytes)"]
    cells = []
    for b in sorted({r["batch"] for r in runs if "batch" in r} | {1}):
        r = _find(runs, forward="segmented", batch=b, cache_ratio=1.0, policy="demand")
        c = _find([x for x in resident if replayed(x)], forward="segmented", batch=b)
        misses = None if r is None else r.get("demand_misses_denoising", r.get("transfers_denoising"))
        if r is None or r.get("wall_ms_median") is None or not r.get("forwards") or misses is None:
            missing += [] if b != 1 else ["batch 1, C/W 1, demand, segmented: its wall ms and demand misses"]
        elif c is None or c.get("wall_ms_median") is None:
            missing += [] if b != 1 else ["batch 1: a resident segmented run that replayed (the compute)"]
        else:
            cells.append((b, r, c, misses))
    figures, ok = {}, True
    for b, r, c, misses in [] if missing else cells:
        link_ms = 1e3 * misses / r["forwards"] * expert_bytes / (peak_gbps * 1e9)
        limit = max(c["wall_ms_median"], link_ms)
        figures[f"batch {b}, C/W 1"] = {
            "wall_ms_median": r["wall_ms_median"],
            "compute_ms": c["wall_ms_median"],
            "misses_per_forward": misses / r["forwards"],
            "link_ms": link_ms,
            "peak_h2d_gbps": peak_gbps,
            "limit_ms": limit,
            "wall_over_limit": r["wall_ms_median"] / limit,
            "bound": "link" if link_ms >= c["wall_ms_median"] else "compute",
        }
        ok &= r["wall_ms_median"] <= T7_OVER_LIMIT * limit
    return {**_verdict("T7", figures, ok, missing), "note": T7_COMPUTE}


def did_not_replay(runs: list[dict]) -> list[dict]:
    """The segmented rows that ran without error but whose segments did not replay (or carry no counters)."""
    return [
        r
        for r in runs
        if isinstance(r, dict) and "error" not in r and forward_of(r) == "segmented" and not replayed(r)
    ]


def judge(report: dict) -> dict:
    """T1-T7 from a report's engine, capped_link, pinned_peak and fp32_tokens steps, on its rows less those
    that did not replay (module docstring); on a CPU dry run every target is unmeasured and says what the CPU
    figures would give (would_be)."""
    rows = (report.get("engine") or {}).get("runs", [])
    skipped = did_not_replay(rows)
    runs = [r for r in rows if not any(r is x for x in skipped)]
    caps = (report.get("capped_link") or {}).get("caps", [])
    cuda = not report.get("dry_run_on_cpu")
    eng = report.get("engine") or {}
    row_dtype = eng.get("dtype", "bfloat16" if cuda else "float32")  # a report from before rows said
    fp32 = [r for r in runs if r.get("dtype", row_dtype) == "float32"]
    fp32 += [
        r
        for r in (report.get("fp32_tokens") or {}).get("runs", [])
        if not any(r is x for x in did_not_replay([r]))
    ]
    out = {
        "T1": t1(runs),
        "T2": t2(runs),
        "T3": t3(runs, cuda),
        "T4": t4(runs),
        "T5": t5([{"dtype": row_dtype, **r} for r in runs], fp32),
        "T5b": t5b(caps),
        "T6": t6(runs),
        "T7": t7(
            runs, eng.get("resident", []), peak_h2d_gbps(report.get("pinned_peak")), eng.get("expert_bytes")
        ),
    }
    if skipped:
        n = len(skipped)
        note = f"{n} row{'s' if n != 1 else ''} did not replay"
        for name, t in out.items():
            if name == "T5b":  # the capped link: no engine row
                continue
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
    if "would_be" in t:  # a dry run: what the CPU figures would give
        why += [t["why"], f"would be {t['not_judged'] if t.get('not_judged') else t['would_be']}"]
    elif t.get("not_judged"):
        status = t["not_judged"]
    if t.get("did_not_replay") and not t.get("not_judged"):
        why.append(f"{t['did_not_replay']} rows that did not replay left out")
    if t.get("missing"):
        why.append(f"missing: {'; '.join(t['missing'])}")
    extra = f" ({'; '.join(why)})" if why else ""
    return f"{name}: {status}{extra} -- {t['rule']}; figures: {json.dumps(t['figures'], default=str)}"
