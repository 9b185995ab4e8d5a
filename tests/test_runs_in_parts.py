"""A set of stored runs recorded in parts, each part committed: the runs of every part record one commit (the
newest that changed the code the runs measure: recording.runs_commit), so `next_run` accepts part two after
part one's commit (and the claims re-ruled on it), and refuses once the code has changed."""

from __future__ import annotations

import subprocess

import pytest

import artifact.experiments.recording as recording


def git(root, *args) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    out = subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, env={**env, "PATH": "/usr/bin:/bin"}
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.fixture
def repo(tmp_path, monkeypatch):
    git(tmp_path, "init", "-q")
    (tmp_path / "artifact").mkdir()
    (tmp_path / "artifact" / "engine.py").write_text("x = 1\n")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "code")
    monkeypatch.setattr(recording, "repo_root", lambda: tmp_path)
    return tmp_path


def head(root) -> str:
    return git(root, "rev-parse", "--short=12", "HEAD")


def commit_file(root, path: str, text: str, message: str) -> None:
    f = root / path
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(text)
    git(root, "add", "-A")
    git(root, "commit", "-qm", message)


def test_a_commit_that_only_adds_stored_runs_keeps_the_runs_commit(repo):
    code = head(repo)
    commit_file(repo, "data/results/cpu/runs/run1/run.json", "{}\n", "part one")
    assert head(repo) != code and recording.runs_commit(head(repo)) == code
    commit_file(repo, "data/results/cpu/runs/run2/run.json", "{}\n", "part two")
    assert recording.runs_commit(head(repo)) == code


def test_a_code_change_is_a_new_commit_for_the_runs_and_records_beside_them_are_not(repo):
    commit_file(repo, "data/results/cpu/runs/run1/run.json", "{}\n", "part one")
    commit_file(repo, "artifact/engine.py", "x = 2\n", "an engine change")
    code = head(repo)
    assert recording.runs_commit(code) == code
    commit_file(repo, "data/results/cpu/claims.json", "{}\n", "the claims re-ruled on part one")
    commit_file(repo, "README.md", "the table\n", "the README's table")
    assert recording.runs_commit(head(repo)) == code
    for path in ("scripts/record_runs.py", "pyproject.toml", "data/tasks/gsm8k.jsonl"):
        commit_file(repo, path, "changed\n", f"a change to {path}")
        assert recording.runs_commit(head(repo)) == head(repo)


def test_a_dirty_checkout_stays_dirty(repo):
    assert recording.runs_commit(head(repo) + "-dirty") == head(repo) + "-dirty"
