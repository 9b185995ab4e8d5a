"""Issue 12 on the command line: every check that does not need the weights runs before they are read
(shown with a checkpoint whose safetensors are garbage, and a watch on every open of its weight files);
unwritable outputs are one line before any work; offload flags without --offload are refused; every
command sets its thread count from one setting and generate reports it; notebooks: stale temporary
files, failed notebooks' errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_cli import one_line_error

import artifact.cli as cli
import artifact.model.checkpoint as checkpoint
import artifact.offload.prepare as prepare
from artifact.cli import build_parser, main
from artifact.errors import SettingError
from artifact.experiments.notebooks import Outcome, clean_stale_temps, summary_table
from artifact.experiments.settings import Settings, load_profile, resolve_threads
from artifact.model.config import get_preset
from artifact.model.decode import DecodeConfig
from artifact.model.routing import Demand, StepInfo
from artifact.model.tiny import tiny_checkpoint
from artifact.offload.replay.trace import TraceRecorder
from artifact.paths import check_writable

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


@pytest.fixture
def restore_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


_WATCHERS: list[list[str]] = []


def _audit(event: str, args: tuple) -> None:
    """Python-level reads of checkpoint weight files (model*.safetensors), e.g. a header read (a test writing
    its garbage weights is not a read)."""
    if event != "open" or not _WATCHERS or not isinstance(args[0], (str, Path)):
        return
    path, mode, flags = args
    writes = any(c in mode for c in "wax+") if mode else bool(flags & (os.O_WRONLY | os.O_RDWR))
    if Path(path).name.startswith("model") and str(path).endswith(".safetensors") and not writes:
        _WATCHERS[-1].append(str(path))


sys.addaudithook(_audit)  # cannot be removed; it records only while a test's weights_opened is active


@pytest.fixture
def weights_opened(monkeypatch):
    """Every checkpoint weight file opened, by Python's open (audit hook) or by safetensors' safe_open (a
    spy: the real one still runs). Routing traces are safetensors too; they are not named model*."""
    opened: list[str] = []
    real = checkpoint.safe_open

    def spy(path, *args, **kwargs):
        if Path(path).name.startswith("model"):
            opened.append(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "safe_open", spy)
    _WATCHERS.append(opened)
    yield opened
    _WATCHERS.remove(opened)


def _copy_without_weights(dst: Path, config_changes: dict | None = None) -> Path:
    """The tiny checkpoint's config and tokenizer, with garbage bytes as its weights."""
    src = tiny_checkpoint()
    dst.mkdir()
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy(src / name, dst / name)
    if config_changes:
        cfg = json.loads((dst / "config.json").read_text())
        cfg.update(config_changes)
        (dst / "config.json").write_text(json.dumps(cfg))
    (dst / "model.safetensors").write_bytes(b"\x00garbage, not a safetensors header" * 64)
    return dst


@pytest.fixture
def unreadable(tmp_path):
    return _copy_without_weights(tmp_path / "ckpt")


def test_the_unreadable_checkpoint_fails_once_its_weights_are_read(unreadable, weights_opened, capsys):
    """The control: with valid arguments the loader opens the garbage weights and fails. So in the tests
    below, the expected message (and nothing opened) shows the check ran before the weights."""
    try:
        rc = main(["generate", "--prompt", "hi", "--gen-length", "32", "--model", str(unreadable)])
    except Exception:  # a damaged safetensors file: helper C's loader checks report it
        rc = None
    assert rc != 0
    assert weights_opened and set(weights_opened) == {str(unreadable / "model.safetensors")}


def _hand_trace(path: Path, meta: dict) -> Path:
    rec = TraceRecorder()
    for t in range(2):
        for layer in (1, 2):
            rec(Demand(StepInfo(t, 0, t, "denoise"), layer, (1, 2), (1, 1)))
    return rec.trace(meta).save(path)


