"""Run the numbered notebooks for one profile with papermill (what run_all.sh calls):

    python -m artifact notebooks [--profile cpu] [--set KEY=VALUE ...] [--model DIR] [--force] [--only 02,04]

1. The profile loads with its overrides (--set, --model): a bad key or value fails here, before anything
   runs. Every notebook's parameters cell (tagged `parameters`) must set exactly `profile` and `overrides`.
2. Each notebook runs with `profile` and `overrides` injected (kernel python3, working directory
   notebooks/, a per-cell timeout) into results/<profile>/<name>.ipynb, written under a temporary name and
   renamed, so a half-written notebook never has the final name; the executed copy records the settings
   it ran with. A notebook whose executed copy is complete (every code cell ran, no error, claim lines
   present, the same parameters and settings, the files it saved still there) is skipped unless --force.
   A failure does not stop the others.
3. A table of every claim's verdict; the exit code is the number of failed notebooks.

With --store, the run then becomes the committed reference (store.py).

nbformat and papermill are imported inside the functions that use them: the CLI imports this module to
register the command (artifact/cli/notebooks.py), and the two take seconds to import (jsonschema,
nbclient), which every `python -m artifact ...` call would pay.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from artifact.experiments.criteria import thresholds
from artifact.experiments.outputs.paths import run_dir
from artifact.experiments.settings import (
    PROFILE_DIR,
    PROFILE_KEYS,
    Settings,
    load_profile,
    profile_path,
)
from artifact.experiments.verdicts.records import TO_DECIDE, unwrap
from artifact.paths import repo_root

KERNEL = "artifact"  # the kernel scripts/env.sh registers in the venv (KERNELSPEC)
CELL_TIMEOUT_S = 1800
CHECK = "# NBVAL_CHECK_OUTPUT"
PARAMETERS = ("profile", "overrides")  # the one parameters cell every notebook has
SETTINGS_KEY = "artifact_settings"  # executed notebook metadata: the profile's values it ran with
_LINE = re.compile(r"^(claim|runs|verdict)(?: \[[a-z]+\])?: (.*)$")
_STORED = re.compile(r"stored runs: pooled ([a-z ]+?);")
_SAVED = re.compile(r"^saved (\S+) and (\S+)$")
_TMP = re.compile(r"^\..+\.(\d+)\.tmp\.ipynb$")  # execute()'s temporary name: .NAME.<pid>.tmp.ipynb


class NotebookError(ValueError):
    def __init__(self, message: str, failed: int = 1):
        super().__init__(message)
        self.failed = failed  # notebooks this error stops (the exit code counts them)


@dataclass
class Outcome:
    name: str
    status: str  # ok | skipped (complete) | FAILED
    seconds: float = 0.0
    claims: list[tuple[str, str]] = field(default_factory=list)  # (claim, verdict)
    error: str = ""


def notebook_dir() -> Path:
    return repo_root() / "notebooks"


def find_notebooks(directory: Path, only: list[str] | None = None) -> list[Path]:
    """The numbered notebooks NN_name.ipynb, in order; `only` keeps those whose number or name is listed."""
    paths = sorted(p for p in Path(directory).glob("[0-9][0-9]_*.ipynb"))
    if only is not None and not only:
        raise NotebookError(f"--only names no notebook; choose from {[p.stem for p in paths]}")
    if only:
        keep = [p for p in paths if any(p.stem == o or p.stem.split("_")[0] == o for o in only)]
        unknown = [o for o in only if not any(p.stem == o or p.stem.split("_")[0] == o for p in paths)]
        if unknown:
            raise NotebookError(
                f"--only {','.join(unknown)}: no such notebook in {directory}; have {[p.stem for p in paths]}"
            )
        paths = keep
    if not paths:
        raise NotebookError(f"{directory}: no numbered notebooks (NN_name.ipynb)")
    return paths


def declared_parameters(path: Path) -> list[str]:
    """Names assigned in the cell tagged `parameters`."""
    import nbformat
    import papermill

    nb = nbformat.read(path, as_version=4)
    if not any(
        "parameters" in c.get("metadata", {}).get("tags", []) for c in nb.cells if c.cell_type == "code"
    ):
        raise NotebookError(
            f"{path}: no code cell tagged 'parameters' (papermill injects the profile after it)"
        )
    return list(papermill.inspect_notebook(str(path)))


def injected_parameters(
    paths: list[Path], profile_arg: str, overrides: dict | None = None
) -> dict[Path, dict]:
    """Per notebook: {"profile": profile_arg, "overrides": overrides}. Every notebook whose parameters cell
    does not set exactly `profile` and `overrides` is reported at once, before anything runs."""
    errors = []
    for path in paths:
        names = declared_parameters(path)
        if sorted(names) != sorted(PARAMETERS):
            errors.append(
                f"{path}: the parameters cell sets {names}; it must set exactly `profile` and "
                "`overrides` (settings are profile keys, given as overrides)"
            )
    if errors:
        raise NotebookError("\n".join(errors), len(errors))
    return {path: {"profile": profile_arg, "overrides": dict(overrides or {})} for path in paths}


def settings_of(P: Settings) -> dict:
    """The profile's values (no file path): what an executed notebook records and complete() compares."""
    values = P.as_dict()
    return {k: values[k] for k in PROFILE_KEYS}


