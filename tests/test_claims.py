"""The claim modules behind the notebooks: verdicts on known numbers, traces recorded once and reused, bench
files that never mix settings, every figure saved as PNG + the CSV of what it plotted, and the paper's
numbers written once."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import nbformat  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from test_phases import phase_split  # noqa: E402

from artifact.experiments import (
    counting,  # noqa: E402
    harness,  # noqa: E402
)
from artifact.experiments.bench.results import COLUMNS, write_rows  # noqa: E402
from artifact.experiments.criteria import (
    paper,  # noqa: E402
    thresholds,  # noqa: E402
)
from artifact.experiments.criteria.claims import STATED
from artifact.experiments.notebooks import claims_of  # noqa: E402
from artifact.experiments.outputs import figures  # noqa: E402
from artifact.experiments.settings import (  # noqa: E402
    CONTROL,  # noqa: E402
    ProfileError,
    load_profile,
)
from artifact.experiments.studies import (  # noqa: E402
    bandwidth_throttling as throttle,
)
from artifact.experiments.studies import (  # noqa: E402
    cache_design_space as cache_design,
)
from artifact.experiments.studies import (  # noqa: E402
    capacity_sweep as capacity,
)
from artifact.experiments.studies import (  # noqa: E402
    miss_accounting as misses,
)
from artifact.experiments.studies import (  # noqa: E402
    quickstart,
    working_set,
)
from artifact.experiments.studies import (  # noqa: E402
    tide_head_to_head as head_to_head,
)
from artifact.experiments.verdicts import records as claims  # noqa: E402
from artifact.experiments.verdicts.pooling import Replicas  # noqa: E402

# noqa: E402
from artifact.experiments.verdicts.records import (
    INCONCLUSIVE,
    NOT_MEASURABLE,
    NOT_REPRODUCED,
    REPRODUCED,
    Claim,
)
from artifact.offload.replay.sim import replay  # noqa: E402
from artifact.offload.replay.synth import SynthParams, synth  # noqa: E402
from artifact.paths import data_dir  # noqa: E402

EXPERIMENTS = Path(claims.__file__).resolve().parents[1]  # artifact/experiments (records is in verdicts/)


@pytest.fixture
def places(tmp_path, monkeypatch):
    """Figures, results and traces under tmp_path, through the environment variables the notebooks honour
    (ARTIFACT_DATA, with the bundled task prompts linked in; ARTIFACT_FIGURES; ARTIFACT_OUTPUT)."""
    tasks = data_dir() / "tasks"
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "tasks").symlink_to(tasks.resolve(), target_is_directory=True)
    monkeypatch.setenv("ARTIFACT_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("ARTIFACT_FIGURES", str(tmp_path / "figures"))
    monkeypatch.setenv("ARTIFACT_OUTPUT", str(tmp_path / "results"))
    return tmp_path


def test_claim_lines_round_trip_through_the_runner_parser(capsys):
    claims.report(
        Claim("c1", "p1", "m1", REPRODUCED), Claim("c2", "p2", "m2", NOT_REPRODUCED, "why", timing=True)
    )
    text = capsys.readouterr().out
    assert "measured [timing]: m2" in text and "verdict [timing]: not reproduced (why)" in text
    nb = {
        "cells": [
            {"cell_type": "code", "outputs": [{"output_type": "stream", "name": "stdout", "text": text}]}
        ]
    }
    assert claims_of(nbformat.from_dict(nb)) == [("c1", "reproduced"), ("c2", "not reproduced (why)")]
    with pytest.raises(ValueError, match="maybe"):
        Claim("c", "p", "m", "maybe")


def test_long_claim_lines_wrap_between_words_and_read_back_whole(capsys):
    """Claim cells print lines of at most WRAP characters, broken between words (a word longer than that
    stays whole); the runner's parser and the nbval sanitizer (timing lines) read them back as one line."""
    long_claim = " ".join(f"word{k}" for k in range(40)) + " a-hyphenated-term " + "x" * 120
    measured = "1.23 s vs 4.56 s over " + " ".join(f"cell{k}" for k in range(30))
    cs = Claim(long_claim, "p", "m", REPRODUCED), Claim("c2", "p2", measured, REPRODUCED, timing=True)
    claims.report(*cs)
    text = capsys.readouterr().out
    words = {w for c in cs for line in c.lines() for w in line.split()}
    for line in text.splitlines():
        assert len(line) <= claims.WRAP or " " not in line.strip(), line
        assert set(line.split()) <= words, line  # no word cut in two
    assert claims.unwrap(text).splitlines()[0] == f"claim: {long_claim}"
    nb = {
        "cells": [
            {"cell_type": "code", "outputs": [{"output_type": "stream", "name": "stdout", "text": text}]}
        ]
    }
    assert claims_of(nbformat.from_dict(nb)) == [(long_claim, "reproduced"), ("c2", "reproduced")]
    cfg = (Path(__file__).parents[1] / "notebooks" / "nbval_sanitize.cfg").read_text()
    regex = re.search(r"^regex: (.*)$", cfg, re.M).group(1)
    masked = re.sub(regex, r"\1 [timing]: (masked)", text)
    assert "measured [timing]: (masked)\nruns [timing]: (masked)\nverdict [timing]: (masked)" in masked
    assert "cell29" not in masked


