"""The forward as segments between the router syncs (forward "segmented", artifact/model/options.py).

A denoising forward of an MoE model must stop once per MoE layer: the host reads the router's demand to plan
it (which experts are resident, which to copy, into which slot). Between two such reads everything is fixed
work on static shapes, so it is cut into segments and each is captured once as a CUDA graph and replayed:

  segment 0          embeddings, rotary tables, mask; the dense layers; the first MoE layer's attention half,
                     router, expert counts and shared expert (the counts are then copied into a pinned
                     host buffer, outside the graph, and read after one event sync)
  segment i          MoE layer i-1's combine and residual; the layers up to MoE layer i's router, as above
  segment M          the last MoE layer's combine; the final norm and lm_head (M = number of MoE layers)
  expert stage       one group of the backend (the resident hits, a group of landed misses, a wave): its plan
                     is one integer row map (E,) written by the host into pinned memory and copied to the
                     device before the replay; offsets, order and masks are computed on the device

So a forward issues M + 1 segment replays, one small counts copy per MoE layer, one replay plus one small
copy per expert group, the link's copies, and one host sync per MoE layer (the counts). On the CPU the same
segment functions run eagerly, which is how the tests check them: bit for bit equal to the eager forward
(LLaDA2MoE.forward, forward "eager").

Programs: the static tensors and graphs of one forward shape, keyed by everything a captured graph bakes in
(batch, fed length, commit, the KV cache's tensors, the logits slice, cross-layer prediction, kernel). The
first forward of a key runs eagerly (warm-up: lazy initialisation, allocator), the second captures every
segment (each replayed at once), later ones replay. Every graph of a program shares one memory pool; this is
safe because segments are all captured in one forward and replayed in that order, expert stages hold no
outputs, and every tensor that outlives a graph (the state below) stays referenced. The logits are cloned out
of the pool. Expert stages are captured per (MoE layer, weight stack): resident experts or a layer's slots.

Legend: B batch, T fed tokens, N = B*T, k experts per token, P = N*k (token, slot) pairs, E experts,
G rows of a weight stack, D hidden.
"""
from __future__ import annotations

import warnings
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from artifact.model.experts import HAS_GROUPED_MM, expert_ffn, grouped_mm_ok
from artifact.model.kv_cache import KVCache
from artifact.model.options import ForwardOptions
from artifact.model.routing import Demand, nonzero_counts

MAX_PROGRAMS = 8          # forward shapes kept per model (each holds its graphs' memory pool)
RING = 64                 # pinned row-map buffers in flight on CUDA (a buffer is reused once its copy is done)


@dataclass
class SegmentCounts:
    """What the segmented forward did: graphs captured and replayed, segments and stages run eagerly on CUDA
    for want of a graph (a timed forward meeting an uncaptured shape, or capture off after an error), and
    the model's capture error, if any (capture is then off for every shape of the model)."""
    captures: int = 0
    replays: int = 0
    eager: int = 0
    capture_error: str | None = None

    @property
    def replayed(self) -> bool:
        return self.replays > 0 and self.capture_error is None

    def since(self, before: SegmentCounts) -> SegmentCounts:
        """The counts added since `before` (the error is the model's: kept)."""
        return SegmentCounts(self.captures - before.captures, self.replays - before.replays,
                             self.eager - before.eager, self.capture_error)


class Programs(OrderedDict):
    """A model's programs (LLaDA2MoE.programs), keyed by program_key, least recently used first; `counts`
    adds up what all of them did over the model's life; `active` is > 0 while a segment or expert stage runs
    (what is issued then is a graph's on CUDA: benchmarks/host_overhead.py counts the rest)."""

    def __init__(self):
        super().__init__()
        self.counts = SegmentCounts()
        self.active = 0


