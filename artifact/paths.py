"""Where things live: the repository root (for data/, figures/, results/) and the ignored build cache."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def repo_root() -> Path:
    """The checkout holding this package (editable install), else the working directory."""
    root = PACKAGE.parent
    return root if (root / "pyproject.toml").is_file() else Path.cwd()


def cache_dir() -> Path:
    """Generated checkpoints live here, never in git: $ARTIFACT_CACHE or <repo>/.cache."""
    return Path(os.environ.get("ARTIFACT_CACHE", repo_root() / ".cache"))


def data_dir() -> Path:
    return Path(os.environ.get("ARTIFACT_DATA", repo_root() / "data"))


def atomic_write_bytes(path: Path | str, data: bytes) -> Path:
    """Write to a temporary file beside `path`, then rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644 & ~_umask())       # mkstemp makes 0600; results are for everyone to read
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: Path | str, text: str) -> Path:
    return atomic_write_bytes(path, text.encode())


def refuse_overwrite(path: Path | str, force: bool) -> None:
    if Path(path).exists() and not force:
        raise FileExistsError(f"{path} exists; pass --force (force=True) to replace it")
