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
copy per expert group, the link's copies, and one host sync per MoE layer (the counts).

What the forward mode does (ForwardOptions.forward, artifact/model/options.py): "eager" runs LLaDA2MoE.forward
module by module; "segmented" runs a denoising forward over a KV cache (the shapes the decoder repeats every
step) through this module. Prefill and the full (uncached) mode stay eager in both.

  CUDA   Per program (below), the first forward is the warm-up: every segment and stage runs eagerly on the
         capture stream (lazy initialisation, allocator). The second captures each segment and stage once
         (capture.capture: its own begin and end on that side stream, whose context is always left) and
         replays it at once; later forwards replay. A stage seen first in a later forward is captured then.
         A forward whose options say capture=False (a timed or profiled run) captures nothing: a piece with
         no graph runs eagerly, counted. A capture that fails is the model's: its error, naming the op where
         the capture linter finds it, turns capture off for every shape (each later piece runs eagerly,
         counted) and reaches the run's RunResult.segments (SegmentCounts: captures, replays, eager,
         capture_error).
  CPU    The same segment and stage functions run eagerly, which is how the tests check them: bit for bit
         equal to the eager forward. Each runs under the capture linter (capture.Linter), which raises, naming
         the op and the segment or stage, on what CUDA stream capture forbids or a replay cannot repeat (host
         reads, data-sized outputs, tensors from host data, output shapes or host values that differ from
         the captured run's). The counts go through the same per-layer host buffers as on CUDA (a copy_
         whose shapes differ is a lint error), so a buffer of the wrong size fails here.