class Program:
    """One forward shape: its static state, its segment functions and, on CUDA, their graphs."""

    def __init__(self, model, opts: ForwardOptions, cache: KVCache, B: int, T: int, commit: int,
                 logits_rows: slice | None):
        cfg = model.cfg
        self.model, self.opts, self.cache, self.commit, self.logits_rows = model, opts, cache, commit, logits_rows
        self.all: Programs = model.programs
        self.layers = list(model.model.layers)
        self.moe = [i for i, layer in enumerate(self.layers) if layer.is_moe]      # model layer indices
        dev = model.lm_head.weight.device
        self.device = dev
        self.cuda = dev.type == "cuda"
        self.k, self.E = cfg.num_experts_per_tok, cfg.num_experts
        # Inputs, copied in before segment 0 (allocated outside any capture).
        self.ids = torch.zeros(B, T, dtype=torch.long, device=dev)
        self.pos = torch.zeros(B, T, dtype=torch.long, device=dev)
        self.key_valid = torch.ones(B, T, dtype=torch.bool, device=dev)
        self.valid = torch.ones(B, T, dtype=torch.bool, device=dev)               # tokens that route
        self.st: dict = {}                 # tensors passed between segments (graph-owned once captured)
        width = 2 * self.E if opts.predict_next else self.E
        self.host = [torch.zeros(width, dtype=torch.long, pin_memory=self.cuda) for _ in self.moe]  # counts
        self.rowmaps: dict = {}            # stack_key -> device (E,) long
        self.rowmap_np: dict = {}          # CPU: the same keys -> the numpy array behind the row map
        if self.cuda:
            self.ring = torch.empty(RING, self.E, dtype=torch.long, pin_memory=True)
            self.ring_np = self.ring.numpy()
            self.ring_events = [None] * RING
            self.ring_next = 0
        self.runs = 0
        self.graphs: dict = {}
        self.pool = None
        self.captures = 0
        self.replays = 0
        self.error: str | None = None      # why capture failed, if it did (the program then runs eagerly)

    # --- the segment functions: tensors in self.st and the inputs only; no host data, no host read ---------
    def segment(self, i: int) -> None:
        st, model = self.st, self.model
        if i == 0:
            x, cos, sin, mask = model.prologue(self.ids, self.pos, self.cache, self.key_valid)
            st.update(cos=cos, sin=sin, mask=mask, pair_valid=self.valid.reshape(-1).repeat_interleave(self.k))
            lo = 0
        else:
            prev = self.moe[i - 1]
            x = self.layers[prev].mlp.finish(st[f"x_res{i - 1}"], st[f"ys{i - 1}"], st[f"w{i - 1}"],
                                             st[f"shared{i - 1}"])
            lo = prev + 1
        hi = self.moe[i] if i < len(self.moe) else len(self.layers)
        cos, sin, mask = st["cos"], st["sin"], st["mask"]
        for layer in self.layers[lo:hi]:                                   # dense layers
            x = layer(x, cos, sin, mask, self.cache, self.commit, None, self.opts)
        if i < len(self.moe):
            layer = self.layers[hi]
            x_res, h = layer.attend(x, cos, sin, mask, self.cache, self.commit)
            flat, idx, w, counts, shared = layer.mlp.start(h, st["pair_valid"], self.opts.predict_next)
            ys = torch.zeros(flat.shape[0] * self.k, flat.shape[1], dtype=flat.dtype, device=flat.device)
            st.update({f"x_res{i}": x_res, f"flat{i}": flat, f"idx{i}": idx, f"w{i}": w, f"counts{i}": counts,
                       f"shared{i}": shared, f"ys{i}": ys})
        else:
            if self.commit:
                self.cache.lens.add_(self.commit)                          # the device lengths; the host's after
            st["logits"] = model.head(x, self.logits_rows)

    def stage(self, i: int, rowmap: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> None:
        st = self.st
        self.layers[self.moe[i]].mlp.stage(st[f"flat{i}"], st[f"idx{i}"], st["pair_valid"], rowmap, gate_up, down,
                                           st[f"ys{i}"])

    def stage_loop(self, i: int, rowmap: torch.Tensor, group, per_expert: list[int]) -> None:
        """The per-expert loop kernel (and CUDA without a grouped GEMM): eager, sized by the host's counts."""
        st, G = self.st, group.gate_up.shape[0]
        row = torch.where(st["pair_valid"], rowmap[st[f"idx{i}"].view(-1)], G)
        n = sum(per_expert[e] for e in group.experts)
        order = torch.argsort(row, stable=True)[:n]                        # (n,) the group's pairs, by row
        xs = st[f"flat{i}"].index_select(0, order // self.k)
        ys = torch.empty_like(xs)
        a = 0
        for e, r in sorted(zip(group.experts, group.rows), key=lambda er: er[1]):
            b = a + per_expert[e]
            ys[a:b] = expert_ffn(xs[a:b], (group.gate_up[r], group.down[r]))
            a = b
        st[f"ys{i}"].index_copy_(0, order, ys)

    # --- running ---------------------------------------------------------------------------------------
    def launch(self, name, fn) -> None:
        """Run fn eagerly (CPU; a program's first forward on CUDA), or capture it once and replay it. A capture
        that fails leaves this program eager from then on, with the reason in `error` (never a failed run)."""
        self.all.active += 1               # what runs in here is a graph on CUDA (benchmarks count the rest)
        try:
            if not self.cuda or self.runs == 0 or self.error is not None:
                fn()
                return
            g = self.graphs.get(name)
            if g is None:
                g = torch.cuda.CUDAGraph()
                try:
                    with torch.cuda.graph(g, pool=self.pool):
                        fn()
                except RuntimeError as e:
                    self.error = f"capture of {name} failed: {e}".splitlines()[0]
                    self.all.counts.capture_error = self.error
                    warnings.warn(f"forward segmented: {self.error}; this forward shape runs eagerly", stacklevel=2)
                    torch.cuda.synchronize()
                    fn()
                    return
                self.pool = self.pool or g.pool()
                self.graphs[name] = g
                self.captures += 1
                self.all.counts.captures += 1
            g.replay()
            self.replays += 1
            self.all.counts.replays += 1
        finally:
            self.all.active -= 1

    def rowmap(self, i: int, group) -> torch.Tensor:
        """The group's plan as a device (E,) row map: each member's stack row, G for every other expert."""
        G = group.gate_up.shape[0]
        key = stack_key(i, group)
        dev = self.rowmaps.get(key)
        if dev is None and self.cuda:
            dev = self.rowmaps[key] = torch.empty(self.E, dtype=torch.long, device=self.device)
        elif dev is None:                  # CPU: the tensor shares the numpy array the host writes
            arr = self.rowmap_np[key] = np.empty(self.E, dtype=np.int64)
            dev = self.rowmaps[key] = torch.from_numpy(arr)
        if not self.cuda:
            arr = self.rowmap_np[key]                                      # written in place: no host list
            arr.fill(G)
            arr[list(group.experts)] = group.rows
            return dev
        j = self.ring_next
        self.ring_next = (j + 1) % RING
        ev = self.ring_events[j]
        if ev is not None and not ev.query():
            ev.synchronize()               # RING copies still queued: the host is far ahead of the device
        arr = self.ring_np[j]
        arr.fill(G)
        arr[list(group.experts)] = group.rows
        dev.copy_(self.ring[j], non_blocking=True)                         # one small H2D copy per group
        if ev is None:
            ev = self.ring_events[j] = torch.cuda.Event()
        ev.record()
        return dev

    def run(self, ids, pos, key_valid, rows, cache: KVCache) -> torch.Tensor:
        """One forward; `cache` holds the same device tensors as the program's (the key says so)."""
        model, routing = self.model, self.model.routing
        self.ids.copy_(ids)
        self.pos.copy_(pos)
        if key_valid is None:
            self.key_valid.fill_(True)
        else:
            self.key_valid.copy_(key_valid)
        if rows is None:
            self.valid.fill_(True)
        else:
            self.valid.copy_(rows)
        grouped = model.expert_kernel == "grouped" and HAS_GROUPED_MM and grouped_mm_ok(self.st_probe())
        for i in range(len(self.moe) + 1):
            self.launch(("segment", i), lambda i=i: self.segment(i))
            if i == len(self.moe):
                break
            layer = self.moe[i]
            if self.cuda:
                # The counts to pinned memory, queued behind the replay (outside the graph: a device-to-host
                # copy into the caching host allocator's memory is not relied on inside a capture), then the
                # one host sync of the layer.
                self.host[i].copy_(self.st[f"counts{i}"], non_blocking=True)
                per = routing.host_counts.wait(self.host[i])
            else:
                per = self.st[f"counts{i}"].tolist()                       # the one host read of the layer
            E = self.E
            predicted = nonzero_counts(per[E:]) if len(per) > E else None
            experts, demanded = nonzero_counts(per[:E])
            demand = Demand(routing.step, layer, experts, demanded, predicted)
            for listener in routing.listeners:
                listener(demand)
            served: set[int] = set()
            computed = 0
            for group in self.opts.backend.groups(demand):
                rowmap = self.rowmap(i, group)
                if grouped:
                    gu, dn = group.gate_up, group.down
                    self.launch(("stage", *stack_key(i, group)),
                                lambda i=i, r=rowmap, gu=gu, dn=dn: self.stage(i, r, gu, dn))
                else:
                    self.stage_loop(i, rowmap, group, per)
                served.update(group.experts)
                computed += len(group.experts)
            assert computed == len(experts) and served == set(experts), \
                f"layer {layer}: the backend served {computed} experts ({len(served)} distinct) of {len(experts)}"
        if self.commit:
            cache.lengths = [n + self.commit for n in cache.lengths]
        self.runs += 1
        logits = self.st["logits"]
        return logits.clone() if self.cuda else logits

    def st_probe(self) -> torch.Tensor:
        """A tensor of the hidden dtype on the device, for the grouped GEMM's capability check."""
        return self.model.model.word_embeddings.weight


def stack_key(i: int, group) -> tuple:
    """What a captured expert stage bakes in of its weight stacks: addresses, shapes and strides. A new engine's
    slots may come back at a freed engine's address; only with the same shape and strides is the old stage
    graph valid for them (it then reads the new slots, which is right)."""
    gu, dn = group.gate_up, group.down
    return (i, gu.data_ptr(), tuple(gu.shape), gu.stride(), dn.data_ptr(), tuple(dn.shape), dn.stride())


def program_key(model, opts: ForwardOptions, ids, cache: KVCache, commit: int, logits_rows) -> tuple:
    """What a captured graph bakes in: shapes, the cache's tensors, the logits slice, the layer options."""
    B, T = ids.shape
    sl = (logits_rows.start, logits_rows.stop, logits_rows.step) if logits_rows is not None else None
    return (B, T, commit, cache.capacity, cache.k[0].data_ptr(), cache.lens.data_ptr(), sl, opts.predict_next,
            model.expert_kernel)


def programs(model) -> Programs:
    """The model's programs (kept with the model, not in its state dict)."""
    return model.programs


def run_segments(model, opts: ForwardOptions, ids, pos, *, cache: KVCache, commit: int = 0, key_valid=None,
                 rows=None, logits_rows: slice | None = None) -> torch.Tensor:
    """LLaDA2MoE.forward for forward "segmented" (see the module docstring); the same logits as the eager
    forward. `opts` carries the forward's backend."""
    progs = programs(model)
    key = program_key(model, opts, ids, cache, commit, logits_rows)
    prog = progs.get(key)
    if prog is None:
        prog = progs[key] = Program(model, opts, cache, ids.shape[0], ids.shape[1], commit, logits_rows)
        while len(progs) > MAX_PROGRAMS:
            progs.popitem(last=False)
    else:
        progs.move_to_end(key)
        prog.opts = opts                   # the same key: the same shapes and prediction; the backend may be new
    return prog.run(ids, pos, key_valid, rows, cache)

