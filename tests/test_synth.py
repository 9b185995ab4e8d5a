"""Synthetic routing streams (artifact.offload.replay.synth) and their fit (replay/fit.py): the statistics
measured on a generated stream match the parameters asked for within sampling error (each tolerance derived
below from the generator's model), fit(synth(p)) recovers p, streams are deterministic traces every tool
reads, the CLI validates
its input, and the issue's stream gives oracle/LRU >= 5 at C/W 1."""

import json
from dataclasses import replace

import numpy as np
import pytest

from artifact.cli import main
from artifact.model.decode import DecodeConfig
from artifact.offload.links.link import REFERENCE_EXPERT_BYTES
from artifact.offload.replay.fit import fit, measure
from artifact.offload.replay.sim import replay
from artifact.offload.replay.synth import SynthParams, synth
from artifact.offload.replay.trace import Trace, mean_working_set, step_similarity
from artifact.offload.runner import decode_prompts
from artifact.offload.spec import RunSpec

Z = 4.0  # tolerance in standard errors: two-sided p ~ 6e-5 per check under a normal sampling error

POINTS = {
    # the issue's stream
    "issue": SynthParams(layers=19, experts=256, top_k=8, w=70, w_spread=0.05, novelty=0.12, prefill=0),
    # every profile term on, prefill, several sequences of batch 2
    "profile": SynthParams(
        layers=6,
        experts=96,
        top_k=4,
        tokens=16,
        blocks=6,
        steps=8,
        sequences=3,
        batch_size=2,
        w=20,
        w_spread=0.2,
        w_depth=0.4,
        w_growth=-0.3,
        w_first=1.5,
        novelty=0.3,
        block_novelty=0.8,
        prefill=1.5,
        seed=3,
    ),
    # W drifts inside a block (persistent noise), as on the tiny model's traces (rho ~ 0.8)
    "drift": SynthParams(
        layers=8,
        experts=128,
        tokens=32,
        blocks=4,
        steps=16,
        sequences=3,
        w=40,
        w_spread=0.25,
        w_persistence=0.8,
        w_first=1.3,
        novelty=0.3,
        block_novelty=0.6,
        prefill=1.2,
        seed=11,
    ),
    # small W, where stochastic rounding is a visible part of W's variance
    "small": SynthParams(
        layers=3,
        experts=48,
        top_k=2,
        tokens=16,
        blocks=10,
        steps=6,
        sequences=4,
        w=12,
        w_spread=0.2,
        w_depth=-0.3,
        w_growth=0.4,
        novelty=0.6,
        block_novelty=0.9,
        seed=7,
    ),
}


def profile(p: SynthParams) -> np.ndarray:
    """mu(l, s), the generator's documented mean W by MoE layer and block step."""
    x = np.arange(p.layers) / max(p.layers - 1, 1)
    y = np.arange(p.steps) / max(p.steps - 1, 1)
    step = 1 + p.w_growth * (y - 0.5)
    step[0] *= p.w_first
    return p.w * (1 + p.w_depth * (x - 0.5))[:, None] * step[None, :] / step.mean()


