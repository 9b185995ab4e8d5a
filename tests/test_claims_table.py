"""The claims tables (the README's two, the paper's claims and beyond the paper; docs/claims.md's full one
and its agreement block) are generated from the committed claim records (data/results/cpu/*.claims.json), and
those records are what the stored notebooks' claim cells print. The README stays what an evaluator reads in
ten minutes."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import nbformat
import pytest

from artifact.errors import ResultFileError
from artifact.experiments import claims_readme, claims_table
from artifact.experiments.criteria import paper
from artifact.experiments.settings import load_profile
from artifact.experiments.verdicts.records import Claim, record, record_path, report, unwrap

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "data" / "results"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
CLAIMS_DOC = ROOT / claims_table.CLAIMS_DOC
README_LINES, README_WIDTH = 250, 300  # what an evaluator reads in ten minutes


def _block(path: Path, marks: tuple[str, str]) -> str:
    begin, end = marks
    return path.read_text().split(begin)[1].split(end)[0].strip()


def test_the_readme_claims_table_is_the_generated_one():
    assert _block(ROOT / "README.md", claims_readme.markers("cpu")) == claims_readme.render_compact(
        "cpu", RESULTS, ROOT / "notebooks"
    ), "README's claims table differs from the committed records: `python -m artifact claims --update-readme`"


def test_the_full_claims_table_in_docs_is_the_generated_one():
    assert _block(CLAIMS_DOC, claims_readme.markers("cpu")) == claims_table.render(
        "cpu", RESULTS, ROOT / "notebooks"
    ), (
        f"{claims_table.CLAIMS_DOC}'s claims table differs from the committed records: "
        "`python -m artifact claims --update-readme`"
    )


def test_the_agreement_block_is_the_generated_one():
    """docs/claims.md's per-run verdicts of the timing claims are rendered from the committed records."""
    assert _block(CLAIMS_DOC, claims_readme.agreement_markers("cpu")) == claims_table.render_agreement(
        "cpu", RESULTS
    ), (
        "docs/claims.md's agreement block differs from the records: `python -m artifact claims "
        "--update-readme`"
    )


def _tables(block: str) -> dict[str, list[list[str]]]:
    """{heading: rows (cells)} of the README's block: its two tables under their ### headings."""
    out, name = {}, None
    for line in block.splitlines():
        if line.startswith("### "):
            name = line[4:]
            out[name] = []
        elif line.startswith("| ") and name:
            out[name].append([x.strip() for x in line.strip()[2:-2].split(" | ")])
    return {k: rows[1:] for k, rows in out.items()}  # without the header (rows[0]); "|---|" is not "| "


def test_the_compact_table_has_one_row_per_claim_and_the_stability_of_timing_claims():
    """Every claim in one of the two tables, the paper's in the first and the ordering row after 04's faster
    claim; per timing claim: the paper's own result ruled here (reproduced for the two the paper prints),
    leave one out (k of N) and how often a fresh run decides alone (data/results/cpu/calibration.csv)."""
    block = claims_readme.render_compact("cpu", RESULTS, ROOT / "notebooks")
    tables = _tables(block)
    assert list(tables) == ["The paper's claims", "Beyond the paper"]
    claims = [c for r in claims_table.records("cpu", RESULTS) for c in r["claims"]]
    decides = claims_readme.fresh_decides("cpu", RESULTS)
    mine = [c for c in claims if claims_readme.own(c)]
    papers = [c for c in claims if not claims_readme.own(c)]
    assert mine and papers and len(tables["Beyond the paper"]) == len(mine)
    rows = [r for r in tables["The paper's claims"] if r[2] != paper.quote_short("ordering")]
    assert len(rows) == len(papers) == len(tables["The paper's claims"]) - 1
    for cells, c in [*zip(rows, papers), *zip(tables["Beyond the paper"], mine)]:
        assert cells[1] == claims_readme.title(c) and c["verdict"] in cells, cells
        loo, fresh = cells[-2:]
        if not c.get("timing"):
            assert (loo, fresh) == ("", ""), cells
            continue
        if c.get("leave_one_out"):
            n = len(c["leave_one_out"])
            assert n == len(c["per_run"]) >= 4 and re.fullmatch(rf"\d of {n}", loo), cells
        assert fresh == decides.get(c["key"], ""), cells
        if c["key"] in decides:
            assert "(real: " in fresh, cells
    for cells, c in zip(rows, papers):
        assert cells[4] == c["verdict"] and cells[3] == claims_readme.measured_short(c, 60), cells
        assert cells[2] == claims_readme.paper_short(c), cells
        assert cells[5] == ("reproduced" if c.get("key") in ("04-faster", "04-equal") else ""), cells


