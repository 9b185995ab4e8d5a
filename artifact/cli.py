"""Command line: python -m artifact {generate,trace,simulate,bench,report,merge,notebooks} ...

Every argument is checked before a model is loaded: a bad value costs nothing."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from artifact.model.decode import MODES, DecodeConfig
from artifact.offload.link import LINKS, PCIE_LATENCY_US
from artifact.offload.policies import POLICIES


def _floats(s: str) -> list[float]:
    try:
        return [float(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {s!r}") from None


def _names(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def add_model_args(p: argparse.ArgumentParser):
    p.add_argument("--model", default="tiny", help="'tiny' (built on first use) or a checkpoint directory")
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 (default: float32 for tiny, bfloat16 otherwise)")
    p.add_argument("--device", default="cpu", help="cpu | cuda")


def add_decode_args(p: argparse.ArgumentParser):
    p.add_argument("--gen-length", type=int, default=64)
    p.add_argument("--steps", type=int, default=32, help="max denoising steps per 32-token block")
    p.add_argument("--threshold", type=float, default=0.95)
    p.add_argument("--mode", choices=MODES, default="cached")


def add_offload_args(p: argparse.ArgumentParser):
    p.add_argument("--offload", action="store_true", help="experts live in host memory behind a per-layer cache")
    p.add_argument("--cache-experts", type=int, default=None, help="C: device slots per MoE layer")
    p.add_argument("--policy", default="demand", help=f"one of {sorted(n for n, s in POLICIES.items() if s.engine_ok)}")
    p.add_argument("--link", default="emulated", help=f"one of {LINKS}")
    p.add_argument("--bandwidth-gbps", type=float, default=None,
                   help="emulated link bandwidth (default: PCIe 4 scaled to this model's expert size)")
    p.add_argument("--latency-us", type=float, default=PCIE_LATENCY_US)
    p.add_argument("--cap-gbps", type=float, default=None, help="throttle: cap the link's bandwidth")
    p.add_argument("--lookahead", type=int, default=1)
    p.add_argument("--tau", type=int, default=4)
    p.add_argument("--oracle-trace", type=Path, default=None, help="trace of an identical earlier run (oracle)")


def decode_config(a) -> DecodeConfig:
    return DecodeConfig(gen_length=a.gen_length, steps=a.steps, threshold=a.threshold, mode=a.mode)


def offload_spec(a, num_experts: int):
    from artifact.offload.runner import OffloadSpec
    if not a.offload:
        for flag in ("cache_experts", "oracle_trace"):
            if getattr(a, flag) is not None:
                raise ValueError(f"--{flag.replace('_', '-')} needs --offload")
        return None
    if a.cache_experts is None:
        raise ValueError("--offload needs --cache-experts C (device slots per MoE layer)")
    spec = OffloadSpec(capacity=a.cache_experts, policy=a.policy, link=a.link, bandwidth_gbps=a.bandwidth_gbps,
                       latency_us=a.latency_us, cap_gbps=a.cap_gbps, lookahead=a.lookahead, tau=a.tau)
    spec.check(num_experts, a.device)
    if POLICIES[spec.policy].needs_trace and a.oracle_trace is None:
        raise ValueError(f"policy {spec.policy!r} needs --oracle-trace FILE (a trace of an identical earlier run)")
    return spec


def model_config(model: str):
    """The architecture, read without loading weights (so arguments are checked first)."""
    from artifact.model.config import ModelConfig, get_preset
    if model == "tiny":
        return get_preset("tiny")
    return ModelConfig.from_hf(Path(model))


def load(a):
    from artifact.model.checkpoint import load_checkpoint
    dtype = a.dtype or ("float32" if a.model == "tiny" else "bfloat16")
    return load_checkpoint(a.model, dtype=dtype, device=a.device, resident=not getattr(a, "offload", False))


def prompt_id(tokens: list[int]) -> str:
    """A command-line prompt's identity is its tokens (an oracle trace must be of the same prompts)."""
    import hashlib
    return "cli/" + hashlib.sha1(json.dumps(tokens).encode()).hexdigest()[:12]


def cmd_generate(a):
    from artifact.offload.runner import check_device, run
    from artifact.model.tasks import encode
    from artifact.offload.trace import Trace
    dc = decode_config(a)
    check_device(a.device)
    cfg = model_config(a.model)
    spec = offload_spec(a, cfg.num_experts)
    if a.record_trace and a.record_trace.exists() and not a.force:
        raise FileExistsError(f"{a.record_trace} exists; pass --force to replace it")
    if not 1 <= len(a.prompt) <= 8:
        raise ValueError(f"give 1-8 --prompt values (one batch), got {len(a.prompt)}")
    oracle = Trace.load(a.oracle_trace, expect_config_hash=cfg.config_hash()) if a.oracle_trace else None
    loaded = load(a)
    tok = loaded.tokenizer
    prompts = [tok.encode(p) if a.raw else encode(tok, p) for p in a.prompt]
    res = run(loaded, prompts, len(prompts), dc, spec=spec, device=a.device, oracle=oracle,
              record=bool(a.record_trace), prompt_ids=[prompt_id(p) for p in prompts])
    if a.record_trace:
        res.trace.save(a.record_trace)
    text = [tok.decode(t, skip_special_tokens=True) for t in res.tokens]
    if a.json:
        print(json.dumps({"tokens": res.tokens, "text": text, "stats": res.stats}))
    else:
        for t in text:
            print(t)
        print(_table(res.stats), file=sys.stderr)