def test_an_oracle_trace_of_other_prompts_is_refused_before_the_weights(
    unreadable, weights_opened, capsys, tmp_path
):
    cfg = get_preset("tiny")
    dc = DecodeConfig(
        gen_length=32, steps=Settings().steps, threshold=Settings().threshold, mode=Settings().mode
    )
    import dataclasses

    trace = _hand_trace(
        tmp_path / "other.safetensors",
        {
            "model": "tiny",
            "config_hash": cfg.config_hash(),
            "prompt_ids": ["cli/000000000000"],
            "batch_size": 1,
            "decode": dataclasses.asdict(dc),
            "moe_layers": [1, 2],
            "num_experts": cfg.num_experts,
            "expert_bytes": 4,
            "task": None,
        },
    )
    line = one_line_error(
        capsys,
        main(
            [
                "generate",
                "--prompt",
                "hi",
                "--gen-length",
                "32",
                "--model",
                str(unreadable),
                "--offload",
                "--cache-experts",
                "8",
                "--policy",
                "oracle",
                "--oracle-trace",
                str(trace),
            ]
        ),
    )
    assert "oracle trace is of another run (differs in ['prompt_ids'])" in line
    assert weights_opened == []


@pytest.mark.slow
def test_the_oracle_check_before_the_load_agrees_with_the_run(
    tmp_path, capsys, weights_opened, restore_threads
):
    """A trace recorded by generate passes the early check (and the run's own); other prompts fail it
    before the tiny model's weights are opened."""
    trace = tmp_path / "run.safetensors"
    base = ["generate", "--prompt", "How many eggs?", "--gen-length", "32", "--json"]
    assert main([*base, "--record-trace", str(trace)]) == 0
    resident = json.loads(capsys.readouterr().out)["tokens"]
    oracle = ["--offload", "--cache-experts", "20", "--policy", "oracle", "--oracle-trace", str(trace)]
    assert main([*base, *oracle]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] == resident
    weights_opened.clear()
    base[2] = "How many ducks?"
    line = one_line_error(capsys, main([*base, *oracle]))
    assert "differs in ['prompt_ids']" in line and weights_opened == []


LONG_PROMPT = " ".join(["Natalia sold clips to 48 of her friends in April."] * 8)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--offload", "--cache-experts", "8", "--lookahead", "0"], "lookahead must be >= 1"),
        (["--offload", "--cache-experts", "8", "--tau", "0"], "tau must be >= 1"),
        (["--offload", "--cache-experts", "8", "--tau", "2.5"], "invalid int value"),
        (["--gen-length", "100000"], "max_position_embeddings 4096"),
        # ~170 tokens
        (["--gen-length", "4064", "--prompt", LONG_PROMPT], "with these prompts needs 4256 positions"),
        (["--raw", "--prompt", ""], "a --prompt is empty (--raw)"),
        (["--prompt", ""], "a --prompt is empty"),
        (["--record-trace", "."], "is a directory"),
        (["--offload", "--cache-experts", "300"], "cache capacity must be an integer in [1, 256]"),
    ],
)
def test_checks_fire_before_the_weights_are_read(unreadable, weights_opened, capsys, args, message):
    argv = ["generate", "--model", str(unreadable), *args]
    if "--prompt" not in args:
        argv += ["--prompt", "hi"]
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's own refusal (a float for an int flag)
        rc = e.code
        assert message in capsys.readouterr().err
    else:
        assert message in one_line_error(capsys, rc)
    assert rc == 2 and weights_opened == []


def test_a_tokenizer_larger_than_the_vocabulary_is_named(tmp_path, weights_opened, capsys):
    small = _copy_without_weights(tmp_path / "small-vocab", {"vocab_size": 512})
    line = one_line_error(capsys, main(["generate", "--prompt", "hi", "--model", str(small)]))
    assert "the tokenizer has" in line and "vocab_size is 512" in line and str(small) in line
    assert weights_opened == []


def test_trace_checks_prompt_positions_before_the_weights(unreadable, weights_opened, capsys, tmp_path):
    line = one_line_error(
        capsys,
        main(
            [
                "trace",
                "--task",
                "gsm8k",
                "--n",
                "2",
                "--gen-length",
                "4064",
                "--model",
                str(unreadable),
                "--out",
                str(tmp_path / "t.safetensors"),
            ]
        ),
    )
    assert "max_position_embeddings 4096" in line and weights_opened == []


