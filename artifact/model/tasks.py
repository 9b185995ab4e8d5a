"""The five benchmark prompt sets (data/tasks/*.jsonl, sources and licences in data/tasks/SOURCES.md)."""

from __future__ import annotations

import hashlib
import json
import random
from functools import lru_cache
from pathlib import Path

from artifact.paths import data_dir

TASKS = ("gsm8k", "humaneval", "mbpp", "math500", "ifeval")


@lru_cache(maxsize=None)
def _rows(name: str, root: str) -> tuple[dict, ...]:
    path = Path(root) / f"{name}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: task file missing (expected one of {TASKS} in {root})")
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not JSON ({e})") from None
        if not isinstance(row.get("prompt"), str) or not isinstance(row.get("id"), str):
            raise ValueError(f"{path}:{n}: a row needs string 'id' and 'prompt'")
        rows.append(row)
    return tuple(rows)


def load_task(name: str) -> list[dict]:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose one of {TASKS}")
    return list(_rows(name, str(data_dir() / "tasks")))


def select(name: str, n: int, seed: int = 0) -> list[dict]:
    """n rows of a task, the same for the same (name, n, seed): a seeded sample, in file order."""
    rows = load_task(name)
    if not 1 <= n <= len(rows):
        raise ValueError(f"task {name!r} has {len(rows)} prompts; asked for {n}")
    picked = sorted(random.Random(f"{name}:{seed}").sample(range(len(rows)), n))
    return [rows[i] for i in picked]


def encode(tokenizer, text: str, max_prompt_tokens: int | None = None) -> list[int]:
    """A user turn in the model's chat template, ready for the assistant's answer."""
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=True, add_generation_prompt=True
    )
    if hasattr(ids, "input_ids"):  # newer transformers return a BatchEncoding
        ids = ids["input_ids"]
    ids = list(ids)
    if max_prompt_tokens and len(ids) > max_prompt_tokens:
        ids = ids[-max_prompt_tokens:]  # keep the end: the question and the assistant turn
    return ids


def prompts(tokenizer, name: str, n: int, seed: int = 0, max_prompt_tokens: int | None = None):
    """(ids, token lists) for n prompts of a task."""
    rows = select(name, n, seed)
    return [r["id"] for r in rows], [encode(tokenizer, r["prompt"], max_prompt_tokens) for r in rows]


def tokens_sha(tokens: list[list[int]]) -> str:
    """A fingerprint of token lists (generated outputs, or a command-line prompt): equal hashes, equal
    tokens."""
    return hashlib.sha1(json.dumps(tokens).encode()).hexdigest()[:12]