def test_setup_lays_overrides_over_the_profile():
    P = harness.setup("cpu", {"gen_length": 64, "repetitions": 2})
    assert P.name == "cpu" and P.gen_length == 64 and P.repetitions == 2
    assert harness.setup("cpu") == load_profile("cpu")
    with pytest.raises(ProfileError, match="gen_lenght"):
        harness.setup("cpu", {"gen_lenght": 64})


def sweep_rows(lru, last, spec, oracle, refresh, ratios=(0.43, 1.0, 1.73)):
    rows = []
    for k, r in enumerate(ratios):
        for pol, m, s in (
            ("demand", lru[k], 0),
            ("last_step", last[k], spec[k]),
            ("oracle", oracle[k], spec[k]),
            ("interval_refresh", refresh[k], 0),
            ("belady", oracle[k], 0),
        ):
            rows.append(
                {
                    "trace": "t",
                    "task": "x",
                    "batch_size": 1,
                    "policy": pol,
                    "cache_ratio": r,
                    "demand_misses": m,
                    "speculative_transfers": s,
                    "prefetch_hits": 0,
                    "wasted_prefetches": 0,
                    "accesses": 1000,
                }
            )
    return pd.DataFrame(rows)


def miss_verdicts(df):
    return misses.verdicts(misses.numbers(misses.miss_summary(df)))


def test_miss_claims_judge_known_counts():
    useless, oracle, refresh = miss_verdicts(
        sweep_rows(
            lru=[500, 300, 100],
            last=[480, 290, 99],
            spec=[200, 150, 40],
            oracle=[400, 45, 10],
            refresh=[495, 298, 100],
        )
    )
    assert useless.verdict == REPRODUCED and "1: 3% removed" in useless.measured
    assert oracle.verdict == REPRODUCED and "C/W = 1: 6.7x" in oracle.measured
    assert refresh.verdict == REPRODUCED
    useless, oracle, refresh = miss_verdicts(
        sweep_rows(
            lru=[500, 300, 100],
            last=[400, 150, 50],
            spec=[200, 150, 40],
            oracle=[400, 200, 10],
            refresh=[400, 250, 100],
        )
    )
    assert (useless.verdict, oracle.verdict, refresh.verdict) == (NOT_REPRODUCED,) * 3
    assert not any(c.timing for c in (useless, oracle, refresh))  # exact counts: compared by nbval
    no_last = sweep_rows([500, 300, 100], [480, 290, 99], [200, 150, 40], [400, 45, 10], [495, 298, 100])
    (c, *_) = miss_verdicts(no_last[no_last.policy != "last_step"])
    assert c.verdict == NOT_MEASURABLE and "0.83-1.73" in c.reason


def test_a_count_claim_rules_on_one_basis_and_names_the_other_only_where_it_disagrees():
    assert counting.on_bases(
        {"excluded": True, "included": True}, {"excluded": "1", "included": "2"}, "excluded"
    ) == (REPRODUCED, "")
    assert counting.on_bases(
        {"excluded": False, "included": True}, {"excluded": "56.6%", "included": "48.4%"}, "excluded"
    ) == (NOT_REPRODUCED, "denoising steps: 56.6% (rules); all demands: 48.4% (would say reproduced)")
    assert counting.on_bases({"included": False}, {"included": "x"}, "included") == (NOT_REPRODUCED, "")


def test_miss_claims_rule_on_the_denoising_steps_and_print_all_demands_where_the_verdict_flips():
    """Constructed so that the prefill forwards flip two verdicts: over the denoising steps last_step removes
    12% of LRU's misses (not few) and the oracle cuts them 6.7x; the prefill forwards add LRU's misses that no
    policy removes, so over all demands last_step would remove 6% and the oracle cut 1.7x."""
    steps = sweep_rows(
        lru=[500, 300, 100],
        last=[480, 264, 88],
        spec=[200, 150, 40],
        oracle=[400, 45, 10],
        refresh=[495, 298, 100],
    )
    prefill = sweep_rows(
        lru=[500, 300, 100],
        last=[500, 300, 100],
        spec=[0, 0, 0],
        oracle=[500, 300, 100],
        refresh=[500, 300, 100],
    )
    useless, oracle, refresh = miss_verdicts(phase_split(steps, prefill, misses.SUMMED))
    assert all(c.counting == counting.DENOISING for c in (useless, oracle, refresh))
    assert useless.verdict == NOT_REPRODUCED and useless.reason == (
        "denoising steps: most removed 12.0% (C/W 1) (rules); all demands: most removed 6.0% (C/W 1) "
        "(would say reproduced)"
    )
    assert oracle.verdict == REPRODUCED and oracle.reason == (
        "denoising steps: 6.7x (rules); all demands: 1.7x (would say not reproduced)"
    )
    assert refresh.verdict == REPRODUCED and refresh.reason == ""  # both bases agree: nothing more to say