Programs: the static tensors and graphs of one forward shape, keyed by everything a captured graph bakes in
(batch, fed length, commit, the KV cache's tensors, the logits slice, cross-layer prediction, kernel). Every
graph of a program shares one memory pool; this is safe because segments are all captured in one forward
and replayed in that order, expert stages hold no outputs, and every tensor that outlives a graph (the state
below) stays referenced. The logits are cloned out of the pool. Expert stages are captured per (MoE layer,
weight stack): resident experts or a layer's slots. The KV caches (LLaDA2MoE.kv_pool) and an offloaded
layer's slots (LLaDA2MoE.slot_pool) are the model's, reused run after run, so a later run of the same shapes
(a new engine included) finds its programs and graphs and captures nothing.

Legend: B batch, T fed tokens, N = B*T, k experts per token, P = N*k (token, slot) pairs, E experts,
G rows of a weight stack, D hidden.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from artifact.model.capture import CudaCapture, Linter, capture, warm_up
from artifact.model.experts import HAS_GROUPED_MM, expert_ffn, grouped_mm_ok
from artifact.model.kv_cache import KVCache
from artifact.model.options import ForwardOptions
from artifact.model.routing import Demand, StepInfo, nonzero_counts

MAX_PROGRAMS = 8  # forward shapes kept per model (each holds its graphs' memory pool)
RING = 64  # pinned row-map buffers in flight on CUDA (a buffer is reused once its copy is done)


@dataclass
class SegmentCounts:
    """What the segmented forward did: forwards run as segments (on any device: the CPU's are eager segments),
    graphs captured and replayed, segments and stages run eagerly on CUDA for want of a graph (a timed forward
    meeting an uncaptured shape, or capture off after an error), and the model's capture error, if any
    (capture is then off for every shape of the model)."""

    forwards: int = 0
    captures: int = 0
    replays: int = 0
    eager: int = 0
    capture_error: str | None = None

    @property
    def replayed(self) -> bool:
        """Whether the run's segments ran as CUDA graphs: replays, no capture error, no piece eager."""
        return self.replays > 0 and self.capture_error is None and self.eager == 0

    def since(self, before: SegmentCounts) -> SegmentCounts:
        """The counts added since `before` (the error is the model's: kept)."""
        return SegmentCounts(
            self.forwards - before.forwards,
            self.captures - before.captures,
            self.replays - before.replays,
            self.eager - before.eager,
            self.capture_error,
        )


class Programs(OrderedDict):
    """A model's programs (LLaDA2MoE.programs), keyed by program_key, least recently used first; `counts`
    adds up what all of them did over the model's life; `active` is > 0 while a segment or expert stage runs
    (what is issued then is a graph's on CUDA: benchmarks/host_overhead.py counts the rest)."""

    def __init__(self, api=None, lint: bool | None = None):
        super().__init__()
        self.counts = SegmentCounts()
        self.active = 0
        self.api = api  # the capture API (capture.CudaCapture's methods); None: CudaCapture on CUDA
        self.lint = lint  # the capture linter on eager segments; None: on the CPU only
        self.stream = None  # the side stream of every warm-up and capture (made on first use)


class Program:
    """One forward shape: its static state, its segment functions and, on CUDA, their graphs."""

    def __init__(
        self,
        model,
        opts: ForwardOptions,
        cache: KVCache,
        B: int,
        T: int,
        commit: int,
        logits_rows: slice | None,
    ):
        cfg = model.cfg
        self.model, self.opts, self.cache, self.commit, self.logits_rows = (
            model,
            opts,
            cache,
            commit,
            logits_rows,
        )
        self.all: Programs = model.programs
        self.layers = list(model.model.layers)
        self.moe = [i for i, layer in enumerate(self.layers) if layer.is_moe]  # model layer indices
        dev = model.lm_head.weight.device
        self.device = dev
        self.cuda = dev.type == "cuda"
        self.k, self.E = cfg.num_experts_per_tok, cfg.num_experts
        # Inputs, copied in before segment 0 (allocated outside any capture).
        self.ids = torch.zeros(B, T, dtype=torch.long, device=dev)
        self.pos = torch.zeros(B, T, dtype=torch.long, device=dev)
        self.key_valid = torch.ones(B, T, dtype=torch.bool, device=dev)
        self.valid = torch.ones(B, T, dtype=torch.bool, device=dev)  # tokens that route
        self.st: dict = {}  # tensors passed between segments (graph-owned once captured)
        # The host counts of each MoE layer, sized by its own counts: (2E,) when the next MoE layer's
        # prediction rides along, (E,) for the last MoE layer (it has no next router) and without the
        # prediction.
        nxt = model.routing.next_router
        self.host = [
            torch.zeros(
                2 * self.E if opts.predict_next and nxt.get(m) is not None else self.E,
                dtype=torch.long,
                pin_memory=self.cuda,
            )
            for m in self.moe
        ]
        self.rowmaps: dict = {}  # stack_key -> device (E,) long
        self.rowmap_np: dict = {}  # CPU: the same keys -> the numpy array behind the row map
        if self.cuda:
            self.ring = torch.empty(RING, self.E, dtype=torch.long, pin_memory=True)
            self.ring_np = self.ring.numpy()
            self.ring_events = [None] * RING
            self.ring_next = 0
        self.runs = 0
        self.api = self.all.api if self.all.api is not None else (CudaCapture() if self.cuda else None)
        self.lint = self.all.lint if self.all.lint is not None else not self.cuda
        self.lint_shapes: dict = {}  # launch name -> (op, output shapes) of its captured run (the linter's)
        self.warm = False  # a warm-up run went by on the capture stream
        self.warming = False  # this run is the warm-up
        self.graphs: dict = {}
        self.step: StepInfo | None = None  # the step of the forward now running (Program.run sets it)
        self.pool = None
        self.captures = 0
        self.replays = 0

    # --- the segment functions: tensors in self.st and the inputs only; no host data, no host read ---------
    def segment(self, i: int) -> None:
        st, model = self.st, self.model
        if i == 0:
            x, cos, sin, mask = model.prologue(self.ids, self.pos, self.cache, self.key_valid)
            st.update(
                cos=cos, sin=sin, mask=mask, pair_valid=self.valid.reshape(-1).repeat_interleave(self.k)
            )
            lo = 0
        else:
            prev = self.moe[i - 1]
            x = self.layers[prev].mlp.finish(
                st[f"x_res{i - 1}"], st[f"ys{i - 1}"], st[f"w{i - 1}"], st[f"shared{i - 1}"]
            )
            lo = prev + 1
        hi = self.moe[i] if i < len(self.moe) else len(self.layers)
        cos, sin, mask = st["cos"], st["sin"], st["mask"]
        for layer in self.layers[lo:hi]:  # dense layers
            x = layer(x, cos, sin, mask, self.cache, self.commit, None, self.opts, self.step)
        if i < len(self.moe):
            layer = self.layers[hi]
            x_res, h = layer.attend(x, cos, sin, mask, self.cache, self.commit)
            flat, idx, w, counts, shared = layer.mlp.start(h, st["pair_valid"], self.opts.predict_next)
            ys = torch.zeros(flat.shape[0] * self.k, flat.shape[1], dtype=flat.dtype, device=flat.device)
            st.update(
                {
                    f"x_res{i}": x_res,
                    f"flat{i}": flat,
                    f"idx{i}": idx,
                    f"w{i}": w,
                    f"counts{i}": counts,
                    f"shared{i}": shared,
                    f"ys{i}": ys,
                }
            )
        else:
            if self.commit:
                self.cache.lens.add_(self.commit)  # the device lengths; the host's after
            st["logits"] = model.head(x, self.logits_rows)

    def stage(self, i: int, rowmap: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> None:
        st = self.st
        self.layers[self.moe[i]].mlp.stage(
            st[f"flat{i}"], st[f"idx{i}"], st["pair_valid"], rowmap, gate_up, down, st[f"ys{i}"]
        )

    def stage_loop(self, i: int, rowmap: torch.Tensor, group, per_expert: list[int]) -> None:
        """The per-expert loop kernel (and CUDA without a grouped GEMM): eager, sized by the host's counts."""
        st, G = self.st, group.gate_up.shape[0]
        row = torch.where(st["pair_valid"], rowmap[st[f"idx{i}"].view(-1)], G)
        n = sum(per_expert[e] for e in group.experts)
        order = torch.argsort(row, stable=True)[:n]  # (n,) the group's pairs, by row
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
        """Run a segment or expert stage. CPU: eagerly, under the capture linter. With a capture API (CUDA):
        the first run of the program is the warm-up, eager on the capture stream; a later one captures once
        and replays. A forward whose options forbid capture (timed, profiled), or any forward once a capture
        of the model failed, runs a piece without a graph eagerly, counted (SegmentCounts.eager)."""
        self.all.active += 1  # what runs in here is a graph on CUDA (benchmarks count the rest)
        try:
            if self.api is None:
                self.eager(name, fn)
            elif name in self.graphs:
                self.replay(self.graphs[name])
            elif not self.opts.capture or self.all.counts.capture_error is not None:
                self.eager(name, fn)
                self.all.counts.eager += 1
            elif self.warming:
                warm_up(self.api, self.capture_stream(), self.device, lambda: self.eager(name, fn))
            else:
                self.capture(name, fn)
        finally:
            self.all.active -= 1

    def eager(self, name, fn) -> None:
        """fn() eagerly; with the linter on, under it: its op shapes are recorded in the run that would be
        captured (the program's second) and compared in later runs."""
        if not self.lint:
            fn()
            return
        shapes = self.lint_shapes.get(name)
        with Linter(where(self, name), shapes) as lint:
            fn()
        if shapes is None and self.runs >= 1:
            self.lint_shapes[name] = lint.recorded

    def replay(self, graph) -> None:
        self.api.replay(graph)
        self.replays += 1
        self.all.counts.replays += 1

    def capture_stream(self):
        if self.all.stream is None:
            self.all.stream = self.api.stream(self.device)
        return self.all.stream

    def capture(self, name, fn) -> None:
        """Capture fn once and replay it. A failure is the model's: its error (naming the op where the linter
        finds it, rerunning fn eagerly) turns capture off for every shape; this forward goes on eagerly."""
        g = self.api.graph()
        error = capture(self.api, g, self.pool, self.capture_stream(), fn)
        if error is None:
            self.pool = self.pool or self.api.pool(g)
            self.graphs[name] = g
            self.captures += 1
            self.all.counts.captures += 1
            self.replay(g)
            return
        self.api.synchronize()
        with Linter(where(self, name), report=True) as lint:
            fn()  # the eager run this forward needs; the linter names the op
        found = f" ({lint.found})" if lint.found else ""
        self.all.counts.capture_error = f"capture of {where(self, name)} failed: {error}{found}"
        self.all.counts.eager += 1
        warnings.warn(
            f"forward segmented: {self.all.counts.capture_error}; capture is off for this model, "
            "its segments run eagerly",
            stacklevel=3,
        )

    def rowmap(self, i: int, group) -> torch.Tensor:
        """The group's plan as a device (E,) row map: each member's stack row, G for every other expert."""
        G = group.gate_up.shape[0]
        key = stack_key(i, group)
        dev = self.rowmaps.get(key)
        if dev is None and self.cuda:
            dev = self.rowmaps[key] = torch.empty(self.E, dtype=torch.long, device=self.device)
        elif dev is None:  # CPU: the tensor shares the numpy array the host writes
            arr = self.rowmap_np[key] = np.empty(self.E, dtype=np.int64)
            dev = self.rowmaps[key] = torch.from_numpy(arr)
        if not self.cuda:
            arr = self.rowmap_np[key]  # written in place: no host list
            arr.fill(G)
            arr[list(group.experts)] = group.rows
            return dev
        j = self.ring_next
        self.ring_next = (j + 1) % RING
        ev = self.ring_events[j]
        if ev is not None and not ev.query():
            ev.synchronize()  # RING copies still queued: the host is far ahead of the device
        arr = self.ring_np[j]
        arr.fill(G)
        arr[list(group.experts)] = group.rows
        dev.copy_(self.ring[j], non_blocking=True)  # one small H2D copy per group
        if ev is None:
            ev = self.ring_events[j] = torch.cuda.Event()
        ev.record()
        return dev

    def run(self, step: StepInfo, ids, pos, key_valid, rows, cache: KVCache) -> torch.Tensor:
        """One forward at `step`; `cache` holds the same device tensors as the program's (the key says so)."""
        self.load(ids, pos, key_valid, rows)
        self.step = step
        self.warming = self.api is not None and not self.warm and self.opts.capture
        grouped = self.opts.expert_kernel == "grouped" and HAS_GROUPED_MM and grouped_mm_ok(self.st_probe())
        for i in range(len(self.moe) + 1):
            self.launch(("segment", i), lambda i=i: self.segment(i))
            if i < len(self.moe):
                per, demand = self.demand(i)
                self.serve(i, per, demand, grouped)
        if self.commit:
            cache.lengths = [n + self.commit for n in cache.lengths]
        self.warm = self.warm or self.warming
        self.warming = False
        self.runs += 1
        self.all.counts.forwards += 1
        logits = self.st["logits"]
        return logits.clone() if self.cuda else logits

    def load(self, ids, pos, key_valid, rows) -> None:
        """The forward's inputs into the program's static tensors."""
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

    def demand(self, i: int) -> tuple[list[int], Demand]:
        """MoE layer i's counts through its host buffer (the one host read of the layer) and its Demand, which
        every listener hears. CUDA: copied non_blocking into pinned memory, queued behind the replay (outside
        any graph), then one event sync. CPU: the same buffer, copied into under the linter, then read."""
        routing, counts = self.model.routing, self.st[f"counts{i}"]
        if self.cuda:
            self.host[i].copy_(counts, non_blocking=True)
            per = routing.host_counts.wait(self.host[i])
        else:
            if self.lint:
                with Linter(f"segment {i}: MoE layer {self.moe[i]}'s counts to the host"):
                    self.host[i].copy_(counts)
            else:
                self.host[i].copy_(counts)
            per = self.host[i].tolist()
        E = self.E
        predicted = nonzero_counts(per[E:]) if len(per) > E else None
        experts, demanded = nonzero_counts(per[:E])
        demand = Demand(self.step, self.moe[i], experts, demanded, predicted)
        for listener in routing.listeners:
            listener(demand)
        return per, demand

    def serve(self, i: int, per: list[int], demand: Demand, grouped: bool) -> None:
        """MoE layer i's expert groups, as the backend hands them out: each one expert stage."""
        served: set[int] = set()
        computed = 0
        for group in self.opts.backend.groups(demand):
            rowmap = self.rowmap(i, group)
            if grouped:
                gu, dn = group.gate_up, group.down
                self.launch(
                    ("stage", *stack_key(i, group)), lambda r=rowmap, gu=gu, dn=dn: self.stage(i, r, gu, dn)
                )
            else:
                self.stage_loop(i, rowmap, group, per)
            served.update(group.experts)
            computed += len(group.experts)
        assert computed == len(demand.experts) and served == set(demand.experts), (
            f"layer {demand.layer}: the backend served {computed} experts ({len(served)} distinct) of "
            f"{len(demand.experts)}"
        )

    def st_probe(self) -> torch.Tensor:
        """A tensor of the hidden dtype on the device, for the grouped GEMM's capability check."""
        return self.model.model.word_embeddings.weight


def stack_key(i: int, group) -> tuple:
    """What a captured expert stage bakes in of its weight stacks: addresses, shapes and strides. A new
    engine's slots may come back at a freed engine's address; only with the same shape and strides is the old
    stage graph valid for them (it then reads the new slots, which is right)."""
    gu, dn = group.gate_up, group.down
    return (i, gu.data_ptr(), tuple(gu.shape), gu.stride(), dn.data_ptr(), tuple(dn.shape), dn.stride())


def where(prog: Program, name: tuple) -> str:
    """A launch's name in words: "segment i" or "expert stage of MoE layer L (segment i, G rows)"."""
    if name[0] == "segment":
        return f"segment {name[1]}"
    return f"expert stage of MoE layer {prog.moe[name[1]]} (segment {name[1]}, {name[3][0]} rows)"


def program_key(model, opts: ForwardOptions, ids, cache: KVCache, commit: int, logits_rows) -> tuple:
    """What a captured graph bakes in: shapes, the cache's tensors, the logits slice, the layer options."""
    B, T = ids.shape
    sl = (logits_rows.start, logits_rows.stop, logits_rows.step) if logits_rows is not None else None
    return (
        B,
        T,
        commit,
        cache.positions,
        cache.k[0].data_ptr(),
        cache.lens.data_ptr(),
        sl,
        opts.predict_next,
        opts.expert_kernel,
    )


def programs(model) -> Programs:
    """The model's programs (kept with the model, not in its state dict)."""
    return model.programs


def run_segments(
    model,
    opts: ForwardOptions,
    step: StepInfo,
    ids,
    pos,
    *,
    cache: KVCache,
    commit: int = 0,
    key_valid=None,
    rows=None,
    logits_rows: slice | None = None,
) -> torch.Tensor:
    """LLaDA2MoE.forward for forward "segmented" (see the module docstring); the same logits as the eager
    forward. `opts` carries the forward's backend and kernel, `step` its StepInfo."""
    progs = programs(model)
    key = program_key(model, opts, ids, cache, commit, logits_rows)
    prog = progs.get(key)
    if prog is None:
        prog = progs[key] = Program(model, opts, cache, ids.shape[0], ids.shape[1], commit, logits_rows)
        while len(progs) > MAX_PROGRAMS:
            progs.popitem(last=False)
    else:
        progs.move_to_end(key)
        prog.opts = opts  # the same key: the same shapes and prediction; the backend may be new
    return prog.run(step, ids, pos, key_valid, rows, cache)
