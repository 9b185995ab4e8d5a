"""Issue 53: every entry point takes a RunSpec and honours it, or refuses in one line. Each entry point runs
on the CPU with one of five options set away from its default, and what the run did shows the value took
effect: the denoising forwards run as segments (forward segmented), the kernel every expert group was
computed with (expert_kernel loop), the priority the run's link was built with (link_priority demand), and
the lookahead and tau its policy was built with (2 each; RunSpec.make_policy and make_link are the one place
a run makes them, so a path that builds its own, or drops the value on the way, leaves the default there).
Where a path cannot honour an option (a stream-driven run has no model forward, the performance model's costs
price eager forwards and the grouped kernel, TIDE's comparison runs our engine in mode full too) it must
refuse with a SettingError naming the option; any other outcome fails."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

import artifact.model.llada2 as llada2
import artifact.offload.spec as spec_module
import artifact.offload.trace_engine as trace_engine
from artifact.errors import SettingError
from artifact.experiments.settings import load_profile
from artifact.model.decode import DecodeConfig
from artifact.offload.spec import RunSpec

ROOT = Path(__file__).resolve().parents[1]
OPTIONS = {  # the option, its non-default value
    "forward": "segmented",
    "expert_kernel": "loop",
    "link_priority": "demand",
    "lookahead": 2,
    "tau": 2,
}
SMALL = {
    "gen_length": 32,
    "max_prompt_tokens": 32,
    "n_prompts": 1,
    "batch_sizes": [1],
    "trace_n_prompts": 1,
    "trace_batch_sizes": [1],
}
DC = DecodeConfig(gen_length=32)


class Seen:
    """What the runs did, as the code that acts on each option saw it."""

    def __init__(self):
        self.kernels, self.priorities, self.policies, self.segment_forwards = set(), [], [], 0

    def value(self, option: str):
        if option == "forward":
            return "segmented" if self.segment_forwards else "eager"
        if option == "expert_kernel":
            return "loop" if self.kernels == {"loop"} else sorted(self.kernels)
        if option == "link_priority":
            return "demand" if self.priorities and set(self.priorities) == {"demand"} else self.priorities
        return {kw[option] for kw in self.policies} or None


@pytest.fixture
def seen(monkeypatch):
    s = Seen()
    real_ffn, real_link, real_policy = llada2.grouped_ffn, spec_module.make_link, spec_module.make_policy
    real_segments = llada2.run_segments

    def segmented(*args, **kw):  # a denoising forward run as segments (the model's, whichever model)
        s.segment_forwards += 1
        return real_segments(*args, **kw)

    def ffn(xs, group, spans, offsets, kernel):
        s.kernels.add(kernel)
        return real_ffn(xs, group, spans, offsets, kernel)

    def link(kind, **kw):
        s.priorities.append(kw.get("priority"))
        return real_link(kind, **kw)

    def policy(name, num_layers, num_experts, **kw):
        s.policies.append(kw)
        return real_policy(name, num_layers, num_experts, **kw)

    monkeypatch.setattr(llada2, "run_segments", segmented)
    monkeypatch.setattr(llada2, "grouped_ffn", ffn)
    monkeypatch.setattr(trace_engine, "grouped_ffn", ffn)
    monkeypatch.setattr(spec_module, "make_link", link)
    monkeypatch.setattr(spec_module, "make_policy", policy)
    return s


# --- the entry points: each runs its own way with one option changed ------------------------------------
def profile(option: str, **more):
    return load_profile("cpu", {**SMALL, option: OPTIONS[option], **more})


def run_bench(tiny, option):
    from artifact.experiments.bench.grid import Cell
    from artifact.experiments.bench.model_runner import ModelRunner

    runner = ModelRunner(profile(option), tiny)
    runner.measure(Cell("gsm8k", 1, 1.0, 1.0), "last_step", 8)


def run_quickstart(tiny, option):
    from artifact.experiments.studies.quickstart import quickstart

    quickstart(profile(option), cache_ratio=0.5)


def run_trace_recorder(tiny, option):
    from artifact.experiments.harness import record_trace

    record_trace(profile(option, trace_capacity=8), "gsm8k", 1)


def run_validation(tiny, option):
    from artifact.experiments.studies.performance_model import validate_cpu

    validate_cpu(
        profile(option),
        ratios=(1.0,),
        policies=("last_step",),
        batch_sizes=(1,),
        repetitions=1,
        n_prompts=1,
        progress=False,
    )


def run_cli_generate(tiny, option):
    from artifact.cli import main

    flag = "--" + option.replace("_", "-")
    args = ["generate", "--prompt", "hi", "--gen-length", "32", "--offload", "--cache-experts", "8"]
    main([*args, "--policy", "last_step", flag, str(OPTIONS[option]), "--json"])


def run_cli_trace(tiny, option, tmp_path):
    from artifact.cli import main

    flag = "--" + option.replace("_", "-")
    main(
        [
            "trace",
            "--task",
            "gsm8k",
            "--n",
            "1",
            "--gen-length",
            "32",
            "--out",
            str(tmp_path / "t.safetensors"),
            flag,
            str(OPTIONS[option]),
        ]
    )


def spec_with(option, **fields) -> RunSpec:
    return RunSpec(decode=DC, **{option: OPTIONS[option]}, **fields)


def run_tide_engine_row(tiny, option):
    from artifact.experiments.tide.adapter import engine_row

    engine_row(tiny, [[11, 12, 13]], 8, spec_with(option), policy="last_step")


def run_calibrate(tiny, option):
    trace_engine.calibrate(tiny, [[11, 12, 13]], spec_with(option))


TRACES = {}  # the routing the stream-driven entry points replay, recorded before the spies are set


@pytest.fixture(scope="module")
def routing(tiny):
    from artifact.offload.runner import decode_prompts

    TRACES["tiny"] = decode_prompts(tiny, [[11, 12, 13]], 1, RunSpec(decode=DC), record=True).trace
    return TRACES["tiny"]


def tiny_trace(tiny):
    return TRACES["tiny"]


def run_stream(tiny, option):
    from artifact.offload.trace_engine import ExpertShape

    cfg = tiny.cfg
    shape = ExpertShape(cfg.hidden_size, cfg.moe_intermediate_size)
    trace_engine.run_stream(tiny_trace(tiny), spec_with(option, capacity=8, policy="last_step"), shape)


def run_model_run(tiny, option):
    from artifact.experiments.hardware import HARDWARE
    from artifact.experiments.studies.performance_model import model_run, shape
    from artifact.offload.links.costs import Costs

    costs = Costs(HARDWARE["cpu-emulated"], shape("tiny"))
    model_run(tiny_trace(tiny), costs, spec_with(option, capacity=8, policy="last_step"))


def run_model_grid(tiny, option):
    from artifact.experiments.hardware import HARDWARE
    from artifact.experiments.studies.performance_model import model_grid

    model_grid([tiny_trace(tiny)], HARDWARE["h200"], "tiny", spec_with(option), ["last_step"], [1.0])


def script(name: str):
    path = ROOT / "scripts" / f"{name}.py"
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(f"_entry_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_gpu_check(tiny, option):
    import torch

    gpu_check = script("gpu_check")
    a = gpu_check.parse_args(
        [
            "--device",
            "cpu",
            "--allow-cpu",
            "--batches",
            "1",
            "--ratios",
            "1.0",
            "--gen-length",
            "32",
            "--prompt-length",
            "32",
            "--layers",
            "2",
            "--" + option.replace("_", "-"),
            str(OPTIONS[option]),
        ]
    )
    cfg = gpu_check.model_config(a, a.layers)
    gpu_check.engine(a, torch, cfg, "float32", {})


def benchmark(name: str):
    path = ROOT / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_benchmark_offload_overhead(tiny, option):
    from artifact.cli.args import add_run_spec_args, run_spec_of

    ap = argparse.ArgumentParser()
    add_run_spec_args(ap)
    a = ap.parse_args(["--" + option.replace("_", "-"), str(OPTIONS[option])])
    spec = run_spec_of(a, decode=DC, capacity=8, policy="last_step")
    benchmark("offload_overhead").timed_layers(tiny, [[11, 12, 13]], spec)


ENTRY_POINTS = {
    "bench": run_bench,
    "notebook 00 (quickstart)": run_quickstart,
    "trace recorder (harness)": run_trace_recorder,
    "notebook 08 (validation)": run_validation,
    "cli generate": run_cli_generate,
    "cli trace": run_cli_trace,
    "tide engine row": run_tide_engine_row,
    "trace_engine.calibrate": run_calibrate,
    "run_stream": run_stream,
    "model_run": run_model_run,
    "model_grid": run_model_grid,
    "scripts/gpu_check.py": run_gpu_check,
    "benchmarks/offload_overhead.py": run_benchmark_offload_overhead,
}
# What an entry point cannot honour, refused in one line (the message names the option).
REFUSES = {
    ("run_stream", "forward"),
    ("model_run", "forward"),
    ("model_run", "expert_kernel"),
    ("model_grid", "forward"),
    ("model_grid", "expert_kernel"),
}
# What an entry point has nothing to apply to: a resident run has no link or policy; the performance model
# and the stream have no model forward to compute the kernel of (run_stream reports its kernel, below).
NOT_READ = {
    (e, o) for e in ("cli trace", "trace_engine.calibrate") for o in ("link_priority", "lookahead", "tau")
}


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_every_entry_point_honours_each_option_or_refuses_it(entry, option, tiny, routing, seen, tmp_path):
    if (entry, option) in NOT_READ - REFUSES:
        pytest.skip(f"{entry} has nothing that reads {option}")
    run = ENTRY_POINTS[entry]
    args = (tiny, option, tmp_path) if entry == "cli trace" else (tiny, option)
    if (entry, option) in REFUSES:
        with pytest.raises(SettingError, match=option.replace("_", "[_ ]")):
            run(*args)
        return
    run(*args)
    got = seen.value(option)
    want = OPTIONS[option] if option in ("forward", "expert_kernel", "link_priority") else {OPTIONS[option]}
    assert got == want, f"{entry} dropped {option}={OPTIONS[option]!r}: the run saw {got!r}"


def test_the_stream_reports_the_kernel_it_computed_with(tiny, routing, seen):
    from artifact.offload.trace_engine import ExpertShape

    shape = ExpertShape(tiny.cfg.hidden_size, tiny.cfg.moe_intermediate_size)
    st = trace_engine.run_stream(tiny_trace(tiny), spec_with("expert_kernel", capacity=8), shape, verify=True)
    assert st["expert_kernel"] == "loop" and seen.kernels == {"loop"}