def _paper_numbers() -> set[float]:
    """Every number criteria/paper.py holds (its upper-case constants and the texts it writes)."""
    texts = [str(getattr(paper, n)) for n in dir(paper) if n.isupper()]
    texts += [paper.quote("ordering"), paper.faster_text(), paper.paired_text(paper.AT_LOW)]
    return {abs(float(x)) for t in texts for x in re.findall(r"\d+(?:\.\d+)?", t)}


def test_the_readme_has_the_papers_claims_with_the_papers_figures_and_beyond_the_paper():
    """The README's block is two tables, the paper's claims and beyond the paper (this artifact's own
    results); each paper row carries the paper's figure (every number in it is paper.py's) beside the measured
    one, the cpu column says it is the proxy, and the abstract's "same ordering across five tasks and batch
    sizes 1-8" has a row that the cpu grid cannot rule and says why."""
    readme = (ROOT / "README.md").read_text()
    assert "### The paper's claims" in readme and "### Beyond the paper" in readme
    tables = _tables(_block(ROOT / "README.md", claims_readme.markers("cpu")))
    head = [x.strip() for x in readme.split("### The paper's claims")[1].split("\n| ")[1].split(" | ")]
    assert head[2:6] == [
        "abstract",
        "measured (cpu)",
        "cpu (proxy: tiny model, emulated link)",
        "the paper's result",
    ]
    numbers = _paper_numbers()
    for cells in tables["The paper's claims"]:
        assert cells[2], f"a paper row without the paper's figure: {cells}"
        found = {abs(float(x)) for x in re.findall(r"\d+(?:\.\d+)?", cells[2])}
        assert found <= numbers, f"{cells[2]}: {found - numbers} is not a number of criteria/paper.py"
    by_claim = {cells[1]: cells for cells in tables["The paper's claims"]}
    faster = next(v for k, v in by_claim.items() if k.startswith("demand-async is faster than async"))
    assert faster[2] == paper.quote_short("faster", "significant") and "4.9-11.8%" in faster[2]
    equal = next(v for k, v in by_claim.items() if k.startswith("at C/W 0.43"))
    assert equal[2] == paper.quote_short("at low")
    oracle = next(v for k, v in by_claim.items() if "oracle" in k)
    assert oracle[2] == paper.quote_short("oracle") and f"{paper.ORACLE_CUT}x" in oracle[2]
    order = next(v for v in tables["The paper's claims"] if v[2] == paper.quote_short("ordering"))
    assert order[4] == "not ruled: grid covers tasks gsm8k, batch 1,4", order
    assert all("own result" not in cells[1] for cells in tables["The paper's claims"])


def test_the_ordering_row_is_ruled_only_on_a_grid_of_the_five_tasks_and_batch_sizes_1_to_8():
    def recs(tasks, batches, verdict="reproduced"):
        cells = [{"cell": {"task": t, "batch_size": b}, "effect": 5.0} for t in tasks for b in batches]
        return [{"claims": [{"claim": "x", "key": "04-faster", "verdict": verdict, "cells": cells}]}]

    five = ("gsm8k", "humaneval", "mbpp", "math500", "ifeval")
    assert claims_readme.ordering([]) == "not run"
    assert claims_readme.ordering(recs(["gsm8k"], [1, 4])) == "not ruled: grid covers tasks gsm8k, batch 1,4"
    assert claims_readme.ordering(recs(five, [1, 4])).startswith(
        "not ruled: grid covers tasks gsm8k, humaneval"
    )
    ruled = claims_readme.ordering(recs(five, [1, 2, 4, 8], "not reproduced"))
    assert ruled.startswith("not reproduced (04's faster claim over tasks") and "batch 1,2,4,8" in ruled