def ols_cov(X: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Covariance of least-squares coefficients when observation d has variance v[d] (sandwich form)."""
    A = np.linalg.inv(X.T @ X)
    return A @ (X.T * v) @ X @ A


def standard_errors(p: SynthParams) -> dict:
    """Sampling standard error of each fitted statistic, from the model: W = mu (1 + sigma z) + rounding,
    where stochastic rounding adds variance f (1 - f) <= 1/4 (1/6 on average when f is uniform), and z is
    an AR(1) chain of correlation rho along a block's steps. Correlation within a chain inflates the
    variance of an average (or a least-squares line) over it by at most (1 + rho) / (1 - rho) for rho >= 0,
    and of an average of squares by at most (1 + rho^2) / (1 - rho^2): the independent-W formulas below
    are scaled by those bounds."""
    mu = profile(p)  # (L, S)
    L, S, reps = p.layers, p.steps, p.blocks * p.sequences
    sig, rho = p.w_spread, max(p.w_persistence, 0.0)
    inflate, inflate2 = (1 + rho) / (1 - rho), (1 + rho**2) / (1 - rho**2)
    var_w = (mu**2 * sig**2 + 0.25) * inflate  # (L, S) variance of one W (rounding bounded)
    N = L * S * reps
    se = {"w": np.sqrt(var_w.sum() * reps) / N}
    # depth: a line through the per-layer means m_l = mean of S * reps demands.
    var_m = var_w.sum(1) * reps / (S * reps) ** 2  # (L,)
    x = np.arange(L) / max(L - 1, 1) - 0.5
    if L >= 2:
        cov = ols_cov(np.stack([np.ones(L), x], 1), var_m)
        a, b = mu.mean(1).mean(), p.w_depth * mu.mean(1).mean()
        se["w_depth"] = np.sqrt(cov[1, 1] / a**2 + b**2 * cov[0, 0] / a**4 - 2 * b * cov[0, 1] / a**3)
    # growth and first step: ratios r = W / m_l by step; a line over y for s >= 1, then the mean at s = 0.
    m = mu.mean(1, keepdims=True)  # (L, 1)
    var_r = var_w / m**2 + (mu / m) ** 2 * (var_m[:, None] / m**2)  # W's noise plus its layer mean's
    y = np.arange(S) / max(S - 1, 1) - 0.5
    g = mu / m  # (L, S) expected ratio
    if S >= 3:
        ys = np.tile(y[1:], L * reps)
        v = np.tile(var_r[:, 1:], (1, reps)).ravel()
        cov = ols_cov(np.stack([np.ones(len(ys)), ys], 1), v)
        step = 1 + p.w_growth * y
        step[0] *= p.w_first
        alpha, beta = 1 / step.mean(), p.w_growth / step.mean()  # the line g = alpha + beta y, s >= 1
        gr = beta / alpha
        se["w_growth"] = np.sqrt(cov[1, 1] + gr**2 * cov[0, 0] - 2 * gr * cov[0, 1]) / alpha
        c = np.array([1, -0.5])
        at0, var_at0 = alpha - beta / 2, c @ cov @ c
        r0, var_r0 = g[:, 0].mean(), var_r[:, 0].sum() * reps / (L * reps) ** 2
        se["w_first"] = p.w_first * np.sqrt(var_r0 / r0**2 + var_at0 / at0**2)
    # spread: sd of N residuals of variance s^2 = sigma^2 + 1/(6 mu^2): SE(s^2) = s^2 sqrt(2 / N), SE(sigma) =
    # SE(s^2) / (2 sigma); the rounding correction's own error (f (1 - f) has sd 1/sqrt(180)) adds its share.
    s2 = sig**2 + np.mean(1 / (6 * mu**2))
    extra = np.sqrt(np.mean(1 / (180 * mu**4)) / N)
    se["w_spread"] = (s2 * np.sqrt(2 * inflate2 / N) + extra) / (2 * sig)
    # persistence = 1 - D / (2 s^2), D the mean squared step-to-step change over n pairs. D / (2 sigma^2) has
    # variance (1 - rho)^2 (2 + (1 - rho)^2) / n (changes are normal, neighbours correlate -(1 - rho) / 2),
    # and
    # s^2's relative error (above) enters times (1 - rho); the two errors correlate, so their SEs are added.
    n = (S - 1) * L * reps
    se["w_persistence"] = (1 - rho) * (np.sqrt((2 + (1 - rho) ** 2) / n) + np.sqrt(2 * inflate2 / N))
    if p.prefill:
        mu_p = p.prefill * p.w * (1 + p.w_depth * x)  # (L,)
        n_p = p.sequences * p.batch_size
        var_pm = (mu_p**2 * sig**2 + 0.25).sum() * n_p / (L * n_p) ** 2
        se["prefill"] = np.sqrt(var_pm + p.prefill**2 * se["w"] ** 2) / p.w
    return se


def bias_bounds(p: SynthParams) -> dict:
    """Deterministic bias of the fit under persistent W: fitting each layer's mean W absorbs the variance of
    that layer's mean z, v = sum of the chain covariances / n_l^2, of which the degrees-of-freedom correction
    restores only 1 / n_l. The spread's variance comes out low by that share, and persistence, read against
    it, low by (1 - rho) times it."""
    rho, S, reps = max(p.w_persistence, 0.0), p.steps, p.blocks * p.sequences
    n_l = S * reps
    i = np.arange(S)
    v = reps * (rho ** np.abs(i[:, None] - i[None, :])).sum() / n_l**2
    lost = max(v - 1 / n_l, 0.0)
    return {"w_spread": p.w_spread * lost / 2, "w_persistence": (1 - rho) * lost}


def novelty_expectation(t: Trace, p: SynthParams):
    """Mean and standard error of the measured novelty, inside blocks and at block starts, given the
    stream's own W: keep = round~((1 - nu) W) clipped to [W - (E - |P|), |P|], so E[new share] is exact per
    pair, and a pair's variance is that of a two-point rounding, f (1 - f) / W^2 (independent pairs).
    Pairs are found here from the stream's layout, not with the code under test."""
    W = np.diff(t.offsets)
    per_seq = (p.batch_size if p.prefill else 0) + p.blocks * p.steps
    out = {"novelty": ([], []), "block_novelty": ([], [])}
    for n in range(len(t)):
        forward = int(t.forward[n])
        if t.kind[n] != 1 or forward % per_seq == 0:
            continue  # prefill, or the first forward of a sequence
        prev = n - p.layers  # same layer, previous forward
        nu = p.novelty if t.block_step[n] > 0 else p.block_novelty
        v = (1 - nu) * W[n]
        lo, f = np.floor(v), v - np.floor(v)
        low, high = W[n] - (p.experts - W[prev]), min(W[prev], W[n])  # the generator's clip of `keep`
        k0, k1 = min(max(lo, low), high), min(max(lo + 1, low), high)
        mean_keep = (1 - f) * k0 + f * k1
        var_keep = (1 - f) * k0**2 + f * k1**2 - mean_keep**2
        key = "novelty" if t.block_step[n] > 0 else "block_novelty"
        out[key][0].append(1 - mean_keep / W[n])
        out[key][1].append(var_keep / W[n] ** 2)
    return {k: (np.mean(m), np.sqrt(np.sum(v)) / len(v)) for k, (m, v) in out.items() if m}


@pytest.fixture(scope="module", params=list(POINTS))
def point(request):
    p = POINTS[request.param]
    return p, synth(p)


def test_measured_statistics_match_the_parameters_within_sampling_error(point):
    p, t = point
    got, se, bias = measure(t), standard_errors(p), bias_bounds(p)
    W = np.diff(t.offsets)[t.kind == 1]
    assert W.min() > 1 and W.max() < min(p.experts, p.tokens * p.top_k), "no clipping, so the model is exact"
    for k, s in se.items():
        tol = Z * s + bias.get(k, 0.0)
        assert abs(got[k] - getattr(p, k)) <= tol, (
            f"{k}: measured {got[k]:.5f}, asked {getattr(p, k)}, SE {s:.5f}"
        )
    for k, (mean, s) in novelty_expectation(t, p).items():
        assert abs(got[k] - mean) <= Z * s + 1e-12, (
            f"{k}: measured {got[k]:.5f}, expected {mean:.5f}, SE {s:.6f}"
        )
        # The points keep clipping rare, so the expectation is the parameter asked for, nearly.
        assert abs(mean - getattr(p, k)) < 0.01, f"{k}: clipping moved the expected novelty to {mean:.4f}"
    if not p.prefill:
        assert got["prefill"] == 0 and not (t.kind == 0).any()


def test_fit_recovers_the_parameters(point):
    p, t = point
    q, se, bias = fit(t), standard_errors(p), bias_bounds(p)
    for k in ("layers", "experts", "top_k", "tokens", "blocks", "steps", "sequences", "batch_size"):
        assert getattr(q, k) == getattr(p, k), k
    for k, s in se.items():
        assert abs(getattr(q, k) - getattr(p, k)) <= Z * s + bias.get(k, 0.0), k
    for k, (mean, s) in novelty_expectation(t, p).items():
        assert abs(getattr(q, k) - mean) <= Z * s + 1e-12, k


def test_streams_are_deterministic_valid_traces(tmp_path):
    p = POINTS["profile"]
    a, b = synth(p), synth(p)
    assert a.equal_routing(b) and a.meta == b.meta
    other = synth(replace(p, seed=p.seed + 1))
    assert not a.equal_routing(other) and a.meta["config_hash"] != other.meta["config_hash"]
    path = a.save(tmp_path / "s.safetensors")
    back = Trace.load(path)
    assert back.equal_routing(a) and back.meta["synth"] == p.__dict__
    m = back.meta
    assert m["num_experts"] == 96 and m["moe_layers"] == list(range(1, 7)) and m["task"] == "synthetic"
    assert m["expert_bytes"] == REFERENCE_EXPERT_BYTES == 3 * 512 * 2048 * 2 and m["batch_size"] == 2
    assert m["config_hash"].startswith("synthetic-")
    o = a.offsets
    for n in range(len(a)):
        e, c = a.experts[o[n] : o[n + 1]], a.counts[o[n] : o[n + 1]]
        assert (np.diff(e) > 0).all(), "experts distinct and ascending, as the model emits them"
        tokens = p.tokens * (2 if a.kind[n] == 0 else 1)  # prefill feeds ceil(1.5) blocks of tokens
        assert c.sum() == tokens * p.top_k and (c >= 1).all()
    per_seq = p.batch_size + p.blocks * p.steps
    assert len(a) == p.sequences * per_seq * p.layers and (a.kind == 0).sum() == p.sequences * 2 * p.layers


def test_the_issue_stream_gives_oracle_over_lru_of_at_least_5(tmp_path, capsys):
    """python -m artifact synth (the issue's flags) then simulate --cache-ratios 1 --policies
    demand,oracle."""
    out = tmp_path / "S.safetensors"
    assert (
        main(
            [
                "synth",
                "--layers",
                "19",
                "--experts",
                "256",
                "--top-k",
                "8",
                "--w",
                "70",
                "--w-spread",
                "0.05",
                "--novelty",
                "0.12",
                "--prefill",
                "0",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert (
        main(
            ["simulate", "--trace", str(out), "--cache-ratios", "1", "--policies", "demand,oracle", "--json"]
        )
        == 0
    )
    rows = {r["policy"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["demand"]["cache_experts"] == round(mean_working_set(Trace.load(out))) == 70
    ratio = rows["demand"]["demand_misses"] / rows["oracle"]["demand_misses"]
    assert ratio >= 5, f"oracle/LRU {ratio:.2f}"


def test_cli_refuses_overwrite_and_bad_numbers(tmp_path, capsys):
    out = tmp_path / "s.safetensors"
    base = {"--layers": "2", "--experts": "16", "--w": "4", "--blocks": "2", "--steps": "3"}
    small = [x for kv in base.items() for x in kv]
    assert main(["synth", *small, "--out", str(out)]) == 0
    assert main(["synth", *small, "--out", str(out)]) == 2
    assert "exists; pass --force" in capsys.readouterr().err
    assert main(["synth", *small, "--seed", "1", "--out", str(out), "--force"]) == 0
    for flags, msg in [
        (["--w", "nan"], "finite"),
        (["--w", "17"], "w (mean W"),
        (["--novelty", "1.5"], "novelty"),
        (["--w-spread", "-0.1"], "w_spread"),
        (["--prefill", "5"], "prefill W"),
        (["--w-depth", "2"], "w_depth"),
        (["--top-k", "0"], "top_k"),
        (["--w", "15", "--novelty", "0.5"], "distinct experts"),
        (["--blocks", "0"], "blocks"),
    ]:
        capsys.readouterr()
        args = {**base, **{flags[j]: flags[j + 1] for j in range(0, len(flags), 2)}}
        rc = main(
            ["synth", *[x for kv in args.items() for x in kv], "--out", str(tmp_path / "bad.safetensors")]
        )
        err = capsys.readouterr().err
        assert rc == 2 and msg in err, (flags, err)
        assert not (tmp_path / "bad.safetensors").exists()


def test_fit_cli_prints_the_fitted_parameters(tmp_path, capsys):
    p = POINTS["small"]
    path = synth(p).save(tmp_path / "s.safetensors")
    assert main(["fit", str(path), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["params"] == fit(Trace.load(path)).__dict__ and got["generated_with"] == p.__dict__
    assert main(["fit", str(path)]) == 0
    text = capsys.readouterr().out
    assert "novelty" in text and "w_cv_total" in text
    assert main(["fit", str(tmp_path / "missing.safetensors")]) == 2


@pytest.fixture(scope="module")
def recorded(tiny, tiny_prompts):
    """A resident tiny-model run of three prompts at batch size 2 (prefill included)."""
    return decode_prompts(
        tiny,
        tiny_prompts[2:5],
        2,
        RunSpec(decode=DecodeConfig(gen_length=40)),
        record=True,
        prompt_ids=["a", "b", "c"],
        task="test",
    ).trace


def test_a_recorded_trace_can_be_fitted_and_regenerated(recorded):
    """fit reads a real trace (the tiny model's): the counts it takes from the trace's layout, W as the trace
    module measures it, novelty as 1 - step_similarity's reuse (an independent computation), and a stream
    regenerated from the fit is a valid trace with that mean W (within its sampling error)."""
    t = recorded
    got = measure(t)
    assert got["w"] == pytest.approx(mean_working_set(t))
    assert got["top_k"] == 8 and not got["measured"]["notes"], "top_k from the tiny preset's config hash"
    assert got["layers"] == 4 and got["batch_size"] == 2 and got["sequences"] == 2 and got["blocks"] == 2
    assert got["novelty"] == pytest.approx(1 - step_similarity(t).reuse.mean())
    assert got["prefill"] > 1 and 0 < got["w_persistence"] < 1, "prompts route widely; W drifts, not jumps"
    q = fit(t)
    again = synth(q)
    se = standard_errors(q)["w"]
    assert (
        abs(measure(again)["w"] - q.w) <= Z * se and replay(again, "demand", round(q.w))["demand_misses"] > 0
    )
