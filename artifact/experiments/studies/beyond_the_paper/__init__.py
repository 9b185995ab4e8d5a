"""06 beyond the paper (this artifact's own results, not the paper's): the prefetcher design space and a
demand-priority link. (1) Does prediction still lose once it can never delay a demand transfer (link_priority:
demand)? (2) Is last-step the right predictor to judge prediction by? misses.py replays the profile's traces
exactly for every predictor against the miss floors belady (this cache's rules) and min (relaxed MIN, any
demand-paging schedule), and rules the count claims (2) on the denoising steps (prefill excluded, as notebook
02 counts: the abstract does not say which forwards its counts cover), all demands printed beside where that
basis would give another verdict (counting.on_bases). throughput.py runs demand against the predictors under
each link priority (one bench file per priority) and rules (1); findings.py gathers both parts' numbers,
verdicts and figure. Notebook 06 and the stored runs (stored_runs.TIMED_STUDIES) read them from here."""

from artifact.experiments.studies.beyond_the_paper.findings import numbers, plot, verdicts  # noqa: F401
from artifact.experiments.studies.beyond_the_paper.misses import (  # noqa: F401
    MIN,
    MISS_POLICIES,
    PREDICTORS,
    SUMMED,
    lookahead_text,
    miss_summary,
    miss_sweep,
)
from artifact.experiments.studies.beyond_the_paper.throughput import (  # noqa: F401
    BENCH_PREDICTORS,
    CPU_TRIM,
    PRIORITIES,
    STEM,
    bench_profile,
    format_tables,
    measure,
    replicas,
    stored_claims,
    throughput_table,
)
