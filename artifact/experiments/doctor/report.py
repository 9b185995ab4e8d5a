"""The doctor's report (`python -m artifact doctor`): its figures (Cell, HostCell, Report) and its text, whose
first line is what a verdict costs (Report.headline) and whose second says which cells the verdict rules would
call host-bound (Report.host_line)."""

from __future__ import annotations

from dataclasses import dataclass, field

from artifact.experiments.criteria import thresholds
from artifact.paths import data_dir

GB = 1e9
CONTEXT_BYTES = 1 << 30  # CUDA context + allocator slack: a stated figure, not measured here


@dataclass
class Cell:
    batch_size: int
    cache_ratio: float
    working_set: float
    measured_w: bool
    capacity: int
    slots: int  # bytes
    kv: int
    activations: int
    total: int

    def fits(self, device_bytes: int | None) -> bool:
        return device_bytes is None or self.total <= device_bytes


@dataclass
class HostCell:
    """A cell's predicted host share of wall time per forward (the largest over its policies) per forward
    mode, a range (host.cell_share), and the host ms per forward, in launches and copies, of its highest
    policy."""

    batch_size: int
    cache_ratio: float
    share: dict  # {forward mode: (low, high)}
    split: dict  # {forward mode: (launch ms, copy ms)}

    def over(self, mode: str) -> bool:
        """Host-bound under `mode` at the range's low end (the rules would call it so)."""
        return self.share[mode][0] > thresholds.HOST_SHARE_LIMIT

    def may_be(self, mode: str) -> bool:
        """Host-bound at the range's high end only."""
        return not self.over(mode) and self.share[mode][1] > thresholds.HOST_SHARE_LIMIT


@dataclass
class Report:
    profile: str
    model: str
    dtype: str
    device: str
    device_bytes: int | None
    device_source: str
    weights: int  # non-expert bytes on the device
    expert_store: int  # host bytes of every routed expert
    checkpoint_bytes: int  # tensor bytes in the safetensors headers
    host_available: int | None
    memlock: str
    disk_free: int
    disk_need: int
    cells: list[Cell]
    grid_cells: int
    runs: int
    forwards: int
    hours: tuple[float, float]  # one run: low, high (equal on a CPU device)
    time_basis: str  # how `hours` was made
    extrapolated: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    verdict_runs: int = thresholds.MIN_RUNS  # the runs a verdict pools (--runs)
    gpu: bool = False
    budget_hours: float | None = None  # verdict_runs x the profile's budget_minutes
    forward: str = "eager"  # the profile's forward mode
    host: list[HostCell] = field(default_factory=list)
    host_basis: list[str] = field(default_factory=list)
    power: list[str] = field(default_factory=list)
    whole_run_minutes: float | None = None  # a whole stored run, measured (run.json: every timing notebook)

    @property
    def verdict_hours(self) -> tuple[float, float]:
        """What the verdict's runs take: verdict_runs x one run's (low, high)."""
        return self.verdict_runs * self.hours[0], self.verdict_runs * self.hours[1]

    def headline(self) -> str:
        """The first line: what a verdict costs, verdict_runs runs of notebook 04's grid."""
        n, (lo, hi), total = self.verdict_runs, self.hours, self.verdict_hours
        unit = "GPU-hours" if self.gpu else "h on this CPU"
        line = f"a verdict: {n} runs x ({hours(lo, hi)}) = {hours(*total).removesuffix(' h')} {unit}"
        line += " (notebook 04's bench grid, each run with its traced run"
        if n < thresholds.MIN_RUNS:
            line += f"; {n} < thresholds.MIN_RUNS = {thresholds.MIN_RUNS} runs: no stored verdict"
        if self.whole_run_minutes is not None:
            m = self.whole_run_minutes
            line += (
                f"; a whole stored run of every timing notebook took {m:.1f} min: {n} runs, {n * m:.0f} min"
            )
        if self.budget_hours is not None:
            within = "within" if total[1] <= self.budget_hours else "OVER"
            line += f"; budget {n} x {self.budget_hours * 60 / n:g} min = {self.budget_hours:.2f} h: {within}"
        return line + ")"

    def host_line(self) -> str:
        """Which cells the rules would call host-bound under the profile's forward, and what to do."""
        if not self.gpu:
            return "host-bound: not ruled on a CPU device (the CPU computes on the host)"
        if not self.host:
            return "host-bound: not predicted"
        line = f"host-bound (a GPU cell over {thresholds.HOST_SHARE_LIMIT:.0%} host time per forward is "
        line += f"inconclusive): {mode_summary(self.host, self.forward)}, with the profile's forward "
        line += self.forward
        if "segmented" in self.host[0].share and self.forward != "segmented":
            line += (
                "; run with the segmented forward (forward: segmented, or --set forward=segmented): "
                + mode_summary(self.host, "segmented")
            )
            over = [c for c in self.host if c.over("segmented") or c.may_be("segmented")]
            if over:
                top = max(over, key=lambda c: c.share["segmented"][1])
                launch, copy = top.split["segmented"]
                line += (
                    f" (C/W {top.cache_ratio:g}: host {launch + copy:.0f} ms per forward, {copy:.0f} ms "
                    "of it the link's copies)"
                )
        return line

    def table(self) -> str:
        """The whole report: the headline, the host-bound cells, the power, then memory, disk and time."""
        host = "unknown" if self.host_available is None else f"{self.host_available / GB:.2f} GB available"
        lines = [self.headline(), self.host_line(), *self.power, *memory_lines(self)]
        lines += [
            f"host memory: expert store {self.expert_store / GB:.2f} GB ({self.checkpoint_bytes / GB:.2f} GB "
            f"of tensors in the checkpoint); {host}; page-lockable (RLIMIT_MEMLOCK): {self.memlock}",
            f"disk: traces and results need about {self.disk_need / GB:.3f} GB; {self.disk_free / GB:.1f} GB "
            f"free under {data_dir()}",
            f"grid: {self.grid_cells} cells, {self.runs} runs (warm-ups, repetitions, the A/A arm) and a "
            f"traced run per (task, batch size), about {self.forwards} forwards: {self.time_basis}",
        ]
        if self.extrapolated:
            lines.append(f"  extrapolated: {'; '.join(self.extrapolated)}")
        lines += host_table(self)
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def hours(lo: float, hi: float) -> str:
    return f"{lo:.2f} h" if lo == hi else f"{lo:.2f}-{hi:.2f} h"