def bench_rows(diffs: dict, reps=2, policies=("demand", "last_step"), noise=0.3, aa=None, aa_noise=0.3):
    """Rows whose paired tokens/s differ by diffs[C/W] percent, +-noise points alternating pair by pair. With
    `aa` (a % or {C/W: %}), demand's A/A pair beside them: a second demand run (arm B) per pair, `aa` % over
    the first, +-aa_noise points alternating."""
    rng = np.random.default_rng(0)
    rows, sign = [], 1
    for r, d in diffs.items():
        bias = aa.get(r, 0.0) if isinstance(aa, dict) else aa
        for task in ("gsm8k", "mbpp"):
            for b in (1, 4):
                for rep in range(reps):
                    base, sign = 50 + 10 * rng.random(), -sign
                    runs = [
                        (pol, "A", base * (1 + (d + noise * sign) / 100) if k == 0 else base)
                        for k, pol in enumerate(policies)
                    ]
                    if bias is not None:
                        demand = next(x for pol, _, x in runs if pol == "demand")
                        runs.append(("demand", "B", demand * (1 + (bias - aa_noise * sign) / 100)))
                    for k, (pol, arm, tps) in enumerate(runs):
                        rows.append(
                            {c: 0 for c in COLUMNS}
                            | {
                                "task": task,
                                "batch_size": b,
                                "cache_ratio": r,
                                "bandwidth_scale": 1.0,
                                "policy": pol,
                                "arm": arm,
                                "rep": rep,
                                "order": k,
                                "tokens_per_second": tps,
                                "seconds": 128 / tps,
                                "tokens_sha": "abc",
                                "demand_misses": 100 - 10 * k,
                                "cache_experts": 10,
                            }
                        )
    return pd.DataFrame(rows)


OFFSETS = (-0.5, 0.0, 0.5)  # the stored runs' effects around the cell's: the spread between runs
AA_OFFSETS = (-0.2, 0.1, 0.2)  # their A/A pairs' offsets: small, around 0


def stored(make, offsets=OFFSETS, aa_offsets=AA_OFFSETS) -> Replicas:
    """Stored runs (no fresh run: ruled pooled) of `make(offset, aa_offset)`'s rows, one per offset."""
    return Replicas(
        None, tuple((f"run{k}", make(o, a)) for k, (o, a) in enumerate(zip(offsets, aa_offsets), 1))
    )


def shifted(diffs: dict, o: float) -> dict:
    return {r: d + o for r, d in diffs.items()}


def capacity_claims(reps):
    """04's claims on Replicas (stored runs, or one run's rows alone)."""
    return capacity.verdicts(capacity.numbers(reps if isinstance(reps, Replicas) else Replicas(reps)))


PLANTED = {0.43: 0.0, 0.83: 8.0, 1.0: 6.0, 1.73: 5.0}


def test_capacity_claims_follow_the_per_cell_intervals():
    """3 stored runs with a clean A/A: each cell's interval is a t interval over the 3 runs' means, ruled on
    the plain effect of demand over last_step."""
    reps = stored(lambda o, a: bench_rows(shifted(PLANTED, o), reps=4, aa=a))
    same, faster, low = capacity_claims(reps)
    assert same.verdict == REPRODUCED and "16 of 16 cells" in same.measured
    assert faster.verdict == REPRODUCED and faster.timing and faster.ruled == "pooled"
    assert "over the per-run means of 3 stored runs" in faster.interval and "A/A (demand over demand)" in (
        faster.interval
    )
    assert faster.margin == "" and "interval above 0" in faster.reason
    assert "C/W 0.83 b=4 mbpp: +8.0% [" in faster.measured and "(3 runs); A/A [" in faster.measured
    cells = {c["label"]: c for c in faster.cells}
    assert len(cells) == 12 and all(c["runs"] == 3 and c["low"] > 0 for c in cells.values())
    assert cells["C/W 1.73 b=1"]["effect"] == pytest.approx(5.0, abs=0.05)  # the plain effect: nothing added
    assert low.verdict == REPRODUCED and low.paper == STATED["04-equal"].said and "inside +-3%" in low.reason
    assert len(capacity.tables(reps.rows)) == 16
    other = {0.43: 20.0, 0.83: 8.0, 1.73: -5.0}

    def changed(o, a):
        rows = bench_rows(shifted(other, o), reps=4, aa=a)
        rows.loc[0, "tokens_sha"] = "changed"
        return rows

    same, faster, low = capacity_claims(stored(changed))
    assert same.verdict == NOT_REPRODUCED
    assert faster.verdict == NOT_REPRODUCED and "1.73" in faster.reason and "0.83" not in faster.reason
    assert "simultaneous level" in faster.reason
    assert low.verdict == NOT_REPRODUCED and "wholly outside" in low.reason
    # one run and no stored runs: no run-to-run spread to size it, whatever its pairs say
    alone = capacity_claims(bench_rows(PLANTED, reps=4, aa=0.0))
    assert alone[1].verdict == alone[2].verdict == INCONCLUSIVE and "record >= 3 runs" in alone[1].reason
    assert alone[0].verdict == REPRODUCED  # the exact count needs no runs


