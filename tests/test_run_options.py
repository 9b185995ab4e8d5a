"""Issue 45: every entry point that decodes passes one RunSpec, so a profile's (or the flags') forward mode
reaches every run. Each entry point runs here with forward "segmented" on the CPU, and the segment counter the
run reports (SegmentCounts.forwards: RunResult.segments, the model's programs' counts, the CLI's output) shows
its denoising forwards went through the segments; the same entry point with forward "eager" runs none."""

from __future__ import annotations

import json

import pytest

from artifact.errors import ProfileError, SettingError, SpecError
from artifact.experiments.settings import load_profile
from artifact.model.decode import DecodeConfig
from artifact.model.options import ForwardOptions
from artifact.offload.runner import decode_prompts
from artifact.offload.spec import RunSpec

SMALL = {
    "gen_length": 32,
    "max_prompt_tokens": 32,
    "n_prompts": 1,
    "batch_sizes": [1],
    "trace_n_prompts": 1,
    "trace_batch_sizes": [1],
}


def profile(forward: str):
    return load_profile("cpu", {**SMALL, "forward": forward})


def segment_forwards(loaded) -> int:
    """Denoising forwards the model has run as segments so far (its programs' counts)."""
    return loaded.model.programs.counts.forwards


def ran(entry, loaded) -> int:
    """Segmented forwards during entry()."""
    before = segment_forwards(loaded)
    entry()
    return segment_forwards(loaded) - before


# --- the object --------------------------------------------------------------------------------------------
def test_run_specs_are_built_once_from_the_profile_and_checked_on_the_way():
    P = profile("segmented")
    o = P.run_spec()
    assert (
        (o.decode, o.device, o.forward) == (P.decode_config(), P.device, "segmented")
        and not o.offloaded
        and o.capture
        and o.expert_kernel == "grouped"
    )
    assert P.run_spec(capture=False).capture is False
    f = o.forward_options(backend=None, predict_next=True)
    assert f == ForwardOptions("segmented", predict_next=True, capture=True, expert_kernel="grouped")
    with pytest.raises(
        SettingError,
        match=r"unknown forward mode 'fast'; choose one of \('eager', "
        r"'segmented'\)",
    ) as e:
        RunSpec(forward="fast")
    assert isinstance(e.value, SpecError) and e.value.field == "forward"
    with pytest.raises(ProfileError, match=r"overrides: forward: unknown forward mode 'fast'"):
        load_profile("cpu", {"forward": "fast"})
    with pytest.raises(SpecError, match="decode must be a DecodeConfig, got dict"):
        RunSpec(decode={"gen_length": 32})


def test_decode_prompts_refuses_a_bare_decode_config(tiny):
    with pytest.raises(SettingError, match="takes a RunSpec as its 4th argument, got DecodeConfig"):
        decode_prompts(tiny, [[11, 12]], 1, DecodeConfig(gen_length=32))


# --- every entry point, segmented on the CPU -------------------------------------------------------------
@pytest.mark.parametrize("forward", ["segmented", "eager"])
def test_quickstart_runs_in_the_profiles_forward_mode(forward):
    from artifact.experiments.studies.quickstart import quickstart

    q = quickstart(profile(forward), cache_ratio=0.5)
    resident, offloaded = q["segments"]
    assert q["resident"]["forward"] == q["offloaded"]["forward"] == forward
    if forward == "eager":
        assert resident is offloaded is None
    else:
        assert resident.forwards == q["resident"]["forwards"] > 0  # every denoising forward: segments
        assert offloaded.forwards == q["offloaded"]["forwards"] > 0
    assert q["same_tokens"]


@pytest.mark.parametrize("forward", ["segmented", "eager"])
def test_the_trace_recorder_runs_in_the_profiles_forward_mode(forward):
    from artifact.experiments.harness import load_model, record_trace

    P = profile(forward)
    loaded = load_model(P)
    n = ran(lambda: record_trace(P, P.trace_tasks[0], 1), loaded)
    assert (n > 0) == (forward == "segmented"), n


def test_the_performance_models_validation_runs_segmented():
    from artifact.experiments.harness import load_model
    from artifact.experiments.studies.performance_model.validation import validate_cpu

    P = profile("segmented")
    loaded = load_model(P)
    out = {}
    n = ran(
        lambda: out.update(
            rows=validate_cpu(
                P,
                ratios=(1.0,),
                policies=("demand",),
                batch_sizes=(1,),
                repetitions=1,
                n_prompts=1,
                progress=False,
            )[0]
        ),
        loaded,
    )
    # its traced run, trace_engine.calibrate's resident runs (a warm-up and one timed: it decodes as the spec
    # says), the calibration's offloaded runs at two C (a warm-up and one timed each), the measured row
    assert n == 8 * int(out["rows"].forwards.iloc[0]) > 0


def test_the_bench_runner_runs_segmented():
    from artifact.experiments.bench.grid import Cell
    from artifact.experiments.bench.model_runner import ModelRunner
    from artifact.experiments.harness import load_model

    P = profile("segmented")
    runner = ModelRunner(P, load_model(P))
    traced = ran(lambda: runner.working_set(P.tasks[0], 1), runner.loaded)  # the W trace recorder
    out = {}
    timed = ran(
        lambda: out.update(row=runner.measure(Cell(P.tasks[0], 1, 1.0, 1.0), "demand", 8)), runner.loaded
    )
    assert traced > 0 and timed == out["row"]["forwards"] > 0


def test_the_tide_adapters_engine_run_runs_segmented(tiny, tiny_prompts):
    from artifact.experiments.tide.adapter import engine_row

    spec = RunSpec(decode=DecodeConfig(gen_length=32), device="cpu", forward="segmented")
    out = {}
    n = ran(lambda: out.update(row=engine_row(tiny, [tiny_prompts[3]], 12, spec)[0]), tiny)
    assert n == out["row"]["forwards"] > 0


def test_the_cli_generate_and_trace_commands_run_segmented(tmp_path, capsys):
    from artifact.cli import main

    args = ["--gen-length", "32", "--forward", "segmented"]
    assert main(["generate", "--prompt", "hello", "--json", *args]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (
        out["stats"]["forward"] == "segmented" and out["segments"]["forwards"] == out["stats"]["forwards"] > 0
    )
    assert main(["generate", "--prompt", "hello", "--json", "--gen-length", "32"]) == 0
    assert "segments" not in json.loads(capsys.readouterr().out)  # eager: no segments
    assert (
        main(["trace", "--task", "gsm8k", "--n", "1", "--out", str(tmp_path / "t.safetensors"), *args]) == 0
    )
    line = capsys.readouterr().out
    assert "forwards as segments" in line and int(line.split(" forwards as segments")[0].split()[-1]) > 0
