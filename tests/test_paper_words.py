"""The paper's words, exactly: every phrase attributed to the paper is a verbatim phrase of its abstract
(docs/paper-abstract.txt, the only source here), kept once in criteria/paper.py; every claim is one entry of
the registry (criteria/claims.py), and what the committed records, the notebooks, the docs, CITATION.cff and
.zenodo.json show as the paper's words is rendered from there or quotes the abstract verbatim."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from artifact.experiments import claims_readme
from artifact.experiments.criteria import paper
from artifact.experiments.criteria.claims import NOTEBOOKS, STATED
from artifact.experiments.criteria.timing import CLAIMS as TIMING

ROOT = Path(__file__).resolve().parents[1]
RECORDS = sorted((ROOT / "data" / "results").glob("*/*.claims.json"))
# A quotation attributed to the paper: the cue, then one or more quoted phrases ("a", "b" and "c").
CUE = r"(?:abstract(?:'s)?|paper's words|paper says|paper calls it|the paper's)"
QUOTED = r"""(?<=[\s(:])(?:"[^"\n]{3,300}"|\u201c[^\u201d\n]{3,300}\u201d|'[^'\n]{3,300}'(?![a-z]))"""
ATTRIBUTED = re.compile(rf"{CUE}[:,]?\s*\(?((?:{QUOTED}(?:\s*(?:,|;|\+|and|or)\s*)?)+)", re.I)


def shown_as_papers(text: str) -> list[str]:
    """Every phrase `text` quotes as the paper's (an ellipsis splits a quotation into phrases)."""
    out = []
    for m in ATTRIBUTED.finditer(text):
        for q in re.compile(QUOTED).findall(text, m.start(1), m.end(1)):
            out += [p.strip(" .,;") for p in re.split(r"\.\.\.|\u2026", q[1:-1]) if p.strip(" .,;")]
    return out


def not_verbatim(text: str) -> list[str]:
    return [p for p in shown_as_papers(text) if paper.plain(p) not in paper.abstract()]


def sources() -> list[tuple[str, str]]:
    files = [*ROOT.glob("artifact/**/*.py"), *ROOT.glob("scripts/*.py"), *ROOT.glob("benchmarks/*.py")]
    files += [*ROOT.glob("docs/*.md"), ROOT / "README.md", ROOT / "CITATION.cff", ROOT / ".zenodo.json"]
    out = [(str(p.relative_to(ROOT)), p.read_text()) for p in sorted(files)]
    for p in sorted(ROOT.glob("notebooks/*.ipynb")):
        cells = json.loads(p.read_text())["cells"]
        out.append((p.name, "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")))
    return out + [(p.name, p.read_text()) for p in RECORDS]


def test_the_abstract_is_the_papers_and_every_phrase_is_verbatim_in_it():
    assert (ROOT / paper.ABSTRACT).read_text().splitlines()[0] == paper.TITLE
    for key, p in paper.PHRASES.items():
        assert p.words in paper.abstract() and p.short and p.short in p.words, key
        assert p.words in p.sentence and p.sentence in paper.abstract(), key


def test_the_check_finds_words_the_abstract_does_not_contain():
    """Planted: the old "very stable" (the abstract says "highly stable"), an ellipsis joining real words,
    a paraphrase in a paper column."""
    assert not_verbatim('its readings of the paper\'s words ("very stable", "few or no demand misses")') == [
        "very stable"
    ]
    assert not_verbatim('abstract: "last-step prefetching reduces ... beyond LRU"') == []
    assert not_verbatim('abstract: "speculative loads queue ahead of demand loads"') != []
    assert not_verbatim("# abstract: 'highly stable over time'") == []
    assert not_verbatim('the abstract\'s "very stable" routing') == ["very stable"]


def test_nothing_shows_words_as_the_papers_that_the_abstract_does_not_contain():
    bad = [f"{name}: {p!r}" for name, text in sources() for p in not_verbatim(text)]
    assert not bad, "shown as the paper's words, not in docs/paper-abstract.txt:\n" + "\n".join(bad)


def test_every_claim_is_one_registry_entry_with_the_papers_words_or_marked_its_own():
    for key, s in STATED.items():
        assert key[:2] in {n[:2] for n in NOTEBOOKS} and s.text, key
        assert all(k in paper.PHRASES for k in s.paper), key
        assert s.own == (not s.paper) and (s.judged or not s.own), key
        said = s.said
        assert said.startswith("abstract: ") if s.paper else said.startswith(paper.OWN), key
    assert set(TIMING) <= set(STATED)


def _template(text: str) -> re.Pattern:
    parts = re.split(r"\{[a-z_]+(?::[^}]*)?\}", text)
    return re.compile("^(\\[own result\\] )?" + ".+?".join(map(re.escape, parts)) + "$")


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.name)
def test_each_recorded_claim_is_rendered_from_its_registry_entry(path):
    """The committed records' claim and paper texts are the registry's: nothing retyped in a study."""
    doc = json.loads(path.read_text())
    keys = []
    for c in doc["claims"]:
        s = STATED.get(c["key"])
        assert s is not None, f"{path.name}: claim {c['claim'][:60]!r} has no registry key"
        assert s.notebook == doc["notebook"]
        assert c["paper"] == s.said, c["key"]
        assert _template(s.text).match(c["claim"]), c["key"]
        keys.append(c["key"])
    assert len(keys) == len(set(keys))


def test_citation_and_zenodo_quote_the_abstract_as_rendered():
    text = claims_readme.citation_abstract()
    assert all(f'"{p.words}"' in text for p in paper.PHRASES.values())
    cff = (ROOT / "CITATION.cff").read_text()
    assert claims_readme._citation(cff) == cff
    zen = (ROOT / ".zenodo.json").read_text()
    assert claims_readme._zenodo(zen) == zen


def test_rule_list_renders_each_timing_claim_from_the_registry(capsys):
    """`python -m artifact rule --list` prints each timing claim's text and paper field from the registry."""
    from types import SimpleNamespace

    from artifact.cli.rule import cmd_rule

    assert cmd_rule(SimpleNamespace(list=True)) == 0
    out = capsys.readouterr().out
    for key in TIMING:
        assert f"{key}: " in out and STATED[key].said in out, key
