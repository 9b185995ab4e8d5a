"""Exact counts are exact everywhere.

The committed exact-count outputs of the cpu profile (01, 02, 06's counts, 07's map, 09's sweep and its
libCacheSim check) are recomputed from the committed code and the committed traces (data/results/cpu/traces/)
and compared with the committed files value for value: a stale reference fails here (tests/helpers_counts.py).
The same count paths run in subprocesses under another PYTHONHASHSEED, another thread count and numpy's SIMD
dispatch restricted to its baseline, and give the same bits. Recording a trace is not part of these paths: it
runs the model in float32 through torch's kernels, whose rounding depends on the CPU and the thread count, and
the tiny model has top-k choices decided by one ulp; that is why the traces are committed (docs/DESIGN.md,
"Exact counts"). Below, the ties the cache could meet are broken by expert id, and LRFU's decay is the same
float on every machine.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import helpers_counts as hc
import numpy as np
import pytest

from artifact.experiments import harness
from artifact.experiments.settings import load_profile
from artifact.model.routing import StepInfo
from artifact.offload.backend.cache import ExpertCache
from artifact.offload.policy.eviction import LRFU, decays
from artifact.offload.policy.eviction_base import Eviction
from artifact.offload.policy.policies import make_policy
from artifact.offload.replay.trace import Trace

FIXTURE = Path(__file__).parent / "fixtures" / "tiny-gsm8k-b1.safetensors"


# --- the committed reference, recomputed ------------------------------------------------------------------
@pytest.fixture(scope="module")
def fresh():
    P = hc.settings()
    return hc.recompute(
        hc.committed_traces(P), P, tuple(n for n in hc.OUTPUTS if n != "09_libcachesim_check")
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in hc.OUTPUTS if n != "09_libcachesim_check"])
def test_each_committed_count_output_equals_a_fresh_computation(fresh, name):
    assert hc.differences(name, fresh[name]) == []


@pytest.mark.slow
def test_the_committed_libcachesim_check_equals_a_fresh_one():
    pytest.importorskip("libcachesim")
    P = hc.settings()
    got = hc.recompute(hc.committed_traces(P), P, ("09_libcachesim_check",))["09_libcachesim_check"]
    assert hc.differences("09_libcachesim_check", got) == []
    assert got.measured[0].startswith("0 of ")  # and libCacheSim agrees on every request


def test_a_changed_count_is_reported_value_for_value():
    ref = hc.committed("09_cache_design_space")
    changed = ref.copy()
    row = changed.index[(changed.policy == "cross_layer+lrfu:lam=2") & (changed.cache_ratio == 0.43)][0]
    changed.loc[row, "speculative_transfers"] -= 1
    (diff,) = hc.differences("09_cache_design_space", changed)
    assert (
        "cross_layer+lrfu:lam=2" in diff
        and f"speculative_transfers = {ref.speculative_transfers[row] - 1}" in diff
    )
    assert hc.differences("09_cache_design_space", ref) == []
    assert hc.differences("09_cache_design_space", changed.iloc[1:]) == [
        f"09_cache_design_space: {len(ref) - 1} rows != committed {len(ref)}"
    ]


# --- the same bits under other environments -----------------------------------------------------------------
def _dispatched_features() -> list[str]:
    """numpy's dispatched SIMD targets this CPU has: disabling them all leaves numpy its baseline."""
    core = getattr(np, "_core", None) or np.core
    umath = core._multiarray_umath
    return [f for f in umath.__cpu_dispatch__ if umath.__cpu_features__.get(f)]


def _run_counts(tmp: Path, env: dict) -> dict:
    """helpers_counts.py in a subprocess under `env` (over a copy of this one): its outputs and its
    runtime."""
    full = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(hc.REPO), os.environ.get("PYTHONPATH", "")]),
        **env,
    }
    names = [n for n in hc.OUTPUTS if n != "09_libcachesim_check"]
    subprocess.run(
        [sys.executable, str(Path(hc.__file__)), str(tmp), *names],
        env=full,
        check=True,
        cwd=hc.REPO,
        timeout=300,
    )
    runtime = json.loads((tmp / "runtime.json").read_text())
    return {"runtime": runtime, "outputs": {n: (tmp / f"{n}.csv").read_bytes() for n in names}}


BASE = {
    "PYTHONHASHSEED": "0",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "COUNTS_TORCH_THREADS": "1",
    "NPY_DISABLE_CPU_FEATURES": "",
}
VARIANTS = {
    "hash seed": {"PYTHONHASHSEED": "12345"},
    "threads": {
        "OMP_NUM_THREADS": "2",
        "MKL_NUM_THREADS": "2",
        "OPENBLAS_NUM_THREADS": "2",
        "COUNTS_TORCH_THREADS": "2",
    },
    "numpy baseline SIMD": {"NPY_DISABLE_CPU_FEATURES": "<dispatched>"},
}


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    return _run_counts(tmp_path_factory.mktemp("base"), BASE)


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_count_paths_give_the_same_bits_under_another_environment(base_run, tmp_path, variant):
    env = {**BASE, **VARIANTS[variant]}
    if env["NPY_DISABLE_CPU_FEATURES"] == "<dispatched>":
        off = _dispatched_features()
        if not off:
            pytest.skip(
                "numpy dispatches no SIMD target beyond its baseline on this CPU: nothing to restrict"
            )
        env["NPY_DISABLE_CPU_FEATURES"] = " ".join(off)
    run = _run_counts(tmp_path, env)
    base, now = base_run["runtime"], run["runtime"]
    # the variation took effect
    if variant == "hash seed":
        assert now["str_hash"] != base["str_hash"]
    elif variant == "threads":
        assert (base["torch_threads"], now["torch_threads"]) == (1, 2)
    else:
        assert base["numpy_simd"] and not set(now["numpy_simd"]) & set(
            env["NPY_DISABLE_CPU_FEATURES"].split()
        )
    differ = [n for n, data in run["outputs"].items() if data != base_run["outputs"][n]]
    assert differ == [], f"{variant}: {differ} differ from the run under {BASE}"


