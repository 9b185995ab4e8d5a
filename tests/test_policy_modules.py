"""A policy of the user's own, named by module: docs/policies.md's example file runs from the command line
(--policy-module), from a profile (policy_modules) in the bench, and in a submitted job's process; a module
that cannot be imported is a one-line error naming the key, the module and what is expected."""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

from artifact.cli import main
from artifact.errors import ProfileError, SettingError
from artifact.experiments.bench.order import primary
from artifact.experiments.settings import load_profile
from artifact.offload.policy.policies import POLICIES, Policy, register
from artifact.offload.policy.policy_modules import load_policy_module
from artifact.offload.policy.prefetch import DemandPolicy

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = "examples/top_count_policy.py"
TRACE = "tests/fixtures/tiny-gsm8k-b1.safetensors"


def test_the_docs_show_the_example_file_as_it_is():
    """docs/policies.md names the file and shows it whole: the code a reader copies is the code tested
    here."""
    doc = (ROOT / "docs/policies.md").read_text()
    m = re.search(rf"`{re.escape(EXAMPLE)}`[^\n]*\n+```python\n(.*?)```", doc, re.S)
    assert m, f"docs/policies.md shows no python block after naming {EXAMPLE}"
    assert m.group(1) == (ROOT / EXAMPLE).read_text()
    assert f"--policy-module {EXAMPLE}" in doc


