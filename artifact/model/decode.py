"""LLaDA2 block-diffusion decoding (temperature 0) for a batch of 1-8 prompts.

Each sequence is split into 32-token blocks aligned to position 0; the block holding the end of the
prompt is the first one decoded. A block starts fully masked (after the prompt) and every denoising
step accepts each masked position whose top probability exceeds `threshold`, or, when fewer than the
step's quota pass, the `quota` most confident ones. Decoding stops at the first block containing eos.

Batches advance block-synchronously: all rows decode their current block, a row whose block is
complete waits (its tokens are not routed) until every row's block is complete, then all rows move on.
So each row's tokens are those it would get alone, and a denoising step has one meaning for the batch.

Two modes give the same tokens; generate runs the block rounds, and each mode's step is its own function:
  full    (step_full) re-runs every row's whole prefix each step (the reference generate);
  cached  (prefill, step_cached) keeps a prefix KV cache: a step feeds only the current block; the first
          step of a block also feeds the previous block's final tokens, whose keys and values are then
          committed once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from artifact.errors import SettingError, SpecError
from artifact.model.kv_cache import KVCache
from artifact.model.llada2 import LLaDA2MoE
from artifact.model.options import EAGER, ForwardOptions
from artifact.model.routing import StepInfo
from artifact.validate import check_number

MODES = ("cached", "full")
MAX_BATCH = 8  # prompts decoded together: the batch sizes the paper measures (1-8)


@dataclass(frozen=True)
class DecodeConfig:
    """How the decoder runs (temperature 0). These are every run's decoding defaults (a profile's and the
    command line's read them; stored traces record the field names), and this is their one validator: a bad
    value is a SpecError naming the field."""

    # tokens generated per prompt (rounded up to whole blocks internally): this artifact's choice (the
    # abstract states no length)
    gen_length: int = 256
    steps: int = 32  # at most this many denoising steps per block
    threshold: float = 0.95  # accept every masked token above this probability
    mode: str = "cached"  # cached (prefix KV cache) | full (re-run the whole prefix every step)
    eos_early_stop: bool = True

    def __post_init__(self):
        if self.mode not in MODES:
            raise SpecError("mode", f"unknown decoding mode {self.mode!r}; choose one of {MODES}")
        for name, rng in (
            ("gen_length", {"low": 1, "integer": True}),
            ("steps", {"low": 1, "integer": True}),
            ("threshold", {"low": 0, "low_open": True, "high": 1}),
        ):
            try:
                check_number(name, getattr(self, name), **rng)
            except SettingError as e:
                raise SpecError(name, str(e)) from None


@dataclass
class DecodeStats:
    """What one generate did."""

    batch_size: int
    mode: str
    forwards: int  # denoising forwards
    prefill_forwards: int
    tokens_generated: int
    seconds: float
    tokens_per_second: float
    tokens_per_forward: float
    blocks: int  # block rounds
    forward_host_ms: list[float]  # per denoising forward: host ms less the time blocked in router syncs
    forward_wall_ms: list[float]  # per denoising forward: CUDA event ms (GPU), elapsed ms (CPU)


@dataclass
class Generation:
    tokens: list[list[int]]  # generated ids per prompt, cut before the first eos
    stats: DecodeStats
    step_logits: dict = field(default_factory=dict)  # (row, block, step) -> (block, V), when recorded


def _event_pair(dev: torch.device):
    """(start recorded now, end) CUDA timing events on the current stream; None on the CPU."""
    if dev.type != "cuda":
        return None
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    return start, end


def transfer_schedule(block: int, steps: int) -> list[int]:
    """Tokens a step must accept at least: block split evenly over the steps, remainder first."""
    steps = min(steps, block)
    base, extra = divmod(block, steps)
    return [base + 1] * extra + [base] * (steps - extra)


def accept(block: torch.Tensor, logits: torch.Tensor, mask_id: int, threshold: float, quota: int) -> None:
    """One denoising update of one row's block (in place). block (n,), logits (n, V)."""
    masked = block == mask_id
    n_masked = int(masked.sum())
    if n_masked == 0:
        return
    p, x0 = torch.softmax(logits.float(), dim=-1).max(dim=-1)  # (n,) greedy token and its probability
    conf = torch.where(masked, p, torch.full_like(p, -float("inf")))
    high = conf > threshold
    quota = min(quota, n_masked)
    if int(high.sum()) >= quota:
        chosen = high
    else:
        chosen = torch.zeros_like(masked)
        chosen[conf.topk(quota).indices] = True
    block[chosen] = x0[chosen]


