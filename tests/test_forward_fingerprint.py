"""The bench fingerprint knows the forward mode (issue 45, part 3): `forward` enters the hash only when it is
not the default, so every eager result file, the committed stored runs among them, keeps its hash, and a
segmented run refuses to resume an eager file and never pools with the eager stored runs."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pandas as pd
import pytest

from artifact.errors import ResultFileError
from artifact.experiments.bench.results import SETTINGS, bench_fingerprint, fingerprint_keys, load_for_append
from artifact.experiments.outputs.stored_runs import stored_rows
from artifact.experiments.settings import fingerprint, load_profile

ROOT = Path(__file__).resolve().parent.parent
RUN1 = ROOT / "data" / "results" / "cpu" / "runs" / "run1" / "bench.csv"


@pytest.fixture(scope="module")
def eager():
    return load_profile("cpu")


@pytest.fixture(scope="module")
def segmented(eager):
    return dataclasses.replace(eager, forward="segmented")


def test_the_default_mode_keeps_every_stored_hash(eager):
    assert fingerprint_keys(eager) == SETTINGS and bench_fingerprint(eager) == fingerprint(eager, SETTINGS)
    stored = set(pd.read_csv(RUN1).fingerprint.astype(str))
    assert stored == {bench_fingerprint(eager)}  # the committed runs' rows are the eager ones


def test_a_segmented_run_has_its_own_hash(eager, segmented):
    assert "forward" in fingerprint_keys(segmented) and bench_fingerprint(segmented) != bench_fingerprint(
        eager
    )


def test_a_segmented_run_refuses_to_resume_an_eager_file(tmp_path, eager, segmented):
    path = tmp_path / "bench.csv"
    shutil.copyfile(RUN1, path)
    # the eager profile resumes it (the stored runs hold the A/A pair, as the profile asks)
    assert len(load_for_append(path, eager, log=lambda *_: None)) > 0
    with pytest.raises(ResultFileError, match="forward must match to resume"):
        load_for_append(path, segmented, log=lambda *_: None)
    assert path.read_bytes() == RUN1.read_bytes()  # refused, nothing lost


def test_a_segmented_run_never_pools_with_the_eager_stored_runs(eager, segmented):
    assert len(stored_rows(eager, "bench", bench_fingerprint(eager))) >= 3
    assert stored_rows(segmented, "bench", bench_fingerprint(segmented)) == []


def test_a_loop_kernel_run_has_its_own_hash_and_the_default_keeps_the_stored_one(eager):
    loop = dataclasses.replace(eager, expert_kernel="loop")
    assert "expert_kernel" in fingerprint_keys(loop) and "expert_kernel" not in fingerprint_keys(eager)
    assert bench_fingerprint(loop) != bench_fingerprint(eager)
    assert set(pd.read_csv(RUN1).fingerprint.astype(str)) == {bench_fingerprint(eager)}