def cmd_trace(a):
    from artifact.offload.runner import check_device, run
    from artifact.model.tasks import prompts
    from artifact.offload.trace import mean_working_set
    dc = decode_config(a)
    check_device(a.device)
    if a.out.exists() and not a.force:
        raise FileExistsError(f"{a.out} exists; pass --force to replace it")
    if not 1 <= a.batch_size <= 8:
        raise ValueError(f"--batch-size must be 1-8, got {a.batch_size}")
    loaded = load(a)
    ids, ps = prompts(loaded.tokenizer, a.task, a.n, a.seed)
    res = run(loaded, ps, a.batch_size, dc, device=a.device, record=True, prompt_ids=ids, task=a.task)
    res.trace.save(a.out)
    print(f"{a.out}: {len(res.trace)} demands, {res.trace.accesses} expert accesses, "
          f"mean working set W = {mean_working_set(res.trace):.1f} experts/layer/step, "
          f"{res.stats['tokens_per_second']:.1f} tokens/s")


def cmd_simulate(a):
    from artifact.offload.sim import sweep
    from artifact.offload.trace import Trace
    for p in a.policies:
        if p not in POLICIES:
            raise ValueError(f"unknown policy {p!r}; choose from {sorted(POLICIES)}")
    traces = [Trace.load(t) for t in a.trace]
    df = sweep(traces, a.cache_ratios, a.policies, progress=not a.json, lookahead=a.lookahead, tau=a.tau)
    if a.csv:
        from artifact.paths import atomic_write_text
        atomic_write_text(a.csv, df.to_csv(index=False))
        print(f"wrote {len(df)} rows to {a.csv}", file=sys.stderr)
    if a.json:
        print(df.to_json(orient="records"))
    elif not a.csv:
        cols = ["task", "batch_size", "cache_ratio", "cache_experts", "policy", "demand_misses",
                "speculative_transfers", "prefetch_hits", "wasted_prefetches", "misses_vs_lru"]
        print(df[cols].to_string(index=False))


def _table(stats: dict) -> str:
    return "\n".join(f"{k:>24}: {v:.4g}" if isinstance(v, float) else f"{k:>24}: {v}" for k, v in stats.items())


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m artifact", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)

    g = sub.add_parser("generate", help="decode prompts (resident or offloaded) and print tokens and stats")
    add_model_args(g)
    add_decode_args(g)
    add_offload_args(g)
    g.add_argument("--prompt", action="append", required=True, help="repeat for a batch (1-8)")
    g.add_argument("--raw", action="store_true", help="encode prompts as is, without the chat template")
    g.add_argument("--record-trace", type=Path, default=None)
    g.add_argument("--force", action="store_true", help="replace an existing --record-trace file")
    g.add_argument("--json", action="store_true")
    g.set_defaults(fn=cmd_generate)

    t = sub.add_parser("trace", help="record the routing trace of a task run")
    add_model_args(t)
    add_decode_args(t)
    t.add_argument("--task", required=True)
    t.add_argument("--n", type=int, default=8, help="prompts")
    t.add_argument("--batch-size", type=int, default=1)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--force", action="store_true")
    t.set_defaults(fn=cmd_trace)

    s = sub.add_parser("simulate", help="replay traces through policies and capacities (exact miss counts)")
    s.add_argument("--trace", type=Path, action="append", required=True)
    s.add_argument("--cache-ratios", type=_floats, default=[0.43, 0.83, 1.0, 1.3, 1.73])
    s.add_argument("--policies", type=_names, default=list(POLICIES))
    s.add_argument("--lookahead", type=int, default=1)
    s.add_argument("--tau", type=int, default=4)
    s.add_argument("--json", action="store_true")
    s.add_argument("--csv", type=Path, default=None)
    s.set_defaults(fn=cmd_simulate)

    from artifact.experiments.bench import add_cli as add_bench_cli
    from artifact.experiments.notebooks import add_cli as add_notebooks_cli
    from artifact.experiments.submit import add_cli as add_submit_cli
    add_bench_cli(sub)
    add_notebooks_cli(sub)
    add_submit_cli(sub)
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        rc = args.fn(args)             # a command may return an exit code (notebooks: failures)
    except (ValueError, KeyError, FileNotFoundError, FileExistsError, RuntimeError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"error: {msg}", file=sys.stderr)
        return 2
    return int(rc or 0)