def claims_of(nb) -> list[tuple[str, str]]:
    """(claim, verdict) pairs printed by the notebook's cells (a claim line, then its verdict line). A timing
    claim ruled on this run alone shows its verdict without the cell-by-cell reason, beside the stored
    verdict and, when inconclusive, what would decide it."""
    pairs, claim, stored = [], None, ""
    for cell in nb.cells:
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if out.get("output_type") != "stream" or out.get("name") != "stdout":
                continue
            for line in unwrap(out.get("text", "")).splitlines():  # a claim line printed over several
                m = _LINE.match(line.strip())
                kind, text = (m.group(1), m.group(2)) if m else ("", "")
                if kind == "claim":
                    claim, stored = text, ""
                elif kind == "runs" and "this run" in text:
                    found = _STORED.search(text)
                    stored = found.group(1) if found else ""
                elif kind == "verdict" and claim is not None:
                    text, _, decide = text.partition(f"; {TO_DECIDE}")
                    if stored:
                        text = f"{text.split(' (')[0]}; stored: {stored}"
                    pairs.append((claim, text + (f"; {TO_DECIDE}{decide}" if decide else "")))
                    claim = None
    return pairs


def _code(nb) -> list[str]:
    return [
        c.source
        for c in nb.cells
        if c.cell_type == "code" and "injected-parameters" not in c.get("metadata", {}).get("tags", [])
    ]


def saved_files(nb) -> list[Path]:
    """Files the notebook reported saving ("saved A and B" lines: figures and their CSVs)."""
    out = []
    for cell in nb.cells:
        for o in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if o.get("output_type") == "stream":
                for line in o.get("text", "").splitlines():
                    m = _SAVED.match(line.strip())
                    if m:
                        out += [repo_root() / m.group(1), repo_root() / m.group(2)]
    return out


def complete(path: Path, params: dict, settings: dict, source: Path | None = None) -> bool:
    """An executed notebook that needs no rerun: it holds the source notebook's code, ran every code cell
    without error with these parameters and these profile values, printed at least one claim with a
    verdict, and the files it saved are still there."""
    import nbformat

    if not path.is_file():
        return False
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception:  # unreadable: run it again
        return False
    pm = nb.metadata.get("papermill", {})
    if pm.get("exception") or pm.get("parameters") != params or nb.metadata.get(SETTINGS_KEY) != settings:
        return False
    if source is not None and _code(nb) != _code(nbformat.read(source, as_version=4)):
        return False
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        if cell.get("execution_count") is None and cell.source.strip():
            return False
        if any(o.get("output_type") == "error" for o in cell.get("outputs", [])):
            return False
    return bool(claims_of(nb)) and all(p.is_file() for p in saved_files(nb))


def ipc_kernel_manager():
    """The kernel manager papermill starts each notebook's kernel with: jupyter_client's, over IPC transport
    (Unix sockets beside the kernel's connection file) instead of TCP on localhost. The kernel then has no
    unencrypted TCP ports to warn about (ipykernel's "Kernel is running over TCP without encryption" on every
    notebook)."""
    from jupyter_client.manager import AsyncKernelManager
    from traitlets import default

    class IPCKernelManager(AsyncKernelManager):
        @default("transport")
        def _transport_default(self) -> str:
            return "ipc"

    return IPCKernelManager


def execute(
    path: Path, out: Path, params: dict, settings: dict, cwd: Path, timeout: int, progress: bool = True
) -> None:
    """papermill into a temporary file beside `out`, the settings recorded in its metadata, renamed onto `out`
    once written (also when the notebook failed, so its error can be read; complete() then asks for a
    rerun)."""
    import nbformat
    import papermill

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.stem}.{os.getpid()}.tmp.ipynb")
    try:
        papermill.execute_notebook(
            str(path),
            str(tmp),
            parameters=params,
            kernel_name=KERNEL,
            cwd=str(cwd),
            execution_timeout=timeout,
            progress_bar=progress,
            log_output=False,
            kernel_manager_class=ipc_kernel_manager(),
        )
    finally:
        if tmp.is_file():
            try:
                nb = nbformat.read(tmp, as_version=4)
                nb.metadata[SETTINGS_KEY] = settings
                nbformat.write(nb, tmp)
            except (OSError, ValueError):  # unreadable: without the settings complete() asks for a rerun
                pass
            os.replace(tmp, out)