def prefill(
    model: LLaDA2MoE, forwards: Forwards, seqs: list[torch.Tensor], first: list[int], nblocks: list[int]
) -> KVCache:
    """cached mode: one batched cache from the model's pool (the same tensors for every run of this shape, so
    graphs captured over it stay valid), each row's prompt prefilled alone into its row."""
    cfg, n = model.cfg, model.cfg.block_length
    dev = seqs[0].device
    shape = (len(seqs), cfg.num_key_value_heads, max(nblocks) * n, cfg.head_dim)
    cache = model.kv_pool.cache(cfg.num_hidden_layers, shape, dev, model.lm_head.weight.dtype)
    for b, seq in enumerate(seqs):
        full = first[b] * n
        if full:
            c = cache.row(b)
            forwards(
                "prefill",
                -1,
                -1,
                seq[None, :full],
                torch.arange(full, device=dev)[None],
                cache=c,
                commit=full,
                logits_rows=slice(0, 0),
            )
            cache.lengths[b] = c.lengths[0]
    return cache


def step_cached(
    forwards: Forwards,
    seqs,
    rows: list[int],
    active: list[int],
    blk: dict,
    r: int,
    s: int,
    n: int,
    cache: KVCache,
):
    """One denoising step, cached mode: every row still decoding feeds its current block (the first step of a
    block also feeds the previous block's final tokens, committed to the cache); rows whose block is done are
    fed but not routed. -> (logits (len(rows), n, V), the rows they belong to)."""
    dev = seqs[0].device
    commit = n if (r > 0 and s == 0) else 0
    lo = [(blk[b] * n - commit) for b in rows]
    ids = torch.stack([seqs[b][a : a + commit + n] for b, a in zip(rows, lo)])
    pos = torch.stack([torch.arange(a, a + commit + n, device=dev) for a in lo])
    routed = None
    if len(active) < len(rows):  # finished rows wait, not routed
        routed = torch.tensor([b in active for b in rows], device=dev)[:, None].expand_as(ids)
    return forwards(
        "denoise",
        r,
        s,
        ids,
        pos,
        cache=cache,
        commit=commit,
        rows=routed,
        logits_rows=slice(commit, commit + n),
    ), rows


def step_full(forwards: Forwards, seqs, active: list[int], blk: dict, r: int, s: int, n: int, mask_id: int):
    """One denoising step, full mode: each active row re-feeds its whole prefix up to its current block,
    right-padded with masks. -> (logits (len(active), n, V), the rows they belong to)."""
    dev = seqs[0].device
    win = [(blk[b] + 1) * n for b in active]
    T = max(win)
    ids = torch.full((len(active), T), mask_id, dtype=torch.long, device=dev)
    valid = torch.zeros(len(active), T, dtype=torch.bool, device=dev)
    for i, (b, w) in enumerate(zip(active, win)):
        ids[i, :w] = seqs[b][:w]
        valid[i, :w] = True
    pos = torch.arange(T, device=dev).expand(len(active), T)
    gather = torch.stack([torch.arange(w - n, w, device=dev) for w in win])
    return forwards("denoise", r, s, ids, pos, key_valid=valid, rows=valid, logits_rows=gather), active


