"""The `slurm:` section of a profile: a mapping whose keys are layered one by one (the defaults, the profile's
`slurm:` mapping, --set slurm.KEY=VALUE), each value checked where it came from."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass

from artifact.errors import ProfileError
from artifact.experiments.profiles.checks import check_value, suggest

__all__ = ["SLURM_KEYS", "SlurmSettings", "merge_slurm"]


@dataclass(frozen=True)
class SlurmSettings:
    """The `slurm:` section of a profile: what each job of a --submit slurm array asks for.
    A profile (or --set slurm.KEY=VALUE) changes single keys; the others keep these defaults."""

    partition: str | None = None  # None: the cluster's default partition
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None  # a node feature, e.g. a GPU type
    time_minutes: int = 240  # wall-clock limit of one job (one shard, or one trace)
    gpus_per_task: int = 1  # 0 for a CPU profile
    cpus_per_task: int = 4
    mem_gb: float | None = None  # None: the partition's default
    array_parallelism: int | None = None  # at most this many array tasks at once (None: all)
    setup: tuple[str, ...] = ()  # shell lines each job runs first, e.g. "module load cuda/12.4"


SLURM_KEYS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(SlurmSettings))
_SLURM_TYPES = typing.get_type_hints(SlurmSettings)


def merge_slurm(current: dict | None, key: str, value, src: str) -> dict:
    """`slurm: {...}` (a mapping) or `slurm.KEY: value` (one key, from --set) laid over the keys so far,
    each value checked where it came from (so an error names the file or the override that set it)."""
    merged = dict(current or {})
    _, dot, sub = str(key).partition(".")
    if dot:
        updates = {sub: value}
    elif isinstance(value, dict):
        updates = value
    else:
        raise ProfileError(
            f"{src}: slurm must be a mapping of {', '.join(SLURM_KEYS)}, got {value!r} "
            f"({type(value).__name__})"
        )
    for k, v in updates.items():
        if k not in SLURM_KEYS:
            raise ProfileError(
                f"{src}: unknown key slurm.{k}{suggest(str(k), SLURM_KEYS)}; "
                f"slurm keys: {', '.join(SLURM_KEYS)}"
            )
        merged[k] = _check_slurm_key(k, v, src)
    return merged


_SLURM_LOWEST = {"time_minutes": 1, "gpus_per_task": 0, "cpus_per_task": 1, "array_parallelism": 1}


def _check_slurm_key(k: str, v, src: str):
    """One slurm value, typed and in range (submitit checks the assembled sbatch parameters again)."""
    if k == "setup":
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise ProfileError(f"{src}: slurm.setup must be a list of shell lines (strings), got {v!r}")
        return tuple(v)
    v = check_value(f"slurm.{k}", v, _SLURM_TYPES[k], src)
    if k in _SLURM_LOWEST and v is not None and v < _SLURM_LOWEST[k]:
        raise ProfileError(f"{src}: slurm.{k} must be >= {_SLURM_LOWEST[k]}, got {v}")
    if k == "mem_gb" and v is not None and not 0 < v < float("inf"):
        raise ProfileError(f"{src}: slurm.mem_gb must be a finite number > 0 or null, got {v}")
    if isinstance(v, str) and (not v.strip() or any(c.isspace() for c in v)):
        raise ProfileError(f"{src}: slurm.{k} must be a name without spaces or null, got {v!r}")
    return v
