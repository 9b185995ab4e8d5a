"""The benchmark grid: its cells, their order, and how shards split them.

The grid is a fixed, ordered list of cells (task, batch_size, cache_ratio, bandwidth_scale): tasks, then
batch sizes, then bandwidth scales, then C/W ratios, each in the profile's order. `--shard i/n`
(0 <= i < n) takes the cells whose grid index % n == i, so n GPUs or a job array run one grid; shard i of n
writes `<stem>.shard-I-of-N.csv` beside the grid's result file (`shard_file`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from artifact.errors import SettingError
from artifact.experiments.settings import Settings


class CellKey(NamedTuple):
    """One cell of a grid, the unit every interval is computed in (nothing pools cells)."""

    task: str
    batch_size: int
    cache_ratio: float
    bandwidth_scale: float


CELL_KEYS = CellKey._fields
PAIR_KEYS = CELL_KEYS + ("rep",)  # a pair: one repetition of a cell, one run per policy


@dataclass(frozen=True)
class Cell:
    task: str
    batch_size: int
    cache_ratio: float
    bandwidth_scale: float

    @property
    def key(self) -> CellKey:
        return CellKey(self.task, self.batch_size, self.cache_ratio, self.bandwidth_scale)

    def __str__(self) -> str:
        return f"{self.task} b={self.batch_size} C/W={self.cache_ratio:g} bw={self.bandwidth_scale:g}x"


def cell_key(row) -> CellKey:
    """The key of the cell a result row (a mapping with the CELL_KEYS) belongs to, typed as Cell.key."""
    return CellKey(
        str(row["task"]), int(row["batch_size"]), float(row["cache_ratio"]), float(row["bandwidth_scale"])
    )


def cell_keys(df) -> list[CellKey]:
    """cell_key of every row of a result DataFrame, in row order."""
    return [cell_key(r) for r in df[list(CELL_KEYS)].to_dict("records")]


def grid(P: Settings) -> list[Cell]:
    return [
        Cell(t, b, r, s)
        for t in P.tasks
        for b in P.batch_sizes
        for s in P.bandwidth_scales
        for r in P.cache_ratios
    ]


def parse_shard(text: str) -> tuple[int, int]:
    """'i/n' -> (i, n) with 0 <= i < n."""
    try:
        i, n = (int(x) for x in str(text).split("/"))
    except ValueError:
        raise SettingError(f"--shard must be i/n with integers, e.g. 0/4, got {text!r}") from None
    if n < 1 or not 0 <= i < n:
        raise SettingError(
            f"--shard i/n needs n >= 1 and 0 <= i < n (shards are numbered from 0), got {text!r}"
        )
    return i, n


def shard_cells(cells: list[Cell], shard: tuple[int, int]) -> list[Cell]:
    i, n = shard
    return [c for k, c in enumerate(cells) if k % n == i]


def shard_file(target: Path, i: int, n: int) -> Path:
    """Shard i of n's own file beside the grid's result file (for bench.csv: bench.shard-I-of-N.csv)."""
    return target.with_name(f"{target.stem}.shard-{i}-of-{n}.csv")