class Forwards:
    """The decoder's forwards: each is passed its StepInfo and the run's options; a denoising forward is
    timed. Per denoising forward: host ms (the Python of the forward, minus the time blocked in the router
    syncs) and wall ms (CUDA: an event pair around it on the compute stream, read once at the end; CPU:
    elapsed)."""

    def __init__(self, model: LLaDA2MoE, options: ForwardOptions):
        self.model, self.options = model, options
        self.dev = model.lm_head.weight.device
        self.counter = {"forward": 0, "denoise": 0, "prefill": 0}
        self.host_ms: list[float] = []
        self.timers: list = []

    def __call__(self, kind: str, block: int, step: int, *args, **kw) -> torch.Tensor:
        info = StepInfo(self.counter["forward"], block, step, kind)  # passed with the forward, not kept
        self.counter["forward"] += 1
        self.counter[kind] += 1
        if kind != "denoise":
            return self.model(*args, options=self.options, step=info, **kw)
        counts = self.model.routing.host_counts
        w0, t0 = counts.wait_seconds, time.perf_counter()
        pair = _event_pair(self.dev)
        out = self.model(*args, options=self.options, step=info, **kw)
        t1 = time.perf_counter()
        self.host_ms.append(1e3 * (t1 - t0 - (counts.wait_seconds - w0)))
        if pair is None:
            self.timers.append(1e3 * (t1 - t0))
        else:
            pair[1].record()
            self.timers.append(pair)
        return out

    def wall_ms(self) -> list[float]:
        return [t if isinstance(t, float) else t[0].elapsed_time(t[1]) for t in self.timers]


@dataclass
class Layout:
    """The sequences of a batch: each row's prompt then masks up to whole blocks."""

    seqs: list[torch.Tensor]  # (nblocks[b] * n,) per row
    plen: list[int]  # prompt lengths
    nblocks: list[int]  # blocks per row
    first: list[int]  # first block each row decodes