def test_the_aa_gates_both_claims_and_never_corrects_the_effect():
    """The A/A (demand's arm B over arm A) gates a cell: a clean one leaves the verdicts to the effect; one
    biased past +-3% makes the claims inconclusive, and the effect printed and ruled on stays the plain one.
    Rows with only the stand-in (CONTROL over demand) are gated by it; rows with neither have no A/A."""

    def effects(c):
        return [x["effect"] for x in c.cells]

    clean = capacity_claims(stored(lambda o, a: bench_rows(shifted(PLANTED, o), reps=4, aa=a)))
    biased = capacity_claims(stored(lambda o, a: bench_rows(shifted(PLANTED, o), reps=4, aa=a + 5.0)))
    for c, b in zip(clean[1:], biased[1:]):
        assert c.verdict == REPRODUCED and b.verdict == INCONCLUSIVE
        assert "A/A (demand over demand)" in b.reason and "wholly outside +-3%" in b.reason
        assert effects(b) == effects(c) and all(x["aa_low"] > 3 for x in b.cells)
    # biased at C/W 0.43 only: the equivalence claim's cells are gated, the direction claim's are not
    only_low = capacity_claims(
        stored(
            lambda o, a: bench_rows(shifted(PLANTED, o), reps=4, aa={0.43: a + 5.0, 0.83: a, 1.0: a, 1.73: a})
        )
    )
    assert only_low[1].verdict == REPRODUCED and only_low[2].verdict == INCONCLUSIVE
    # a noisy A/A (wide between pairs and runs) gates too: containing 0 is not enough
    noisy = capacity_claims(
        stored(lambda o, a: bench_rows(shifted(PLANTED, o), reps=4, aa=a), aa_offsets=(-6.0, 0.0, 6.0))
    )[2]
    assert noisy.verdict == INCONCLUSIVE and "A/A" in noisy.reason
    # the stand-in: CONTROL timing like last_step is 8% off demand at C/W 0.83, level with it at 0.43
    stand_in = capacity_claims(
        stored(
            lambda o, a: bench_rows(
                shifted(PLANTED, o), reps=4, policies=("demand", "last_step", CONTROL), aa=None
            )
        )
    )
    assert stand_in[1].verdict == INCONCLUSIVE and "stand-in A/A" in stand_in[1].reason
    assert "C/W 0.83" in stand_in[1].reason and stand_in[2].verdict == REPRODUCED
    assert effects(stand_in[1]) == effects(clean[1])
    # no A/A at all: inconclusive, saying so
    none = capacity_claims(stored(lambda o, a: bench_rows(shifted(PLANTED, o), reps=4)))[1]
    assert (
        none.verdict == INCONCLUSIVE and "no A/A in this cell" in none.reason and "(A/A" not in none.measured
    )


def test_cache_design_bench_judges_the_best_eviction_against_lru():
    """09's throughput claim: the best eviction over lru in tokens/s, the plain paired effect per cell over
    the stored runs, gated by the A/A, labelled as the artifact's own result; its bench is one small cell with
    enough pairs."""
    best = "demand+lrfu:lam=2"

    def verdict(reps):
        return cache_design.bench_verdict(reps, best)

    def runs(d, noise=0.3, aa=True, **kw):
        return stored(
            lambda o, a: bench_rows(
                {1.0: d + o}, reps=4, policies=(best, "demand"), noise=noise, aa=a if aa else None
            ),
            **kw,
        )

    c = verdict(runs(6.0))
    assert (
        c.verdict == REPRODUCED
        and c.timing
        and c.claim.startswith("[own result]")
        and "lrfu:lam=2" in c.claim
    )
    assert c.ruled == "pooled" and "3 stored runs" in c.interval and "C/W 1 b=1: +6.0% [" in c.measured
    assert "(3 runs); A/A [" in c.measured
    assert "demand misses over this run's timed runs: lru 1440, lrfu:lam=2 1600" in c.measured
    assert verdict(runs(-6.0)).verdict == NOT_REPRODUCED
    assert verdict(runs(0.0, noise=3.0, offsets=(-2.0, 0.0, 2.0))).verdict == INCONCLUSIVE
    biased = verdict(runs(6.0, aa_offsets=(5.0, 6.0, 7.0)))  # the A/A 6% off: the gate, not a correction
    assert (
        biased.verdict == INCONCLUSIVE and "A/A" in biased.reason and "C/W 1 b=1: +6.0% [" in biased.measured
    )
    assert verdict(runs(6.0, aa=False)).verdict == INCONCLUSIVE  # no A/A in this cell
    one = bench_rows({1.0: 6.0}, reps=4, policies=(best, "demand"), aa=0.0)
    assert verdict(Replicas(one)).verdict == INCONCLUSIVE  # one run, no stored runs
    P = cache_design.bench_profile(load_profile("cpu"), best)
    assert P.policies == ("demand", best, CONTROL) and P.batch_sizes == (1,) and len(P.tasks) == 1
    assert P.cache_ratios == (cache_design.BENCH_RATIO,) and P.warmup == 1
    assert P.repetitions >= thresholds.MIN_PAIRS  # one cell: its pairs are its repetitions


def eviction_rows(misses: dict, lru=100, floor=50) -> pd.DataFrame:
    """An eviction sweep (cache_design.eviction_sweep's columns): per batch size, C/W and policy, LRU's misses
    unless `misses` says otherwise, min's `floor`."""
    rows = []
    for b in (1, 4):
        for r in cache_design.RATIOS:
            for pol in cache_design.EVICTIONS + cache_design.FLOORS:
                m = floor if pol == "min" else misses.get(pol, lru)
                rows.append(
                    {
                        "task": "x",
                        "batch_size": b,
                        "policy": pol,
                        "cache_ratio": r,
                        "demand_misses": m,
                        "speculative_transfers": 0,
                        "accesses": 1000,
                    }
                )
    return pd.DataFrame(rows)


