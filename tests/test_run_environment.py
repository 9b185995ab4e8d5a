"""Every run says what it ran on: a fresh stored run's run.json and a claim record carry the versions of
python, torch, numpy, pandas and transformers, torch's CPU kernel level and the CPU's model and SIMD flags
(provenance.environment); the committed records and stored runs predate it and keep their bytes."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy
import pandas
import pandas as pd
import torch

from artifact.experiments import recording
from artifact.experiments.outputs import provenance, stored_runs
from artifact.experiments.outputs.provenance import VERSIONED, environment
from artifact.experiments.settings import load_profile
from artifact.experiments.verdicts.records import Claim, record, record_path

ROOT = Path(__file__).resolve().parents[1]


def check_environment(env: dict) -> None:
    versions = env["versions"]
    assert set(versions) == {"python", *VERSIONED}
    assert versions["python"] == ".".join(map(str, sys.version_info[:3]))
    assert (versions["torch"], versions["numpy"], versions["pandas"]) == (
        torch.__version__,
        numpy.__version__,
        pandas.__version__,
    )
    assert env["cpu"]["model"] and env["cpu"]["machine"]
    if Path("/proc/cpuinfo").is_file():
        text = Path("/proc/cpuinfo").read_text()
        flags = set((re.search(r"^(?:flags|Features)\s*:(.*)$", text, re.M) or ["", ""])[1].split())
        assert set(env["cpu"]["simd"]) <= flags
        assert ("avx2" in flags) == ("avx2" in env["cpu"]["simd"]) and ("fma" in flags) == (
            "fma" in env["cpu"]["simd"]
        )
        assert {f for f in flags if f.startswith("avx512")} <= set(env["cpu"]["simd"])


def test_a_fresh_stored_run_records_the_versions_and_the_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("ARTIFACT_DATA", str(tmp_path / "data"))
    P = load_profile("cpu")
    work = tmp_path / "data" / "results" / "cpu"
    work.mkdir(parents=True)
    cell = dict(task="gsm8k", batch_size=1, cache_ratio=1.0, bandwidth_scale=1.0, rep=0)
    pd.DataFrame(
        [dict(cell, policy=p, tokens_per_second=t) for p, t in (("demand", 105.0), ("last_step", 100.0))]
    ).to_csv(work / "bench.csv", index=False)
    run = recording.record_run(P, log=lambda s: None)
    check_environment(json.loads((run / "run.json").read_text())["environment"])
    stored_runs.check_stored_runs("cpu")  # the manifest covers the new run.json


def test_a_claim_record_carries_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("ARTIFACT_OUTPUT", str(tmp_path / "run"))
    P = load_profile("cpu")
    record(P, "04_x", [Claim("c", "p", "m", "reproduced")])
    check_environment(json.loads(record_path(P, "04_x").read_text())["environment"])


def test_without_proc_cpuinfo_the_cpu_is_what_platform_knows(monkeypatch, tmp_path):
    monkeypatch.setattr(provenance, "CPUINFO", tmp_path / "absent")
    env = environment()
    assert env["cpu"]["simd"] is None and env["cpu"]["model"] and env["versions"]["python"]


def test_the_committed_records_and_stored_runs_carry_the_environment():
    """The committed claim records (--store under rules version 3) carry this machine's kind of environment;
    each stored run's run.json names the versions and the CPU it was recorded with (whatever they were: the
    check is that they are there, not that this machine has them), and still has the bytes its manifest
    hashed."""
    for p in (ROOT / "data" / "results" / "cpu").glob("[0-9][0-9]_*.claims.json"):
        env = json.loads(p.read_text())["environment"]
        assert set(env["versions"]) == {"python", *VERSIONED}, p.name
    runs = stored_runs.check_stored_runs("cpu")  # each run.json still the bytes its manifest hashed
    assert runs
    for run in runs:
        env = stored_runs.run_meta(run)["environment"]
        assert set(env["versions"]) == {"python", *VERSIONED}, run.name
        assert all(env["versions"].values()) and env["cpu"]["model"] and env["cpu"]["machine"], run.name
