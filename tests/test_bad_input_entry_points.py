"""A bad argument never starts a run: each entry point refuses it in one line on stderr, exit 2, no traceback,
and every file that existed before is byte-equal afterwards (no model runs: doctor, prepare and the flag
checks refuse before any weight is read)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from artifact.cli import main
from artifact.model.tiny import tiny_checkpoint

ROOT = Path(__file__).resolve().parents[1]


def snapshot(*folders: Path) -> dict[str, bytes]:
    """Every file under the folders, with its bytes."""
    return {
        str(p): p.read_bytes()
        for f in folders
        if f.exists()
        for p in sorted(Path(f).rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def damaged(tmp_path_factory) -> dict[str, Path]:
    """Damaged copies of the tiny checkpoint: each one thing wrong."""
    base, tiny = tmp_path_factory.mktemp("damaged"), tiny_checkpoint()
    out = {}
    for name in ("truncated", "header_cut", "config_list", "hidden_size_text", "empty"):
        d = out[name] = base / name
        if name == "empty":
            d.mkdir()
            continue
        shutil.copytree(tiny, d)
    st = out["truncated"] / "model.safetensors"
    os.truncate(st, st.stat().st_size // 2)
    os.truncate(out["header_cut"] / "model.safetensors", 100)
    (out["config_list"] / "config.json").write_text("[1, 2]")
    cfg = json.loads((out["hidden_size_text"] / "config.json").read_text())
    (out["hidden_size_text"] / "config.json").write_text(json.dumps({**cfg, "hidden_size": "64"}))
    return out


def refused(capsys, argv) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, (rc, err)
    return lines[0]


@pytest.mark.parametrize(
    "damage, message",
    [
        ("truncated", "the file is truncated"),
        ("header_cut", "not a complete safetensors file"),
        ("config_list", "not a JSON object"),
        ("hidden_size_text", "hidden_size is '64', expected an integer"),
        ("empty", "no config.json"),
    ],
)
def test_doctor_and_generate_refuse_a_damaged_checkpoint(damaged, tmp_path, capsys, damage, message):
    before = snapshot(damaged[damage], tmp_path)
    assert message in refused(capsys, ["doctor", "--model", str(damaged[damage])])
    out = tmp_path / "t.npz"
    argv = ["trace", "--model", str(damaged[damage]), "--task", "gsm8k", "--n", "1", "--out", str(out)]
    assert message in refused(capsys, argv)
    assert snapshot(damaged[damage], tmp_path) == before


@pytest.mark.parametrize(
    "argv, message",
    [
        (  # the device first (no CUDA here), then the model
            ["notebooks", "--profile", "h200_ae"],
            "has model: null: pass --model DIR" if torch.cuda.is_available() else "has no CUDA device",
        ),
        (["notebooks", "--only", ","], "--only names no notebook; choose from ['00_quickstart'"),
        (["notebooks", "--only", "99"], "--only 99: no such notebook"),
        (["notebooks", "--timeout", "-1"], "--timeout must be in"),
        (["notebooks", "--timeout", "9" * 30], "--timeout must be in"),
        (["notebooks", "--set", "model=[1"], "is not YAML"),
        (["generate", "--prompt", "hi", "--forward", "segmented", "--mode", "full"], "needs mode cached"),
        (
            [
                "trace",
                "--task",
                "gsm8k",
                "--n",
                "1",
                "--out",
                "t.npz",
                "--forward",
                "segmented",
                "--mode",
                "full",
            ],
            "needs mode cached",
        ),
    ],
)
def test_bad_flags_are_refused_before_a_run(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    results = tmp_path / "results"
    argv = [*argv, "--results", str(results)] if argv[0] == "notebooks" else argv
    before = snapshot(tmp_path, ROOT / "results", ROOT / "data" / "results")
    assert message in refused(capsys, argv)
    assert snapshot(tmp_path, ROOT / "results", ROOT / "data" / "results") == before


@pytest.mark.parametrize(
    "args, message",
    [
        (["a5000_ae", "--model"], "--model needs a value"),
        (["cpu", "--shards", "2"], "--shards needs --submit"),
        (["cpu", "--submit", "local", "--shards", "9" * 30], "expected a whole number"),
        (["--model", "x"], "the first argument is the profile"),
        (["cpu", "--model", "TRUNCATED"], "the file is truncated"),
    ],
)
def test_run_all_refuses_in_one_line(damaged, args, message):
    args = [str(damaged["truncated"]) if a == "TRUNCATED" else a for a in args]
    before = snapshot(ROOT / "results", ROOT / "data" / "results", damaged["truncated"])
    p = subprocess.run(["./run_all.sh", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and message in lines[0], p.stderr
    assert "Traceback" not in p.stderr
    assert snapshot(ROOT / "results", ROOT / "data" / "results", damaged["truncated"]) == before


@pytest.mark.parametrize(
    "argv",
    [
        ["notebooks", "--timeout", "abc"],
        ["bench", "--no-such-flag"],
        ["rule", "--cell", "1"],
        ["no-such-command"],
    ],
)
def test_a_flag_argparse_refuses_is_one_line_too(capsys, argv):
    """argparse's own refusals (a bad type, an unknown flag or command, a missing value): one line, exit 2,
    never the usage block."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    assert "see --help" in err and "Traceback" not in err