def test_eviction_claims_rule_on_the_denoising_steps_and_print_all_demands_where_the_verdict_flips():
    """Over the denoising steps lrfu removes 12% of LRU's misses and token_lru < lru < its reverse; the
    prefill forwards add misses where lrfu gains nothing and token_lru loses, so over all demands the first
    claim would fail (6%) and so would the token order; the gap to min (24% closed) is the same on both
    bases."""
    steps = eviction_rows(
        {"demand+lrfu:lam=2": 88, "demand+token_lru": 95, "demand+token_lru:reverse=true": 105, "belady": 60}
    )
    prefill = eviction_rows({"demand+token_lru": 110, "belady": 100}, floor=100)
    s = cache_design.summary(phase_split(steps, prefill, cache_design.SUMMED))
    assert cache_design.best_eviction(s) == "demand+lrfu:lam=2"
    gain, gap, token = cache_design.verdicts(cache_design.numbers(s, pd.DataFrame()))
    assert all(c.counting == counting.DENOISING for c in (gain, gap, token))
    assert gain.verdict == REPRODUCED and gain.reason == (
        "denoising steps: the best, lrfu:lam=2, removes 12.0% (rules); all demands: the best, lrfu:lam=2, "
        "removes 6.0% (would say not reproduced)"
    )
    assert gap.verdict == REPRODUCED and gap.reason == "" and "pooled 24%" in gap.measured
    assert token.verdict == REPRODUCED and token.reason == (
        "denoising steps: lru 1000, token_lru 950, reversed 1050 (rules); all demands: lru 2000, token_lru "
        "2050, "
        "reversed 2050 (would say not reproduced)"
    )
    plain = cache_design.numbers(cache_design.summary(steps), pd.DataFrame())  # no phases: all demands
    assert plain.basis == "included" and cache_design.verdicts(plain)[0].counting == counting.ALL_DEMANDS


def test_the_lru_resident_share_counts_the_denoising_steps_as_its_label_says():
    """01's share of demanded experts already resident under LRU: the demand policy's hits over the denoising
    steps (prefill excluded), not over all demands; a stream with large prefill forwards tells them apart."""
    t = synth(SynthParams(layers=3, experts=64, top_k=4, tokens=8, blocks=2, steps=8, w=16, prefill=3.0))
    share = working_set.lru_share([t], (1.0,))
    C = int(share.cache_experts.iloc[0])
    by = replay(t, "demand", C, by_phase=True)["by_phase"]
    hits, misses_ = (sum(by[p][k] for p in ("first", "later")) for k in ("demand_hits", "demand_misses"))
    every = replay(t, "demand", C)
    denoising, all_demands = hits / (hits + misses_), every["demand_hits"] / every["accesses"]
    assert share.resident_share.iloc[0] == pytest.approx(denoising) and abs(denoising - all_demands) > 0.02
    n = working_set.numbers(working_set.working_set_table([t]), working_set.stability_table([t]), share)
    (c,) = working_set.verdicts(n)
    assert n.lru_resident == pytest.approx(denoising)
    assert f"denoising steps' demands already resident under LRU at C/W = 1: {denoising:.2f}" in c.measured
    assert c.counting.startswith(counting.DENOISING) and "resident under LRU" in c.counting


def throttle_rows(reps=1, jitter=0.0, last_step_stall=0.9, aa=None):
    """03's rows: per bandwidth, demand's and last_step's stall (seconds per run, +-jitter alternating on
    last_step's); with `aa`, demand's A/A pair beside them: a second demand run (arm B) stalling `aa` s more,
    +-0.002 alternating."""
    rows = []
    for scale, gbps in ((2.0, 0.2), (1.0, 0.1), (0.5, 0.05)):
        for rep in range(reps):
            wobble = jitter * (1 if rep % 2 else -1)
            runs = [
                ("demand", "A", 0.5 / scale, 100, 0),
                ("last_step", "A", (last_step_stall + wobble) / scale, 90, 40),
            ]
            if aa is not None:
                runs.append(("demand", "B", (0.5 + aa + (0.002 if rep % 2 else -0.002)) / scale, 100, 0))
            for pol, arm, stall, m, spec in runs:
                rows.append(
                    {
                        "task": "gsm8k",
                        "batch_size": 4,
                        "cache_ratio": 1.0,
                        "rep": rep,
                        "forwards": 100,
                        "bandwidth_scale": scale,
                        "link_gbps": gbps,
                        "policy": pol,
                        "arm": arm,
                        "seconds": 2 + stall,
                        "tokens_per_second": 128 / (2 + stall),
                        "stall_seconds": stall,
                        "link_busy_seconds": 1.0,
                        "demand_misses": m,
                        "speculative_transfers": spec,
                    }
                )
    return pd.DataFrame(rows)


def throttle_verdicts(reps):
    return throttle.verdicts(throttle.numbers(reps if isinstance(reps, Replicas) else Replicas(reps)))


def throttle_runs(jitter=0.02, last_step_stall=0.9, offsets=(-0.01, 0.01, 0.0), aa=0.0):
    """3 stored runs of throttle_rows, last_step's stall shifted by `offsets` s between runs (the last one,
    whose rows the study's means print, unshifted)."""
    return stored(
        lambda o, a: throttle_rows(4, jitter, last_step_stall + o, None if aa is None else aa + a / 100),
        offsets=offsets,
    )