def check_prompts(cfg, prompts: list[list[int]], dc: DecodeConfig) -> None:
    if not 1 <= len(prompts) <= MAX_BATCH:
        raise ValueError(f"batch size must be 1-{MAX_BATCH} prompts, got {len(prompts)}")
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty")
        if max(p) >= cfg.vocab_size or min(p) < 0:
            raise ValueError(f"prompt {i} has token ids outside [0, {cfg.vocab_size})")
    n = cfg.block_length
    need = max(-(-(len(p) + dc.gen_length) // n) for p in prompts) * n
    if need > cfg.max_position_embeddings:
        raise ValueError(
            f"prompt + gen_length needs {need} positions > "
            f"max_position_embeddings {cfg.max_position_embeddings}"
        )


def layout(cfg, prompts: list[list[int]], dc: DecodeConfig, dev) -> Layout:
    n = cfg.block_length
    plen = [len(p) for p in prompts]
    nblocks = [-(-(p + dc.gen_length) // n) for p in plen]
    seqs = []
    for p, nb in zip(prompts, nblocks):
        x = torch.full((nb * n,), cfg.mask_token_id, dtype=torch.long, device=dev)
        x[: len(p)] = torch.tensor(p, device=dev)
        seqs.append(x)
    return Layout(seqs, plen, nblocks, [p // n for p in plen])


def decode_round(
    forwards: Forwards,
    lay: Layout,
    rows: list[int],
    r: int,
    cache: KVCache | None,
    dc: DecodeConfig,
    schedule: list[int],
    logits_out: dict | None,
) -> dict[int, int]:
    """Block round r: every row in `rows` denoises its current block (the rows' first block + r) until no mask
    is left or the schedule ends. -> each row's block."""
    cfg = forwards.model.cfg
    n, mask_id = cfg.block_length, cfg.mask_token_id
    blk = {b: lay.first[b] + r for b in rows}
    views = {b: lay.seqs[b][blk[b] * n : (blk[b] + 1) * n] for b in rows}  # views: updates write through
    for s, quota in enumerate(schedule):
        active = [b for b in rows if bool((views[b] == mask_id).any())]
        if not active:
            break
        if cache is not None:
            logits, fed = step_cached(forwards, lay.seqs, rows, active, blk, r, s, n, cache)
        else:
            logits, fed = step_full(forwards, lay.seqs, active, blk, r, s, n, mask_id)
        for i, b in enumerate(fed):
            if b not in active:
                continue
            if logits_out is not None:
                logits_out[(b, blk[b], s)] = logits[i].cpu()
            accept(views[b], logits[i], mask_id, dc.threshold, quota)
    return blk


def finished_rows(cfg, lay: Layout, rows: list[int], blk: dict[int, int], dc: DecodeConfig) -> list[int]:
    """The rows whose sequence ends with this round: last block decoded, or eos generated (early stop)."""
    n = cfg.block_length
    out = []
    for b in rows:
        gen = lay.seqs[b][lay.plen[b] : (blk[b] + 1) * n]
        if blk[b] + 1 == lay.nblocks[b] or (dc.eos_early_stop and bool((gen == cfg.eos_token_id).any())):
            out.append(b)
    return out


@torch.no_grad()
def generate(
    model: LLaDA2MoE,
    prompts: list[list[int]],
    dc: DecodeConfig = DecodeConfig(),
    record_logits: bool = False,
    options: ForwardOptions = EAGER,
) -> Generation:
    """Decode a batch of prompts; every forward runs with `options` (artifact/model/options.py)."""
    cfg = model.cfg
    check_prompts(cfg, prompts, dc)
    dev = model.lm_head.weight.device
    lay = layout(cfg, prompts, dc, dev)
    schedule = transfer_schedule(cfg.block_length, dc.steps)
    forwards = Forwards(model, options)
    logits_out: dict = {}
    t0 = time.perf_counter()
    rows = list(range(len(prompts)))  # rows still decoding
    cache = prefill(model, forwards, lay.seqs, lay.first, lay.nblocks) if dc.mode == "cached" else None
    r = 0
    while rows:
        blk = decode_round(forwards, lay, rows, r, cache, dc, schedule, logits_out if record_logits else None)
        finished = finished_rows(cfg, lay, rows, blk, dc)
        if finished:
            keep = [i for i, b in enumerate(rows) if b not in finished]
            rows = [rows[i] for i in keep]
            if cache is not None and rows:
                cache = cache.select(keep, model.kv_pool)
        r += 1
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    seconds = time.perf_counter() - t0
    tokens = tokens_of(cfg, lay, dc)
    return Generation(tokens, decode_stats(forwards, len(prompts), dc, seconds, r, tokens), logits_out)


def tokens_of(cfg, lay: Layout, dc: DecodeConfig) -> list[list[int]]:
    """Each row's generated ids, cut before the first eos."""
    tokens = []
    for b, seq in enumerate(lay.seqs):
        gen = seq[lay.plen[b] : lay.plen[b] + dc.gen_length].tolist()
        if cfg.eos_token_id in gen:
            gen = gen[: gen.index(cfg.eos_token_id)]
        tokens.append(gen)
    return tokens


def decode_stats(
    forwards: Forwards, batch: int, dc: DecodeConfig, seconds: float, blocks: int, tokens: list[list[int]]
) -> DecodeStats:
    produced = sum(len(t) for t in tokens)
    denoise = forwards.counter["denoise"]
    return DecodeStats(
        batch_size=batch,
        mode=dc.mode,
        forwards=denoise,
        prefill_forwards=forwards.counter["prefill"],
        tokens_generated=produced,
        seconds=seconds,
        tokens_per_second=produced / seconds if seconds > 0 else float("nan"),
        tokens_per_forward=produced / max(denoise, 1),
        blocks=blocks,
        forward_host_ms=forwards.host_ms,
        forward_wall_ms=forwards.wall_ms(),
    )