# --- output paths: probed before any work, one line each ----------------------------------------
def _unwritable_dir(tmp_path: Path) -> Path:
    """A directory this process cannot create files in. root ignores permission bits, so as root take
    sysfs, which refuses new files to everyone."""
    if os.geteuid() != 0:
        d = tmp_path / "read-only"
        d.mkdir()
        d.chmod(0o500)
        return d
    return Path("/sys")


@pytest.mark.parametrize("where", ["unwritable", "file-as-dir", "directory", "too-long", "nul"])
@pytest.mark.parametrize("command", ["generate", "trace", "simulate", "report", "merge", "bench", "synth"])
def test_unwritable_outputs_are_one_line_before_any_work(
    tmp_path, capsys, monkeypatch, weights_opened, restore_threads, where, command
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "a-dir").mkdir()
    out = {
        "unwritable": _unwritable_dir(tmp_path) / "out.csv",
        "file-as-dir": tmp_path / "a-file" / "out.csv",
        "directory": tmp_path / "a-dir",
        "too-long": tmp_path / ("x" * 300 + ".csv"),
        "nul": Path(str(tmp_path / "out") + "\0.csv"),
    }[where]
    argv = {
        "generate": ["generate", "--prompt", "hi", "--record-trace", str(out)],
        "trace": ["trace", "--task", "gsm8k", "--out", str(out)],
        "simulate": ["simulate", "--trace", "none.safetensors", "--csv", str(out)],
        "report": ["report", "none.csv", "--csv", str(out)],
        "merge": ["merge", "none.csv", "--out", str(out)],
        "bench": ["bench", "--profile", "cpu", "--out", str(out)],
        "synth": ["synth", "--out", str(out)],
    }[command]
    monkeypatch.setattr(
        prepare, "load_checkpoint", lambda *a, **k: pytest.fail("loaded a model despite bad output")
    )
    line = one_line_error(capsys, main(argv))
    expect = {
        "unwritable": "Permission denied",
        "file-as-dir": "is a file, not a directory",
        "directory": "is a directory",
        "too-long": "File name too long",
        "nul": "null",
    }[where]
    assert expect in line, line
    assert "none." not in line  # the output was checked before the (missing) inputs


def test_an_existing_bench_file_is_resumed_not_refused(tmp_path):
    out = tmp_path / "bench.csv"
    out.write_text("")
    check_writable(out, "--out", exists_ok=True)  # no error: bench resumes into it
    with pytest.raises(FileExistsError, match="pass --force"):
        check_writable(out, "--csv")
    check_writable(out, "--csv", force=True)
    check_writable(tmp_path / "new" / "deeper" / "x.csv", "--csv")
    assert not (tmp_path / "new").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["bench.csv"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["simulate", "--trace", "t.safetensors", "--cache-ratios", "inf"],
            "--cache-ratios must be a finite number",
        ),
        (
            ["simulate", "--trace", "t.safetensors", "--cache-ratios", "1,nan"],
            "--cache-ratios must be a finite number",
        ),
        (["simulate", "--trace", "t.safetensors", "--csv", "SYS/x.csv"], "Permission denied"),
        (["simulate", "--trace", "t.safetensors", "--csv", "."], "is a directory"),
    ],
)
def test_from_a_shell_bad_input_is_rc_2_without_a_traceback(tmp_path, argv, message):
    rec = TraceRecorder()
    rec(Demand(StepInfo(0, 0, 0, "denoise"), 1, (1, 2), (1, 1)))
    rec.trace(
        {
            "moe_layers": [1],
            "num_experts": 4,
            "config_hash": "x",
            "task": "hand",
            "batch_size": 1,
            "expert_bytes": 4,
        }
    ).save(tmp_path / "t.safetensors")
    argv = [str(_unwritable_dir(tmp_path)) + "/x.csv" if a == "SYS/x.csv" else a for a in argv]
    p = subprocess.run(
        [sys.executable, "-m", "artifact", *argv], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert p.returncode == 2 and "Traceback" not in p.stderr and message in p.stderr, p.stderr


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--latency-us", "1e300", "--latency-us: latency_us must be in [0, 1e+06]"),
        ("--bandwidth-gbps", "1e-300", "--bandwidth-gbps: link_gbps must be >= 0.0001"),
        ("--cap-gbps", "1e-300", "--cap-gbps: cap_gbps must be >= 0.0001"),
    ],
)
def test_link_knobs_too_extreme_to_sleep_on_are_refused_before_the_weights(
    unreadable, weights_opened, capsys, flag, value, message
):
    """Finite, but one copy would outlast what time.sleep can express: an OverflowError mid-run before."""
    line = one_line_error(
        capsys,
        main(
            [
                "generate",
                "--prompt",
                "hi",
                "--model",
                str(unreadable),
                "--offload",
                "--cache-experts",
                "8",
                flag,
                value,
            ]
        ),
    )
    assert message in line and weights_opened == []