def mode_summary(host: list[HostCell], mode: str) -> str:
    """'k of n cells predicted over (C/W ...), m may be (C/W ...), host low-high% of the wall'."""
    over = [c for c in host if c.over(mode)]
    maybe = [c for c in host if c.may_be(mode)]
    batches = len({c.batch_size for c in host}) > 1

    def name(cells: list[HostCell]) -> str:
        return "C/W " + ", ".join(
            f"{c.cache_ratio:g}" + (f" (batch {c.batch_size})" if batches else "") for c in cells
        )

    lo, hi = min(c.share[mode][0] for c in host), max(c.share[mode][1] for c in host)
    text = f"{len(over)} of {len(host)} cells predicted over"
    text += f" ({name(over)})" if 0 < len(over) < len(host) else ""
    text += f", {len(maybe)} may be ({name(maybe)})" if maybe else ""
    return text + f", host {_range(lo, hi)} of the wall"


def memory_lines(r: Report) -> list[str]:
    """The device-memory table: per batch size and C/W, the parts and whether they fit."""
    g = lambda b: f"{b / GB:8.2f}"  # noqa: E731
    lines = [
        f"doctor: profile {r.profile}, model {r.model} ({r.dtype}), device {r.device}",
        f"device memory: {r.device_bytes / GB:.2f} GB ({r.device_source})"
        if r.device_bytes
        else f"device memory: host memory ({r.device_source})",
        f"{'batch':>5} {'C/W':>5} {'W':>7} {'C':>5} {'slots GB':>8} {'weights':>8} {'KV GB':>8} "
        f"{'act GB':>8} {'total GB':>8}  fits",
    ]
    for c in r.cells:
        w = f"{c.working_set:.1f}" + ("" if c.measured_w else "*")
        lines.append(
            f"{c.batch_size:>5} {c.cache_ratio:>5g} {w:>7} {c.capacity:>5} {g(c.slots)} {g(r.weights)} "
            f"{g(c.kv)} {g(c.activations)} {g(c.total)}  {'yes' if c.fits(r.device_bytes) else 'NO'}"
        )
    if any(not c.measured_w for c in r.cells):
        lines.append(
            "  * no current trace for this (task, batch size): W is its upper bound min(E, "
            "batch x block x top-k), so C and the slots are upper bounds too"
        )
    if r.device_bytes is not None:  # the same condition under which the doctor adds it to each total
        lines.append(f"  totals add {CONTEXT_BYTES / GB:.2f} GB of CUDA context and allocator slack (stated)")
    else:
        lines.append("  totals add no CUDA context: they run in host memory (--gpu-memory-gb plans a GPU)")
    return lines


def host_table(r: Report) -> list[str]:
    """Per cell, the predicted host share under each forward mode priced, and what the figures rest on."""
    if not r.host:
        return []
    modes = list(r.host[0].share)
    lines = [
        "host share of wall time per forward, predicted (the largest over the policies; low: a copy's host "
        "time the model does not charge adds to the wall, high: it overlaps the link; ! over the limit, "
        "? at the high end only):"
    ]
    lines.append(f"{'batch':>7} {'C/W':>5}" + "".join(f" {m:>10}" for m in modes))
    for c in r.host:
        marks = {m: "!" if c.over(m) else "?" if c.may_be(m) else " " for m in modes}
        shares = "".join(f" {_range(*c.share[m]):>9}{marks[m]}" for m in modes)
        lines.append(f"{c.batch_size:>7} {c.cache_ratio:>5g}{shares}")
    return lines + [f"  {b}" for b in r.host_basis]


def _range(lo: float, hi: float) -> str:
    return f"{lo:.0%}" if round(100 * lo) == round(100 * hi) else f"{lo:.0%}-{hi:.0%}"
