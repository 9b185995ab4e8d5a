"""Host time per expert copy on the link (printed, not asserted): what one `Link.copy` costs the host per
expert, against the bare floor of issuing the same copies with `Tensor.copy_(non_blocking=True)`.

The engine hands the link one batch per MoE layer (the layer's misses, `--batch` copies). A batch is issued
`--calls` times over `--slots` slot tensors of `--expert-kib` KiB each, from page-locked host rows, and only
the host's time inside the calls is counted (the copies themselves run on the copy engine meanwhile; every
`--drain` calls the host waits for them, untimed, so the stream never backs up):

  link_us_per_copy    host us per expert inside CudaLink.copy (views, schedule, stream switch, one event
                      record per slot, the batch's timing pair, stats)
  bare_us_per_copy    host us per expert of the same copies issued directly (torch's launch floor; 0 on CPU)
  python_us_per_copy  the difference: the link's own Python per copy (issue target: under 3 us)

On a CPU-only machine the emulated link is measured instead (`--device cpu`): it has no launch floor and runs
the timeline's bookkeeping, which CudaLink does not, so its figure is an upper bound on that Python only.

    .venv/bin/python benchmarks/copy_overhead.py [--device cuda] [--batch 8] [--calls 2000] [--json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from artifact.offload.link import make_link


def measure(device: str, batch: int, calls: int, slots: int, expert_kib: int, drain: int, reps: int) -> dict:
    n = expert_kib * 1024 // 2                                             # bf16 elements per expert
    cuda = torch.device(device).type == "cuda"
    dst = torch.empty(slots, n, dtype=torch.bfloat16, device=device)      # the slot tensor
    src = torch.zeros(slots, n, dtype=torch.bfloat16, pin_memory=cuda)     # host rows of the store
    link = make_link("cuda" if cuda else "emulated", device=device, expert_bytes=n * 2)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    batches = [[(dst[(k * batch + i) % slots], src[(k * batch + i) % slots], "")
                for i in range(batch)] for k in range(max(1, slots // batch))]

    def timed(issue) -> float:
        spent = 0.0
        for c in range(calls):
            items = batches[c % len(batches)]
            t0 = time.perf_counter()
            issue(items)
            spent += time.perf_counter() - t0
            if (c + 1) % drain == 0:
                sync()
        sync()
        return 1e6 * spent / (calls * batch)

    def via_link(items):
        link.copy(items)

    def bare(items):
        for d, s, _ in items:
            d.copy_(s, non_blocking=True)

    link_us, bare_us = [], []
    try:
        for _ in range(reps):                 # interleaved, so a busy machine slows both alike
            link_us.append(timed(via_link))
            if cuda:                          # on CPU copy_ moves the bytes at once: no launch floor to compare
                bare_us.append(timed(bare))
    finally:
        link.close()
    lk = statistics.median(link_us)
    br = statistics.median(bare_us) if bare_us else 0.0
    return {"device": torch.cuda.get_device_name() if cuda else "cpu", "link": link.kind, "batch": batch,
            "calls": calls, "reps": reps, "expert_kib": expert_kib, "link_us_per_copy": round(lk, 2),
            "bare_us_per_copy": round(br, 2), "python_us_per_copy": round(lk - br, 2),
            "link_us_per_copy_reps": [round(x, 2) for x in link_us],
            "bare_us_per_copy_reps": [round(x, 2) for x in bare_us],
            "torch": torch.__version__}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, default=8, help="copies per call (a layer's misses)")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--slots", type=int, default=64)
    ap.add_argument("--expert-kib", type=int, default=64, help="bytes per copy (host cost barely depends on it)")
    ap.add_argument("--drain", type=int, default=16, help="untimed wait for the copies every N calls")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    for k in ("batch", "calls", "slots", "expert_kib", "drain", "reps"):
        if getattr(a, k) < 1:
            ap.error(f"--{k.replace('_', '-')} must be >= 1, got {getattr(a, k)}")
    r = measure(a.device, a.batch, a.calls, a.slots, a.expert_kib, a.drain, a.reps)
    if a.json:
        print(json.dumps(r, indent=1))
    else:
        print(f"{r['link']} link on {r['device']}: {r['link_us_per_copy']} us per copy inside Link.copy, "
              f"{r['bare_us_per_copy']} us bare copy_ -> {r['python_us_per_copy']} us of the link's Python per copy "
              f"(median of {r['reps']}; batch {r['batch']})")


if __name__ == "__main__":
    main()