# --- item 6: offload flags without --offload -----------------------------------------------------
@pytest.mark.parametrize(
    "flag",
    [
        ["--policy", "last_step"],
        ["--link", "emulated"],
        ["--bandwidth-gbps", "10"],
        ["--latency-us", "5"],
        ["--link-priority", "fifo"],
        ["--cap-gbps", "5"],
        ["--lookahead", "2"],
        ["--tau", "2"],
        ["--oracle-trace", "t.safetensors"],
        ["--cache-experts", "8"],
    ],
)
def test_offload_flags_without_offload_are_refused(capsys, flag):
    line = one_line_error(capsys, main(["generate", "--prompt", "hi", *flag]))
    assert f"{flag[0]} needs --offload" in line


def test_several_offload_flags_are_named_together(capsys):
    line = one_line_error(capsys, main(["generate", "--prompt", "hi", "--tau", "2", "--policy", "demand"]))
    assert "--policy, --tau need --offload" in line


def test_an_oracle_trace_for_a_policy_that_ignores_it_is_refused(capsys, tmp_path):
    line = one_line_error(
        capsys,
        main(
            [
                "generate",
                "--prompt",
                "hi",
                "--offload",
                "--cache-experts",
                "8",
                "--oracle-trace",
                str(tmp_path / "t.safetensors"),
            ]
        ),
    )
    assert (
        "--oracle-trace: an oracle trace is read only by ['oracle']; policy 'demand' would ignore it" in line
    )


def test_force_without_an_output_is_refused(capsys):
    line = one_line_error(capsys, main(["generate", "--prompt", "hi", "--force"]))
    assert "--force replaces an existing --record-trace file" in line


# --- item 7: one thread setting ------------------------------------------------------------------
def test_resolve_threads():
    assert resolve_threads(None, "tiny", "cpu") == 1 and resolve_threads(None, None, "cpu") == 1
    assert resolve_threads(3, "tiny", "cpu") == 3
    assert resolve_threads(None, "/ckpt", "cpu") == torch.get_num_threads()  # a real model: torch's choice
    assert Settings().threads == 1 and load_profile("cpu").threads == 1
    with pytest.raises(SettingError, match=r"torch_threads must be in \[1, 1024\]"):
        resolve_threads(0, "tiny", "cpu")


@pytest.mark.parametrize(
    "argv, threads",
    [
        (["generate", "--prompt", "x"], 1),
        (["generate", "--prompt", "x", "--threads", "2"], 2),
        (["trace", "--task", "gsm8k", "--out", "x", "--threads", "3"], 3),
        (["simulate", "--trace", "x"], 1),
        (["report", "x.csv", "--threads", "2"], 2),
        (["bench", "--profile", "cpu"], 1),
        (["bench", "--profile", "cpu", "--threads", "2"], 2),
        (["synth", "--out", "x", "--threads", "2"], 2),
        (["fit", "x"], 1),
    ],
)
def test_every_command_sets_its_thread_count(restore_threads, argv, threads):
    torch.set_num_threads(5)
    a = build_parser().parse_args(argv)
    assert cli.set_threads(a) == threads == torch.get_num_threads()