# --- ties ---------------------------------------------------------------------------------------------------
class _AllEqual(Eviction):
    """Every resident has the same victim key: the cache's tie rule alone decides."""

    name = "all_equal_test"

    def victim_keys(self, i, residents):
        return np.zeros(len(residents), dtype=np.int64)


@pytest.mark.parametrize("first", [[5, 1, 7, 3], [3, 7, 1, 5]])
def test_equal_victim_keys_evict_the_lowest_expert_id_first_whatever_the_slots(first):
    pol = make_policy("demand", 1, 16)
    pol.eviction = _AllEqual(1, 16)
    cache = ExpertCache([0], 16, 4, pol, 1)
    step = StepInfo(forward=0, block=0, block_step=1, kind="denoise")
    for e in first:  # fill the slots in this order
        cache.plan(0, np.array([e]), np.array([1]), step, 2)
    plan, _ = cache.plan(0, np.array([9, 10]), np.array([1, 1]), step, 2)
    assert plan.load_victims.tolist() == [1, 3]
    assert _AllEqual(1, 16).victim_order(0, np.array([7, 2, 5])).tolist() == [2, 5, 7]


def test_lrfu_decays_are_correctly_rounded_powers_of_two_so_equal_scores_tie():
    whole = decays(2, 600)
    assert all(whole[d] == (2.0 ** (-2 * d) if 2 * d <= 1074 else 0.0) for d in range(601))
    half = decays(0.5, 500)
    assert all(half[2 * k] == 2.0**-k for k in range(250))
    # 2 tokens two forwards earlier score exactly 1 token now: the scores tie and LRU decides
    assert all(2 * half[d + 2] == half[d] for d in range(400))
    assert half[1] == float.fromhex("0x1.6a09e667f3bcdp-1")  # 2**-0.5, correctly rounded
    assert decays(0.0, 10)[:11].tolist() == [1.0] * 11 and decays(2000.0, 3)[1:4].tolist() == [0.0] * 3


def test_lrfu_scores_use_the_decay_table():
    ev = LRFU(1, 8, lam=0.5)
    step = StepInfo(forward=0, block=0, block_step=1, kind="denoise")
    ev.demanded(0, np.array([1, 2]), np.array([2, 1]), np.array([False, False]), step)
    ev.demanded(0, np.array([3]), np.array([1]), np.array([False]), step)
    ev.demanded(0, np.array([2]), np.array([1]), np.array([True]), step)
    row = ev.current_row(0)
    assert (
        row[1] == 2 * decays(0.5, 2)[2] == 1.0
        and row[2] == decays(0.5, 2)[2] + 1
        and row[3] == decays(0.5, 1)[1]
    )


# --- the reference traces -----------------------------------------------------------------------------------
def _as_current(P, task: str, batch: int, dest: Path, mark: str) -> Path:
    """The fixture trace relabelled as P's trace of (task, batch) (its settings' fingerprint, prompts)."""
    from artifact.experiments.settings import fingerprint
    from artifact.model.tasks import select

    t = Trace.load(FIXTURE)
    t.meta.update(
        profile_fingerprint=fingerprint(P, harness.TRACE_SETTINGS),
        batch_size=batch,
        mark=mark,
        prompt_ids=[r["id"] for r in select(task, P.trace_n_prompts, P.seed)],
    )
    return t.save(dest)


def test_the_committed_reference_trace_comes_first_and_store_writes_only_a_missing_one(tmp_path, monkeypatch):
    (tmp_path / "tasks").symlink_to((hc.REPO / "data" / "tasks").resolve(), target_is_directory=True)
    monkeypatch.setenv("ARTIFACT_DATA", str(tmp_path))
    P = load_profile("cpu", {"trace_tasks": ["gsm8k"], "trace_batch_sizes": [1]})
    own, ref = harness.trace_path(P, "gsm8k", 1), harness.reference_trace_path(P, "gsm8k", 1)
    assert ref == tmp_path / "results" / "cpu" / "traces" / "gsm8k-b1.safetensors"
    _as_current(P, "gsm8k", 1, own, "own")
    assert harness.current_trace(P, "gsm8k", 1).meta["mark"] == "own"
    assert harness.store_traces(P) == 1 and ref.read_bytes() == own.read_bytes()
    _as_current(P, "gsm8k", 1, own, "own, later")
    assert harness.store_traces(P) == 0  # a current reference stays
    assert harness.current_trace(P, "gsm8k", 1).meta["mark"] == "own"
    assert [t.meta["mark"] for t in harness.traces(P, progress=False)] == ["own"]
    other = load_profile("cpu", {"trace_tasks": ["gsm8k"], "trace_batch_sizes": [1], "threshold": 0.9})
    assert harness.current_trace(other, "gsm8k", 1) is None  # another setting: neither is current
