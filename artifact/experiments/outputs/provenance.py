"""Where a run ran: its date, commit, command and environment (software versions, CPU), recorded with every
claim record (verdicts/records.py) and stored run (outputs/stored_runs.py)."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

import torch

from artifact.paths import repo_root


def run_info() -> dict:
    """The run that prints these claims: UTC date, the checkout's commit (with "-dirty" when the code that
    produced them, artifact/, differs from it; the notebooks only call into it, and their stored outputs, like
    the run's own outputs under data/ and figures/, change with every --store), the command that started
    the notebook (the kernel's parent process, when readable) and the environment (software versions, CPU)."""

    def git(*args):
        try:
            return subprocess.run(
                ["git", "-C", str(repo_root()), *args], capture_output=True, text=True, timeout=30
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    commit = git("rev-parse", "--short=12", "HEAD") or "unknown"
    if git("status", "--porcelain", "--untracked-files=no", "--", "artifact"):
        commit += "-dirty"
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "commit": commit,
        "command": _parent_command(),
        "environment": environment(),
    }


VERSIONED = ("torch", "numpy", "pandas", "transformers")  # beside python, in every record's environment
SIMD = ("sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "avx_vnni", "asimd", "sve", "sve2")
SIMD_FAMILIES = ("avx512", "amx")  # every flag of these families (avx512f, amx_tile, ...)
CPUINFO = Path("/proc/cpuinfo")


def environment() -> dict:
    """What a run ran on, recorded with it (run_info): "versions", of python and VERSIONED (None where one is
    not installed); "torch_cpu_capability", torch's CPU kernel level (AVX2, AVX512, ...: the kernels that
    round the router's scores, docs/DESIGN.md "Exact counts"); "cpu", its model and its SIMD flags (SIMD and
    SIMD_FAMILIES, from /proc/cpuinfo; None where that file is not, e.g. on macOS, whose model is then what
    `platform` knows). Stored runs and claim records written before this was recorded lack it: nothing
    compares it."""
    versions = {"python": platform.python_version()}
    for name in VERSIONED:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except (AttributeError, RuntimeError):  # a torch without the query
        capability = None
    return {"versions": versions, "torch_cpu_capability": capability, "cpu": _cpu()}


def _cpu() -> dict:
    """{"model", "machine", "simd"} of this CPU: the first processor's entries in /proc/cpuinfo (x86: "model
    name" and "flags"; ARM: "Features"), else platform's names and simd None."""
    fields: dict[str, str] = {}
    try:
        for line in CPUINFO.read_text().splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    flags = (fields.get("flags") or fields.get("Features") or "").split()
    return {
        "model": fields.get("model name") or fields.get("Processor") or platform.processor() or "unknown",
        "machine": platform.machine(),
        "simd": sorted({f for f in flags if f in SIMD or f.startswith(SIMD_FAMILIES)}) if fields else None,
    }


def _parent_command() -> str:
    try:
        raw = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
    except OSError:
        return "unknown"
    argv = [a for a in raw.decode(errors="replace").split("\0") if a]
    if len(argv) > 2 and argv[1:3] == ["-m", "artifact"]:
        return " ".join(["python", *argv[1:]])
    return "notebook run outside `python -m artifact notebooks`"
