"""Policy modules: the user's own files or modules that define policies, imported by name before any
policy is resolved (the profile key `policy_modules`, the CLI flag `--policy-module`; docs/policies.md).

A name is either a path to a .py file (it ends in `.py` or holds a path separator; relative to the working
directory) or a dotted module name importable from sys.path (e.g. `mypkg.policies`). Importing a module
runs its code: it is the user's own code, named by them; nothing that was not named is imported. A module
must register at least one policy (`@register`) or eviction policy (`@register_eviction`), so a misspelled
name that happens to import (a standard-library module, say) is refused instead of silently doing nothing.
Importing is idempotent: a file is loaded once per process (by its resolved path), a dotted name once by
Python's own module cache.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Iterable

from artifact.errors import SettingError
from artifact.offload.policy.eviction import EVICTIONS
from artifact.offload.policy.policies import POLICIES

EXPECTED = (
    "expected a dotted module name importable from sys.path (e.g. mypkg.policies) or a path to a .py "
    "file, whose code registers a policy (@register) or an eviction policy (@register_eviction)"
)


def is_path(name: str) -> bool:
    """Whether a policy module's name is a file path (else a dotted module name)."""
    return name.endswith(".py") or "/" in name or os.sep in name


def module_name_for(path: Path) -> str:
    """The sys.modules name a policy file is loaded under: its stem and a hash of its resolved path, so two
    files of one name do not collide and one file is one module."""
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:8]
    return f"policy_module_{path.stem}_{digest}"


def _import_file(path: Path) -> ModuleType:
    name = module_name_for(path)
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not a Python source file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _where(e: BaseException) -> str:
    """' at FILE:LINE' of the innermost frame of an exception raised by a module's code (else '')."""
    frames = [
        f
        for f in traceback.extract_tb(e.__traceback__)
        if not f.filename.startswith("<") and f.filename not in (__file__, importlib.__file__)
    ]
    return f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""


def load_policy_module(name: str, key: str = "--policy-module") -> ModuleType:
    """Import one policy module (a .py path or a dotted name); any failure is a SettingError naming `key`,
    the module and what is expected."""
    if not isinstance(name, str) or not name.strip():
        raise SettingError(f"{key}: a policy module is a non-empty string, got {name!r}; {EXPECTED}")
    name = name.strip()
    try:
        if is_path(name):
            path = Path(name).expanduser().resolve()
            if not path.is_file():
                raise SettingError(f"{key}: {name!r} is not a file ({path}); {EXPECTED}")
            module = _import_file(path)
        else:
            module = importlib.import_module(name)
    except SettingError:
        raise
    except Exception as e:  # the user's code: any error it raises is theirs to fix, in one line
        raise SettingError(
            f"{key}: {name!r} cannot be imported ({type(e).__name__}: {e}{_where(e)}); {EXPECTED}"
        ) from e
    defined = [n for n, c in (*POLICIES.items(), *EVICTIONS.items()) if c.__module__ == module.__name__]
    if not defined:
        raise SettingError(f"{key}: {name!r} was imported but registers no policy; {EXPECTED}")
    return module


def load_policy_modules(names: Iterable[str], key: str = "--policy-module") -> list[ModuleType]:
    """Import each named policy module, in order (see load_policy_module)."""
    return [load_policy_module(n, key) for n in names]
