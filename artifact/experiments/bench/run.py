"""Paired throughput benchmark: the profile's policies side by side on identical prompts, cell by cell.

The grid (bench/grid.py) is a fixed, ordered list of cells (task, batch_size, cache_ratio, bandwidth_scale).
Per cell:
  1. W, the mean per-step expert working set, from one traced run of the cell's prompts (once per
     task and batch size; resident, or offloaded at trace_capacity). It doubles as the warm-up, and
     its trace feeds the oracle policy. C = capacity_for(cache_ratio, W, E).
  2. `warmup` untimed runs of every policy.
  3. R repetitions; repetition r runs every policy once, in the order bench/order.py's slot_order gives
     index rotation * R + r (the profile's `rotation`): a Williams design, so over a cycle of repetitions
     every policy runs in every slot (first, second, ...) equally often, and every ordered pair of
     policies runs back to back equally often; `rotation` continues the cycle across stored runs. One CSV
     row per timed run; its `order` is the run's slot (0 = first). With the A/A pair (Settings.aa_pair)
     demand runs twice per repetition, as two arms of the design (its B arm's slot label `demand#B`,
     bench/order.py), both demand's code: rows `policy` demand, `arm` A and B; every other row arm A.
After each cell its rows are appended to the CSV in one write and fsynced, under an exclusive lock on
the sidecar `<out>.lock`, so the file only ever holds whole cells and a rerun resumes by skipping the
cells it already has (bench/results.py: concurrent writers and interrupted appends).

Sharding: `--shard i/n` (0 <= i < n) takes the cells whose grid index % n == i, so n GPUs or a job
array (Slurm: --array=0-(n-1), --shard $SLURM_ARRAY_TASK_ID/n) run one grid; each shard writes its
own file by default and `python -m artifact merge` joins them. Shards may also share one --out.
`--submit slurm|local --shards n` (experiments/submit/) submits the n shards as jobs through submitit, waits
and merges.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from tqdm.auto import tqdm

from artifact.experiments.bench.grid import Cell, grid, shard_cells
from artifact.experiments.bench.locks import CellClaims, locked
from artifact.experiments.bench.model_runner import ModelRunner
from artifact.experiments.bench.order import slot_order, slot_run, slots
from artifact.experiments.bench.results import (
    append_rows,
    bench_fingerprint,
    check_same_model,
    default_out,
    finished_cells,
    has_aa_pair,
    load_for_append,
    read_rows,
)
from artifact.experiments.settings import Settings
from artifact.offload.replay.sim import capacity_for


def run_claimed(out: Path, todo: list[Cell], run_cell, log=print) -> int:
    """Run each cell of `todo` under its claim on `out` (CellClaims): first the cells nobody else is running,
    then, waiting for each, those another process held. Returns how many cells `run_cell` wrote here."""
    ran = 0
    with CellClaims(out) as claims:
        later = []
        for cell in todo:  # cells nobody else is running, first
            if not claims.take(cell, wait=False):
                later.append(cell)
                continue
            try:
                ran += run_cell(cell)
            finally:
                claims.release(cell)
        if later:
            log(
                f"note: {len(later)} cells (e.g. {later[0]}) "
                f"were being run by another process writing {out}; waiting for each, "
                "then running it here only if that process did not finish it"
            )
        for cell in later:
            claims.take(cell, wait=True)  # returns when the other process finished it or died
            try:
                ran += run_cell(cell)
            finally:
                claims.release(cell)
    return ran


def _cells_to_run(P: Settings, out: Path, cells: list[Cell], shard: tuple[int, int], skip, log):
    """The rows `out` holds and this shard's cells still to run (neither finished there nor in `skip`),
    said."""
    mine = shard_cells(cells, shard)
    with locked(out, log=log):
        old = load_for_append(out, P, log)
    done = finished_cells(old)
    todo = [c for c in mine if c.key not in done and c.key not in skip]
    elsewhere = sum(c.key in skip and c.key not in done for c in mine)
    log(
        f"bench {P.name}: shard {shard[0]}/{shard[1]} has {len(mine)} of {len(cells)} cells; "
        f"{len(mine) - len(todo) - elsewhere} done in {out}, "
        + (f"{elsewhere} done elsewhere, " if elsewhere else "")
        + f"{len(todo)} to run"
    )
    extra = len(done - {c.key for c in cells})
    if extra:
        log(f"note: {out} also holds {extra} cells outside this profile's grid; they are kept")
    return old, todo


def run_bench(
    P: Settings,
    out: Path | str | None = None,
    shard: tuple[int, int] = (0, 1),
    runner=None,
    loaded=None,
    progress: bool = True,
    log=print,
    skip=frozenset(),
    on_cell=lambda cell: None,
):
    """Run (or resume) this shard of the profile's grid into `out`; returns all rows of `out`. The
    coordinator: which cells are this shard's and still to run, the cell claims and the file's lock around
    each cell; the measurement itself is measure_cell's.
    Safe to run concurrently with other shards or reruns on the same `out` (see "Result files").
    `skip`: keys of cells that are complete elsewhere (a submission's merged target file), not run here.
    `on_cell(cell)`: called after each cell whose rows this process wrote (the file's lock released)."""
    out = Path(out) if out else default_out(P, shard)
    cells = grid(P)
    old, todo = _cells_to_run(P, out, cells, shard, skip, log)
    if not todo:
        return old
    runner = runner or ModelRunner(P, loaded)
    meta = dict(runner.meta, profile=P.name, fingerprint=bench_fingerprint(P), grid_cells=len(cells))
    check_same_model(old, meta, out)
    policies, R, aa = list(P.policies), P.repetitions, has_aa_pair(P)
    per_cell = len(policies) * P.warmup + len(slots(policies, aa)) * R  # runs of one cell
    t0 = time.perf_counter()
    bar = tqdm(
        total=len(todo) * per_cell,
        unit="run",
        desc=f"bench {P.name}",
        disable=not progress,
        file=sys.stderr,
    )

    def run_cell(cell: Cell) -> bool:
        """Measure one cell and append its rows; False when another process had finished it."""
        with locked(out, log=log):
            if cell.key in finished_cells(load_for_append(out, P, log)):
                log(f"note: {cell} was finished meanwhile by another process writing {out}; skipped")
                bar.update(per_cell)
                return False
        bar.set_postfix_str(str(cell))
        new = measure_cell(
            runner, cell, policies, R, P.warmup, meta, on_run=bar.update, rotation=P.rotation, aa_pair=aa
        )
        with locked(out, log=log):  # re-read: another process may have appended meanwhile
            now = load_for_append(out, P, log)
            check_same_model(now, meta, out)
            if cell.key in finished_cells(now):
                log(
                    f"note: another process writing {out} finished {cell} first; this run's rows are dropped "
                    "so that no run is in the file twice"
                )
                return False
            append_rows(out, new)  # whole cells only: the resume invariant
        on_cell(cell)
        return True

    try:
        ran = run_claimed(out, todo, run_cell, log)
    finally:
        bar.close()
    minutes = (time.perf_counter() - t0) / 60
    note = ""
    if P.budget_minutes is not None and ran == len(cells):
        note = f"; budget {P.budget_minutes:g} min: {'within' if minutes <= P.budget_minutes else 'OVER'}"
    rows = read_rows(out)
    log(
        f"bench {P.name}: ran {ran} cells ({ran * len(slots(policies, aa)) * R} timed runs) "
        f"in {minutes:.2f} min{note}; {len(rows)} rows in {out}"
    )
    return rows


def measure_cell(
    runner,
    cell: Cell,
    policies: list[str],
    repetitions: int,
    warmup: int,
    meta: dict,
    on_run=lambda: None,
    rotation: int = 0,
    aa_pair: bool = False,
) -> list[dict]:
    """One cell's rows, measured: W from the runner's traced run, C from the cell's C/W, `warmup` untimed runs
    of every policy in the listed order, then `repetitions` timed ones, repetition r in the order
    slot_order(slots(policies, aa_pair), rotation * repetitions + r): with `aa_pair` and demand listed,
    demand's B arm is one more slot, run as demand (its row: `policy` demand, `arm` B). A row's `order` is its
    run's slot. No file, no lock: run_bench decides whether a cell runs and where its rows go. `on_run` is
    called after every run (a progress bar)."""
    W = runner.working_set(cell.task, cell.batch_size)
    C = capacity_for(cell.cache_ratio, W, runner.num_experts)
    for _ in range(warmup):
        for pol in policies:
            runner.measure(cell, pol, C)
            on_run()
    rows = []
    for r in range(repetitions):
        for pos, slot in enumerate(slot_order(slots(policies, aa_pair), rotation * repetitions + r)):
            pol, arm = slot_run(slot)  # the B arm runs its policy's code; only the policy reaches the row
            s = runner.measure(cell, pol, C)
            rows.append(
                {
                    **meta,
                    "task": cell.task,
                    "batch_size": cell.batch_size,
                    "cache_ratio": cell.cache_ratio,
                    "bandwidth_scale": cell.bandwidth_scale,
                    "policy": pol,
                    "rep": r,
                    "order": pos,
                    "working_set": W,
                    "cache_experts": C,
                    **s,
                    "arm": arm,
                }
            )
            on_run()
    return rows