def _simulate(module: str) -> dict:
    """`python -m artifact simulate` of the tiny stored trace, in a fresh process: rows by policy."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "artifact",
            "simulate",
            "--trace",
            TRACE,
            "--cache-experts",
            "8",
            "--policies",
            "demand,top_count,top_count:lookahead=2",
            "--policy-module",
            module,
            "--json",
            "--threads",
            "1",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return {r["policy"]: r for r in json.loads(out.stdout)}


@pytest.mark.parametrize("module", [EXAMPLE, "examples.top_count_policy"])
def test_the_command_line_runs_the_example_policy(module):
    """By path or by dotted name (the working directory is on sys.path): the policy ran, and its option
    too."""
    rows = _simulate(module)
    assert rows["demand"]["speculative_transfers"] == 0
    assert rows["top_count"]["speculative_transfers"] > 0 and rows["top_count"]["prefetch_hits"] > 0
    assert (
        rows["top_count"]["demand_misses"] != rows["top_count:lookahead=2"]["demand_misses"]
        or rows["top_count"]["prefetch_hits"] != rows["top_count:lookahead=2"]["prefetch_hits"]
    )


def test_without_the_module_the_name_is_unknown_and_says_how(capsys):
    assert "top_count" not in POLICIES
    assert (
        main(["simulate", "--trace", str(ROOT / TRACE), "--cache-experts", "8", "--policies", "top_count"])
        == 2
    )
    err = capsys.readouterr().err
    assert (
        "unknown policy 'top_count'" in err
        and "--policy-module" in err
        and len(err.strip().splitlines()) == 1
    )


@pytest.mark.parametrize(
    "module, says",
    [
        ("no_such_policy_module", "'no_such_policy_module' cannot be imported (ModuleNotFoundError"),
        ("json", "'json' was imported but registers no policy"),
        ("missing/policy.py", "'missing/policy.py' is not a file"),
    ],
)
def test_a_module_that_does_not_load_is_one_line_naming_the_flag_and_the_module(capsys, module, says):
    assert (
        main(["simulate", "--trace", str(ROOT / TRACE), "--policies", "demand", "--policy-module", module])
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith("error: --policy-module: ") and says in err and "expected a dotted module name" in err
    )
    assert len(err.splitlines()) == 1


def test_an_error_in_the_module_names_its_line(tmp_path):
    bad = tmp_path / "bad_policy.py"
    bad.write_text("import numpy\n\nraise ValueError('half written')\n")
    with pytest.raises(SettingError, match=rf"ValueError: half written at {re.escape(str(bad))}:3\)"):
        load_policy_module(str(bad), "--policy-module")


def test_the_profile_key_is_checked_at_load_and_names_the_file(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text("policy_modules: [no_such_policy_module]\npolicies: [demand]\n")
    with pytest.raises(
        ProfileError,
        match=rf"^{re.escape(str(f))}: policy_modules: 'no_such_policy_module' "
        "cannot be imported",
    ):
        load_profile(f)
    f.write_text("policies: [demand, top_count]\n")
    with pytest.raises(ProfileError, match="policies has 'top_count': unknown policy"):
        load_profile(f)


def test_the_profile_key_registers_the_policy_for_the_profile(user_policy):
    P = load_profile("cpu", {"policy_modules": [str(ROOT / EXAMPLE)], "policies": ["demand", "top_count"]})
    assert P.policies == ("demand", "top_count") and POLICIES["top_count"].__module__ == user_policy.__name__


def test_the_flag_adds_to_the_profile_key_on_a_profile_command(user_policy):
    from artifact.cli import build_parser
    from artifact.cli.args import overrides_from_args

    a = build_parser().parse_args(
        [
            "bench",
            "--set",
            f"policy_modules=[{ROOT / EXAMPLE}]",
            "--policy-module",
            "examples.top_count_policy",
            "--policy-module",
            str(ROOT / EXAMPLE),
        ]
    )
    assert overrides_from_args(a)["policy_modules"] == [str(ROOT / EXAMPLE), "examples.top_count_policy"]


def test_an_unpickled_profile_imports_its_modules_in_a_fresh_process(tmp_path, user_policy):
    """What a submitted bench shard gets: the pickled Settings, in another process."""
    P = load_profile("cpu", {"policy_modules": [str(ROOT / EXAMPLE)], "policies": ["demand", "top_count"]})
    (tmp_path / "P.pkl").write_bytes(pickle.dumps(P))
    code = (
        "import pickle; from artifact.offload.policy.policies import POLICIES; assert 'top_count' not in "
        "POLICIES; "
        f"P = pickle.loads(open({str(tmp_path / 'P.pkl')!r}, 'rb').read()); print('top_count' in "
        "POLICIES)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True"]


def test_a_name_taken_by_another_file_is_refused(user_policy):
    class Mine(Policy):
        name = "demand"

    taken = r"policy name .demand. is taken by artifact.offload.policy.prefetch.DemandPolicy"
    with pytest.raises(TypeError, match=taken):
        register(Mine)
    assert POLICIES["demand"] is DemandPolicy
    again = load_policy_module("examples.top_count_policy")  # the same file by another name: replaces itself
    assert POLICIES["top_count"].__module__ == again.__name__
    del POLICIES["top_count"]  # the fixture removes the first one's


@pytest.mark.slow
def test_the_bench_runs_the_example_policy_from_the_profile_key(tiny, tmp_path, user_policy):
    from artifact.experiments.bench import run_bench

    p = load_profile(
        "cpu",
        {
            "tasks": ["mbpp"],
            "batch_sizes": [1],
            "cache_ratios": [1.0],
            "repetitions": 1,
            "warmup": 0,
            "n_prompts": 1,
            "gen_length": 32,
            "max_prompt_tokens": 32,
            "policies": ["demand", "top_count"],
            "policy_modules": [str(ROOT / EXAMPLE)],
        },
    )
    rows = run_bench(p, tmp_path / "b.csv", loaded=tiny, progress=False, log=lambda s: None)
    df = primary(rows).set_index("policy")  # arm A: the A/A pair's second demand run left out
    assert list(df.index) == ["demand", "top_count"] and df.tokens_sha.nunique() == 1
    assert df.speculative_transfers["demand"] == 0 and df.speculative_transfers["top_count"] > 0


@pytest.mark.slow
def test_generate_runs_the_example_policy_in_the_engine():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "artifact",
            "generate",
            "--prompt",
            "What is 2 + 2?",
            "--gen-length",
            "32",
            "--offload",
            "--cache-experts",
            "8",
            "--policy",
            "top_count",
            "--policy-module",
            EXAMPLE,
            "--json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    stats = json.loads(out.stdout)["stats"]
    assert stats["speculative_transfers"] > 0 and stats["prefetch_hits"] > 0
