"""07 routing map: which routing statistics let prediction win. Synthetic streams (synth.py) over a grid
of step novelty nu x W spread are replayed (sim.replay; `min` is bounds.relaxed_min) at C/W 1 and 1.73, with
and without prefill forwards; the cpu traces are placed on the map from their fitted parameters, the
abstract's oracle cut (paper.ORACLE_CUT, placed at C/W 1 by this artifact) is drawn as a contour, and two
streams (at the point this artifact infers from that cut, the 'paper point', an illustration, and at the cpu
traces' point) run through the stream-driven engine (offload/trace_engine.py) on the emulated link, demand vs
last_step, paired by repetition. The map is this artifact's own result, not a figure of the paper.

The map's streams share one base (`base_params`): LLaDA2.0-mini's shape (E 256, top-k 8, 32 tokens and up to
32 steps a block, W 70) with the generator's neutral W profile, except the W persistence (how W drifts from
step to step) and the prefill W multiple: both the median of the cpu traces' fits (real routing drifts;
without drift a large spread would force extra novelty through clipping, and the axes would not be
independent). All streams of one map share a seed (common random numbers: neighbouring cells differ by the
parameters, not by the draw).

map.py holds the replayed map (its numbers, verdicts, figure), streams.py the timed streams (their claim and
figure); notebook 07, the tests and the stored-run machinery (stored_runs.TIMED_STUDIES) read them as one
module, `routing_map.X`: what they use is re-exported here.
"""

from artifact.experiments.studies.routing_map.map import (  # noqa: F401
    DEFAULT_GRID,
    GRIDS,
    POLICIES,
    MapGrid,
    at_point,
    base_params,
    crossing,
    grid_for,
    numbers,
    plot_map,
    prefill_multiple,
    reading,
    routing_map,
    trace_fits,
    verdicts,
)
from artifact.experiments.studies.routing_map.streams import (  # noqa: F401
    METRIC,
    STREAMS,
    calibration,
    measure,
    plot_throughput,
    replicas,
    stored_claims,
    stream_points,
    stream_runs,
    streams,
    throughput,
    throughput_claim,
    throughput_table,
)
