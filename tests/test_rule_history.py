"""Every commit that touched a rule file (criteria.RULE_FILES: the verdict rules, run pooling, the thresholds,
the paper's numbers, each claim's question, metric and basis) after the commit the stored runs were recorded
at has its row in docs/verdicts.md ("Rule changes after the stored runs"); and the checker itself, on planted
git repositories: a rule change without a row is missing, with a row it passes, a rename and a merge's own
resolution count, a shallow clone without the stored commit fails in one line. The real-repository test fails,
never skips, without git or the
stored commit: CI runs on a full clone."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from artifact.experiments.criteria import RULE_FILES
from artifact.experiments.verdicts import rule_history
from artifact.experiments.verdicts.rule_history import RuleHistoryError

ROOT = Path(__file__).resolve().parent.parent
VERDICTS_MD = ROOT / "docs" / "verdicts.md"


def test_every_rule_change_after_the_stored_runs_has_a_row_in_docs_verdicts():
    stored = rule_history.stored_commits(ROOT)
    assert stored, (
        "no stored runs found (data/results/*/runs/run<k>/run.json): nothing to hold the table against"
    )
    md = VERDICTS_MD.read_text()
    for profile, commits in sorted(stored.items()):
        for commit in sorted(commits):
            try:
                gone = rule_history.missing(commit, ROOT, md)
            except RuleHistoryError as e:
                pytest.fail(f"profile {profile}: {e}")
            assert not gone, f"profile {profile}: {rule_history.missing_text(gone, commit)}"


def test_every_former_name_of_a_rule_file_since_the_stored_runs_is_a_rule_file():
    """A rule file renamed after the stored runs keeps its old name in RULE_FILES, so the commits before the
    rename stay listed."""
    for commit in sorted(set().union(*rule_history.stored_commits(ROOT).values())):
        try:
            former = rule_history.renamed_from(commit, ROOT)
        except RuleHistoryError as e:
            pytest.fail(str(e))
        assert former <= set(RULE_FILES), (
            f"rule files renamed after {commit} from {sorted(former - set(RULE_FILES))}: add those paths to "
            "RULE_FILES"
        )


# --- the checker on planted repositories
# ------------------------------------------------------------------------

TABLE = """# Verdicts

### Rule changes after the stored runs

| commit | what changed in the rule files | data already committed? | stored verdicts flipped |
|---|---|---|---|
{rows}
## Next
| `{after}` | a table of another section |
"""


def sh(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def commit_file(repo: Path, path: str, text: str, message: str) -> str:
    (repo / path).parent.mkdir(parents=True, exist_ok=True)
    (repo / path).write_text(text)
    sh(repo, "add", "-A")
    sh(repo, "commit", "-q", "-m", message)
    return sh(repo, "rev-parse", "--short=12", "HEAD")


@pytest.fixture
def repo(tmp_path):
    """A repository whose first commit holds the rule files and the stored run's data: the 'stored' commit."""
    sh(tmp_path, "init", "-q", "-b", "main")
    for path in (
        "artifact/experiments/verdicts.py",
        "artifact/experiments/replication.py",
        "artifact/experiments/criteria/thresholds.py",
        "README.md",
    ):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(f"# {path}\nLIMIT = 1\n")
    sh(tmp_path, "add", "-A")
    sh(tmp_path, "commit", "-q", "-m", "stored runs recorded here")
    return tmp_path


def stored(repo: Path) -> str:
    return sh(repo, "rev-list", "--max-parents=0", "HEAD")[:12]


def table(*rows: str, after: str = "0000000") -> str:
    return TABLE.format(rows="".join(f"| {r} | a change | yes | none |\n" for r in rows), after=after)


def test_a_rule_change_without_a_row_is_missing_and_with_a_row_passes(repo):
    s = stored(repo)
    commit_file(repo, "README.md", "not a rule\n", "docs only")
    c = commit_file(repo, "artifact/experiments/criteria/thresholds.py", "LIMIT = 2\n", "raise the limit")
    assert rule_history.changes_after(s, repo) == [(c[:7], "raise the limit")]
    assert rule_history.missing(s, repo, table()) == [(c[:7], "raise the limit")]
    assert rule_history.missing(s, repo, table(f"`{c[:7]}`")) == []
    assert rule_history.missing(s, repo, table(f"`{c}`")) == [], "a 12-digit hash names the commit too"
    assert rule_history.missing(s, repo, table(f"`1234567`, `{c[:8]}`")) == [], (
        "a cell may list several commits"
    )


