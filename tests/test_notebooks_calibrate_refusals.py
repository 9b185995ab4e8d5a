"""Two refusals of `python -m artifact` (issue 60, item 6), each one line and exit 2 before any work:
`notebooks` with a CUDA profile on a machine without CUDA, or with a model folder that is not a checkpoint,
refuses before any notebook runs (it used to start them and fail inside notebook 04, exit 1); and
`calibrate`'s integer flags are checked by the CLI's one number check (validate.check_number), so each
message names its flag (`--seed -1` said numpy's "expected non-negative integer", naming none)."""

from __future__ import annotations

import pytest
import torch

import artifact.cli.notebooks as notebooks_cli
from artifact.cli import main
from artifact.errors import SettingError
from artifact.validate import check_number


def one_line(err: str) -> str:
    assert err.endswith("\n") and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("error: "), err
    return err


@pytest.fixture
def no_notebook_runs(monkeypatch):
    def ran(*args, **kwargs):
        raise AssertionError("a notebook ran")

    monkeypatch.setattr(notebooks_cli, "run_notebooks", ran)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_a_cuda_profile_without_cuda_is_refused_before_any_notebook(tmp_path, capsys, no_notebook_runs):
    empty = tmp_path / "model"
    empty.mkdir()
    assert main(["notebooks", "--profile", "h200_flash", "--model", str(empty)]) == 2
    out, err = capsys.readouterr()
    assert out == "", out
    assert "profile 'h200_flash' runs on device cuda, and this machine has no CUDA device" in one_line(err)
    assert "nothing was run" in err


def test_a_model_folder_without_a_checkpoint_is_refused_before_any_notebook(
    tmp_path, capsys, monkeypatch, no_notebook_runs
):
    """The device passes (as on a GPU machine); the empty folder does not."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    empty = tmp_path / "model"
    empty.mkdir()
    for profile in ("h200_flash", "cpu"):
        assert main(["notebooks", "--profile", profile, "--model", str(empty)]) == 2
        out, err = capsys.readouterr()
        assert out == "" and "no config.json" in one_line(err) and str(empty) in err, err


def test_a_profile_with_model_null_still_asks_for_model(capsys, monkeypatch):
    """The device check does not hide run_notebooks' own refusal of a GPU profile without --model."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert main(["notebooks", "--profile", "h200_flash"]) == 2
    assert "has model: null: pass --model DIR" in one_line(capsys.readouterr().err)


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--seed", "-1"], "--seed must be >= 0, got -1"),
        (["--studies", "0"], "--studies must be >= 1, got 0"),
        (["--processes", "0"], "--processes must be >= 1, got 0"),
    ],
)
def test_calibrate_names_the_integer_flag(argv, says, capsys, monkeypatch):
    from artifact.experiments.verdicts import calibration

    def ran(*args, **kwargs):
        raise AssertionError("calibration ran")

    monkeypatch.setattr(calibration, "run", ran)
    assert main(["calibrate", "--quiet", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and one_line(err) == f"error: {says}\n", err


def test_the_number_check_names_an_integer_too_large_for_a_float():
    """Before: OverflowError (int too large to convert to float), a traceback, from `trace --seed 9...9`."""
    with pytest.raises(SettingError, match=r"--seed must be in \[0, 100\], got 1000"):
        check_number("--seed", 10**400, low=0, high=100, integer=True)
    assert check_number("--seed", 10**400, low=0, integer=True) == 10**400
