"""Where things live: the repository root (for data/, figures/, results/) and the ignored build cache."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from artifact.errors import ResultFileError

PACKAGE = Path(__file__).resolve().parent


def is_checkout(d: Path) -> bool:
    """A checkout of this project: its pyproject.toml beside the artifact/ package and notebooks/."""
    return (
        (d / "pyproject.toml").is_file()
        and (d / "artifact" / "__init__.py").is_file()
        and (d / "notebooks").is_dir()
    )


def repo_root() -> Path:
    """The checkout a command or notebook runs in: the nearest checkout of this project at or above the
    working directory (a notebook's kernel starts in notebooks/), so outputs land in the checkout it was
    opened from even when another clone's editable install is the one imported; else the checkout holding
    this package (editable install), else the working directory."""
    cwd = Path.cwd()
    for d in (cwd, *cwd.parents):
        if is_checkout(d):
            return d
    root = PACKAGE.parent
    return root if (root / "pyproject.toml").is_file() else cwd


def cache_dir() -> Path:
    """Generated checkpoints live here, never in git: $ARTIFACT_CACHE or <repo>/.cache."""
    return Path(os.environ.get("ARTIFACT_CACHE", repo_root() / ".cache"))


def data_dir() -> Path:
    return Path(os.environ.get("ARTIFACT_DATA", repo_root() / "data"))


def atomic_write_bytes(path: Path | str, data: bytes) -> Path:
    """Write to a temporary file beside `path`, fsync it, rename it over `path`, then fsync the directory:
    readers never see half a file, and after a power loss `path` holds the old bytes or the new ones."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise _named(e, path) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # the data reaches the disk before the rename can
        os.chmod(tmp, 0o644 & ~_umask())  # mkstemp makes 0600; results are for everyone to read
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise _named(e, path) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


# Write failures of the storage, not of the program: a full disk, a quota, a read-only file system.
DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG)


def _named(e: OSError, path: Path) -> OSError:
    """The error of writing `path`, naming `path` (not the temporary file beside it), errno kept."""
    out = OSError(e.errno, e.strerror or str(e), str(path))
    return out


def fsync_dir(directory: Path | str) -> None:
    """Make a rename or a new file in `directory` durable. A no-op where directories cannot be opened
    or fsynced (Windows, some network file systems): the rename itself is still atomic there."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: Path | str, text: str) -> Path:
    return atomic_write_bytes(path, text.encode())


def refuse_overwrite(path: Path | str, force: bool) -> None:
    if Path(path).exists() and not force:
        raise FileExistsError(f"{path} exists; pass --force (force=True) to replace it")


def check_writable(path: Path | None, flag: str, force: bool = False, exists_ok: bool = False) -> None:
    """Before any work: `path` can be written the way atomic_write_* writes it (a temporary file beside it,
    then a rename). The probe creates and removes such a file in the nearest existing directory (so nothing
    is left when the directories are still to be made), so an unwritable destination fails now, not after a
    finished run. An existing file is refused unless `force` (or `exists_ok`: a resumable result file)."""
    if path is None:
        return
    path = Path(path)
    try:
        if path.is_dir():
            raise IsADirectoryError(f"{flag} {path} is a directory; give a file name")
        if path.exists() and not (force or exists_ok):
            raise FileExistsError(f"{path} exists; pass --force to replace it")
        where = path.parent
        while not where.exists():
            where = where.parent
        if not where.is_dir():
            raise NotADirectoryError(f"{flag} {path}: {where} is a file, not a directory")
        fd, probe = tempfile.mkstemp(dir=where, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except (FileExistsError, IsADirectoryError, NotADirectoryError):
        raise  # ours above, each naming the path and the fix
    except (OSError, ValueError, OverflowError) as e:  # EACCES, EROFS, ENAMETOOLONG, a NUL byte, ...
        raise ResultFileError(
            f"{flag} {path}: cannot write there ({getattr(e, 'strerror', None) or e}); choose a writable path"
        ) from None
