"""The first and last steps of scripts/gpu_run.sh: `environment` (what this machine and python have) and
`summary` (the steps' results, T1-T6 with their verdicts, the reports to commit). Both write their JSON
under --out atomically; the shell script runs each under `timeout` and records its exit.

  python scripts/gpu_run.py environment --out DIR --name NAME [--dry-run]
  python scripts/gpu_run.py summary --out DIR --name NAME [--dry-run]

Exit codes: 0 done; 2 bad arguments; 3 (environment) no CUDA GPU visible on a run that is not --dry-run."""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_targets import did_not_replay, judge, line  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
STEPS = ("environment", "cuda_tests", "graphs", "summary")
PACKAGES = ("torch", "numpy", "safetensors", "pytest", "transformers", "tokenizers", "pandas")
EXIT_NO_GPU = 3


def names(out: Path, name: str) -> dict:
    """The files a run writes under --out: one JSON per step (the shell script's record of it), the graphs
    check's report, the CUDA tests' JSON and log, the environment and the summary."""
    return {"step": lambda step: out / f"{name}_gpu_run.{step}.json",
            "graphs": out / f"{name}_graphs.json", "tests_json": out / f"{name}_gpu_run_tests.json",
            "tests_log": out / f"{name}_gpu_run_tests.log", "environment": out / f"{name}_gpu_run_environment.json",
            "summary": out / f"{name}_gpu_run_summary.json"}


def environment(a) -> int:
    import torch

    from artifact.offload.cuda_batch import NO_BATCH_ENV
    from artifact.paths import atomic_write_text
    cuda = torch.cuda.is_available()
    env = {"python": sys.executable, "python_version": platform.python_version(),
           "venv": str(ROOT / ".venv") if sys.prefix == str(ROOT / ".venv") else None,
           "torch": torch.__version__, "cuda_runtime": torch.version.cuda, "cuda_available": cuda,
           "device": torch.cuda.get_device_name() if cuda else "cpu", "dry_run": a.dry_run,
           "packages": {p: importlib.util.find_spec(p) is not None for p in PACKAGES},
           NO_BATCH_ENV: os.environ.get(NO_BATCH_ENV)}
    if cuda:
        free, total = torch.cuda.mem_get_info()
        env.update(capability=list(torch.cuda.get_device_capability()), free_bytes=free, total_bytes=total)
    atomic_write_text(names(a.out, a.name)["environment"], json.dumps(env, indent=2))
    print(f"environment: python {env['python_version']} ({'the checkout .venv' if env['venv'] else sys.executable}), "
          f"torch {env['torch']}, CUDA {env['cuda_runtime']}, device {env['device']}", flush=True)
    print("packages: " + ", ".join(f"{p} {'yes' if ok else 'no'}" for p, ok in env["packages"].items()), flush=True)
    if not a.dry_run and not cuda:
        print("gpu_run: no CUDA GPU visible (torch.cuda.is_available() is False); nothing else runs. "
              "--dry-run runs the steps on the CPU.", file=sys.stderr, flush=True)
        return EXIT_NO_GPU
    if cuda and a.name.lower() not in env["device"].lower().replace(" ", ""):
        print(f"note: the GPU is {env['device']}, and the reports are named {a.name}_*: pass --name to name them "
              "after this GPU", flush=True)
    return 0


def read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def summary(a) -> int:
    from artifact.paths import atomic_write_text
    n = names(a.out, a.name)
    steps = {s: read(n["step"](s)) for s in STEPS[:-1]}
    tests = read(n["tests_json"]) or {}
    report = read(n["graphs"])
    print("steps:", flush=True)
    for s, r in steps.items():
        state = ("not run" if r is None else f"timed out after its {r['budget_s']} s" if r["timed_out"]
                 else f"exit {r['rc']}")
        print(f"  {s}: {state}" + (f" in {r['seconds']:.0f} s" if r else ""), flush=True)
    print(f"cuda tests: {tests.get('verdict', 'no result (the step wrote none)')}", flush=True)
    out = {"steps": steps, "cuda_tests": tests.get("verdict"), "targets": None, "rows_not_replayed": None}
    if report is None:
        print("graphs check: no report; T1-T6 unmeasured", flush=True)
        for t in ("T1", "T2", "T3", "T4", "T5", "T6"):
            print(f"{t}: unmeasured (the graphs check wrote no report)", flush=True)
    else:
        targets = judge(report)              # from the rows on disk: also those of a step cut short
        runs = (report.get("engine") or {}).get("runs", [])
        out["targets"], out["rows_not_replayed"] = targets, len(did_not_replay(runs))
        print(f"graphs check: {len(runs)} offloaded rows, {out['rows_not_replayed']} of them segmented rows that "
              "did not replay" + ("" if "targets" in report else " (the step did not finish: judged on the rows "
                                                                  "written before it ended)"), flush=True)
        for name, t in targets.items():
            print(line(name, t), flush=True)
    own = (n["summary"], n["step"]("summary"))         # written as this step ends
    files = [p for p in (n["environment"], *(n["step"](s) for s in STEPS[:-1]), n["tests_json"], n["tests_log"],
                         n["graphs"], *own) if p.exists() or p in own]
    out["reports"] = [str(p) for p in files]
    atomic_write_text(n["summary"], json.dumps(out, indent=2, default=str))
    if a.dry_run:
        print(f"dry run on the CPU: nothing to commit (its files: {a.out})", flush=True)
    else:
        print("reports to commit:", flush=True)
        for p in files:
            print(f"  {p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}", flush=True)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=("environment", "summary"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--name", required=True, help="the reports' name prefix (h200: data/gpu_check/h200_graphs.json)")
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    if not a.name.replace("-", "").replace("_", "").isalnum():
        ap.error(f"--name must be letters, digits, - or _, got {a.name!r}")
    return environment(a) if a.step == "environment" else summary(a)


if __name__ == "__main__":
    sys.exit(main())
