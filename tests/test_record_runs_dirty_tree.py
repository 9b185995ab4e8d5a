"""scripts/record_runs.py records from committed code only (issue 60, item 6): an uncommitted change anywhere
under recording.CODE_PATHS (a prompt file in data/tasks/, a script, not only artifact/) would be measured
but recorded under the clean commit's label, so it is refused in one line, exit 2, before anything is
measured. recording.dirty_code_paths names the paths, on a throwaway git repository here."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

import artifact.experiments.recording as recording

ROOT = Path(__file__).resolve().parent.parent


def git(root: Path, *args: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "PATH": "/usr/bin:/bin",
    }
    out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def write(root: Path, path: str, text: str) -> None:
    f = root / path
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(text)


@pytest.fixture
def repo(tmp_path) -> Path:
    """A committed checkout: a prompt file, a script, the package, and a .gitignore'd cache folder."""
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q")
    write(root, "data/tasks/gsm8k.jsonl", '{"q": "1 + 1"}\n')
    write(root, "scripts/record_runs.py", "print('record')\n")
    write(root, "artifact/engine.py", "x = 1\n")
    write(root, ".gitignore", "scripts/__pycache__/\n*.pyc\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "code")
    return root


def test_a_clean_checkout_has_no_dirty_code_path(repo):
    write(repo, "README.md", "not code the runs measure\n")  # untracked, outside CODE_PATHS
    write(repo, "data/results/cpu/runs/run1/run.json", "{}\n")  # the runs themselves
    assert recording.dirty_code_paths(repo) == []
    recording.check_committed(repo)  # no error


def test_a_modified_prompt_file_is_named(repo):
    write(repo, "data/tasks/gsm8k.jsonl", '{"q": "2 + 2"}\n')
    assert recording.dirty_code_paths(repo) == ["data/tasks/gsm8k.jsonl"]


def test_a_staged_change_and_a_deletion_are_named(repo):
    write(repo, "artifact/engine.py", "x = 2\n")
    git(repo, "add", "artifact/engine.py")
    (repo / "scripts" / "record_runs.py").unlink()
    assert sorted(recording.dirty_code_paths(repo)) == ["artifact/engine.py", "scripts/record_runs.py"]


def test_an_untracked_script_counts_and_an_ignored_file_does_not(repo):
    write(repo, "scripts/__pycache__/record_runs.cpython-311.pyc", "ignored\n")
    write(repo, "artifact/engine.pyc", "ignored\n")
    assert recording.dirty_code_paths(repo) == []
    write(repo, "scripts/new_tool/helper.py", "print('new')\n")  # in an untracked folder: the file is named
    assert recording.dirty_code_paths(repo) == ["scripts/new_tool/helper.py"]


def test_a_renamed_file_is_named_by_its_new_path(repo):
    git(repo, "mv", "data/tasks/gsm8k.jsonl", "data/tasks/gsm8k_v2.jsonl")
    assert recording.dirty_code_paths(repo) == ["data/tasks/gsm8k_v2.jsonl"]


def test_a_folder_that_is_not_a_checkout_has_nothing_git_can_name(tmp_path):
    assert recording.dirty_code_paths(tmp_path) == []


def test_the_message_names_the_first_path_and_what_to_do(repo):
    write(repo, "data/tasks/gsm8k.jsonl", "changed\n")
    write(repo, "scripts/extra.py", "print()\n")
    with pytest.raises(recording.RunsError) as e:
        recording.check_committed(repo)
    msg = str(e.value)
    assert msg.startswith("data/tasks/gsm8k.jsonl (and 1 more): uncommitted change") and "\n" not in msg
    assert "commit or stash it first" in msg


@pytest.fixture
def record_runs():
    spec = importlib.util.spec_from_file_location("record_runs_dirty", ROOT / "scripts" / "record_runs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_record_runs_refuses_a_dirty_prompt_file_before_measuring(
    repo, record_runs, tmp_path, monkeypatch, capsys
):
    """The script's refusal path: rc 2, one line on stderr naming the path, nothing measured or stored."""
    write(repo, "data/tasks/gsm8k.jsonl", '{"q": "an uncommitted prompt"}\n')
    monkeypatch.setattr(recording, "repo_root", lambda: repo)  # the checkout the script checks
    monkeypatch.setenv("ARTIFACT_DATA", str(tmp_path / "data"))

    def measured(*args, **kwargs):
        raise AssertionError("measured from a dirty checkout")

    monkeypatch.setattr(record_runs, "measure", measured)
    assert record_runs.main(["--profile", "cpu", "--runs", "1"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("error: data/tasks/gsm8k.jsonl: uncommitted change under the code"), err
    assert "commit or stash it first" in err
    assert not (tmp_path / "data" / "results" / "cpu" / "runs").exists()