def clean_stale_temps(outdir: Path, log=print) -> list[Path]:
    """Remove the `.NAME.<pid>.tmp.ipynb` files that execute() leaves when its process was killed. A file
    whose process is still alive (another run on this results directory) is left alone."""
    removed = []
    for tmp in sorted(Path(outdir).glob(".*.tmp.ipynb")):
        m = _TMP.match(tmp.name)
        if m is None:
            continue
        pid = int(m.group(1))
        if pid != os.getpid() and _alive(pid):
            continue
        tmp.unlink(missing_ok=True)
        removed.append(tmp)
        log(f"note: removed {tmp} (a half-written notebook of a run that was killed, pid {pid})")
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def run_notebooks(
    profile: str = "cpu",
    overrides: dict | None = None,
    force: bool = False,
    only: list[str] | None = None,
    directory: Path | None = None,
    results: Path | None = None,
    timeout: int = CELL_TIMEOUT_S,
    progress: bool = True,
    log=print,
) -> list[Outcome]:
    """Run (or skip, when complete) the numbered notebooks for `profile` with `overrides` laid over it."""

    directory = Path(directory or notebook_dir())
    paths = find_notebooks(directory, only)
    P = load_profile(profile, overrides)  # a bad profile or override fails here
    if P.model is None:  # the GPU profiles name no checkpoint: every model notebook would fail
        raise NotebookError(
            f"profile {P.name!r} has model: null: pass --model DIR (a LLaDA2.0 checkpoint directory)"
        )
    # a bundled profile is injected by name, one given as a file by absolute path (the kernel runs in
    # notebooks/)
    bundled = profile_path(profile).resolve().parent == PROFILE_DIR
    arg = P.name if bundled else str(Path(profile).resolve())
    params = injected_parameters(paths, arg, overrides)
    settings = settings_of(P)
    # ARTIFACT_OUTPUT relocates it, as for the kernels
    outdir = Path(results) / P.name if results else run_dir(P)
    clean_stale_temps(outdir, log)
    saved_env = os.environ.get("ARTIFACT_OUTPUT")
    if results is not None and saved_env is None:  # the kernels save figures and data beside the notebooks
        os.environ["ARTIFACT_OUTPUT"] = str(Path(results).resolve())
    try:
        return _run_each(paths, P, params, settings, outdir, directory, force, timeout, progress, log)
    finally:
        if results is not None and saved_env is None:
            os.environ.pop("ARTIFACT_OUTPUT", None)


def _run_each(
    paths, P, params, settings, outdir: Path, directory: Path, force: bool, timeout: int, progress: bool, log
) -> list[Outcome]:
    import nbformat

    outcomes = []
    for path in paths:
        out = outdir / path.name
        if not force and complete(out, params[path], settings, path):
            outcomes.append(
                Outcome(path.stem, "skipped (complete)", 0.0, claims_of(nbformat.read(out, as_version=4)))
            )
            log(f"{path.stem}: executed copy {out} is complete; skipped (--force reruns it)")
            continue
        log(f"{path.stem}: running on profile {P.name} -> {out}")
        t0 = time.perf_counter()
        try:
            execute(path, out, params[path], settings, directory, timeout, progress)
            status, error = "ok", ""
        except Exception as e:  # keep going: the table reports it, the exit code counts it
            status, error = "FAILED", _short(e)
            log(f"{path.stem}: FAILED: {error}")
        claims = claims_of(nbformat.read(out, as_version=4)) if out.is_file() else []
        if status == "ok" and not claims:
            status, error = "FAILED", "no claim/verdict lines printed"
        outcomes.append(Outcome(path.stem, status, time.perf_counter() - t0, claims, error))
    return outcomes


def _short(e: Exception) -> str:
    name = getattr(e, "ename", type(e).__name__)
    value = getattr(e, "evalue", str(e))
    return f"{name}: {value}".splitlines()[0][:300]


def summary_table(outcomes: list[Outcome], width: int = 70) -> str:
    rows = []
    for o in outcomes:
        # A notebook that printed claims and then failed shows them and its error (claims alone would
        # read like a success).
        pairs = list(o.claims) + ([("error", o.error)] if o.claims and o.error else [])
        for k, (claim, verdict) in enumerate(pairs or [("-", o.error or "-")]):
            c = claim if len(claim) <= width else claim[: width - 3] + "..."
            rows.append(
                (
                    o.name if k == 0 else "",
                    o.status if k == 0 else "",
                    f"{o.seconds:.0f}" if k == 0 else "",
                    c,
                    verdict,
                )
            )
    head = ("notebook", "status", "seconds", "claim", "verdict")
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(4)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths) + "  {}"
    lines = [fmt.format(*head), fmt.format(*("-" * w for w in widths), "-" * 7)]
    lines += [fmt.format(*r) for r in rows]
    failed = sum(o.status == "FAILED" for o in outcomes)
    total = sum(o.seconds for o in outcomes)
    lines.append(f"{len(outcomes)} notebooks, {failed} failed, {total / 60:.1f} min")
    lines.append(TIMING_NOTE)
    return "\n".join(lines)


TIMING_NOTE = (
    "Timing verdicts (03-09) of a run come from that run alone, each cell's interval sized by the stored "
    "runs' run-to-run spread and widened by this run's own excess noise (with no stored runs of the profile: "
    "inconclusive), shown beside the stored verdict; the stored result, in the README, pools "
    f">= {thresholds.MIN_RUNS} runs (with its leave-one-out and how often a fresh run decides alone). "
    "docs/verdicts.md"
)