def test_throttle_claims():
    counts, stall = throttle_verdicts(throttle_runs())
    assert counts.verdict == REPRODUCED and "+30% link transfers" in counts.measured and not counts.timing
    assert stall.verdict == REPRODUCED and stall.timing and "3 stored runs" in stall.interval
    # highest bandwidth first; the stall basis: (0.45 - 0.25) s per 100 forwards over demand's 2.25 s per 100
    assert stall.measured.startswith("0.2 GB/s b=4 C/W 1: +8.9") and "(3 runs); A/A [" in stall.measured
    assert "0.2 GB/s: stall 0.25 s (demand) vs 0.45 s (last_step)" in stall.measured
    # Claim 03 has an interval per cell: a stall gap inside the run-to-run noise is inconclusive, a gap the
    # other way is not reproduced, an A/A stall off by 0.1 s (4 points) gates it, and one run alone decides
    # nothing
    noisy = throttle_runs(last_step_stall=0.52, offsets=(-0.05, 0.0, 0.05))
    assert throttle_verdicts(noisy)[1].verdict == INCONCLUSIVE
    assert throttle_verdicts(throttle_runs(last_step_stall=0.3))[1].verdict == NOT_REPRODUCED
    gated = throttle_verdicts(throttle_runs(aa=0.1))[1]
    assert gated.verdict == INCONCLUSIVE and "A/A" in gated.reason
    alone = throttle_verdicts(throttle_rows(reps=4, jitter=0.02, aa=0.0))[1]
    assert alone.verdict == INCONCLUSIVE and "record >= 3 runs" in alone.reason
    P = load_profile("cpu")
    T = throttle.throttle_profile(P)
    assert (T.tasks, T.batch_sizes, T.cache_ratios, T.policies) == (
        P.tasks[:1],
        (4,),
        (1.0,),
        ("demand", "last_step", CONTROL),
    )
    assert T.bandwidth_scales == P.throttle_scales == (2.0, 1.0, 0.5)
    assert T.repetitions == max(P.repetitions, thresholds.MIN_PAIRS)
    # the stall basis is in points of demand's wall time per forward (criteria/timing.py's unit), not %
    assert stall.measured.startswith("0.2 GB/s b=4 C/W 1: +8.9 points [")


def test_throttle_summary_fills_the_unpaced_cuda_bandwidth():
    rows = throttle_rows()
    rows.loc[rows.bandwidth_scale == 2.0, "link_gbps"] = None  # as a cuda row at scale 1 holds it
    s = throttle.summary_table(rows)
    assert len(s) == 6 and np.allclose(sorted(s.link_gbps.unique()), [0.05, 0.1, 0.2])


def test_tide_claims_without_tide_say_why():
    P = load_profile("cpu")
    reason = head_to_head.tide_unavailable(P)
    assert "tide_path is null" in reason and "tiny" in reason
    c = head_to_head.released_verdict(None, reason)
    assert c.verdict == NOT_MEASURABLE and reason in c.lines()[-1]
    pols = ("demand", "interval_refresh")

    def style(diffs, noise=0.3, **kw):
        reps = stored(
            lambda o, a: bench_rows(shifted(diffs, o), reps=4, policies=pols, noise=noise, aa=a), **kw
        )
        return head_to_head.style_verdict(head_to_head.style_numbers(reps))

    rows = bench_rows({1.0: 0.0, 0.5: 0.5}, reps=4, policies=pols, aa=0.0)
    table = head_to_head.style_table(rows)
    claim = style({1.0: 0.0, 0.5: 0.5}, offsets=(-0.5, 0.5, 0.0))
    assert claim.verdict == REPRODUCED and set(table.cache_ratio) == {1.0, 0.5} and len(table) == 8
    assert claim.measured.startswith("C/W 1: +0.0% [") and "C/W 0.5 mbpp b=4: -0.5% [" in claim.measured
    assert "interval below +3%" in claim.reason and "(3 runs); A/A [" in claim.measured
    assert "misses vs demand's, this run: C/W 1 -10%" in claim.measured
    # "does not beat" is non-superiority: a wide interval decides nothing, a faster interval_refresh fails it
    assert style({1.0: 0.0, 0.5: 0.0}, offsets=(-4.0, 0.0, 4.0)).verdict == INCONCLUSIVE
    c = style({1.0: -8.0, 0.5: 0.0})
    assert c.verdict == NOT_REPRODUCED and "C/W 1" in c.reason and "C/W 0.5" not in c.reason
    # the A/A gates it: an A/A 5% off makes it inconclusive, though every interval lies below +3%
    c = style({1.0: 0.0, 0.5: 0.5}, aa_offsets=(4.5, 5.0, 5.5))
    assert c.verdict == INCONCLUSIVE and "A/A" in c.reason
    parts = {
        1.0: {"speedup_total": 3.0, "speedup_kv_cache": 2.0, "speedup_offload": 1.5},
        0.5: {"speedup_total": 0.9, "speedup_kv_cache": 0.9, "speedup_offload": 1.0},
    }
    c = head_to_head.released_verdict(parts, None)
    assert c.verdict == NOT_REPRODUCED and "C/W 1: 3.0x (KV cache 2.0x, offload 1.5x)" in c.measured


