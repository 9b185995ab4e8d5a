"""07 routing map (this artifact's own result, not a figure of the paper): which routing statistics let
prediction win. Synthetic streams (synth.py) over a grid of step novelty nu x W spread are replayed
(sim.replay; `min` is bounds.relaxed_min) at C/W 1 and 1.73, with and without prefill forwards; the cpu traces
are placed on the map from their fits, and the abstract's oracle cut (paper.ORACLE_CUT, placed at C/W 1 by
this artifact) is drawn as a contour. Two streams, at the point this artifact infers from that cut (the
'paper point', an illustration) and at the cpu traces' point, run through the stream-driven engine
(offload/trace_engine.py) on the emulated link, demand vs last_step, paired by repetition.

The streams share one base (`base_params`): LLaDA2.0-mini's shape (E 256, top-k 8, 32 tokens and up to 32
steps a block, W 70) with the generator's neutral W profile, but the W persistence (how W drifts from step to
step) and the prefill W multiple are the cpu traces' fits' medians (without drift a large spread would force
extra novelty through clipping: the axes would not be independent). One seed for all streams of a map
(common random numbers: neighbouring cells differ by the parameters, not by the draw).

map.py: the replayed map, its numbers, verdicts and figure; streams.py: the timed streams, their claim and
figure. Notebook 07, the tests and stored_runs.TIMED_STUDIES read both as `routing_map.X` (re-exported here).
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
