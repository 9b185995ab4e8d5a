"""The TIDE adapter on a fake TIDE checkout the tests write: argument mapping, loading, rows, errors.

The fake mimics the interface of TIDE's released model file (model/modeling_llada2_moe.py: class
LLaDA2MoeModelLM with from_pretrained, enable_predictive_expert_offload and generate returning
(tokens, per-step stats)); it records every call and decodes a deterministic sequence, so the rows
the adapter builds can be checked against numbers computed here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

from artifact.errors import SettingError
from artifact.experiments.bench.model_runner import usable_cores
from artifact.experiments.tide import adapter as tide
from artifact.experiments.tide import checkout as tide_checkout
from artifact.experiments.tide import released
from artifact.model.decode import DecodeConfig
from artifact.model.tasks import tokens_sha
from artifact.model.tiny import tiny_checkpoint
from artifact.offload.spec import RunSpec

# The fake is not TIDE's pinned model file: check_tide warns about that; the warning has its own test.
pytestmark = pytest.mark.filterwarnings("ignore:.*is not the model file of ims-kdks/TIDE:UserWarning")

FAKE_CAP = 64  # the fake lowers any budget above this, as TIDE does when GPU memory is short
FAKE_STEPS = 3  # denoising steps the fake reports per block
COUNTS = {"cpu_tokens": 3, "gpu_tokens": 5, "promotions": 2, "demotions": 1, "experts_move_time": 0.25}

FAKE_CONFIG = "class LLaDA2MoeConfig:\n    model_type = 'llada2_moe'\n"

FAKE_MODELING = textwrap.dedent(f"""
    import math
    import torch
    from .configuration_llada2_moe import LLaDA2MoeConfig

    CALLS = []
    THREADS = []          # torch threads seen by each generate call

    class LLaDA2MoeModelLM:
        @classmethod
        def from_pretrained(cls, path, **kwargs):
            CALLS.append(("from_pretrained", str(path), kwargs))
            return cls()

        def eval(self):
            return self

        def enable_predictive_expert_offload(self, max_gpu_experts_per_layer, reserve_vram_gb=1.5,
                                             collect_stats=False, jump_steps=1):
            CALLS.append(("enable", dict(max_gpu_experts_per_layer=max_gpu_experts_per_layer,
                                         collect_stats=collect_stats, jump_steps=jump_steps)))
            self.collect_stats = collect_stats
            budget = min(max_gpu_experts_per_layer, {FAKE_CAP})
            return {{"enabled": True, "gpu_expert_budget_per_layer": budget, "jump_steps": jump_steps}}

        def generate(self, input_ids=None, temperature=0.0, block_length=32, steps=32, gen_length=2048,
                     top_p=None, top_k=None, eos_early_stop=False, minimal_topk=1, threshold=0.95,
                     eos_id=156892, mask_id=156895, max_length=None, attention_mask=None,
                     stopping_criteria=None, pad_token_id=None, use_cache=None, do_sample=None):
            CALLS.append(("generate", dict(input_ids=input_ids.tolist(), temperature=temperature,
                          block_length=block_length, steps=steps, gen_length=gen_length, threshold=threshold,
                          eos_early_stop=eos_early_stop, minimal_topk=minimal_topk, eos_id=eos_id,
                          mask_id=mask_id, do_sample=do_sample)))
            THREADS.append(torch.get_num_threads())
            self.sampled_with = self._sample(do_sample=do_sample)
            n = len(input_ids[0])
            body = [100 + i for i in range(min(n, gen_length))]     # n tokens, then eos (if room)
            out = body + ([eos_id] if n < gen_length else [])
            blocks = math.ceil((n + gen_length) / block_length) - n // block_length
            stats = [{{"block": b, "step": s, "offload_stats": dict({COUNTS!r})}}
                     for b in range(blocks) for s in range({FAKE_STEPS})] if self.collect_stats else []
            return torch.tensor([out]), stats

        def _sample(self, temperature=0.0, do_sample=True):
            if do_sample:
                return "multinomial"
            return "argmax"
