"""The README's claims tables, generated from the claim records (claims_table.py reads them): the
paper's claims, each with the paper's figure (as its record states it, written from criteria/paper.py) beside
the measured one, and beyond the paper, this artifact's own results. `update_readme` rewrites the generated
blocks of the README and docs/claims.md (`python -m artifact claims --update-readme`, and `--store`);
tests/test_claims_table.py regenerates them and fails on any difference. A display of the verdicts: it rules
nothing (the verdicts are the records')."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pandas as pd

from artifact.errors import ResultFileError
from artifact.experiments import claims_forest
from artifact.experiments import claims_table as table
from artifact.experiments.criteria import paper
from artifact.experiments.criteria.claims import STATED
from artifact.experiments.settings import PAPER_BATCH_SIZES
from artifact.experiments.verdicts.judge import paper_ruled
from artifact.model.tasks import TASKS
from artifact.paths import atomic_write_text, data_dir, repo_root

CITATION, ZENODO = "CITATION.cff", ".zenodo.json"  # beside the README, their abstracts rendered here
CALIBRATION = "calibration.csv"  # data/results/<profile>/: `python -m artifact calibrate --out`
PROXY = {"cpu": "cpu (proxy: tiny model, emulated link)"}  # a profile's column header: what it measures
NOT_RUN = {"verdict": "not run"}  # another profile's records lack the claim


def own(c: dict) -> bool:
    """This artifact's own result, not a claim of the paper (criteria/claims.py; a record of a claim the
    registry does not hold, a user's own, by its paper field)."""
    s = STATED.get(c.get("key", ""))
    return s.own if s else c.get("paper", "").startswith(paper.OWN)


def paper_figure(c: dict) -> str:
    """The paper's words the claim answers, quoted from the abstract (criteria/claims.py; a claim the
    registry does not hold: its record's paper field, to its first ';')."""
    s = STATED.get(c.get("key", ""))
    return paper.quote(*s.paper) if s else c.get("paper", "").split("; ")[0]


def measured_short(c: dict, width: int = 100) -> str:
    """The measured figure in a line: a timing claim's effects over its cells, else the clauses of its
    measured text that fit `width` (docs/claims.md has it whole)."""
    text, cells = c.get("measured", ""), [x for x in c.get("cells") or [] if "effect" in x]
    unit = " points" if " points [" in text else "%"
    if len(cells) == 1:
        return f"{cells[0]['effect']:+.1f}{unit} [{cells[0]['low']:+.1f}, {cells[0]['high']:+.1f}]"
    if cells:
        e = sorted(x["effect"] for x in cells)
        return f"{e[0]:+.1f}{unit} to {e[-1]:+.1f}{unit} over {len(cells)} cells"
    short = ""
    for part in text.split("; "):
        if len(short) + len(part) + 2 > width:
            break
        short = f"{short}; {part}" if short else part
    short = short or text[:width].rsplit(" ", 1)[0]
    return short if short == text else f"{short} ..."


def ordering(recs: list[dict]) -> str:
    """The abstract's "The same ordering holds across five tasks and batch sizes 1-8", on one profile: ruled
    only where its 04 faster claim's cells cover the five tasks and batch sizes 1-8 (this artifact's TASKS and
    PAPER_BATCH_SIZES), as that claim's verdict; else not ruled, naming the tasks and batch sizes covered."""
    c = next((c for r in recs for c in r["claims"] if c.get("key") == "04-faster"), None)
    if c is None:
        return "not run"
    cells = [x["cell"] for x in c.get("cells") or []]
    tasks, batches = sorted({x["task"] for x in cells}), sorted({x["batch_size"] for x in cells})
    covered = f"tasks {', '.join(tasks) or 'none'}, batch {','.join(map(str, batches)) or 'none'}"
    if set(TASKS) <= set(tasks) and set(PAPER_BATCH_SIZES) <= set(batches):
        return f"{c['verdict']} (04's faster claim over {covered})"
    return f"not ruled: grid covers {covered}"


