"""The rule history: every change to a rule bumps records.RULES_VERSION and adds a row to docs/verdicts.md's
table "Rule history" (its version, what changed, the stored verdicts it flipped). A commit that changes no
rule (formatting, imports, moves) bumps nothing and gets no row; tests/test_rule_history.py holds them
together: the table has a row for every version up to the current one, and every committed claim record was
ruled at the current version (`python -m artifact stored-runs --rule-again` re-rules the records and prints
the flips for the row)."""

from __future__ import annotations

import re
from pathlib import Path

from artifact.errors import UserError

SECTION = "Rule history"
ROW = re.compile(r"^\|\s*v(\d+)\s*\|(.*)\|\s*$")


class RuleHistoryError(UserError):
    """A document without the table, or a table without a version's row."""


def versions(doc: Path) -> dict[int, str]:
    """{version: its row's text} from the table under the heading SECTION in `doc`."""
    text = Path(doc).read_text()
    m = re.search(rf"^#+ {SECTION}\s*$(.*?)(?=^#+ |\Z)", text, re.S | re.M)
    if not m:
        raise RuleHistoryError(f"{doc}: no section '{SECTION}' (expected a table of rule versions)")
    out = {}
    for line in m.group(1).splitlines():
        row = ROW.match(line.strip())
        if row:
            out[int(row.group(1))] = row.group(2).strip()
    return out


def missing(doc: Path, current: int) -> list[int]:
    """The versions 1..current without a row."""
    have = versions(doc)
    return [v for v in range(1, current + 1) if v not in have]