""")


def write_fake(root, modeling=FAKE_MODELING, requirements="torch==2.9.1\ntransformers==4.57.1\n"):
    (root / "model").mkdir(parents=True)
    (root / "model" / "modeling_llada2_moe.py").write_text(modeling)
    (root / "model" / "configuration_llada2_moe.py").write_text(FAKE_CONFIG)
    (root / "requirements.txt").write_text(requirements)
    return root


@pytest.fixture
def fake(tmp_path):
    return write_fake(tmp_path / "TIDE")


def calls(root):
    return tide_checkout.load_tide_module(tide_checkout.check_tide(root, device="cpu")).CALLS


no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised when there is no GPU")


# --- argument mapping ----------------------------------------------------------------------------
def test_tide_arguments_map_our_settings():
    a = released.tide_arguments(
        48, 3, gen_length=256, steps=64, threshold=0.9, block_length=32, mask_id=7, eos_id=5
    )
    assert a["offload"] == {"max_gpu_experts_per_layer": 48, "jump_steps": 3, "collect_stats": True}
    g = a["generate"]
    assert g["steps"] == 32  # our schedule caps steps at the block length
    assert (g["gen_length"], g["block_length"], g["threshold"]) == (256, 32, 0.9)
    assert (g["mask_id"], g["eos_id"]) == (7, 5)
    assert g["temperature"] == 0.0 and g["do_sample"] is False and g["minimal_topk"] == 1
    assert g["eos_early_stop"] is False  # TIDE's block-level eos stop is our eos_early_stop=True
    assert set(a["offload"]) <= set(tide_checkout.OFFLOAD_ARGS) and set(g) <= set(tide_checkout.GENERATE_ARGS)


@pytest.mark.parametrize(
    "kw, words",
    [
        ({"gen_length": 16}, ["gen_length=16", "steps=32"]),
        ({"eos_early_stop": False}, ["eos_early_stop=True"]),
        ({"budget_experts": 0}, ["budget_experts", "0"]),
        ({"jump_steps": 0}, ["jump_steps", "0"]),
        ({"threshold": 1.5}, ["threshold", "1.5"]),
    ],
)
def test_tide_arguments_refuse_what_tide_would_decode_differently(kw, words):
    base = dict(budget_experts=8, jump_steps=1, gen_length=64, steps=32, threshold=0.95, mask_id=2, eos_id=1)
    with pytest.raises(ValueError) as e:
        released.tide_arguments(**{**base, **kw})
    assert all(w in str(e.value) for w in words), str(e.value)


# --- checking a checkout ---------------------------------------------------------------------------
def test_check_tide_reads_the_interface(fake):
    info = tide_checkout.check_tide(fake, device="cpu")
    assert info.modeling_file == fake / "model" / "modeling_llada2_moe.py"
    assert info.offload_defaults == {
        "max_gpu_experts_per_layer": None,
        "reserve_vram_gb": 1.5,
        "collect_stats": False,
        "jump_steps": 1,
    }
    assert info.generate_defaults["steps"] == 32 and info.generate_defaults["threshold"] == 0.95
    assert info.imports == ("torch",)
    assert info.pins["transformers"] == "transformers==4.57.1"


@pytest.mark.parametrize(
    "path, exc, words",
    [
        (None, ValueError, ["tide_path", "ims-kdks/TIDE"]),
        ("", ValueError, ["tide_path"]),
    ],
)
def test_check_tide_needs_a_path(path, exc, words):
    with pytest.raises(exc) as e:
        tide_checkout.check_tide(path, device="cpu")
    assert all(w in str(e.value) for w in words)


def test_check_tide_names_a_missing_checkout_or_file(tmp_path, fake):
    with pytest.raises(FileNotFoundError, match="nowhere.*TIDE checkout not found"):
        tide_checkout.check_tide(tmp_path / "nowhere", device="cpu")
    (fake / "model" / "modeling_llada2_moe.py").unlink()
    with pytest.raises(FileNotFoundError) as e:
        tide_checkout.check_tide(fake, device="cpu")
    assert "model/modeling_llada2_moe.py" in str(e.value) and "configuration" not in str(e.value)


def test_check_tide_names_an_interface_change(tmp_path):
    renamed = FAKE_MODELING.replace("jump_steps=1):", "refresh_every=1):")
    with pytest.raises(
        ValueError,
        match=r"enable_predictive_expert_offload\(\) lacks arguments "
        r"\['jump_steps'\]",
    ):
        tide_checkout.check_tide(write_fake(tmp_path / "a", renamed), device="cpu")
    no_class = FAKE_MODELING.replace("class LLaDA2MoeModelLM", "class Other")
    with pytest.raises(ValueError, match="no class LLaDA2MoeModelLM"):
        tide_checkout.check_tide(write_fake(tmp_path / "b", no_class), device="cpu")


def test_check_tide_names_missing_requirements(tmp_path):
    modeling = "import not_a_real_pkg_4711.sub\nfrom json import loads\n" + FAKE_MODELING
    root = write_fake(tmp_path / "T", modeling, requirements="torch==2.9.1\nnot-a-real-pkg-4711==1.2\n")
    with pytest.raises(ModuleNotFoundError) as e:
        tide_checkout.check_tide(root, device="cpu")
    msg = str(e.value)
    assert "not_a_real_pkg_4711" in msg and "not-a-real-pkg-4711==1.2" in msg and "requirements.txt" in msg
    assert "'json'" not in msg and "'torch'" not in msg  # stdlib and installed modules are fine


@no_gpu
def test_check_tide_needs_cuda(fake):
    with pytest.raises(RuntimeError, match=r"CUDA only.*torch.cuda.is_available\(\) is False"):
        tide_checkout.check_tide(fake)


def test_check_checkpoint_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="checkpoint directory not found"):
        tide_checkout.check_checkpoint(tmp_path / "none")
    ck = tmp_path / "ck"
    ck.mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        tide_checkout.check_checkpoint(ck)
    (ck / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="model_type is 'llama'"):
        tide_checkout.check_checkpoint(ck)
    (ck / "config.json").write_text((tiny_checkpoint() / "config.json").read_text())
    (ck / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(FileNotFoundError, match=r"no model.safetensors.*pytorch_model.bin.*never loaded"):
        tide_checkout.check_checkpoint(ck)
    assert tide_checkout.check_checkpoint(tiny_checkpoint()) == tiny_checkpoint()


# --- running TIDE (the fake) ------------------------------------------------------------------------
def run_tide(
    tide_path,
    checkpoint,
    prompts: list[list[int]],
    budget_experts: int,
    jump_steps: int = 1,
    dc: DecodeConfig = DecodeConfig(),
    *,
    reps: int = 1,
    warmup: bool = True,
    task: str | None = None,
    cache_ratio: float | None = None,
    **options,
) -> list[dict]:
    """TIDE's released generate timed on `prompts` (token lists), as the adapter drives it
    (released.check_prompts, open_tide, TideRun.measure): one row per repetition over all prompts.
    jump_steps=1 is TIDE's own default. `options` are open_tide's (device, dtype, mask_id, eos_id,
    block_length, collect_stats, threads) with its defaults; device="cpu" only serves a stand-in TIDE."""
    released.check_prompts(prompts, reps)
    run = released.open_tide(
        tide_path,
        checkpoint,
        budget_experts,
        jump_steps,
        dc,
        warmup_prompt=prompts[0] if warmup else None,
        **options,
    )
    return [run.measure(prompts, rep, task, cache_ratio)[0] for rep in range(reps)]


def test_run_tide_maps_arguments_and_builds_rows(fake):
    prompts = [[5, 6, 7], list(range(10, 50))]
    dc = DecodeConfig(gen_length=64, steps=16, threshold=0.9)
    path_before = list(sys.path)
    rows = run_tide(
        fake,
        tiny_checkpoint(),
        prompts,
        budget_experts=8,
        jump_steps=3,
        dc=dc,
        reps=2,
        device="cpu",
        dtype="bfloat16",
        task="gsm8k",
        cache_ratio=0.5,
    )
    assert sys.path == path_before  # imported from the checkout without a path hack
    log = calls(fake)
    kind = [c[0] for c in log]
    assert kind == ["from_pretrained", "enable"] + ["generate"] * (1 + 2 * len(prompts))  # warm-up first
    _, path, kw = log[0]
    assert path == str(tiny_checkpoint())
    assert kw == {"dtype": torch.bfloat16, "local_files_only": True, "use_safetensors": True}
    assert log[1][1] == {"max_gpu_experts_per_layer": 8, "collect_stats": True, "jump_steps": 3}
    warm, first = log[2][1], log[3][1]
    assert warm["gen_length"] == 32 and warm["input_ids"] == [prompts[0]]
    cfg = json.loads((tiny_checkpoint() / "config.json").read_text())
    assert first == {
        "input_ids": [prompts[0]],
        "temperature": 0.0,
        "block_length": 32,
        "steps": 16,
        "gen_length": 64,
        "threshold": 0.9,
        "eos_early_stop": False,
        "minimal_topk": 1,
        "eos_id": cfg["eos_token_id"],
        "mask_id": cfg["mask_token_id"],
        "do_sample": False,
    }

    assert [r["rep"] for r in rows] == [0, 1]
    tokens = sum(min(len(p), 64) for p in prompts)  # the fake's rule; eos is not counted
    with_eos = sum(len(p) + 1 if len(p) < 64 else 64 for p in prompts)
    steps = sum(FAKE_STEPS * (-(-(len(p) + 64) // 32) - len(p) // 32) for p in prompts)
    for r in rows:
        assert (r["system"], r["policy"], r["mode"], r["batch_size"]) == (
            "tide_released",
            "tide_released",
            "full",
            1,
        )
        assert (r["task"], r["cache_ratio"], r["cache_experts"], r["budget_experts"]) == ("gsm8k", 0.5, 8, 8)
        assert r["tokens"] == tokens and r["tide_tokens_with_eos"] == with_eos
        assert r["tokens_sha"] == tokens_sha([[100 + i for i in range(min(len(p), 64))] for p in prompts])
        assert r["forwards"] == steps
        assert r["tokens_per_second"] == pytest.approx(tokens / r["seconds"])
        assert r["tide_promotions"] == COUNTS["promotions"] * steps
        assert r["tide_experts_move_time"] == pytest.approx(COUNTS["experts_move_time"] * steps)
        assert r["tide_hit_ratio"] == pytest.approx(5 / 8)
        assert r["tide_budget_capped"] is False and r["tide_gpu_expert_budget_per_layer"] == 8
        assert (r["jump_steps"], r["steps"], r["gen_length"]) == (3, 16, 64)


def test_run_tide_reports_a_capped_budget(fake):
    rows = run_tide(
        fake,
        tiny_checkpoint(),
        [[1, 2, 3]],
        budget_experts=100,
        device="cpu",
        warmup=False,
        dc=DecodeConfig(gen_length=32),
    )
    assert rows[0]["cache_experts"] == FAKE_CAP and rows[0]["budget_experts"] == 100
    assert rows[0]["tide_budget_capped"] is True


def test_run_tide_refuses_before_loading(fake, tmp_path):
    with pytest.raises(ValueError, match="bfloat16"):
        run_tide(fake, tiny_checkpoint(), [[1, 2]], 8, device="cpu", dtype="float32")
    with pytest.raises(FileNotFoundError, match="checkpoint directory not found"):
        run_tide(fake, tmp_path / "no-ckpt", [[1, 2]], 8, device="cpu")
    with pytest.raises(ValueError, match="empty prompt"):
        run_tide(fake, tiny_checkpoint(), [[]], 8, device="cpu")
    assert calls(fake) == []  # nothing was loaded or generated


@no_gpu
def test_run_tide_on_cuda_without_a_gpu_says_so(fake):
    with pytest.raises(RuntimeError, match="CUDA only"):
        run_tide(fake, tiny_checkpoint(), [[1, 2, 3]], 8)
    assert calls(fake) == []


def test_import_failure_names_the_pins(tmp_path):
    broken = FAKE_MODELING.replace(
        "import torch\n", "import torch\nfrom torch import no_such_symbol_4711\n", 1
    )
    root = write_fake(tmp_path / "T", broken)
    info = tide_checkout.check_tide(root, device="cpu", import_module=False)  # the static checks pass
    assert info.imports == ("torch",)
    with pytest.raises(ImportError) as e:
        tide_checkout.check_tide(root, device="cpu")  # importing it does not
    msg = str(e.value)
    assert "no_such_symbol_4711" in msg and "transformers==4.57.1" in msg and "pip install -r" in msg


# --- the comparison ---------------------------------------------------------------------------------
def test_speedup_parts_multiply_to_the_total():
    rows = [
        {"system": "engine", "mode": "cached", "policy": "demand", "tokens_per_second": v} for v in (30, 34)
    ]
    rows += [{"system": "engine", "mode": "full", "policy": "demand", "tokens_per_second": v} for v in (8, 8)]
    rows += [{"system": "tide_released", "mode": "full", "policy": "tide_released", "tokens_per_second": 2.0}]
    s = tide.speedup_parts(rows)
    assert s["speedup_total"] == pytest.approx(16.0)
    assert s["speedup_kv_cache"] == pytest.approx(4.0) and s["speedup_offload"] == pytest.approx(4.0)
    assert s["speedup_total"] == pytest.approx(s["speedup_kv_cache"] * s["speedup_offload"])
    with pytest.raises(ValueError, match="system='tide_released'"):
        tide.speedup_parts(rows[:4])


def test_compare_with_engine_interleaves_three_systems(fake, tiny, tiny_prompts):
    prompts = [tiny_prompts[3]]  # the shortest: a quick test
    rows = tide.compare_with_engine(
        tiny,
        fake,
        prompts,
        budget_experts=96,
        jump_steps=2,
        spec=RunSpec(decode=DecodeConfig(gen_length=32), device="cpu", lookahead=2),
        reps=2,
        progress=False,
    )
    systems = [(r["system"], r["mode"]) for r in rows]
    assert systems[:3] == [("engine", "cached"), ("engine", "full"), ("tide_released", "full")]
    assert systems[3:] == [("engine", "full"), ("tide_released", "full"), ("engine", "cached")]  # rotated
    eng = [r for r in rows if r["system"] == "engine"]
    assert all(r["cache_experts"] == 96 and r["batch_size"] == 1 and r["demand_misses"] > 0 for r in eng)
    run = ("eager", "grouped", "fifo", 2, 4)  # the spec's, in every engine row
    keys = ("forward", "expert_kernel", "link_priority", "lookahead", "tau")
    assert all(tuple(r[k] for k in keys) == run for r in eng)
    assert [r["order"] for r in rows] == [0, 1, 2, 0, 1, 2]
    from artifact.experiments.bench.results import STAT_COLUMNS

    assert all(set(STAT_COLUMNS) <= set(r) for r in eng)  # the benchmark's row format
    cached = [r for r in eng if r["mode"] == "cached"]
    full = [r for r in eng if r["mode"] == "full"]
    assert [r["tokens_sha"] for r in cached] == [r["tokens_sha"] for r in full]  # same tokens either mode
    t = [r for r in rows if r["system"] == "tide_released"]
    assert all(r["same_tokens_as_engine"] == 0.0 for r in t)  # the fake decodes other tokens
    assert all(r["tokens_sha"] != full[0]["tokens_sha"] for r in t)
    gen = [c[1] for c in calls(fake) if c[0] == "generate"]
    assert gen[0]["eos_id"] == tiny.cfg.eos_token_id and gen[0]["mask_id"] == tiny.cfg.mask_token_id
    s = tide.speedup_parts(rows)
    assert s["speedup_total"] == pytest.approx(s["speedup_kv_cache"] * s["speedup_offload"])


@no_gpu
def test_compare_with_engine_on_cuda_without_a_gpu_says_so(fake, tiny):
    with pytest.raises(RuntimeError, match="CUDA only"):
        tide.compare_with_engine(tiny, fake, [[1, 2, 3]], 8)


def test_compare_with_engine_refuses_an_unfair_setup(fake, tiny, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # reach the checks after the CUDA one
    with pytest.raises(ValueError, match="bfloat16"):
        tide.compare_with_engine(tiny, fake, [[1, 2, 3]], 8)  # tiny is float32
    bf16 = type(tiny)(tiny.model, tiny.experts.to(torch.bfloat16), tiny.tokenizer, tiny.cfg, tiny.path)
    with pytest.raises(ValueError, match="resident=False"):
        tide.compare_with_engine(bf16, fake, [[1, 2, 3]], 8)  # experts resident (a backend is set)


# --- opt-in: a real TIDE checkout (never downloaded by the tests) -----------------------------------
@pytest.mark.skipif(
    not os.environ.get("ARTIFACT_TIDE_PATH"),
    reason="set ARTIFACT_TIDE_PATH to a clone of ims-kdks/TIDE (in an env with its requirements)",
)
def test_real_tide_is_the_same_model_as_ours(tmp_path):
    """TIDE's model class loads a checkpoint we write and computes our logits (float32, CPU, experts on
    the CPU so no placement runs): the head to head compares two implementations of one model.
    No tokenizer is involved, so TIDE's pinned transformers may differ from ours."""
    from artifact.model.config import get_preset
    from artifact.model.tiny import random_model, save_checkpoint, state_tensors

    ours = random_model(get_preset("tiny"), seed=1)
    root = save_checkpoint(tmp_path / "ck", ours.cfg, state_tensors(ours.model, ours.experts))
    info = tide_checkout.check_tide(os.environ["ARTIFACT_TIDE_PATH"], device="cpu")
    cls = getattr(tide_checkout.load_tide_module(info), tide_checkout.MODEL_CLASS)
    theirs = cls.from_pretrained(
        str(root), dtype=torch.float32, local_files_only=True, use_safetensors=True
    ).eval()
    ids = torch.arange(5, 5 + 64)[None]
    n = ids.shape[1] // 32
    mask = torch.tril(torch.ones(n, n)).repeat_interleave(32, 0).repeat_interleave(32, 1)[None, None].log()
    with torch.no_grad():
        got = theirs(ids, attention_mask=mask, position_ids=torch.arange(64)[None]).logits
    torch.testing.assert_close(got, ours.model(ids, torch.arange(64)[None]), rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(
    not os.environ.get("ARTIFACT_TIDE_PATH") or torch.cuda.is_available(),
    reason="set ARTIFACT_TIDE_PATH; checks the error of the real TIDE on a machine without a GPU",
)
def test_real_tide_without_a_gpu_fails_clearly(tmp_path):
    from artifact.model.config import get_preset
    from artifact.model.tiny import random_model, save_checkpoint, state_tensors

    ours = random_model(get_preset("tiny"), seed=1)
    root = save_checkpoint(tmp_path / "ck", ours.cfg, state_tensors(ours.model, ours.experts))
    with pytest.raises(RuntimeError, match="enable_predictive_expert_offload failed: CUDA is not available"):
        run_tide(os.environ["ARTIFACT_TIDE_PATH"], root, [[5, 6, 7]], 8, device="cpu")


# --- fairness: pinned revision, jump_steps sweep, seconds per forward, threads -----------------------
def test_check_tide_refuses_a_sampler_that_ignores_do_sample(tmp_path):
    """TIDE before 0d8c547 accepted do_sample in generate but always sampled: greedy runs were random."""
    old = FAKE_MODELING.replace(
        "self.sampled_with = self._sample(do_sample=do_sample)", "self.sampled_with = self._sample()"
    )
    with pytest.raises(
        ValueError,
        match=r"generate\(\) accepts do_sample but no sampler it calls branches "
        r"on it.*"
        r"0d8c547.*git checkout 5611ace",
    ):
        tide_checkout.check_tide(write_fake(tmp_path / "a", old), device="cpu")
    ignores = FAKE_MODELING.replace("if do_sample:\n", "if temperature > 1:\n")
    with pytest.raises(ValueError, match="no sampler it calls branches on it"):
        tide_checkout.check_tide(write_fake(tmp_path / "b", ignores), device="cpu")


def test_the_pinned_revision_is_recognised_by_the_model_file(fake, monkeypatch):
    modeling = fake / "model" / "modeling_llada2_moe.py"
    if shutil.which("git"):
        out = subprocess.run(
            ["git", "hash-object", str(modeling)], capture_output=True, text=True, check=True
        )
        assert tide_checkout._blob_sha(modeling) == out.stdout.strip()  # git's own blob id
    with pytest.warns(
        UserWarning, match="is not the model file of ims-kdks/TIDE@5611ace.*git -C .* checkout 5611ace"
    ):
        info = tide_checkout.check_tide(fake, device="cpu")
    assert not info.pinned
    monkeypatch.setattr(tide_checkout, "PINNED_MODELING_BLOB", tide_checkout._blob_sha(modeling))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tide_checkout.check_tide(fake, device="cpu").pinned
    row = run_tide(
        fake, tiny_checkpoint(), [[1, 2, 3]], 8, device="cpu", warmup=False, dc=DecodeConfig(gen_length=32)
    )[0]
    assert row["tide_pinned"] is True and row["tide_modeling_sha"] == tide_checkout._blob_sha(modeling)


def test_tide_runs_on_the_machines_cores_and_restores_the_bench_threads(fake):
    assert torch.get_num_threads() == 1  # the bench's (conftest's) setting
    rows = run_tide(
        fake, tiny_checkpoint(), [[1, 2, 3], [4, 5]], 8, device="cpu", reps=2, dc=DecodeConfig(gen_length=32)
    )
    seen = tide_checkout.load_tide_module(tide_checkout.check_tide(fake, device="cpu")).THREADS
    assert seen == [usable_cores()] * (1 + 2 * 2)  # warm-up and every timed generate
    assert all(r["threads"] == usable_cores() for r in rows)
    assert torch.get_num_threads() == 1  # restored
    run_tide(
        fake,
        tiny_checkpoint(),
        [[1, 2, 3]],
        8,
        device="cpu",
        warmup=False,
        threads=3,
        dc=DecodeConfig(gen_length=32),
    )
    assert seen[-1] == 3 and torch.get_num_threads() == 1
    with pytest.raises(RuntimeError, match="boom"), released.tide_threads(2):
        raise RuntimeError("boom")
    assert torch.get_num_threads() == 1  # restored after an error too


def test_compare_with_engine_sweeps_jump_steps_and_reports_seconds_per_forward(fake, tiny, tiny_prompts):
    rows = tide.compare_with_engine(
        tiny,
        fake,
        [tiny_prompts[3]],
        budget_experts=96,
        spec=RunSpec(decode=DecodeConfig(gen_length=32), device="cpu"),
        reps=2,
        progress=False,
    )
    assert tide.JUMP_STEPS == (1, 2, 4)
    t = [r for r in rows if r["system"] == "tide_released"]
    assert sorted(r["jump_steps"] for r in t) == [1, 1, 2, 2, 4, 4]
    jobs = [(r["system"], r["mode"], r.get("jump_steps") if r["system"] != "engine" else None) for r in rows]
    assert jobs[:5] == [
        ("engine", "cached", None),
        ("engine", "full", None),
        ("tide_released", "full", 1),
        ("tide_released", "full", 2),
        ("tide_released", "full", 4),
    ]
    assert jobs[5:] == jobs[1:5] + jobs[:1]  # rep 1 rotated by one
    enables = [c[1]["jump_steps"] for c in calls(fake) if c[0] == "enable"]
    assert enables == [1, 2, 4, 1, 2, 4]  # TIDE's own call sets each interval
    for r in rows:
        assert r["seconds_per_forward"] == pytest.approx(r["seconds"] / r["forwards"]) and r["forwards"] > 0
    assert all(r["threads"] == usable_cores() for r in t)
    assert all(r["threads"] == 1 for r in rows if r["system"] == "engine")
    s = tide.speedup_parts(rows)
    best = max((1, 2, 4), key=lambda j: sum(r["tokens_per_second"] for r in t if r["jump_steps"] == j))
    assert s["tide_jump_steps"] == best
    assert s["tide_seconds_per_forward"] == pytest.approx(
        sum(r["seconds_per_forward"] for r in t if r["jump_steps"] == best) / 2
    )
    with pytest.raises(ValueError, match="jump_steps"):
        tide.compare_with_engine(
            tiny, fake, [[1, 2]], 96, jump_steps=(2, 2), spec=RunSpec(device="cpu"), progress=False
        )
    with pytest.raises(SettingError, match="give forward eager"):  # the engine's full-mode rows: eager only
        tide.compare_with_engine(tiny, fake, [[1, 2]], 96, spec=RunSpec(forward="segmented"), progress=False)


def test_speedup_parts_takes_tide_at_its_best_jump_steps():
    rows = [
        {"system": "engine", "mode": m, "policy": "demand", "tokens_per_second": v, "seconds_per_forward": f}
        for m, v, f in (("cached", 40.0, 0.01), ("full", 10.0, 0.04))
    ]
    rows += [
        {
            "system": "tide_released",
            "mode": "full",
            "policy": "tide_released",
            "jump_steps": j,
            "tokens_per_second": v,
            "seconds_per_forward": 0.1 * j,
        }
        for j, v in ((1, 2.0), (2, 5.0), (4, 4.0))
    ]
    s = tide.speedup_parts(rows)
    assert s["tide_jump_steps"] == 2 and s["tide_tps"] == 5.0 and s["speedup_total"] == pytest.approx(8.0)
    assert (
        s["tide_seconds_per_forward"] == pytest.approx(0.2) and s["engine_full_seconds_per_forward"] == 0.04
    )
    assert tide.speedup_parts(rows, jump_steps=1)["speedup_total"] == pytest.approx(20.0)
