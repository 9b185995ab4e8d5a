"""The rule history: every change to a rule bumps records.RULES_VERSION and adds a row to docs/verdicts.md's
table "Rule history" (its version, what changed, the stored verdicts it flipped); a commit that changes no
rule (formatting, imports, moves) bumps nothing and gets no row. Here: every rule version up to the current
one has its row, every committed claim record was ruled at the current version (`python -m artifact
stored-runs --rule-again` re-rules the records and prints the flips for the row), and the checker finds a
missing row on a planted document."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from artifact.experiments.verdicts.records import RULES_VERSION

ROOT = Path(__file__).resolve().parent.parent
VERDICTS_MD = ROOT / "docs" / "verdicts.md"
SECTION = "Rule history"
ROW = re.compile(r"^\|\s*v(\d+)\s*\|(.*)\|\s*$")


def versions(doc: Path) -> dict[int, str]:
    """{version: its row's text} from the table under the heading SECTION in `doc`."""
    m = re.search(rf"^#+ {SECTION}\s*$(.*?)(?=^#+ |\Z)", Path(doc).read_text(), re.S | re.M)
    assert m, f"{doc}: no section '{SECTION}' (expected a table of rule versions)"
    rows = (ROW.match(line.strip()) for line in m.group(1).splitlines())
    return {int(r.group(1)): r.group(2).strip() for r in rows if r}


def missing(doc: Path, current: int) -> list[int]:
    """The versions 1..current without a row."""
    have = versions(doc)
    return [v for v in range(1, current + 1) if v not in have]


def test_every_rule_version_has_its_row():
    assert not missing(VERDICTS_MD, RULES_VERSION)


def test_the_committed_records_were_ruled_at_the_current_rules():
    """A rule change bumps RULES_VERSION: the stored records must then be ruled again."""
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
    assert missing(doc, 1) == []
    assert missing(doc, 2) == [2]
    doc.write_text("# V\n\nno table\n")
    with pytest.raises(AssertionError, match="Rule history"):
        versions(doc)
