"""The helpers of scripts/gpu_run.sh: `card` (the GPU's short name from nvidia-smi's, checked against --name),
`environment` (what this machine and python have; the name checked against torch's device name) and `summary`
(the steps' results, T1-T7 with their verdicts, one archive of the run's files, the reports to commit).
environment and summary write their JSON under --out atomically; the shell script runs each under `timeout`
and records its exit in NAME_gpu_run.steps.jsonl, one line per step.

  python scripts/gpu_run.py args [GPU_RUN_ARGS ...] checks gpu_run.sh's arguments, prints them as shell
                                                    assignments (one line on stderr and exit 2 if bad)
  python scripts/gpu_run.py card [--name NAME]      reads nvidia-smi's GPU names on stdin, prints the name
  python scripts/gpu_run.py environment --out DIR --name NAME [--dry-run]
  python scripts/gpu_run.py summary --out DIR --name NAME [--dry-run]

What a run leaves under --out fits a borrowed GPU machine's return (MAX_FILES files, none in a folder): the
environment, the step records, the graphs report, the CUDA tests' JSON and log, the summary, and one archive
of all of them (NAME_gpu_run.tar.gz); a file beyond MAX_FILES would be left out of the folder (it stays in the
archive), the least needed first. Temporary files of an atomic write that was killed are removed.

`args` refuses, before anything is written: a flag it does not know, one without its value or given twice, a
budget that is not a whole number of seconds in [1, MAX_BUDGET_S] (artifact.validate.check_number; no sign, no
leading zero), an --out that is a file or cannot be written, and a dry run whose --out holds this name's files
from a real run (a dry run never writes over a measurement; real_run_files). `environment` refuses (no CUDA
GPU, or a GPU that is not --name) before it writes anything, so a run that stops there leaves --out as it was.

Exit codes: 0 done; 2 bad arguments, or a --name that is not the GPU's; 3 (environment) no CUDA GPU visible on
a run that is not --dry-run."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import shlex
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(1, str(ROOT))  # the artifact package (its validator), run from any folder
STEPS = ("environment", "graphs", "cuda_tests", "summary")  # the order they run: the graphs check first
PACKAGES = ("torch", "numpy", "safetensors", "pytest", "transformers", "tokenizers", "pandas")
EXIT_USAGE, EXIT_NO_GPU = 2, 3
MAX_FILES = 8  # what a borrowed GPU machine returns of its output folder (at most two folders deep)
VENDOR_WORDS = {"nvidia", "tesla", "geforce", "quadro", "rtx", "gtx"}


def names(out: Path, name: str) -> dict:
    """The files a run writes under --out: the step records (the shell script's, one JSON line per step), the
    graphs check's report, the CUDA tests' JSON and log, the environment, the summary and the archive."""
    return {
        "steps": out / f"{name}_gpu_run.steps.jsonl",
        "graphs": out / f"{name}_graphs.json",
        "tests_json": out / f"{name}_gpu_run_tests.json",
        "tests_log": out / f"{name}_gpu_run_tests.log",
        "environment": out / f"{name}_gpu_run_environment.json",
        "summary": out / f"{name}_gpu_run_summary.json",
        "archive": out / f"{name}_gpu_run.tar.gz",
    }


# In the order a file is kept beside the archive when the folder holds too many: the summary and the archive
# first, then what the performance model reads (the graphs report), then the rest.
KEEP_ORDER = ("summary", "archive", "graphs", "tests_json", "steps", "environment", "tests_log")


# --- gpu_run.sh's arguments ----------------------------------------------------------------------------
KILL_S = 5  # timeout's grace after a step's budget, for a step that ignores the TERM
MAX_BUDGET_S = 86_400  # a day: far beyond any step, and far from the shell's 64-bit arithmetic
BUDGET_FLAGS = {
    "--budget-environment": "B_ENV",
    "--budget-graphs": "B_GRAPHS",
    "--budget-tests": "B_TESTS",
    "--budget-summary": "B_SUMMARY",
}
DEFAULT_BUDGETS = {  # by --full: environment, graphs, cuda_tests, summary
    False: {"B_ENV": 60, "B_GRAPHS": 140, "B_TESTS": 60, "B_SUMMARY": 15},
    True: {"B_ENV": 60, "B_GRAPHS": 260, "B_TESTS": 180, "B_SUMMARY": 15},
}
# by --dry-run; under the ignored results/ (.gitignore): no run writes into the checkout's tracked folders
DEFAULT_OUT = {False: "results/gpu_run", True: "results/gpu_run_dry"}
VALUE_FLAGS = {"--out": "a folder", "--name": "a name", **{f: "seconds" for f in BUDGET_FLAGS}}
SWITCHES = {"--dry-run": "DRY", "--full": "FULL", "--show-budgets": "SHOW", "-h": "HELP", "--help": "HELP"}
EXPECTED = "expected --out DIR, --name NAME, --dry-run, --full, --budget-STEP S, --show-budgets"


class UsageError(Exception):
    """A bad argument of gpu_run.sh: one line on stderr, exit 2."""


def seconds(flag: str, text: str) -> int:
    """A budget: a whole number of seconds in [1, MAX_BUDGET_S], written as plain digits (no sign, no leading
    zero: bash would read 08 as octal)."""
    from artifact.errors import SettingError
    from artifact.validate import check_number

    if not re.fullmatch(r"0|[1-9][0-9]*", text):
        raise UsageError(
            f"{flag} needs a whole number of seconds (digits, no sign or leading zero), got {text!r}"
        )
    if len(text) > len(str(MAX_BUDGET_S)) + 1:  # never parsed: an over-long integer is out of range anyway
        raise UsageError(f"{flag} (seconds) must be in [1, {MAX_BUDGET_S}], got a {len(text)}-digit number")
    try:
        return check_number(f"{flag} (seconds)", int(text), low=1, high=MAX_BUDGET_S, integer=True)
    except SettingError as e:
        raise UsageError(str(e)) from None


def real_run_files(out: Path, name: str) -> list[Path]:
    """This name's run files under `out` that a real run (not a dry run) wrote: the graphs report unless it
    says dry_run_on_cpu, every other file unless the environment beside it says dry_run (a file whose origin
    cannot be told counts as measured)."""
    n = names(out, name)
    env, graphs = read(n["environment"]), read(n["graphs"])
    env_dry = isinstance(env, dict) and env.get("dry_run") is True
    graphs_dry = isinstance(graphs, dict) and graphs.get("dry_run_on_cpu") is True
    return [p for k, p in n.items() if p.exists() and not (graphs_dry if k == "graphs" else env_dry)]


def check_out(out: Path) -> None:
    """--out is a folder (or can be made one) that this user can write in: a temporary file is created and
    removed in it, or in its nearest existing parent, so nothing is left behind."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {str(out)!r} is a file, not a folder")
    where = out
    while not where.exists():
        where = where.parent
    if not where.is_dir():
        raise UsageError(f"--out {str(out)!r}: {str(where)!r} is a file, not a folder")
    try:
        fd, probe = tempfile.mkstemp(dir=where, prefix=".gpu_run_probe.", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:  # EACCES, EROFS, ENAMETOOLONG, ...
        raise UsageError(
            f"--out {str(out)!r}: cannot write there ({e.strerror or e}); choose another folder"
        ) from None


def parse_run_args(argv: list[str], cwd: Path) -> dict:
    """gpu_run.sh's arguments -> the shell's variables (OUT absolute, not created; budgets and their TOTAL),
    or a UsageError naming the first bad one. A relative --out is the caller's (cwd), the default the
    checkout's."""
    v = {"OUT": "", "NAME": "", "DRY": 0, "FULL": 0, "SHOW": 0, "HELP": 0}
    given: dict[str, str] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in SWITCHES:
            v[SWITCHES[a]], i = 1, i + 1
            continue
        if a not in VALUE_FLAGS:
            raise UsageError(f"unknown argument {a!r}; {EXPECTED}")
        if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
            got = f", got the flag {argv[i + 1]!r}" if i + 1 < len(argv) else ""
            raise UsageError(f"{a} needs {VALUE_FLAGS[a]}{got}")
        if a in given:
            raise UsageError(f"{a} given twice ({given[a]!r} and {argv[i + 1]!r})")
        given[a], i = argv[i + 1], i + 2
    if v["HELP"]:
        return v
    budgets = dict(DEFAULT_BUDGETS[bool(v["FULL"])])
    for flag, key in BUDGET_FLAGS.items():
        if flag in given:
            budgets[key] = seconds(flag, given[flag])
    v.update(budgets, KILL_S=KILL_S, TOTAL=sum(budgets.values()) + len(budgets) * KILL_S)
    name = given.get("--name", "")
    if "--name" in given and not re.fullmatch(r"[A-Za-z0-9_-]{1,32}", name):
        raise UsageError(f"--name must be letters, digits, - or _ (1 to 32 of them), got {name!r}")
    v["NAME"] = name
    if v["SHOW"]:
        return v
    if "--out" in given and not given["--out"]:
        raise UsageError("--out needs a folder, got ''")
    out = cwd / given["--out"] if "--out" in given else ROOT / DEFAULT_OUT[bool(v["DRY"])]
    out = Path(os.path.abspath(out))
    check_out(out)
    if v["DRY"]:
        measured = real_run_files(out, name or "cpu") if out.is_dir() else []
        if measured:
            raise UsageError(
                f"--out {str(out)!r} holds {measured[0].name}, written by a real run: a dry run never writes "
                "over it; give the dry run another --out (or --name)"
            )
    v["OUT"] = str(out)
    return v


def run_args(argv: list[str]) -> int:
    """`args`: gpu_run.sh's arguments checked, printed as shell assignments for its eval."""
    try:
        v = parse_run_args(argv, Path.cwd())
    except UsageError as e:
        print(f"gpu_run: {e}", file=sys.stderr)
        return EXIT_USAGE
    for k, x in v.items():
        print(f"{k}={shlex.quote(str(x))}")
    return 0


# --- the GPU's name ---------------------------------------------------------------------------------
def card_name(device: str) -> str:
    """The short, lower-case name of a GPU from nvidia-smi's (or torch.cuda.get_device_name's) full one:
    "NVIDIA H200" -> h200, "NVIDIA H100 80GB HBM3" -> h100, "NVIDIA RTX A5000" -> a5000, "NVIDIA
    A100-SXM4-80GB"
    -> a100, "NVIDIA GeForce RTX 4090" -> rtx4090 (a bare number keeps the word before it); "" if none."""
    words = [w for w in re.split(r"[\s_]+", device.strip()) if w]
    for i, w in enumerate(words):
        head = w.split("-")[0].lower()
        if w.lower() in VENDOR_WORDS or not re.search(r"\d", head) or re.fullmatch(r"\d+(gb|g)", head):
            continue
        if head.isdigit() and i > 0:
            head = words[i - 1].lower() + head
        return re.sub(r"[^a-z0-9]", "", head)
    return ""


def card(a) -> int:
    """nvidia-smi's GPU names (one a line, on stdin) -> the name printed on stdout; with --name, a name that
    is not the GPU's is refused (one line on stderr, exit 2)."""
    found = [card_name(ln) for ln in sys.stdin.read().splitlines() if ln.strip()]
    found = [f for f in found if f]
    if not found:
        print("gpu_run: nvidia-smi named no GPU", file=sys.stderr)
        return EXIT_USAGE
    if a.name and a.name.lower() != found[0]:
        print(
            f"gpu_run: --name {a.name} but the GPU is {found[0]} (nvidia-smi): "
            f"the reports would be named after the wrong card; drop --name or pass --name {found[0]}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    print(found[0])
    return 0


def environment(a) -> int:
    import torch

    from artifact.offload.links.cuda_batch import NO_BATCH_ENV
    from artifact.paths import atomic_write_text

    cuda = torch.cuda.is_available()
    env = {
        "python": sys.executable,
        "python_version": platform.python_version(),
        "venv": str(ROOT / ".venv") if sys.prefix == str(ROOT / ".venv") else None,
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "cuda_available": cuda,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "dry_run": a.dry_run,
        "packages": {p: importlib.util.find_spec(p) is not None for p in PACKAGES},
        NO_BATCH_ENV: os.environ.get(NO_BATCH_ENV),
    }
    if cuda:
        free, total = torch.cuda.mem_get_info()
        env.update(capability=list(torch.cuda.get_device_capability()), free_bytes=free, total_bytes=total)
    print(
        f"environment: python {env['python_version']} "
        f"({'the checkout .venv' if env['venv'] else sys.executable}), "
        f"torch {env['torch']}, CUDA {env['cuda_runtime']}, device {env['device']}",
        flush=True,
    )
    print(
        "packages: " + ", ".join(f"{p} {'yes' if ok else 'no'}" for p, ok in env["packages"].items()),
        flush=True,
    )
    # the refusals first: a run that stops here writes nothing (--out stays as it was)
    if not a.dry_run and not cuda:
        print(
            f"gpu_run: no CUDA GPU visible (torch.cuda.is_available() is False); nothing written under "
            f"{a.out}, nothing else runs. --dry-run runs the steps on the CPU.",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_NO_GPU
    if cuda and not a.dry_run and card_name(env["device"]) != a.name.lower():
        print(
            f"gpu_run: the reports are named {a.name}_* but the GPU is {card_name(env['device'])} "
            f"({env['device']}); pass --name {card_name(env['device'])}",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_USAGE
    a.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(names(a.out, a.name)["environment"], json.dumps(env, indent=2))
    return 0


def read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def read_steps(path: Path) -> dict:
    """The step records (one JSON object a line; a line cut short by a kill is skipped), by step."""
    out = {}
    try:
        text = path.read_text()
    except OSError:
        return out
    for ln in text.splitlines():
        try:
            r = json.loads(ln)
        except json.JSONDecodeError:
            continue
        if isinstance(r, dict) and "step" in r:
            out[r["step"]] = r
    return out


def leftover_tmp(out: Path, name: str) -> list[Path]:
    """Temporary files of atomic writes under `out` that a kill left behind: artifact.paths' hidden
    .FILE.XXXX.tmp and the shell's FILE.tmp, of this run's name."""
    return sorted({*out.glob(f".{name}_*.tmp"), *out.glob(f"{name}_*.tmp")})


def pack(out: Path, name: str) -> tuple[Path, list[Path]]:
    """One archive (NAME_gpu_run.tar.gz, written atomically) of the run's files under `out`, then the files
    beside it cut to MAX_FILES (KEEP_ORDER: the least needed leave the folder first; they stay in the
    archive). Returns the archive and the files left beside it."""
    from artifact.paths import atomic_write_bytes

    n = names(out, name)
    members = [n[k] for k in KEEP_ORDER if k != "archive" and n[k].exists()]
    tmp = out / f".{name}_gpu_run.tar.gz.build.tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        for p in members:
            tar.add(p, arcname=f"{name}_gpu_run/{p.name}")
    atomic_write_bytes(n["archive"], tmp.read_bytes())
    tmp.unlink()
    for p in leftover_tmp(out, name):
        p.unlink(missing_ok=True)
    ours = [n[k] for k in KEEP_ORDER if n[k].exists()]
    others = [p for p in out.iterdir() if p not in ours]
    if others:
        print(
            f"note: {out} holds {len(others)} other entries: "
            f"a borrowed GPU machine returns at most {MAX_FILES} files of its output folder "
            "(give this run an empty --out there)",
            flush=True,
        )
    excess = len(ours) - MAX_FILES  # this run's files; the others are not this run's to remove
    for p in reversed(ours[2:]):  # never the summary nor the archive
        if excess <= 0:
            break
        p.unlink()
        excess -= 1
    return n["archive"], [p for p in ours if p.exists()]


def summary(a) -> int:
    from gpu_targets import did_not_replay, judge, line

    from artifact.paths import atomic_write_text

    n = names(a.out, a.name)
    steps = {s: None for s in STEPS[:-1]} | {
        s: r for s, r in read_steps(n["steps"]).items() if s != "summary"
    }
    tests = read(n["tests_json"]) or {}
    report = read(n["graphs"])
    print("steps:", flush=True)
    for s, r in steps.items():
        state = (
            "not run"
            if r is None
            else f"timed out after its {r['budget_s']} s"
            if r["timed_out"]
            else f"exit {r['rc']}"
        )
        print(f"  {s}: {state}" + (f" in {r['seconds']:.0f} s" if r else ""), flush=True)
    print(f"cuda tests: {tests.get('verdict', 'no result (the step wrote none)')}", flush=True)
    out = {"steps": steps, "cuda_tests": tests.get("verdict"), "targets": None, "rows_not_replayed": None}
    if report is None:
        print("graphs check: no report; T1-T7 unmeasured", flush=True)
        from gpu_targets import RULES

        for t in RULES:
            print(f"{t}: unmeasured (the graphs check wrote no report)", flush=True)
    else:
        targets = judge(report)  # from the rows on disk: also those of a step cut short
        runs = (report.get("engine") or {}).get("runs", [])
        out["targets"], out["rows_not_replayed"] = targets, len(did_not_replay(runs))
        print(
            f"graphs check: {len(runs)} offloaded rows, "
            f"{out['rows_not_replayed']} of them segmented rows that did not replay"
            + (
                ""
                if "targets" in report
                else " (the step did not finish: judged on the rows written before it ended)"
            ),
            flush=True,
        )
        for name, t in targets.items():
            print(line(name, t), flush=True)
    # the summary and the archive are written below: listed as they will be (the step's own record joins the
    # steps file after this step ends, in the folder and not in the archive)
    out["reports"] = [str(n[k]) for k in KEEP_ORDER if k in ("summary", "archive") or n[k].exists()]
    out["archive"] = {
        "path": str(n["archive"]),
        "holds": [
            str(n[k].name) for k in KEEP_ORDER if k in ("summary",) or (k != "archive" and n[k].exists())
        ],
    }
    atomic_write_text(n["summary"], json.dumps(out, indent=2, default=str))
    try:
        _, kept = pack(a.out, a.name)
    except OSError as e:  # the summary stands without the archive
        print(f"gpu_run: no archive ({e})", file=sys.stderr, flush=True)
        out["reports"] = [r for r in out["reports"] if r != str(n["archive"])]
        out["archive"] = {"error": str(e)}
        atomic_write_text(n["summary"], json.dumps(out, indent=2, default=str))
        kept = [Path(r) for r in out["reports"]]
    files = [p for p in kept if p.exists()]
    if a.dry_run:
        print(f"dry run on the CPU: nothing to commit (its files: {a.out})", flush=True)
    else:
        print("reports to commit:", flush=True)
        for p in files:
            print(f"  {p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}", flush=True)
        if a.out.resolve() != (ROOT / "data" / "gpu_check").resolve():
            print(
                "  (copy them to data/gpu_check/ first: the performance model reads "
                f"data/gpu_check/{a.name}_graphs.json)",
                flush=True,
            )
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["args"]:  # gpu_run.sh's own flags, checked without argparse (one line, exit 2)
        return run_args(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=("args", "card", "environment", "summary"))
    ap.add_argument("--out", type=Path)
    ap.add_argument("--name", help="the reports' name prefix (h200: data/gpu_check/h200_graphs.json)")
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    if a.name is not None and not a.name.replace("-", "").replace("_", "").isalnum():
        ap.error(f"--name must be letters, digits, - or _, got {a.name!r}")
    if a.step == "card":
        return card(a)
    if a.out is None or a.name is None:
        ap.error(f"{a.step} needs --out and --name")
    return environment(a) if a.step == "environment" else summary(a)


if __name__ == "__main__":
    sys.exit(main())