def fresh_decides(profile_name: str, results: Path | None = None) -> dict:
    """{timing claim key: "fresh % (observed k of m)"}: how often a fresh run here decides alone, as the
    calibration predicts it at the noise measured in real fresh runs (the "as stored, fresh run x..." rows;
    "as stored" in a table without them), beside how many of the kept real fresh runs decided
    (fresh_runs/decided.csv, written by `python -m artifact fresh-runs`); {} without the table."""
    root = Path(results or data_dir() / "results") / profile_name
    path = root / CALIBRATION
    if not path.is_file():
        return {}
    try:
        t = pd.read_csv(path)
        here = t[t.scenario.str.startswith("as stored, fresh run")]
        rows = (here if len(here) else t[t.scenario == "as stored"]).itertuples()
        out = {r.claim: f"{r.fresh_decides:.0f}%" for r in rows}
    except (ValueError, AttributeError, KeyError) as e:
        raise ResultFileError(
            f"{path}: not a calibration table ({e}); expected `calibrate --out`'s"
        ) from None
    observed = root / "fresh_runs" / "decided.csv"
    if observed.is_file():
        for r in pd.read_csv(observed).itertuples():
            if r.claim in out:
                out[r.claim] += f" (real: {r.decided}/{r.runs}, {r.agree} as stored)"
    return out


def loo_text(c: dict) -> str:
    """'k of N': with each stored run left out of every input in turn, how many pooled verdicts are the
    pooled one ("" for a claim without leave-one-out views)."""
    views = c.get("leave_one_out") or []
    if not c.get("timing") or not views:
        return ""
    return f"{sum(v == (c.get('pooled') or c['verdict']) for v in views)} of {len(views)}"


def title(c: dict) -> str:
    """A claim's text to its first clause, without its tags ([own result], [modeled: ...]): the README's
    cell (docs/claims.md has it whole)."""
    text, depth = re.sub(r"^(\[[^\]]*\]\s*)+", "", c["claim"]), 0
    for i, ch in enumerate(text):  # the first ": " outside parentheses ends the first clause
        depth += (ch == "(") - (ch == ")")
        if depth == 0 and text.startswith(": ", i):
            text = text[:i]
            break
    text = re.sub(r"(\s*\([^()]*\))+$", "", text)  # a closing remark in parentheses
    return text + (" (modelled)" if "[modeled" in c["claim"] else "")


def paper_short(c: dict) -> str:
    """The cores of the abstract's phrases the claim answers (paper.quote_short); a record the registry does
    not hold: its own paper field, to its first ';'."""
    s = STATED.get(c.get("key", ""))
    return paper.quote_short(*s.paper) if s else paper_figure(c)


def render_compact(profile_name="cpu", results: Path | None = None, notebook_dir: Path | None = None) -> str:
    """The README's block, two tables of short cells (docs/claims.md has every text whole). The paper's
    claims: the abstract's words beside the measured figure, the abstract's "same ordering" after 04's faster
    claim, the paper's own result ruled here. Beyond the paper: this artifact's own results. A row per claim
    with its notebook, the verdict of every profile with records and, for a timing claim, leave one out and
    how often a fresh run decides alone."""
    recs = table.records(profile_name, results)
    if not recs:
        return f"No claim records for profile {profile_name} (run `./run_all.sh {profile_name}`)."
    others = table.others(profile_name, results)
    decides, cols = fresh_decides(profile_name, results), [PROXY.get(profile_name, profile_name), *others]
    measured, stable = f"measured ({profile_name})", ["leave one out", "a fresh run decides"]
    papers = table.head(
        ["nb", "the paper's claim", "abstract", measured, *cols, "the paper's result", *stable]
    )
    beyond = table.head(["nb", "this artifact's own result", measured, *cols, *stable])
    for r in recs:
        nb, shown = r["notebook"], set()
        for k, c in enumerate(r["claims"]):
            rows, key = (beyond if own(c) else papers), c.get("key") or ""
            first = id(rows) not in shown
            shown.add(id(rows))
            verdicts = [(table.same_claim(o.get(nb), k, c) or NOT_RUN)["verdict"] for o in others.values()]
            cells = [f"[{nb[:2]}](notebooks/{nb}.ipynb)" if first else "", title(c)]
            cells += [] if rows is beyond else [paper_short(c)]
            cells += [measured_short(c, 60), c["verdict"], *verdicts]
            cells += [] if rows is beyond else [paper_ruled(key) if key else ""]
            rows.append(table.row([*cells, loo_text(c), decides.get(key, "")]))
            if key == "04-faster":  # the abstract's next sentence: the same ordering across tasks and batches
                order = [ordering(recs), *(ordering(list(o.values())) for o in others.values())]
                claim = "demand-async stays faster across tasks and batch sizes"
                papers.append(table.row(["", claim, paper.quote_short("ordering"), "", *order, "", "", ""]))
    return "\n".join(["### The paper's claims", "", *papers, "", "### Beyond the paper", "", *beyond])


