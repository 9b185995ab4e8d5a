"""Settings and profiles: the dataclass holds every default, a profile only overrides; every bundled one
loads; every bad key or value is named in a clear error."""

from __future__ import annotations

import math
import typing

import pytest
import yaml

from artifact.errors import SettingError, UserError
from artifact.experiments import settings
from artifact.experiments.settings import (
    PROFILE_DIR,
    PROFILE_KEYS,
    RANGES,
    ProfileError,
    Settings,
    list_profiles,
    load_profile,
    parse_override,
)

PAPER_RATIOS = (0.43, 0.83, 1.0, 1.3, 1.73)


def write(tmp_path, text, name="mine.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_bundled_profiles_load():
    assert list_profiles() == ["a5000", "a5000_ae", "cpu", "h200", "h200_ae", "h200_flash"]
    for name in list_profiles():
        p = load_profile(name)
        assert p.name == name and p.description
        assert p.n_prompts >= max(p.batch_sizes)


def test_defaults_are_valid_and_profiles_hold_overrides_only():
    defaults = Settings()
    assert not hasattr(settings, "Profile") and defaults.name == "defaults"  # one name for the type
    assert load_profile(PROFILE_DIR / "cpu.yaml").gen_length == 32  # by path as by name
    for name in list_profiles():
        data = yaml.safe_load((PROFILE_DIR / f"{name}.yaml").read_text())
        same = [
            k
            for k, v in data.items()
            if k != "description" and (tuple(v) if isinstance(v, list) else v) == getattr(defaults, k)
        ]
        assert not same, f"{name}.yaml repeats defaults {same}: a profile holds overrides only"
    assert not list(PROFILE_DIR.glob("base.y*ml"))  # the dataclass is the base


def _numeric(key):
    tp = typing.get_type_hints(Settings)[key]  # int, float, X | None or tuple[X, ...]
    args = typing.get_args(tp)
    inner = [a for a in args if a is not type(None)] or [tp]
    if typing.get_origin(inner[0]) is tuple:
        inner = typing.get_args(inner[0])[:1]
    return inner[0] in (int, float)


def test_every_numeric_setting_has_a_range():
    """Every int/float setting is range-checked: by RANGES, or as a run key (settings.RUN_KEYS) by the one
    validator of a run's values (RunSpec.check and DecodeConfig, through Settings.run_spec)."""
    numeric = {k for k in PROFILE_KEYS if _numeric(k)}
    assert numeric <= set(RANGES) | set(settings.RUN_KEYS), (
        "every int/float setting needs a RANGES entry or is a run key (NaN, inf and range checks)"
    )
    assert not set(RANGES) & set(settings.RUN_KEYS), "a run key is checked by RunSpec, not twice"


HINTS = typing.get_type_hints(Settings)
FLOAT_KEYS = [k for k in PROFILE_KEYS if HINTS[k] in (float, float | None, tuple[float, ...])]


@pytest.mark.parametrize("key", FLOAT_KEYS)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nan_and_inf_are_refused_for_every_float_setting(tmp_path, key, bad):
    value = [bad] if HINTS[key] == tuple[float, ...] else bad
    with pytest.raises(ProfileError, match=f"{key} must be a finite number") as e:
        load_profile("cpu", {key: value})
    assert "overrides" in str(e.value)
    text = {math.nan: ".nan", math.inf: ".inf", -math.inf: "-.inf"}[bad]
    path = write(tmp_path, f"{key}: {'[' + text + ']' if isinstance(value, list) else text}\n")
    with pytest.raises(ProfileError, match=f"{path}: {key} must be a finite number"):
        load_profile(path)


def test_float_keys_cover_the_float_settings():
    assert {
        "latency_us",
        "link_gbps",
        "threshold",
        "cache_ratios",
        "bandwidth_scales",
        "budget_minutes",
        "throttle_scales",
        "throttle_ratio",
    } == set(FLOAT_KEYS)


def test_a_key_given_twice_is_refused(tmp_path):
    path = write(tmp_path, "repetitions: 3\nwarmup: 0\nrepetitions: 4\n")
    with pytest.raises(ProfileError, match=r"key 'repetitions' given twice \(lines 1 and 3\)") as e:
        load_profile(path)
    assert str(path) in str(e.value)


def test_errors_are_user_errors():
    assert issubclass(ProfileError, SettingError) and issubclass(SettingError, UserError)
    assert issubclass(UserError, ValueError)  # code guarding with `except ValueError` keeps working


def test_gpu_profiles_hold_the_papers_grid():
    for name in ("a5000", "h200", "h200_flash"):
        p = load_profile(name)
        assert p.cache_ratios == PAPER_RATIOS
        assert p.batch_sizes == (1, 2, 4, 8)
        assert len(p.tasks) == 5
        assert p.link == "cuda" and p.device == "cuda" and p.model is None
        assert {"demand", "last_step"} <= set(p.policies)


@pytest.mark.parametrize("name, faster", [("h200_ae", [0.83, 1.73]), ("a5000_ae", [0.83, 1.73])])
def test_a_reviewers_profile_decides_04s_headline_claims(name, faster):
    """Notebook 04's two claims (C/W 0.43; the C/W of 0.83-1.73 its grid has, both ends among them) at batch
    size 1, one task, with demand's A/A pair, at least MIN_PAIRS pairs per cell, on the GPU of its name (its
    time, within its budget: tests/test_doctor.py)."""
    from artifact.experiments.criteria import paper, thresholds
    from artifact.experiments.settings import CONTROL

    p = load_profile(name, {"model": "tiny"})  # the profile's model: null is refused at load (RunSpec)
    assert paper.AT_LOW.cache_ratio in p.cache_ratios and set(p.cache_ratios) <= set(PAPER_RATIOS)
    in_range = [r for r in p.cache_ratios if paper.FASTER_RANGE[0] <= r <= paper.FASTER_RANGE[1]]
    assert in_range == faster and {in_range[0], in_range[-1]} == set(paper.FASTER_RANGE)
    assert p.batch_sizes == (1,) and len(p.tasks) == 1 and p.bandwidth_scales == (1.0,)
    assert p.policies == ("demand", "last_step", CONTROL) and p.repetitions >= thresholds.MIN_PAIRS
    assert p.link == "cuda" and p.device == "cuda" and p.budget_minutes <= 120
    assert p.trace_tasks == p.tasks and p.trace_batch_sizes == p.batch_sizes  # only the traces its grid needs
    assert "\nmodel: null " in (PROFILE_DIR / f"{name}.yaml").read_text()


def test_flash_writes_to_folders_of_its_own(tmp_path, monkeypatch):
    """LLaDA2.0-flash runs under h200_flash: its claim records, bench grids, traces and figures go to folders
    named after it, never to mini's (h200)."""
    from artifact.experiments.outputs import paths
    from artifact.experiments.verdicts.records import Claim, record

    monkeypatch.setenv("ARTIFACT_OUTPUT", str(tmp_path / "results"))
    monkeypatch.setenv("ARTIFACT_DATA", str(tmp_path / "data"))
    monkeypatch.delenv("ARTIFACT_FIGURES", raising=False)
    flash, mini = load_profile("h200_flash"), load_profile("h200")
    written = record(flash, "04_capacity_sweep", [Claim("c", "p", "m", "reproduced")])
    assert written == tmp_path / "results" / "h200_flash" / "data" / "04_capacity_sweep.claims.json"
    assert written.is_file() and not (tmp_path / "results" / "h200").exists()
    for where in (paths.run_dir, paths.figures_dir, paths.run_data_dir, paths.results_dir, paths.traces_dir):
        assert where(flash).name == "h200_flash" or where(flash).parent.name == "h200_flash"
        assert where(flash) != where(mini)
    assert flash.trace_capacity == 128 and mini.trace_capacity is None  # flash's experts do not fit 141 GB


def test_cpu_profile_is_small_and_states_a_budget():
    p = load_profile("cpu")
    assert p.model == "tiny" and p.link == "emulated" and p.device == "cpu"
    assert p.cache_ratios == PAPER_RATIOS
    # with last_step_conservative (settings.CONTROL: demand's loads + host time); the A/A pair: demand twice
    assert p.policies == ("demand", "last_step", "last_step_conservative")
    assert p.budget_minutes is not None and p.budget_minutes <= 15
    assert p.torch_dtype == "float32"


def test_profile_by_path_overlays_base(tmp_path):
    path = write(tmp_path, "repetitions: 7\ncache_ratios: [1, 2.5]\n")
    p = load_profile(path)
    assert p.name == "mine" and p.repetitions == 7
    assert p.cache_ratios == (1.0, 2.5) and all(isinstance(r, float) for r in p.cache_ratios)
    assert p.gen_length == Settings().gen_length == 256  # from the defaults


def test_overrides_are_validated_and_win():
    p = load_profile("cpu", {"repetitions": 2, "model": "/some/dir", "dtype": None})
    assert p.repetitions == 2 and p.model == "/some/dir" and p.torch_dtype == "bfloat16"
    with pytest.raises(ProfileError, match="repetitions must be an integer"):
        load_profile("cpu", {"repetitions": 2.5})
    assert parse_override("cache_ratios=[1.0, 1.73]") == ("cache_ratios", [1.0, 1.73])
    assert parse_override("model=null") == ("model", None)
    with pytest.raises(ProfileError, match="expected KEY=VALUE"):
        parse_override("repetitions")
    with pytest.raises(ProfileError, match="unknown key 'repetition'.*did you mean 'repetitions'"):
        parse_override("repetition=3")


def test_unknown_key_names_it_and_lists_valid_keys(tmp_path):
    path = write(tmp_path, "batch_size: [1]\n")
    with pytest.raises(ProfileError) as e:
        load_profile(path)
    msg = str(e.value)
    assert str(path) in msg and "'batch_size'" in msg and "did you mean 'batch_sizes'" in msg
    for k in PROFILE_KEYS:
        assert k in msg


def test_unknown_profile_name_lists_profiles(tmp_path):
    listed = r"\['a5000', 'a5000_ae', 'cpu', 'h200', 'h200_ae', 'h200_flash'\]"
    with pytest.raises(ProfileError, match=rf"unknown profile 'gpu'.*{listed}"):
        load_profile("gpu")
    with pytest.raises(ProfileError, match="unknown profile 'base'"):
        load_profile("base")
    with pytest.raises(FileNotFoundError, match="profile file not found"):
        load_profile(tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    "text, pattern",
    [
        ("repetitions: '3'", r"repetitions must be an integer, got '3' \(str\)"),
        ("repetitions: true", r"repetitions must be an integer, got True \(bool\)"),
        ("gen_length: 32.0", r"gen_length must be an integer, got 32.0 \(float\)"),
        ("batch_sizes: 4", r"batch_sizes must be a non-empty list of integers, got 4 \(int\)"),
        ("batch_sizes: []", r"batch_sizes must be a non-empty list of integers"),
        ("batch_sizes: [1, two]", r"batch_sizes must be a non-empty list of integers, got \[1, 'two'\]"),
        ("cache_ratios: [1.0, 1.0]", r"cache_ratios lists a value twice"),
        ("link_gbps: fast", r"link_gbps must be a number or null, got 'fast' \(str\)"),
        ("threshold: [0.9]", r"threshold must be a number, got \[0.9\]"),
        ("model: 3", r"model must be a string or null, got 3 \(int\)"),
    ],
)
def test_wrong_types_name_key_type_and_value(tmp_path, text, pattern):
    path = write(tmp_path, text + "\n")
    with pytest.raises(ProfileError, match=pattern) as e:
        load_profile(path)
    assert str(path) in str(e.value)


@pytest.mark.parametrize(
    "text, pattern",
    [
        ("batch_sizes: [1, 9]", r"batch_sizes must be in 1-8 .*got 9"),
        ("batch_sizes: [0]", r"batch_sizes must be in 1-8 .*got 0"),
        ("trace_batch_sizes: [16]", r"trace_batch_sizes must be in 1-8"),
        ("cache_ratios: [0.5, 0]", r"cache_ratios must be > 0, got 0.0"),
        ("bandwidth_scales: [-1]", r"bandwidth_scales must be > 0"),
        (
            "policies: [demand, belady]",
            r"policies has 'belady': policy 'belady' runs in the simulator only",
        ),
        ("policies: [demand, mru]", r"policies has 'mru': unknown policy 'mru'"),
        (
            "policies: [demand, lru]",
            r"policies has 'lru': 'lru' is an eviction policy, not a prefetch policy",
        ),
        ("sim_policies: [magic]", r"sim_policies has 'magic': unknown policy 'magic'"),
        ("tasks: [gsm8k, squad]", r"tasks has unknown value 'squad'; choose from \['gsm8k'"),
        ("link: nvlink", r"link: unknown link 'nvlink'; choose one of \('emulated', 'cuda'\)"),
        ("mode: fast", r"mode: unknown decoding mode 'fast'; choose one of \('cached', 'full'\)"),
        ("forward: maybe", r"forward: unknown forward mode 'maybe'; choose one of \('eager', 'segmented'\)"),
        ("dtype: int8", r"dtype 'int8' unknown"),
        ("device: tpu", r"device: unknown device 'tpu'"),
        ("link: cuda", r"link cuda computes on the GPU, but device is 'cpu'; use link emulated"),
        (
            "device: cuda\nlink: cuda\nbandwidth_scales: [2.0]",
            r"bandwidth_scales: bandwidth_scale must be in \(0, 1\], got 2.0",
        ),
        (
            "device: cuda\nlink: cuda\nthrottle_scales: [1.0, 2.0]",
            r"throttle_scales: bandwidth_scale must be in \(0, 1\], got 2.0",
        ),
        ("expert_kernel: fused", r"expert_kernel: unknown expert_kernel 'fused'"),
        ("link_priority: urgent", r"link_priority: unknown link priority 'urgent'"),
        ("lookahead: 0", r"lookahead must be >= 1, got 0"),
        ("tau: 0", r"tau must be >= 1, got 0"),
        ("latency_us: -1", r"latency_us must be in \[0, 1e\+06\]"),
        ("gen_length: 0", r"gen_length must be >= 1, got 0"),
        ("steps: 0", r"steps must be >= 1, got 0"),
        ("repetitions: 0", r"repetitions must be > 0, got 0"),
        ("warmup: -1", r"warmup must be >= 0"),
        ("threshold: 1.5", r"threshold must be in \(0, 1\]"),
        ("budget_minutes: 0", r"budget_minutes must be > 0 or null"),
        ("n_prompts: 2\nbatch_sizes: [1, 4]", r"n_prompts = 2 cannot fill a batch of 4"),
    ],
)
def test_out_of_range_values_are_named(tmp_path, text, pattern):
    path = write(tmp_path, text + "\n")
    with pytest.raises(ProfileError, match=pattern):
        load_profile(path)


def test_not_a_mapping(tmp_path):
    with pytest.raises(ProfileError, match="a profile is a mapping"):
        load_profile(write(tmp_path, "- a\n- b\n"))
    with pytest.raises(ProfileError, match="not valid YAML"):
        load_profile(write(tmp_path, "a: [1,\n"))
    assert load_profile(write(tmp_path, "")).name == "mine"  # empty = all defaults


def test_as_dict_is_plain():
    d = load_profile("cpu").as_dict()
    assert set(d) == set(PROFILE_KEYS) | {"name", "path"}
    assert isinstance(d["cache_ratios"], list)
    assert yaml.safe_dump(d)  # plain values only


def test_cli_reports_profile_errors(capsys):
    from artifact.cli import main as main_for_tests

    assert main_for_tests(["bench", "--profile", "nope", "--list"]) == 2
    assert "error: unknown profile 'nope'" in capsys.readouterr().err
    assert main_for_tests(["bench", "--profile", "cpu", "--set", "repetitons=2", "--list"]) == 2
    assert "did you mean 'repetitions'" in capsys.readouterr().err
