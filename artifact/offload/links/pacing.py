"""Pacing of the capped CUDA link: pure arithmetic, so it is tested on the CPU with an injected clock.

  Pacing          how the copy stream paces itself: each chunk of a copy is followed by a GPU spin
                  (torch.cuda._sleep) of the time it would have taken at the cap minus the time it took
  calibrate_rate  units per second of some enqueued work, free of any fixed cost per measurement (the
                  peak pinned copy rate and the spin kernel's cycles per second, once per CudaLink)

CudaLink (offload/links/cuda_link.py) holds one Pacing and replaces it with the feedback of each finished
batch (`observed`); nothing here touches CUDA.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Pacing:
    """How the copy stream paces itself. A chunk of b bytes copies at the measured peak in b / peak
    seconds; the stream then spins (b / cap - b / peak) seconds, so over any run of chunks the rate is
    the cap, on the GPU timeline, with no host thread. Uncapped (cap None, or cap >= peak) the spin is
    zero and nothing else changes: capped and uncapped are the same copies in the same chunks."""

    peak_gbps: float  # measured pinned H2D rate of a chunk
    cap_gbps: float | None = None
    spin_hz: float = 1.0  # GPU spin cycles per second (torch.cuda._sleep), calibrated
    chunk_bytes: int | None = None  # None: a copy is one chunk (the cap then holds per copy)
    spin_scale: float = 1.0  # feedback: corrects the spin for a peak or clock that drifted

    def __post_init__(self):
        if not self.peak_gbps > 0:
            raise ValueError(f"pacing needs a measured peak > 0 GB/s, got {self.peak_gbps}")
        if self.cap_gbps is not None and not self.cap_gbps > 0:
            raise ValueError(f"bandwidth cap must be > 0 GB/s, got {self.cap_gbps}")
        if self.chunk_bytes is not None and self.chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be >= 1, got {self.chunk_bytes}")
        if not self.spin_hz > 0:
            raise ValueError(f"spin_hz must be > 0, got {self.spin_hz}")

    def chunks(self, nbytes: int) -> list[tuple[int, int]]:
        step = self.chunk_bytes or max(nbytes, 1)
        return [(a, min(a + step, nbytes)) for a in range(0, nbytes, step)]

    def spin_seconds(self, nbytes: int) -> float:
        if self.cap_gbps is None or self.cap_gbps >= self.peak_gbps:
            return 0.0
        return max(0.0, nbytes / (self.cap_gbps * 1e9) - nbytes / (self.peak_gbps * 1e9))

    def spin_cycles(self, nbytes: int) -> int:
        return round(self.spin_seconds(nbytes) * self.spin_hz * self.spin_scale)

    def observed(self, nbytes: int, seconds: float, weight: float = 0.5) -> Pacing:
        """Feedback from one paced batch that took `seconds` on the GPU timeline for `nbytes`: scale the
        spin so the next batch takes nbytes / cap. Expert-sized copies can run below the calibration's
        peak, and the SM clock that times a spin moves with boost; both show up here and are absorbed.
        The step is damped (weight) and bounded (x0.5 .. x2 per batch)."""
        if self.cap_gbps is None or self.cap_gbps >= self.peak_gbps or nbytes <= 0 or not seconds > 0:
            return self
        target = nbytes / (self.cap_gbps * 1e9)
        copy = nbytes / (self.peak_gbps * 1e9)
        ratio = (target - copy) / (seconds - copy) if seconds > copy else 2.0
        ratio = min(2.0, max(0.5, ratio))
        return dataclasses.replace(self, spin_scale=self.spin_scale * ratio**weight)

    def schedule(self, nbytes: int) -> list[tuple[int, int, int]]:
        """(start, end, spin cycles after it) for each chunk of a copy."""
        return [(a, b, self.spin_cycles(b - a)) for a, b in self.chunks(nbytes)]


def calibrate_rate(
    run: Callable[[int], None], clock: Callable[[], float], units: int, reps: int = 3
) -> float:
    """Units per second of `run(units)` timed by `clock`, free of any fixed cost per measurement.

    Each timed interval holds the work and a fixed overhead: on CUDA the host's sync on the start event,
    the launch that follows and the end event's record (tens of us to ~1 ms of polling), which made a
    plain units / seconds read 2-10 % low, so a capped link ran above its cap. So the rate is read off the
    difference of two sizes: units / (t(2 units) - t(units)), each the best of `reps` (after a warm-up),
    which cancels any overhead that does not grow with the work. On CUDA, `run` enqueues work and
    `clock` is a device-timed clock; the tests inject both (timeline.ManualClock)."""
    if units < 1:
        raise ValueError(f"calibration needs units >= 1, got {units}")
    run(units)

    def best(n: int) -> float:
        b = math.inf
        for _ in range(reps):
            t0 = clock()
            run(n)
            b = min(b, clock() - t0)
        return b

    one, two = best(units), best(2 * units)
    if not one > 0 or not two > 0:
        raise RuntimeError(
            f"calibration measured {min(one, two)} s for {units} units: the clock did not advance"
        )
    if not two > one:
        raise RuntimeError(
            f"calibration: {2 * units} units took {two:.3g} s, not longer than {units} units "
            f"({one:.3g} s); the measurement is noise, not the work"
        )
    return units / (two - one)
