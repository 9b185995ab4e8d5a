"""The rule history (verdicts/rule_history.py): every rule version up to records.RULES_VERSION has its row in
docs/verdicts.md ("Rule history"), every committed claim record was ruled at the current version, and the
checker finds a missing row on a planted document."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from artifact.experiments.verdicts import rule_history
from artifact.experiments.verdicts.records import RULES_VERSION
from artifact.experiments.verdicts.rule_history import RuleHistoryError

ROOT = Path(__file__).resolve().parent.parent
VERDICTS_MD = ROOT / "docs" / "verdicts.md"


def test_every_rule_version_has_its_row():
    assert not rule_history.missing(VERDICTS_MD, RULES_VERSION)


def test_the_committed_records_were_ruled_at_the_current_rules():
    """A rule change bumps RULES_VERSION: the stored records must then be ruled again (`python -m artifact
    stored-runs --rule-again`, which prints the flips for the row)."""
    for path in sorted((ROOT / "data" / "results").glob("*/[0-9][0-9]_*.claims.json")):
        doc = json.loads(path.read_text())
        if any(c.get("timing") for c in doc["claims"]):
            assert doc.get("rules_version") == RULES_VERSION, (
                f"{path.name}: ruled at {doc.get('rules_version')}"
            )


def test_the_checker_finds_a_missing_row(tmp_path):
    doc = tmp_path / "v.md"
    doc.write_text(
        "# V\n\n## Rule history\n\n| version | change | flips |\n|---|---|---|\n| v1 | a | none |\n"
    )
    assert rule_history.missing(doc, 1) == []
    assert rule_history.missing(doc, 2) == [2]
    doc.write_text("# V\n\nno table\n")
    with pytest.raises(RuleHistoryError, match="Rule history"):
        rule_history.versions(doc)
