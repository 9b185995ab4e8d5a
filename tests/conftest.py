"""Shared fixtures. The tiny checkpoint is built once per test session into a temporary cache."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("ARTIFACT_CACHE", os.path.join(os.path.dirname(__file__), "..", ".cache"))
# The tiny model's matmuls are too small to gain from a second thread, and on a shared 2-core machine
# OpenMP spin-waiting makes two threads 10-30x slower; one thread also keeps float results stable.
torch.set_num_threads(1)


# The unit tier (./run_tests.sh --fast, pytest -m "not slow") leaves out what runs the tiny model end to end:
# tests using these fixtures (they decode prompts or write whole checkpoints), and the tests named below.
MODEL_RUN_FIXTURES = {"tiny_prompts", "resident", "recorded", "written"}
SLOW_TESTS = {
    "test_cli_trace_and_simulate",  # records a trace through the CLI
    "test_cpu_dry_run_writes_the_summary",  # scripts/gpu_check in subprocesses
    "test_no_gpu_exits_3_with_a_clear_message",
    "test_a_failing_measurement_keeps_the_summary",
    "test_run_skip_force_and_failures",  # executes notebooks in kernels
    "test_every_figure_is_saved_with_the_data_it_plotted",  # records traces and draws every figure
    "test_traces_are_recorded_once_and_rerecorded_when_settings_change",
    "test_tiny_checkpoint_is_deterministic",  # builds the tiny checkpoint twice
    "test_after_an_exception_in_a_forward_no_copy_writes_into_the_slots",  # decodes over a 1 MB/s link (15 s)
}


def pytest_collection_modifyitems(config, items):
    slow = pytest.mark.slow
    for item in items:
        if MODEL_RUN_FIXTURES & set(getattr(item, "fixturenames", ())) or item.originalname in SLOW_TESTS:
            item.add_marker(slow)
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU; torch.cuda.is_available() is False on this machine")
        for item in items:
            if "cuda" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny():
    """The tiny checkpoint loaded in float32 on the CPU (experts resident)."""
    from artifact.model.checkpoint import load_checkpoint
    from artifact.model.tiny import tiny_checkpoint

    return load_checkpoint(tiny_checkpoint())


@pytest.fixture(scope="session")
def tiny_prompts(tiny):
    """Five chat-formatted prompts of different lengths (two shorter than a block, one over two)."""
    from artifact.model.tasks import encode

    texts = [
        "Janet's ducks lay 16 eggs per day.",
        "def add(a, b):",
        "Write a haiku about the sea, in exactly three lines, with no commas at all, and a title.",
        "What is 2 + 2?",
        "Natalia sold clips to 48 of her friends in April, and then she sold half as "
        "many clips in May. How many clips did Natalia sell altogether in April and May?",
    ]
    return [encode(tiny.tokenizer, t) for t in texts]


@pytest.fixture
def user_policy():
    """examples/top_count_policy.py (docs/policies.md's example policy, `top_count`) imported as a policy
    module; afterwards its registration and module are removed, so no other test sees the extra policy."""
    import sys

    from artifact.offload.policy.policies import POLICIES
    from artifact.offload.policy.policy_modules import load_policy_module

    before = set(sys.modules)
    module = load_policy_module(
        os.path.join(os.path.dirname(__file__), "..", "examples", "top_count_policy.py")
    )
    try:
        yield module
    finally:
        for name in [n for n, c in POLICIES.items() if c.__module__ == module.__name__]:
            del POLICIES[name]
        for name in set(sys.modules) - before:
            del sys.modules[name]
