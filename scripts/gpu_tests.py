"""The CUDA tests of a GPU run (scripts/gpu_run.sh step 3, scripts/gpu_check.py step 2): an explicit list of
test files that import only what a bare GPU image has (torch, numpy, safetensors, pytest and this
checkout), never the whole tests/ folder, whose other files need packages such an image lacks.

FILES, marked cuda: the CUDA link, the pinned store, the engine on the GPU, the stream on the CUDA link, the
segmented forward's capture. By default (NEW_PATH) only the tests of what changed since the H200 run whose 21
CUDA tests passed (data/gpu_check/h200_cuda_tests.log): the segmented forward's capture and replay, and the
CUDA link's copies (the batched copy, cudaMemcpyBatchAsync); --full runs all of FILES. DESELECTED (--full):
parametrizations left out for time (the "full" decode mode repeats the cached mode's copy path over longer
runs: 82 s of the 175 s the whole list took on one H200). The log is verbose (-v -rA --durations=10): a run
cut short at its time limit still shows which tests passed. Tests that load the tiny checkpoint
(TINY_FIXTURES) need its tokenizer (transformers, tokenizers): where those are not importable they are
deselected and the report says so (`not_run`), never counted as passed.

`python scripts/gpu_tests.py --out DIR --name NAME --timeout S [--full]` runs the step alone:
DIR/NAME_gpu_run_tests.json (atomically) and the pytest output in DIR/NAME_gpu_run_tests.log."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILES = ("tests/test_cuda.py", "tests/test_trace_engine.py")
NEW_PATH = (
    "tests/test_cuda.py::test_segmented_captures_and_replays_whole_recorded_runs_on_cuda",
    "tests/test_cuda.py::test_segmented_equals_eager_on_cuda_except_at_router_near_ties",
    "tests/test_cuda.py::test_segmented_grouped_stage_is_captured_in_bf16_on_cuda",
    "tests/test_cuda.py::test_cuda_link_copies_land_and_are_counted",
)
LOG_ARGS = ("-v", "-rA", "--durations=10")  # each test's outcome on its own line, as it ends
DESELECTED = tuple(
    f"tests/test_cuda.py::test_offloaded_tokens_equal_resident_on_cuda[{p}-full]"
    for p in ("demand", "last_step", "interval_refresh")
)
TINY_FIXTURES = ("tiny", "tiny_cuda", "tiny_prompts")  # tests/conftest.py, tests/test_cuda.py
TINY_NEEDS = ("transformers", "tokenizers")
NO_TINY_ENV = "GPU_TESTS_NO_TINY"  # read by the plugin below (pytest -p gpu_tests)


def missing_for_tiny() -> list[str]:
    """The packages the tiny checkpoint's tokenizer needs that this python cannot import."""
    return [m for m in TINY_NEEDS if importlib.util.find_spec(m) is None]


def command(python: str = sys.executable, full: bool = False) -> list[str]:
    """The pytest command of the step (run in ROOT, with scripts/ on PYTHONPATH for the plugin): NEW_PATH's
    tests, or with `full` all of FILES less DESELECTED."""
    chosen = [*FILES] if full else [*NEW_PATH]
    deselect = [x for d in DESELECTED for x in ("--deselect", d)] if full else []
    return [
        python,
        "-m",
        "pytest",
        *chosen,
        "-m",
        "cuda",
        *LOG_ARGS,
        "-p",
        "no:cacheprovider",
        "-p",
        "gpu_tests",
        *deselect,
    ]


def collect_command(cmd: list[str]) -> list[str]:
    """The collection of `cmd`: its ids one a line (-q in place of the log's -v)."""
    return [x for x in cmd if x not in LOG_ARGS] + ["-q", "--collect-only"]


def pytest_collection_modifyitems(config, items):
    """pytest plugin hook (-p gpu_tests): with NO_TINY_ENV set, deselect the tests that load the tiny
    checkpoint."""
    if not os.environ.get(NO_TINY_ENV):
        return
    drop = [i for i in items if set(getattr(i, "fixturenames", ())) & set(TINY_FIXTURES)]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = [i for i in items if i not in drop]


def run_env(no_tiny: bool) -> dict:
    """The environment of the pytest runs: scripts/ (this plugin) and the checkout on PYTHONPATH; no plugin
    loaded by entry point (an image's own pytest plugins, or one whose imports fail, stay out)."""
    paths = [str(ROOT / "scripts"), str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in paths if p),
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    }
    if no_tiny:
        env[NO_TINY_ENV] = "1"
    return env