def test_bench_threads_are_the_profile_key(restore_threads):
    a = build_parser().parse_args(["bench", "--profile", "cpu", "--threads", "2"])
    cli.set_threads(a)
    assert a.set == ["torch_threads=2"]  # so it is part of the result file's settings


def test_bad_thread_counts_are_one_line(capsys, restore_threads):
    for n in ("0", "100000"):
        line = one_line_error(capsys, main(["generate", "--prompt", "x", "--threads", n]))
        assert f"--threads must be in [1, 1024], got {n}" in line
        line = one_line_error(capsys, main(["bench", "--threads", n, "--list"]))
        assert f"overrides: torch_threads must be in [1, 1024] or null, got {n}" in line
    assert "not both" in one_line_error(
        capsys, main(["bench", "--threads", "2", "--set", "torch_threads=1", "--list"])
    )


@pytest.mark.slow
def test_generate_reports_the_thread_count_it_set(capsys, restore_threads):
    for extra, want in (([], 1), (["--threads", "2"], 2)):
        torch.set_num_threads(4)
        assert main(["generate", "--prompt", "What is 2 + 2?", "--gen-length", "32", "--json", *extra]) == 0
        stats = json.loads(capsys.readouterr().out)["stats"]
        assert stats["threads"] == want == torch.get_num_threads()


# --- item 8 leftovers: notebooks ------------------------------------------------------------------
def test_stale_notebook_temporaries_are_removed(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # a pid that is certainly gone
    dead = tmp_path / f".02_miss_accounting.{child.pid}.tmp.ipynb"
    live = tmp_path / f".03_bandwidth_throttling.{os.getppid()}.tmp.ipynb"  # our parent: alive
    other = tmp_path / ".hidden.ipynb"
    for p in (dead, live, other):
        p.write_text("{}")
    notes = []
    assert clean_stale_temps(tmp_path, notes.append) == [dead]
    assert not dead.exists() and live.exists() and other.exists()
    assert len(notes) == 1 and str(child.pid) in notes[0]
    assert clean_stale_temps(tmp_path / "missing") == []


def test_a_failed_notebook_shows_its_error_beside_its_claims():
    outcomes = [
        Outcome(
            "02_miss_accounting",
            "FAILED",
            3.0,
            [("oracle cuts misses 6.7x", "not reproduced")],
            "ValueError: C/W must be finite",
        ),
        Outcome("03_bandwidth_throttling", "FAILED", 1.0, [], "KeyError: 'x'"),
        Outcome("04_capacity_sweep", "ok", 9.0, [("demand beats last_step", "reproduced")]),
    ]
    table = summary_table(outcomes)
    assert "ValueError: C/W must be finite" in table and "oracle cuts misses 6.7x" in table
    assert "KeyError: 'x'" in table and "3 notebooks, 2 failed" in table
    assert table.count("error") == 1  # only the failed notebook with claims gets the row


def test_the_bench_default_output_is_probed_too(tmp_path, capsys, monkeypatch, restore_threads):
    (tmp_path / "a-file").write_text("x")
    monkeypatch.setenv("ARTIFACT_DATA", str(tmp_path / "a-file"))  # data/results/cpu/bench.csv under a file
    line = one_line_error(capsys, main(["bench", "--profile", "cpu"]))
    assert "a-file/results/cpu/bench.csv" in line and "is a file, not a directory" in line


@pytest.mark.parametrize(
    "argv", [["notebooks"], ["trace-all", "--submit", "local"], ["run-jobs", "--submit", "local"]]
)
def test_commands_whose_jobs_take_the_profiles_threads_leave_them(argv, restore_threads):
    torch.set_num_threads(3)
    assert cli.set_threads(build_parser().parse_args(argv)) is None and torch.get_num_threads() == 3