def test_a_hash_outside_the_commit_column_or_the_section_is_not_a_row(repo):
    s = stored(repo)
    c = commit_file(repo, "artifact/experiments/replication.py", "POOL = 2\n", "pool otherwise")
    md = table("`1234567`", after=c[:7]).replace("| a change |", f"| reverses `{c[:7]}` |")
    assert rule_history.missing(s, repo, md) == [(c[:7], "pool otherwise")]
    with pytest.raises(RuleHistoryError, match="no heading"):
        rule_history.documented("# Verdicts\n| commit |\n|---|\n")


def test_a_new_file_in_criteria_and_a_rename_of_a_rule_file_count(repo):
    s = stored(repo)
    sh(repo, "mv", "artifact/experiments/verdicts.py", "artifact/experiments/rules.py")
    sh(repo, "commit", "-q", "-m", "rename the rules")
    renamed = sh(repo, "rev-parse", "--short=7", "HEAD")
    q = commit_file(repo, "artifact/experiments/criteria/questions.py", "Q = 1\n", "the questions")
    assert [h for h, _ in rule_history.missing(s, repo, table())] == [q[:7], renamed]
    assert rule_history.renamed_from(s, repo) == {"artifact/experiments/verdicts.py"}


def test_a_branch_merged_lists_its_commits_and_a_merge_only_for_its_own_resolution(repo):
    s = stored(repo)
    sh(repo, "checkout", "-q", "-b", "side")
    b = commit_file(repo, "artifact/experiments/replication.py", "POOL = 'side'\n", "side: pool")
    sh(repo, "checkout", "-q", "main")
    m = commit_file(repo, "artifact/experiments/replication.py", "POOL = 'main'\n", "main: pool")
    conflict = subprocess.run(
        [
            "git",
            "-C",
            str(repo),
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "merge",
            "-q",
            "--no-ff",
            "side",
        ],
        capture_output=True,
        text=True,
    )
    assert conflict.returncode != 0, "the planted merge must conflict"
    (repo / "artifact/experiments/replication.py").write_text("POOL = 'resolved anew'\n")
    sh(repo, "commit", "-q", "-a", "-m", "merge side")
    merge = sh(repo, "rev-parse", "--short=7", "HEAD")
    assert {h for h, _ in rule_history.changes_after(s, repo)} == {b[:7], m[:7], merge}
    sh(repo, "checkout", "-q", "-b", "plain", s)
    p = commit_file(repo, "artifact/experiments/criteria/thresholds.py", "LIMIT = 3\n", "plain: limit")
    sh(repo, "checkout", "-q", "main")
    sh(repo, "merge", "-q", "--no-ff", "-m", "merge plain", "plain")
    assert {h for h, _ in rule_history.changes_after(s, repo)} == {b[:7], m[:7], merge, p[:7]}, (
        "a clean merge adds no row of its own; the branch's commit is listed"
    )


def test_a_clone_without_the_stored_commit_fails_in_one_line(repo, tmp_path_factory):
    s = stored(repo)
    commit_file(repo, "artifact/experiments/replication.py", "POOL = 2\n", "pool otherwise")
    shallow = tmp_path_factory.mktemp("shallow") / "clone"
    subprocess.run(
        ["git", "clone", "-q", "--depth", "1", f"file://{repo}", str(shallow)],
        check=True,
        capture_output=True,
    )
    with pytest.raises(RuleHistoryError, match=f"commit {s} is not in .*shallow.*git fetch --unshallow"):
        rule_history.changes_after(s, shallow)
    with pytest.raises(RuleHistoryError, match="no such commit"):
        rule_history.changes_after("0123456789ab", repo)
    with pytest.raises(RuleHistoryError, match="rev-parse --git-dir"):
        rule_history.changes_after(s, tmp_path_factory.mktemp("not_a_checkout"))


def test_a_rule_change_reverted_on_a_merged_branch_is_listed(repo):
    """Git's default history simplification follows only the parent a merge is identical to, so a branch whose
    rule change was reverted before the merge would vanish from the log; --full-history keeps both of its
    commits."""
    s = stored(repo)
    sh(repo, "checkout", "-q", "-b", "side")
    a = commit_file(repo, "artifact/experiments/replication.py", "POOL = 2\n", "side: pool")
    r = commit_file(
        repo,
        "artifact/experiments/replication.py",
        "# artifact/experiments/replication.py\nLIMIT = 1\n",
        "side: back",
    )
    sh(repo, "checkout", "-q", "main")
    commit_file(repo, "README.md", "main moves on\n", "main: docs")
    sh(repo, "merge", "-q", "--no-ff", "-m", "merge side", "side")
    assert [h for h, _ in rule_history.changes_after(s, repo)] == [r[:7], a[:7]]