def test_bench_file_never_mixes_settings(places):
    P = load_profile("cpu")
    assert harness.bench_file(P) == places / "data" / "results" / "cpu" / "bench.csv"
    row = {c: 0 for c in COLUMNS} | {
        "profile": "cpu",
        "fingerprint": "other",
        "task": "gsm8k",
        "policy": "demand",
        "tokens_sha": "x",
    }
    write_rows(harness.bench_file(P), [row])
    other = harness.bench_file(P)
    assert other.name.startswith("bench-") and other.name != "bench.csv"


def test_the_notebooks_load_their_model_after_preparing_the_run(places, monkeypatch):
    """run_grid and traces load through harness.load_model, which makes prepare's checks before any
    weights."""
    from artifact.errors import SettingError
    from artifact.offload import prepare

    monkeypatch.setattr(
        prepare, "load_checkpoint", lambda *a, **k: pytest.fail("loaded a model despite bad input")
    )
    P = load_profile("cpu", {"gen_length": 8192})  # more positions than the tiny model has
    for path in (
        lambda: harness.run_grid(P, progress=False, log=lambda *a: None),
        lambda: harness.traces(P, False),
    ):
        with pytest.raises(SettingError, match="positions > the model's max_position_embeddings"):
            path()


def test_traces_are_recorded_once_and_rerecorded_when_settings_change(places, monkeypatch):
    P = load_profile("cpu", {"trace_tasks": ["gsm8k"], "trace_batch_sizes": [1], "trace_n_prompts": 1})
    first = harness.traces(P, progress=False)
    assert len(first) == 1 and harness.trace_path(P, "gsm8k", 1).is_file()
    assert harness.trace_path(P, "gsm8k", 1).is_relative_to(places / "data" / "traces")
    calls = []
    real = harness.record_trace
    monkeypatch.setattr(harness, "record_trace", lambda *a: calls.append(a) or real(*a))
    again = harness.traces(P, progress=False)
    assert calls == [] and again[0].equal_routing(first[0])
    changed = load_profile(
        "cpu", {"trace_tasks": ["gsm8k"], "trace_batch_sizes": [1], "trace_n_prompts": 1, "threshold": 0.9}
    )
    harness.traces(changed, progress=False)
    assert len(calls) == 1


def test_every_figure_is_saved_with_the_data_it_plotted(places):
    P = load_profile("cpu", {"trace_tasks": ["gsm8k"], "trace_batch_sizes": [1], "trace_n_prompts": 1})
    ts = harness.traces(P, progress=False)
    ws, sim = working_set.working_set_table(ts), working_set.stability_table(ts)
    share = working_set.lru_share(ts, (0.5, 1.0))
    (claim,) = working_set.verdicts(working_set.numbers(ws, sim, share))
    assert claim.verdict in (REPRODUCED, NOT_REPRODUCED) and "C/W = 1" in claim.measured
    summary = misses.miss_summary(
        misses.miss_sweep(ts, load_profile("cpu", {"cache_ratios": [0.5, 1.0]}), progress=False)
    )
    assert set(summary.policy) == set(P.sim_policies) | {misses.BOUND}
    assert (summary[summary.policy == "demand"].misses_vs_lru == 1).all()
    n04 = capacity.numbers(
        Replicas(bench_rows({0.43: 1.0, 1.0: 5.0}, policies=("demand", "last_step", CONTROL)))
    )
    q = {
        "resident": {"seconds": 1.0},
        "offloaded": {"seconds": 2.0, "stall_seconds": 0.5},
        "cache_experts": 5,
    }
    made = {
        "00": quickstart.plot(q, P),
        "01a": working_set.plot_working_set(ws, P),
        "01b": working_set.plot_stability(sim, share, P),
        "02": misses.plot(summary, P),
        "03": throttle.plot(
            throttle.summary_table(throttle_rows(reps=4)),
            throttle.numbers(Replicas(throttle_rows(reps=4))),
            P,
        ),
        "04": capacity.plot(n04, P),
        "05": head_to_head.plot(bench_rows({1.0: 0.0, 0.5: 0.5}, policies=("demand", "interval_refresh")), P),
    }
    for name, (fig, df) in made.items():
        png, csv = figures.save(fig, df, P, name, log=lambda s: None)
        assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size < 300_000
        assert len(pd.read_csv(csv)) == len(df) > 0
        assert not list(png.parent.glob(".*.tmp")) and not list(csv.parent.glob(".*.tmp"))
    assert (places / "figures" / "cpu" / "04.png").is_file()
    assert (places / "results" / "cpu" / "data" / "04.csv").is_file()  # a run's data: ignored by git
    assert not (places / "data" / "results" / "cpu" / "04.csv").exists()  # the reference: only --store


def test_quickstart_claim_follows_the_tokens():
    q = {
        "offloaded": {"demand_misses": 62, "demand_hits": 38},
        "cache_experts": 27,
        "num_experts": 256,
        "cache_ratio": 0.5,
        "same_tokens": True,
    }
    (c,) = quickstart.verdicts(quickstart.numbers(q))
    assert c.verdict == REPRODUCED and c.measured == (
        "C = 27 of 256 experts per layer (C/W = 0.5), 62% of expert uses missed, identical tokens: yes"
    )
    assert quickstart.verdicts(quickstart.numbers(q | {"same_tokens": False}))[0].verdict == NOT_REPRODUCED


