"""The rule files' history after the stored runs: which commits changed a rule file (criteria.RULE_FILES)
after the commit the stored runs were recorded at, and which of them docs/verdicts.md lists in its table "Rule
changes after the stored runs". tests/test_rule_history.py holds the two together: a rule changed after its
data existed is said in that table, with the stored verdicts it flipped.

A commit is listed by `changes_after` when its diff touches a rule file: every non-merge commit in
`git log <stored>..HEAD` that touches one (with --full-history, so no side of a merge is simplified away), and
a merge commit only where its result differs in a rule file from every parent (a conflict resolved by new
code); a merge that takes one side's rule files unchanged adds nothing the side's own commits do not list."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from artifact.errors import UserError
from artifact.experiments.criteria import RULE_FILES

SECTION = "Rule changes after the stored runs"
HASH = re.compile(r"`([0-9a-f]{7,40})`")


class RuleHistoryError(UserError):
    """No git, no checkout, or a checkout without the stored runs' commit; or a document without the table."""


def git(repo_root: Path, *args: str) -> str:
    """A git command's stdout in `repo_root`; RuleHistoryError naming the command when git is missing or
    fails."""
    cmd = ["git", "-C", str(repo_root), *args]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except OSError as e:
        raise RuleHistoryError(f"cannot run git ({e}): the rule files' history needs git on PATH") from e
    if out.returncode != 0:
        raise RuleHistoryError(f"`{' '.join(cmd[3:])}` in {repo_root} failed: {out.stderr.strip()}")
    return out.stdout


def require_commit(commit: str, repo_root: Path) -> None:
    """RuleHistoryError unless `commit` is a commit of the checkout at `repo_root` (a shallow clone may lack
    it)."""
    git(repo_root, "rev-parse", "--git-dir")
    try:
        git(repo_root, "cat-file", "-e", f"{commit}^{{commit}}")
    except RuleHistoryError as e:
        shallow = git(repo_root, "rev-parse", "--is-shallow-repository").strip() == "true"
        why = (
            "the checkout is shallow: run `git fetch --unshallow`"
            if shallow
            else "no such commit in this checkout"
        )
        raise RuleHistoryError(
            f"the stored runs' commit {commit} is not in {repo_root} ({why}); the rule "
            "files' "
            f"history after it cannot be read without it"
        ) from e


def changes_after(commit: str, repo_root: Path) -> list[tuple[str, str]]:
    """(short hash, subject) of each commit after `commit` up to HEAD that touched a rule file, newest
    first."""
    repo_root = Path(repo_root)
    require_commit(commit, repo_root)
    log = git(
        repo_root, "log", "--full-history", "--format=%h%x09%p%x09%s", f"{commit}..HEAD", "--", *RULE_FILES
    )
    found = []
    for line in log.splitlines():
        short, parents, subject = line.split("\t", 2)
        if len(parents.split()) > 1 and not merge_changes_rules(short, repo_root):
            continue
        found.append((short, subject))
    return found


def merge_changes_rules(merge: str, repo_root: Path) -> bool:
    """Whether a merge's result differs in a rule file from every one of its parents."""
    return bool(
        git(repo_root, "diff-tree", "--cc", "--name-only", "--no-commit-id", merge, "--", *RULE_FILES).strip()
    )


def renamed_from(commit: str, repo_root: Path) -> set[str]:
    """The former paths of today's rule files, from renames after `commit` (git log --follow, one file at a
    time)."""
    repo_root = Path(repo_root)
    require_commit(commit, repo_root)
    former = set()
    for path in git(repo_root, "ls-files", "--", *RULE_FILES).splitlines():
        log = git(repo_root, "log", "--follow", "--name-status", "--format=", f"{commit}..HEAD", "--", path)
        former |= {f.split("\t")[1] for f in log.splitlines() if f.startswith("R")}
    return former


def documented(md_text: str) -> set[str]:
    """Every hash (7 to 40 hex digits, in backticks) in the commit column of the table under the heading
    "Rule changes after the stored runs", up to the next heading."""
    lines = md_text.splitlines()
    start = next(
        (i for i, s in enumerate(lines) if s.startswith("#") and s.lstrip("#").strip() == SECTION), None
    )
    if start is None:
        raise RuleHistoryError(
            f"no heading {SECTION!r} in the document: the table of rule changes is missing"
        )
    rows = []
    for s in lines[start + 1 :]:
        if s.startswith("#"):
            break
        if s.lstrip().startswith("|"):
            rows.append([c.strip() for c in s.strip().strip("|").split("|")])
    if not rows or "commit" not in rows[0]:
        raise RuleHistoryError(f"the table under {SECTION!r} has no header row with a 'commit' column")
    col = rows[0].index("commit")
    return {h for r in rows[1:] if len(r) > col for h in HASH.findall(r[col])}


def is_listed(short: str, hashes: set[str]) -> bool:
    """Whether one of `hashes` names the commit `short`: one is a prefix of the other (7 vs 12 digits)."""
    return any(h.startswith(short) or short.startswith(h) for h in hashes)


def missing(commit: str, repo_root: Path, md_text: str) -> list[tuple[str, str]]:
    """The commits `changes_after(commit)` finds that the table does not list."""
    hashes = documented(md_text)
    return [(h, s) for h, s in changes_after(commit, repo_root) if not is_listed(h, hashes)]


def stored_commits(repo_root: Path) -> dict[str, set[str]]:
    """Each profile with stored runs (data/results/<profile>/runs/run<k>/run.json) -> the commits they were
    recorded at."""
    found: dict[str, set[str]] = {}
    for p in sorted(Path(repo_root).glob("data/results/*/runs/run*/run.json")):
        commit = json.loads(p.read_text()).get("commit")
        if not isinstance(commit, str) or not re.fullmatch(r"[0-9a-f]{7,40}", commit):
            raise RuleHistoryError(
                f"{p}: 'commit' is {commit!r}, expected a commit hash (7 to 40 hex digits)"
            )
        found.setdefault(p.parent.parent.parent.name, set()).add(commit)
    return found


def missing_text(rows: list[tuple[str, str]], commit: str) -> str:
    """What a failure says: the commits missing from the table, and the row each needs."""
    listed = "\n".join(f"  {h} {s[:120]}" for h, s in rows)
    return (
        f"{len(rows)} commit(s) after the stored runs' commit {commit} touched a rule file "
        f"(criteria.RULE_FILES) but have no row in docs/verdicts.md under {SECTION!r}:\n{listed}\n"
        "add a row for each: | `<commit>` | what changed in the rule files | data already committed? "
        "(yes: the "
        "stored runs existed) | every stored verdict it flipped (recomputed at the commit and its "
        "parent), or "
        "none |"
    )
