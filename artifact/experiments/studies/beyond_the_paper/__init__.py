"""06 beyond the paper (this artifact's own results, not the paper's): the prefetcher design space and a
demand-priority link. Two questions:
  (1) does prediction still lose once it can never delay a demand transfer (link_priority: demand)?
  (2) is last-step the right predictor to judge prediction by?
Miss accounting replays the profile's traces exactly for every predictor, against the miss floors belady (this
cache's rules) and min (relaxed MIN, any demand-paging schedule), with every count per phase: the count claims
rule on the denoising steps (prefill excluded), as notebook 02 counts (this artifact's choice: the abstract
does not say which forwards its counts cover), and print all demands beside them where that basis would give
another verdict (counting.on_bases). Paired throughput runs demand against the predictors under each link
priority, one bench file per priority.

The study's three parts: misses.py (the exact replay, its counts and the count claims (2)), throughput.py (the
paired bench under both link priorities and the priority claim (1)) and findings.py (both parts' numbers, the
verdicts and the figure); notebook 06 and the stored-run machinery (stored_runs.TIMED_STUDIES) read them as
one module, `beyond_the_paper.X`.
"""

from artifact.experiments.studies.beyond_the_paper.findings import (  # noqa: F401
    STYLE,
    Numbers,
    numbers,
    plot,
    verdicts,
)
from artifact.experiments.studies.beyond_the_paper.misses import (  # noqa: F401
    BOUNDS,
    MIN,
    MISS_POLICIES,
    PREDICTORS,
    SUMMED,
    Counts,
    conservative_claim,
    count_claims,
    counts,
    cross_layer_claim,
    headroom_claim,
    lookahead_text,
    miss_summary,
    miss_sweep,
)
from artifact.experiments.studies.beyond_the_paper.throughput import (  # noqa: F401
    BENCH_PREDICTORS,
    CELL,
    CLAIM,
    CPU_TRIM,
    PRIORITIES,
    STEM,
    bench_profile,
    bootstrap_above_zero,
    format_tables,
    label,
    measure,
    priority_claim,
    replicas,
    stored_claims,
    throughput_table,
)