def test_the_readme_is_short():
    """At most README_LINES lines, and no line of prose over README_WIDTH characters (a table's row renders
    as a table whatever its width: the generated claims tables carry each claim's whole text)."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_LINES, (
        f"README.md has {len(lines)} lines (> {README_LINES}): move the detail to docs/"
    )
    wide = [i + 1 for i, line in enumerate(lines) if len(line) > README_WIDTH and not line.startswith("| ")]
    assert not wide, f"README.md lines {wide} are over {README_WIDTH} characters"


def test_the_docs_index_lists_every_doc_once_in_both_places():
    docs = sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.name != "README.md")
    index = re.findall(
        r"^- \[docs/([^\]]+)\]\(\.\./docs/\1\): "
        r"(.+)$",
        (ROOT / "docs/README.md").read_text(),
        re.M,
    )
    readme = re.findall(r"^- \[docs/([^\]]+)\]\(docs/\1\): (.+)$", (ROOT / "README.md").read_text(), re.M)
    assert sorted(f for f, _ in index) == docs, "docs/README.md must list every file of docs/, one line each"
    assert readme == index, "the README's index of docs/ differs from docs/README.md"


def test_k_of_n_counts_the_runs_that_give_the_pooled_verdict_and_the_opposite_ones(tmp_path):
    def claim(i, pooled, runs):
        return {"claim": f"c{i}", "verdict": pooled, "timing": True, "pooled": pooled, "per_run": runs}

    claims = [
        claim(0, "reproduced", ["reproduced", "inconclusive", "reproduced"]),
        claim(1, "inconclusive", ["inconclusive", "not reproduced", "inconclusive"]),
        {"claim": "a count", "verdict": "reproduced", "timing": False},
    ]
    d = tmp_path / "cpu"
    d.mkdir()
    (d / "04_x.claims.json").write_text(
        json.dumps({"notebook": "04_x", "claims": claims, "command": "cmd", "date": "d", "commit": "c"})
    )
    assert [claims_table.k_of_n(c) for c in claims[:2]] == ["2 of 3", "2 of 3 (1 opposite)"]
    text = claims_table.render_agreement("cpu", tmp_path)
    assert (
        "| 04 | c1 | inconclusive | not reproduced | inconclusive | inconclusive | 2 of 3 (1 opposite) |"
        in text
    )
    assert "In 1 of 2 timing claims no stored run says the opposite" in text and "a count" not in text


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_stored_claim_cell_has_its_record_and_they_agree(path):
    """The record is written by the same claim cell whose output --store copied: the same lines."""
    rec = RESULTS / "cpu" / f"{path.stem}.claims.json"
    assert rec.is_file(), f"{rec.name} missing: run ./run_all.sh cpu --force with --store and commit it"
    doc = json.loads(rec.read_text())
    assert doc["notebook"] == path.stem and doc["profile"] == "cpu"
    assert doc["date"] and doc["commit"] and doc["command"]
    assert not doc["commit"].endswith("-dirty"), f"{rec.name} was run from uncommitted code"
    lines = "\n\n".join("\n".join(Claim(**c).lines()) for c in doc["claims"])
    nb = nbformat.read(path, as_version=4)
    out = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.get("output_type") == "stream")
    assert lines in unwrap(out), f"{path.name}: stored claim output differs from {rec.name}"


def test_every_row_names_its_basis_and_run():
    block = claims_table.render("cpu", RESULTS, ROOT / "notebooks")
    rows = [r for r in block.splitlines() if r.startswith("| ") and not r.startswith("| notebook")]
    assert len(rows) == sum(
        len(json.loads(p.read_text())["claims"]) for p in (RESULTS / "cpu").glob("*.claims.json")
    )
    for r in rows:
        cells = [c.strip() for c in r.strip("|").split(" | ")]
        basis, run = cells[5], cells[6]
        assert run.startswith("run "), r
        if not cells[4].startswith("not measurable"):
            kinds = ("exact counts", "over per-run means", "stored runs", "modelled: deterministic")
            assert any(k in basis for k in kinds), r
    assert "- run 1: `python -m artifact notebooks --profile cpu" in block


def test_records_render_update_and_a_gpu_column(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ARTIFACT_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("ARTIFACT_OUTPUT", str(tmp_path / "run"))
    P = load_profile("cpu")
    report(
        Claim("c1", "p1", "m1", "reproduced", counting="per run", interval="exact counts, no interval"),
        Claim("c2", "p2", "m|2", "inconclusive", "too wide", timing=True, pairs=4, margin="upper bound +9"),
        P=P,
        notebook="09_x",
    )
    assert "verdict [timing]: inconclusive (too wide)" in capsys.readouterr().out
    # the run's, ignored
    assert record_path(P, "09_x") == tmp_path / "run" / "cpu" / "data" / "09_x.claims.json"
    doc = json.loads(record_path(P, "09_x").read_text())
    assert [c["claim"] for c in doc["claims"]] == ["c1", "c2"] and {"date", "commit", "command"} <= set(doc)
    results = tmp_path / "data" / "results"
    (results / "cpu").mkdir(parents=True)
    shutil.copy(record_path(P, "09_x"), results / "cpu")  # what --store does with a run's records
    block = claims_table.render("cpu", results, tmp_path)
    assert "| c2 | p2 | m\\|2 (margin: upper bound +9) | inconclusive (too wide) | 4 pairs | run 1 |" in block
    assert "h200" not in block
    compact = claims_readme.render_compact("cpu", results, tmp_path)
    assert (
        "| c2 | p2 | m\\|2 | inconclusive |  |  |  |" in compact
        and "| c1 | p1 | m1 | reproduced |  |" in compact
    )
    gpu = load_profile("h200") if (ROOT / "artifact/experiments/profiles/h200.yaml").is_file() else None
    if gpu is not None:
        (results / "h200").mkdir()
        shutil.copy(record(gpu, "09_x", [Claim("c1", "p1", "g1", "not reproduced")]), results / "h200")
        block = claims_table.render("cpu", results, tmp_path)
        assert "h200: verdict (measured)" in block and "| not reproduced (g1) |" in block
        compact = claims_readme.render_compact("cpu", results, tmp_path)
        assert "| cpu (proxy: tiny model, emulated link) | h200 |" in compact
        assert "| c1 | p1 | m1 | reproduced | not reproduced |  |  |  |" in compact
    readme = tmp_path / "README.md"
    readme.write_text("head\n<!-- claims:cpu:begin -->\nold\n<!-- claims:cpu:end -->\ntail\n")
    doc = tmp_path / "docs" / "claims.md"
    doc.parent.mkdir()
    doc.write_text("top\n<!-- claims:cpu:begin -->\nold\n<!-- claims:cpu:end -->\n")
    monkeypatch.setattr(claims_readme, "render_compact", lambda name: "NEW")
    monkeypatch.setattr(claims_table, "render", lambda name: "FULL")
    assert claims_readme.update_readme(readme, "cpu") is True
    assert readme.read_text() == "head\n<!-- claims:cpu:begin -->\nNEW\n<!-- claims:cpu:end -->\ntail\n"
    assert doc.read_text() == "top\n<!-- claims:cpu:begin -->\nFULL\n<!-- claims:cpu:end -->\n"
    assert claims_readme.update_readme(readme, "cpu") is False
    readme.write_text("no markers")
    with pytest.raises(ValueError, match="claims:cpu:begin"):
        claims_readme.update_readme(readme, "cpu")


def test_a_runs_verdicts_are_set_beside_the_stored_ones_by_key(tmp_path):
    """A run's timing verdicts beside the stored ones, matched by the claim's key (a record with its claims
    in another order still matches), and records of another profile refused."""

    def write(d, claims, profile="cpu"):
        d.mkdir(parents=True, exist_ok=True)
        doc = {
            "notebook": "04_x",
            "profile": profile,
            "claims": claims,
            "command": "c",
            "date": "d",
            "commit": "h",
        }
        (d / "04_x.claims.json").write_text(json.dumps(doc))

    stored = [
        {"claim": c, "key": c, "verdict": v, "timing": True, "pooled": v, "per_run": [v] * 3}
        for c, v in (("a", "reproduced"), ("b", "reproduced"), ("c", "not reproduced"))
    ]
    write(
        tmp_path / "results" / "cpu", stored + [{"claim": "count", "verdict": "reproduced", "timing": False}]
    )
    mine = [
        {
            "claim": "c",
            "key": "c",
            "verdict": "reproduced",
            "timing": True,
            "agreement": "differs from the stored verdict",
        },
        {
            "claim": "a",
            "key": "a",
            "verdict": "reproduced",
            "timing": True,
            "agreement": "agrees with the stored verdict",
        },
        {
            "claim": "b",
            "key": "b",
            "verdict": "inconclusive",
            "timing": True,
            "agreement": "is inconclusive alone",
        },
    ]
    write(tmp_path / "run", mine + [{"claim": "count", "verdict": "reproduced", "timing": False}])
    text = claims_table.render_this_run("cpu", tmp_path / "run", tmp_path / "results")
    assert "| 04 | a | reproduced | reproduced | agrees with the stored verdict |" in text
    assert "| 04 | b | inconclusive | reproduced | is inconclusive alone |" in text
    assert "| 04 | c | reproduced | not reproduced | differs from the stored verdict |" in text
    assert "count" not in text
    write(tmp_path / "other", mine, profile="h200")
    with pytest.raises(ResultFileError, match="h200"):
        claims_table.render_this_run("cpu", tmp_path / "other", tmp_path / "results")