def markers(profile_name: str) -> tuple[str, str]:
    return f"<!-- claims:{profile_name}:begin -->", f"<!-- claims:{profile_name}:end -->"


def agreement_markers(profile_name: str) -> tuple[str, str]:
    return f"<!-- agreement:{profile_name}:begin -->", f"<!-- agreement:{profile_name}:end -->"


def replace_block(text: str, profile_name: str, block: str, marks: tuple[str, str] | None = None) -> str:
    begin, end = marks or markers(profile_name)
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise ValueError(f"expected one {begin} ... {end} pair in the file")
    head, rest = text.split(begin)
    return f"{head}{begin}\n{block}\n{end}{rest.split(end)[1]}"


def update_readme(readme_path=None, profile_name: str = "cpu", claims_doc=None) -> bool:
    """Rewrite the README's block (its two tables) and docs/claims.md's full and agreement blocks from the
    records, atomically; True when either changed."""
    path = Path(readme_path or repo_root() / "README.md")
    doc = Path(claims_doc or path.parent / table.CLAIMS_DOC)
    changed = _rewrite(path, lambda t: replace_block(t, profile_name, render_compact(profile_name)))
    if doc.is_file():

        def full(text: str) -> str:
            new = replace_block(text, profile_name, table.render(profile_name))
            marks = agreement_markers(profile_name)
            return (
                replace_block(new, profile_name, table.render_agreement(profile_name), marks)
                if marks[0] in new
                else new
            )

        changed = _rewrite(doc, full) or changed
    if path == repo_root() / "README.md":  # the committed README's picture of the claims, from the records
        claims_forest.write(profile_name)
    for name, edit in ((CITATION, _citation), (ZENODO, _zenodo)):
        if (path.parent / name).is_file():
            changed = _rewrite(path.parent / name, edit) or changed
    return changed


# CITATION.cff's abstract and .zenodo.json's description: the abstract's claims quoted from
# criteria/paper.py, then what this artifact is (rewritten by update_readme, checked by
# tests/test_paper_words.py)
ABOUT = (
    "The artifact is an inference engine for LLaDA2.0-style diffusion MoE models whose routed experts live "
    "in host memory behind a per-layer GPU cache: prefetch and eviction policies driven through one code "
    "path by the engine and an exact trace simulator, a paired benchmark with 95% intervals over stored "
    "runs, an adapter for TIDE's released code, a performance model, and ten notebooks that each print a "
    "claim with its measured figure and a verdict. Its stored results are from the cpu profile, a tiny "
    "random-weight model on an emulated link: they show the mechanisms, not the paper's GPU numbers."
)


def citation_abstract() -> str:
    """The archive's abstract: the paper's claims as verbatim phrases of its abstract, then ABOUT."""
    quoted = "; ".join(f'"{p.words}"' for p in paper.PHRASES.values())
    return (
        f'This artifact reproduces the paper "{paper.TITLE}". The claims of its abstract that this artifact '
        f"rules, quoted from it: {quoted}. {ABOUT}"
    )


def _citation(text: str) -> str:
    """CITATION.cff with its `abstract: >-` block rendered from citation_abstract."""
    head, rest = text.split("abstract: >-\n", 1)
    lines = rest.splitlines(True)
    tail = "".join(lines[next(i for i, line in enumerate(lines) if not line.startswith("  ")) :])
    block = textwrap.fill(citation_abstract(), 110, initial_indent="  ", subsequent_indent="  ")
    return f"{head}abstract: >-\n{block}\n{tail}"


def _zenodo(text: str) -> str:
    doc = json.loads(text)
    doc["description"] = citation_abstract()
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def _rewrite(path: Path, edit) -> bool:
    text = path.read_text()
    new = edit(text)
    if new != text:
        atomic_write_text(path, new)
    return new != text
