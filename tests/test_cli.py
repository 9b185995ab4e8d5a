"""The command line: known errors are one line (exit 2), bugs keep their traceback; defaults come from the
settings dataclass (and RunSpec's); every run is one RunSpec, its link derived alike; simulate --cache-experts
replays an engine run at its absolute capacity."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

import artifact.cli.engine as engine
import artifact.offload.prepare as prepare
from artifact.cli import build_parser, main
from artifact.errors import DeviceError, SettingError, SpecError, UserError
from artifact.experiments.settings import RUN_KEYS, Settings, load_profile
from artifact.model.decode import DecodeConfig
from artifact.model.options import ForwardOptions
from artifact.model.routing import Demand, StepInfo
from artifact.offload.links.link import REFERENCE_EXPERT_BYTES, emulated_bandwidth_gbps
from artifact.offload.replay.trace import TraceRecorder
from artifact.offload.spec import RunSpec

ROOT = Path(__file__).resolve().parents[1]
EB = REFERENCE_EXPERT_BYTES  # one LLaDA2.0-mini expert in bf16


@pytest.fixture
def no_load(monkeypatch):
    """A model load fails the test: every bad input must be refused before it."""
    monkeypatch.setattr(
        prepare, "load_checkpoint", lambda *a, **k: pytest.fail("loaded a model despite bad input")
    )


@pytest.fixture
def small_trace(tmp_path):
    """A hand-made 2-layer trace over 16 experts (no model run)."""
    rec = TraceRecorder()
    for t, d in enumerate([{1, 2, 3}, {2, 3, 4}, {2, 3, 5}, {7, 8}]):
        for layer in (1, 2):
            exp = tuple(sorted(d))
            rec(Demand(StepInfo(t, 0, t, "denoise"), layer, exp, (1,) * len(exp)))
    trace = rec.trace(
        {
            "moe_layers": [1, 2],
            "num_experts": 16,
            "config_hash": "x",
            "task": "hand",
            "batch_size": 1,
            "expert_bytes": 4,
        }
    )
    return trace.save(tmp_path / "hand.safetensors")


def one_line_error(capsys, code) -> str:
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


# --- known errors: one line, exit 2, before any model is loaded ---------------------------------------
@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["generate", "--prompt", "hi", "--threshold", "nan"],
            "--threshold: threshold must be a finite number",
        ),
        (["generate", "--prompt", "hi", "--gen-length", "0"], "--gen-length: gen_length must be >= 1"),
        (
            ["generate", "--prompt", "hi", "--offload", "--cache-experts", "8", "--cap-gbps", "nan"],
            "--cap-gbps: cap_gbps must be a finite number",
        ),
        (
            ["generate", "--prompt", "hi", "--offload", "--cache-experts", "8", "--bandwidth-gbps", "inf"],
            "--bandwidth-gbps: link_gbps must be a finite number",
        ),
        (
            ["generate", "--prompt", "hi", "--offload", "--cache-experts", "8", "--latency-us", "-1"],
            "--latency-us: latency_us must be in [0, 1e+06]",
        ),
        (
            ["generate", "--prompt", "hi", "--offload", "--cache-experts", "8", "--tau", "0"],
            "--tau: tau must be >= 1",
        ),
        (["generate", "--prompt", "hi", "--cache-experts", "8"], "--cache-experts needs --offload"),
        (["generate", "--prompt", "  "], "a --prompt is empty"),
        (["generate", "--prompt", "hi", "--dtype", "int8"], "--dtype: dtype 'int8' unknown"),
        (["generate", "--prompt", "hi", "--device", "tpu"], "unknown device 'tpu'"),
        (["generate", "--prompt", "hi", "--gen-length", "100000"], "max_position_embeddings"),
        (["trace", "--task", "squad", "--out", "x.safetensors"], "unknown task 'squad'"),
        (["trace", "--task", "gsm8k", "--n", "100000", "--out", "x.safetensors"], "--n must be in [1, "),
        (
            ["trace", "--task", "gsm8k", "--batch-size", "9", "--out", "x.safetensors"],
            "--batch-size must be in [1, 8]",
        ),
        (
            ["trace", "--task", "gsm8k", "--batch-size", "4", "--n", "2", "--out", "x.safetensors"],
            "--batch-size 4 needs at least that many prompts; got --n 2",
        ),
        (["generate", "--prompt", "hi", "--model", "/nonexistent/ckpt"], "/nonexistent/ckpt"),
    ],
)
def test_bad_arguments_are_one_line_before_loading(no_load, capsys, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    line = one_line_error(capsys, main(args))
    assert message in line


def test_a_checkpoint_config_error_is_a_checkpoint_error(no_load, capsys, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    line = one_line_error(capsys, main(["generate", "--prompt", "hi", "--model", str(tmp_path)]))
    assert "model_type is 'llama'" in line


@pytest.mark.parametrize(
    "args, message",
    [
        (["--cache-ratios", "nan"], "--cache-ratios must be a finite number"),
        (["--cache-ratios", "1,inf"], "--cache-ratios must be a finite number"),
        (["--cache-ratios=-inf"], "--cache-ratios must be a finite number"),
        (["--cache-ratios", "0"], "--cache-ratios must be > 0"),
        (["--cache-ratios", ""], "--cache-ratios is empty"),
        (["--policies", ""], "--policies is empty"),
        (["--policies", "mru"], "unknown policy 'mru'"),
        (["--policies", "lfu"], "'lfu' is an eviction policy, not a prefetch policy"),
        (["--cache-experts", "0"], "--cache-experts (trace"),
        (["--cache-experts", "17"], "must be in [1, 16]"),
        (["--cache-experts", ""], "--cache-experts is empty"),
        (["--lookahead", "0"], "--lookahead: lookahead must be >= 1"),
        (["--cache-ratios", "1,0.5,1"], "--cache-ratios lists [1.0] more than once"),
        (["--cache-experts", "3,3"], "--cache-experts lists [3] more than once"),
        (["--policies", "demand,demand"], "--policies lists ['demand'] more than once"),
    ],
)
def test_simulate_bad_arguments(capsys, small_trace, args, message):
    line = one_line_error(capsys, main(["simulate", "--trace", str(small_trace), *args]))
    assert message in line


def test_simulate_refuses_both_capacity_forms(small_trace):
    with pytest.raises(SystemExit) as e:  # argparse: mutually exclusive
        main(["simulate", "--trace", str(small_trace), "--cache-ratios", "1", "--cache-experts", "3"])
    assert e.value.code == 2


def test_simulate_csv_is_not_overwritten_without_force(capsys, small_trace, tmp_path):
    out = tmp_path / "m.csv"
    assert main(["simulate", "--trace", str(small_trace), "--cache-experts", "2", "--csv", str(out)]) == 0
    first = out.read_text()
    capsys.readouterr()
    assert "exists; pass --force" in one_line_error(
        capsys, main(["simulate", "--trace", str(small_trace), "--cache-experts", "3", "--csv", str(out)])
    )
    assert out.read_text() == first
    assert (
        main(["simulate", "--trace", str(small_trace), "--cache-experts", "3", "--csv", str(out), "--force"])
        == 0
    )
    assert out.read_text() != first


def test_the_same_trace_twice_is_refused(capsys, small_trace):
    line = one_line_error(
        capsys, main(["simulate", "--trace", str(small_trace), "--trace", str(small_trace)])
    )
    assert "--trace lists" in line and "more than once" in line


def test_profile_errors_name_the_file(capsys, tmp_path):
    path = tmp_path / "twice.yaml"
    path.write_text("warmup: 0\nwarmup: 1\n")
    line = one_line_error(capsys, main(["bench", "--profile", str(path), "--list"]))
    assert str(path) in line and "key 'warmup' given twice" in line
    line = one_line_error(capsys, main(["bench", "--profile", "cpu", "--set", "link_gbps=.nan", "--list"]))
    assert "overrides: link_gbps must be a finite number" in line


def test_missing_files_are_one_line(capsys, tmp_path):
    line = one_line_error(capsys, main(["simulate", "--trace", str(tmp_path / "none.safetensors")]))
    assert "none.safetensors" in line
    (tmp_path / "junk.safetensors").write_bytes(b"not a trace")
    line = one_line_error(capsys, main(["simulate", "--trace", str(tmp_path / "junk.safetensors")]))
    assert "junk.safetensors" in line


# --- bugs keep their traceback -----------------------------------------------------------------
@pytest.mark.parametrize(
    "exc",
    [KeyError("slot"), RuntimeError("boom"), ValueError("a plain ValueError is a bug"), OSError("disk")],
)
def test_unexpected_exceptions_are_not_swallowed(monkeypatch, small_trace, exc):
    def broken(a):
        raise exc

    monkeypatch.setattr(engine, "cmd_simulate", broken)
    with pytest.raises(type(exc)):
        main(["simulate", "--trace", str(small_trace)])


@pytest.mark.slow
def test_a_bug_prints_a_traceback_from_the_command_line(tmp_path):
    """End to end in a subprocess: a failing command that is not a user error shows its traceback."""
    code = (
        "import sys, artifact.cli as c, artifact.cli.engine as e\n"
        "def broken(a): raise KeyError('slot 3')\n"
        "e.cmd_simulate = broken\n"
        "sys.exit(c.main(['simulate', '--trace', 'x']))\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert p.returncode == 1 and "Traceback" in p.stderr and "KeyError: 'slot 3'" in p.stderr


def test_user_errors_are_value_errors():
    for cls in (SettingError, DeviceError):
        assert issubclass(cls, UserError) and issubclass(cls, ValueError)


# --- defaults come from the settings dataclass -------------------------------------------------
def test_cli_defaults_are_the_settings_defaults():
    d = Settings()
    g = build_parser().parse_args(["generate", "--prompt", "x", "--offload", "--cache-experts", "4"])
    assert (g.gen_length, g.steps, g.threshold, g.mode) == (d.gen_length, d.steps, d.threshold, d.mode)
    assert (g.model, g.dtype, g.device) == (d.model, d.dtype, d.device)
    assert (g.forward, g.expert_kernel) == (d.forward, d.expert_kernel)
    assert g.link is None and g.tau is None  # offload flags: None until resolved, to see what was given
    spec = engine.run_spec_from_args(g)  # the flags not given take RunSpec's defaults
    assert (spec.link, spec.latency_us, spec.lookahead, spec.tau) == (
        d.link,
        d.latency_us,
        d.lookahead,
        d.tau,
    )
    assert (spec.link_gbps, spec.policy, spec.link_priority) == (d.link_gbps, d.policies[0], d.link_priority)
    assert spec.capacity == 4 and spec.decode == d.decode_config() and spec == d.run_spec(4)
    t = build_parser().parse_args(["trace", "--task", "gsm8k", "--out", "x"])
    assert (t.n, t.seed, t.gen_length) == (d.trace_n_prompts, d.seed, d.gen_length)
    s = build_parser().parse_args(["simulate", "--trace", "x"])
    assert s.policies == list(d.sim_policies) and s.cache_ratios is None and s.cache_experts is None
    assert (s.lookahead, s.tau) == (d.lookahead, d.tau)
    m = build_parser().parse_args(["model", "--trace", "x"])
    assert (m.lookahead, m.tau) == (d.lookahead, d.tau)


def test_core_run_defaults_equal_the_settings_defaults():
    """Settings' run keys (RUN_KEYS) default to RunSpec()'s and DecodeConfig()'s, and the list is whole: every
    Settings field that is a RunSpec or DecodeConfig field is a run key."""
    d, run, dc = Settings(), RunSpec(), DecodeConfig()
    decode_keys = {f.name for f in dataclasses.fields(DecodeConfig)}
    for key in RUN_KEYS:
        core = getattr(dc, key) if key in decode_keys else getattr(run, key)
        assert getattr(d, key) == core, key
    shared = {f.name for f in dataclasses.fields(Settings)} & (
        {f.name for f in dataclasses.fields(RunSpec)} | decode_keys
    )
    assert set(RUN_KEYS) == shared and len(RUN_KEYS) == len(shared)
    assert run.policy == d.policies[0]
    assert ForwardOptions().forward == run.forward == d.forward == d.run_spec().forward
    assert ForwardOptions().expert_kernel == run.expert_kernel == d.expert_kernel
    assert d.run_spec() == RunSpec(decode=d.decode_config()) == run


# --- Settings.run_spec: the link's rates --------------------------------------------------------
def test_run_spec_on_the_emulated_link_scales_the_bandwidth():
    p = load_profile("cpu", {"lookahead": 2, "tau": 3, "latency_us": 5.0})
    spec = p.run_spec(12, "last_step", bandwidth_scale=0.5)
    bandwidth, cap = spec.link_rates(EB)
    assert bandwidth == pytest.approx(emulated_bandwidth_gbps(EB) * 0.5) == pytest.approx(12.5)
    assert (spec.capacity, spec.policy, spec.link, cap) == (12, "last_step", "emulated", None)
    assert (spec.lookahead, spec.tau, spec.latency_us) == (2, 3, 5.0)  # never dropped (issue 10)
    assert spec.link_rate(EB) == bandwidth
    assert spec.make_link(EB).bandwidth_gbps == pytest.approx(12.5)
    fixed = load_profile("cpu", {"link_gbps": 2.0}).run_spec(4, bandwidth_scale=2.0, cap_gbps=3.0)
    assert fixed.link_rates(EB) + (fixed.link_rate(EB),) == (4.0, 3.0, 3.0)


def test_run_spec_on_the_cuda_link_caps_below_scale_one():
    s = RunSpec(device="cuda", capacity=8, link="cuda", link_gbps=40.0, lookahead=2)
    assert s.link_rates(EB) + (s.link_rate(EB), s.lookahead) == (None, None, None, 2)  # unpaced
    assert s.replace(bandwidth_scale=0.25).link_rates(EB) == (None, 10.0)
    # no link_gbps in the profile: the bench fills in the measured pinned-copy rate (here 50 GB/s)
    unmeasured = RunSpec(device="cuda", capacity=8, link="cuda", bandwidth_scale=0.5)
    assert unmeasured.replace(link_gbps=50.0).link_rates(EB) == (None, 25.0)
    with pytest.raises(SettingError, match="needs link_gbps"):
        unmeasured.link_rates(EB)
    with pytest.raises(SettingError, match="finite"):
        s.replace(bandwidth_scale=math.nan)
    with pytest.raises(SettingError, match=r"bandwidth_scale must be in \(0, 1\]"):
        s.replace(bandwidth_scale=2.0)  # a cuda link cannot run faster than its hardware


def test_spec_check_refuses_nan_and_bad_knobs():
    for bad, pattern in [
        (dict(cap_gbps=math.nan), "cap_gbps must be a finite"),
        (dict(link_gbps=math.inf), "link_gbps must be a finite"),
        (dict(latency_us=math.nan), "latency_us must be a finite"),
        (dict(lookahead=0), "lookahead must be >= 1"),
        (dict(capacity=True), "cache capacity must be an integer"),
    ]:
        with pytest.raises(SpecError, match=re.escape(pattern)) as e:
            RunSpec(**{"capacity": 4, **bad})
        assert e.value.field == next(iter(bad)), bad


def test_every_run_is_built_as_one_run_spec():
    """The hand-written copies the issue found (bench, analysis, tide, cli) all make their run one way: from
    the profile (Settings.run_spec) or the flags (run_spec_from_args), or take a RunSpec whole; the link's
    rates are derived in one place (RunSpec.link_rates, through RunSpec.make_link)."""
    for rel in ("artifact/experiments/bench/model_runner.py", "artifact/experiments/harness.py"):
        text = (ROOT / rel).read_text()
        assert ".run_spec(" in text and not re.search(r"(?<![\w.])RunSpec\(", text), rel
    cli = (ROOT / "artifact/cli/engine.py").read_text()
    assert len(re.findall(r"= run_spec_from_args\(a\)", cli)) == 2, "generate and trace"
    for path in sorted((ROOT / "artifact").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "artifact/offload/spec.py" or rel.startswith("artifact/offload/links/"):
            continue
        text = path.read_text()
        assert not re.search(r"(?<![\w.])make_link\(|emulated_bandwidth_gbps\(", text), rel


# --- simulate --cache-experts reproduces an engine run -----------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    "policy, forward", [("demand", "eager"), ("last_step", "eager"), ("last_step", "segmented")]
)
def test_simulate_at_the_engines_capacity_gives_the_engines_counts(tmp_path, capsys, policy, forward):
    trace = tmp_path / "run.safetensors"
    assert (
        main(
            [
                "generate",
                "--prompt",
                "How many eggs?",
                "--prompt",
                "def add(a, b):",
                "--gen-length",
                "32",
                "--offload",
                "--cache-experts",
                "20",
                "--policy",
                policy,
                "--record-trace",
                str(trace),
                "--forward",
                forward,
                "--json",
            ]
        )
        == 0
    )
    engine = json.loads(capsys.readouterr().out)["stats"]
    assert engine["forward"] == forward
    assert (
        main(["simulate", "--trace", str(trace), "--cache-experts", "20", "--policies", policy, "--json"])
        == 0
    )
    (row,) = json.loads(capsys.readouterr().out)
    assert row["cache_experts"] == engine["cache_experts"] == 20
    for k in (
        "demand_hits",
        "demand_misses",
        "speculative_transfers",
        "prefetch_hits",
        "wasted_prefetches",
        "bytes_h2d",
    ):
        assert row[k] == engine[k], k
    assert engine["demand_misses"] > 0
    assert engine["transfers"] == engine["demand_misses"] + engine["speculative_transfers"]  # docs/DESIGN.md