# --- the paper's numbers, once ---------------------------------------------------------------------
PAPER_FIGURES = ("6.7", "4.9", "11.8", "0.73", "1.16", "2.63", "14.4", "6.1")


def test_quickstart_says_why_the_tiny_models_text_is_gibberish():
    q = {"text": "beginbegin work"}
    assert "seeded random weights" in quickstart.generated(q, load_profile("cpu"))
    assert (
        quickstart.generated(q, load_profile("cpu", {"model": "/models/LLaDA2.0-mini"}))
        == "generated: 'beginbegin work'"
    )


def test_the_throttle_axis_names_the_pcie_generation_of_each_scaled_bandwidth():
    summary = pd.DataFrame({"bandwidth_scale": [0.5, 1.0, 2.0], "link_gbps": [0.05, 0.1, 0.2]})
    why, ticks = throttle._bandwidth_axis(summary, load_profile("cpu"))
    assert "scaled to the tiny model's experts" in why and "PCIe 4 = 25 GB/s" in why
    assert [t.split("\n")[1] for t in ticks.values()] == ["~PCIe 3", "~PCIe 4", "~PCIe 5"]
    assert throttle._pcie(0.3) == "0.3 x PCIe 4"
    why, ticks = throttle._bandwidth_axis(summary, load_profile("cpu", {"link_gbps": 1.0}))  # a stated rate
    assert why == "" and list(ticks.values()) == ["0.05", "0.1", "0.2"]


def test_the_papers_numbers_live_only_in_paper_py():
    """No other experiments module writes one of the paper's figures as a literal."""
    for path in sorted(EXPERIMENTS.rglob("*.py")):
        if path.name == "paper.py":
            continue
        tree = ast.parse(path.read_text())
        literals = {
            repr(n.value)
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, float)
        }
        strings = " ".join(
            n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
        )
        found = [f for f in PAPER_FIGURES if f in literals or f in strings]
        assert not found, f"{path.name} writes the paper's figure(s) {found}; take them from paper.py"


def test_paper_table_derives_from_paper_py():
    assert paper.demand_vs_last_step(0.43) == ("+0.73 [-1.16, +2.63]", paper.NO_DIFFERENCE)
    assert paper.demand_vs_last_step(1.3) == ("+4.9..+11.8, CI excludes 0", paper.FASTER)
    assert paper.demand_vs_last_step(0.5) is None
    assert tuple(head_to_head.RATIOS) == (1.0, 0.5)


def test_claim_modules_import_at_the_top():
    """Imports sit at the top of the claim modules (no function-local imports)."""
    for name in (
        "verdicts/records",
        "verdicts/rules",
        "verdicts/pairs",
        "verdicts/pooling",
        "verdicts/judge",
        "counting",
        "recording",
        "harness",
        "criteria/paper",
        "criteria/thresholds",
        "outputs/paths",
        "outputs/figures",
        "studies/quickstart",
        "studies/working_set",
        "studies/miss_accounting",
        "studies/bandwidth_throttling",
        "studies/capacity_sweep",
        "studies/tide_head_to_head",
        "paired_table",
    ):
        tree = ast.parse((EXPERIMENTS / f"{name}.py").read_text())
        local = [
            n.lineno
            for f in ast.walk(tree)
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            for n in ast.walk(f)
            if isinstance(n, (ast.Import, ast.ImportFrom))
        ]
        assert not local, f"{name}.py imports inside functions at lines {local}"


# --- the committed cpu figures ----------------------------------------------------------------------
ROOT = EXPERIMENTS.parent.parent


def test_every_notebook_figure_is_committed_small_and_linked_from_the_claims_table():
    saved = set()
    for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        for cell in nbformat.read(nb, as_version=4).cells:
            saved |= set(re.findall(r'save\(fig, df, P, "([^"]+)"\)', cell.source))
    assert len(saved) == 12
    table = (ROOT / "docs" / "claims.md").read_text()  # the full table; the README's shows one a notebook
    for name in sorted(saved):
        png, csv = ROOT / "figures" / "cpu" / f"{name}.png", ROOT / "data" / "results" / "cpu" / f"{name}.csv"
        assert png.is_file() and csv.is_file(), f"{name}: run ./run_all.sh cpu --force and commit both"
        assert png.stat().st_size < 300_000 and csv.stat().st_size < 300_000
        assert f"(../figures/cpu/{name}.png)" in table, (
            f"docs/claims.md's claims table does not link {name}.png"
        )


def test_host_bound_gpu_cells_make_the_capacity_verdict_inconclusive():
    """The same intervals on GPU rows: host-bound cells (host > 50% of wall per forward) flip reproduced to
    inconclusive with the reason; below the bound, and on the CPU whatever the share, the verdict stands."""
    for device, host, want in (
        ("cuda:0", 7.4, INCONCLUSIVE),
        ("cuda:0", 3.0, REPRODUCED),
        ("cpu", 9.9, REPRODUCED),
    ):
        on = dict(wall_ms_per_forward=10.0, device=device, host_ms_per_forward=host)
        reps = stored(lambda o, a, on=on: bench_rows(shifted(PLANTED, o), reps=4, aa=a).assign(**on))
        _, faster, low = capacity_claims(reps)
        assert faster.verdict == low.verdict == want, (device, host)
        if want == INCONCLUSIVE:
            assert "host-bound: host 74% of wall" in faster.reason and "host-bound" in low.reason