def cuda_tests(a, torch) -> dict:
    """Collect, then run, FILES' CUDA tests within a.test_timeout seconds (a.skip_tests: not at all)."""
    if a.skip_tests:
        return {"skipped": "--skip-tests"}
    missing = missing_for_tiny()
    full = bool(getattr(a, "full", True))
    env, base = run_env(bool(missing)), command(full=full)
    out = {
        "command": " ".join(base[1:]),
        "selection": "full" if full else "new path",
        "files": list(FILES) if full else list(NEW_PATH),
        "deselected_for_time": list(DESELECTED) if full else [],
        "not_run": (
            {"tests that load the tiny checkpoint": f"{', '.join(missing)} not importable"} if missing else {}
        ),
    }
    t0 = time.perf_counter()
    try:
        c = subprocess.run(
            collect_command(base), cwd=ROOT, capture_output=True, text=True, timeout=a.test_timeout, env=env
        )
    except subprocess.TimeoutExpired:
        return {**out, "collected": None, "collection_ok": False, "ok": False, "timed_out": True}
    collected = sum(1 for ln in c.stdout.splitlines() if "::" in ln)
    if c.returncode not in (0, 5) or collected == 0:
        return {
            **out,
            "command": " ".join(collect_command(base)[1:]),
            "returncode": c.returncode,
            "collected": collected,
            "collection_ok": False,
            "ok": False,
            "tail": (c.stdout + c.stderr)[-2000:],
        }
    try:
        p = subprocess.run(
            base,
            cwd=ROOT,
            capture_output=True,
            text=True,
            env=env,
            timeout=max(1, a.test_timeout - (time.perf_counter() - t0)),
        )
    except subprocess.TimeoutExpired as e:
        tail = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return {
            **out,
            "returncode": None,
            "timed_out": True,
            "ok": False,
            "collected": collected,
            "collection_ok": True,
            "seconds": time.perf_counter() - t0,
            "passed_before_the_limit": passed_ids(tail),
            "tail": tail[-2000:],
            "log": tail,
        }
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
    summary = next(
        (ln for ln in reversed(lines) if re.search(r"passed|failed|error|skipped|deselected", ln)), ""
    )
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", summary)}
    ran = counts.get("passed", 0) + counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
    return {
        **out,
        "returncode": p.returncode,
        "timed_out": False,
        "collected": collected,
        "collection_ok": True,
        "ran": ran,
        "counts": counts,
        # on a GPU a skipped CUDA test did not run (it skipped for a reason the report must show)
        "all_ran": ran + (0 if torch.cuda.is_available() else counts.get("skipped", 0)) >= collected,
        "ok": p.returncode == 0,
        "summary": summary.strip("= "),
        "tail": (p.stdout + p.stderr)[-2000:],
        "log": p.stdout + p.stderr,
    }


def passed_ids(log: str) -> list[str]:
    """The test ids a verbose (-v) log shows as passed: what a run cut short still proved."""
    return re.findall(r"^(\S+::\S+) PASSED", log, re.M)


def verdict(r: dict) -> str:
    """One line: what the step showed."""
    if r.get("skipped"):
        return f"skipped: {r['skipped']}"
    if not r.get("collection_ok"):
        return "not run: the tests could not be collected" + (" (timed out)" if r.get("timed_out") else "")
    if r.get("timed_out"):
        return (
            f"timed out after collecting {r['collected']}; "
            f"{len(r.get('passed_before_the_limit') or [])} passed before the limit (the log names them)"
        )
    c = r.get("counts", {})
    if r.get("ran", 0) == 0:
        return f"none ran: {c.get('skipped', 0)} skipped (no CUDA GPU visible)"
    head = "passed" if r["ok"] and r["all_ran"] else "FAILED" if not r["ok"] else "not all ran"
    left = (
        "; not run: " + "; ".join(f"{k} ({v})" for k, v in r["not_run"].items()) if r.get("not_run") else ""
    )
    return f"{head}: {r.get('summary', '')}{left}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="folder for NAME_gpu_run_tests.json and .log")
    ap.add_argument("--name", default="gpu", help="the files' prefix (scripts/gpu_run.sh: --name)")
    ap.add_argument("--timeout", type=int, default=150, help="seconds for collection and the run together")
    ap.add_argument("--full", action="store_true", help="all of FILES' CUDA tests (default: NEW_PATH's)")
    a = ap.parse_args(argv)
    if a.timeout < 1:
        ap.error(f"--timeout must be >= 1 s, got {a.timeout}")
    import torch

    from artifact.paths import atomic_write_text

    a.skip_tests, a.test_timeout = False, a.timeout
    r = cuda_tests(a, torch)
    log = r.pop("log", None)
    if log is not None:
        atomic_write_text(a.out / f"{a.name}_gpu_run_tests.log", log)
    r["verdict"] = verdict(r)
    atomic_write_text(a.out / f"{a.name}_gpu_run_tests.json", json.dumps(r, indent=2))
    print(f"cuda tests: {r['verdict']}", flush=True)
    return 0 if r.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
