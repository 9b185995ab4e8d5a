"""Command line: python -m artifact {generate,trace,simulate,bench,report,merge,notebooks} ...

Every argument is checked before a checkpoint's weights are read: values and flags first, then what needs
the config or the tokenizer (positions, the oracle trace's prompts, the tokenizer's fit to the vocabulary),
and every output path is probed for writability, so a bad input costs seconds, not a load or a finished
run. Errors a user can fix (artifact.errors.UserError, and a missing, existing or unwritable file) print one
line and exit 2; anything else is a bug and shows its traceback. Every command sets torch's thread count
from one setting (--threads; default: Settings.torch_threads resolved by resolve_threads)."""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

import pandas as pd
import torch

from artifact.errors import CheckpointError, ResultFileError, SettingError, UserError
from artifact.experiments import bench, notebooks, submit
from artifact.experiments.settings import Settings, load_profile, parse_override, resolve_threads
from artifact.model.checkpoint import DTYPES, _with_token_ids, load_checkpoint, load_tokenizer, tiny_checkpoint
from artifact.model.config import ModelConfig, get_preset
from artifact.model.decode import MAX_BATCH, MODES, DecodeConfig
from artifact.model.tasks import TASKS, encode, load_task, prompts
from artifact.offload.link import LINKS
from artifact.offload.policies import POLICIES, check_policy, split_policies
from artifact.offload.runner import OffloadSpec, RunSettings, check_device, check_oracle_before_load, run
from artifact.offload.sim import BOUNDS, COUNTS, PHASES, check_spec, phase_columns, replay, sweep
from artifact.offload.synth import add_cli as add_synth_cli
from artifact.offload.timeline import PRIORITIES
from artifact.offload.trace import Trace, mean_working_set
from artifact.paths import atomic_write_text
from artifact.validate import check_number

D = Settings()          # every default below comes from the settings dataclass: one source of truth

# OSErrors that name a user's file: a path given wrong, not a broken machine.
USER_OS_ERRORS = (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError, NotADirectoryError)

# Flags that only mean something for an offloaded run, with the defaults they take then (from Settings).
# argparse's default is None, so "given explicitly" is known after parsing and such a flag without
# --offload is refused instead of silently ignored.
OFFLOAD_DEFAULTS = {"cache_experts": None, "policy": D.policies[0], "link": D.link, "bandwidth_gbps": D.link_gbps,
                    "latency_us": D.latency_us, "link_priority": D.link_priority, "cap_gbps": None,
                    "lookahead": D.lookahead, "tau": D.tau, "oracle_trace": None}


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _floats(s: str) -> list[float]:
    try:
        return [float(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {s!r}") from None


def _ints(s: str) -> list[int]:
    try:
        return [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from None


def _names(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def add_model_args(p: argparse.ArgumentParser):
    p.add_argument("--model", default=D.model, help="'tiny' (built on first use) or a checkpoint directory")
    p.add_argument("--dtype", default=D.dtype,
                   help="float32 | bfloat16 (default: float32 for tiny, bfloat16 otherwise)")
    p.add_argument("--device", default=D.device, help="cpu | cuda")


def add_threads_arg(p: argparse.ArgumentParser, bench_like: bool = False):
    where = "the profile's torch_threads" if bench_like else "Settings.torch_threads"
    p.add_argument("--threads", type=int, default=None,
                   help=f"torch intra-op threads (default: {where}; unset: 1 for the tiny model or no model on "
                        "the CPU, where more threads only spin, else torch's default of one per core)")


def add_decode_args(p: argparse.ArgumentParser):
    p.add_argument("--gen-length", type=int, default=D.gen_length, help="tokens generated per prompt")
    p.add_argument("--steps", type=int, default=D.steps, help="max denoising steps per 32-token block")
    p.add_argument("--threshold", type=float, default=D.threshold)
    p.add_argument("--mode", choices=MODES, default=D.mode)


def add_offload_args(p: argparse.ArgumentParser):
    p.add_argument("--offload", action="store_true", help="experts live in host memory behind a per-layer cache")
    # Defaults are None here and filled from OFFLOAD_DEFAULTS by offload_flags (see there).
    p.add_argument("--cache-experts", type=int, default=None, help="C: device slots per MoE layer (with --offload)")
    p.add_argument("--policy", default=None, help=f"one of {sorted(n for n, s in POLICIES.items() if s.engine_ok)} "
                                                  f"(default: {OFFLOAD_DEFAULTS['policy']})")
    p.add_argument("--link", default=None, help=f"one of {LINKS} (default: {OFFLOAD_DEFAULTS['link']})")
    p.add_argument("--bandwidth-gbps", type=float, default=None,
                   help="emulated link bandwidth (default: PCIe 4 scaled to this model's expert size)")
    p.add_argument("--latency-us", type=float, default=None, help=f"default: {OFFLOAD_DEFAULTS['latency_us']}")
    p.add_argument("--link-priority", choices=PRIORITIES, default=None,
                   help="fifo: one copy queue in issue order; demand: speculative copies never delay a demand copy "
                        f"by more than one expert copy (default: {OFFLOAD_DEFAULTS['link_priority']})")
    p.add_argument("--cap-gbps", type=float, default=None, help="throttle: cap the link's bandwidth")
    p.add_argument("--lookahead", type=int, default=None, help=f"default: {OFFLOAD_DEFAULTS['lookahead']}")
    p.add_argument("--tau", type=int, default=None, help=f"default: {OFFLOAD_DEFAULTS['tau']}")
    p.add_argument("--oracle-trace", type=Path, default=None, help="trace of an identical earlier run (oracle)")


def offload_flags(a) -> None:
    """Refuse offload flags given without --offload (they would be ignored), then fill in the defaults."""
    given = [_flag(k) for k in OFFLOAD_DEFAULTS if getattr(a, k) is not None]
    if not a.offload and given:
        raise SettingError(f"{', '.join(given)} {'needs' if len(given) == 1 else 'need'} --offload (without it "
                           "every expert is resident and these flags would be ignored)")
    for k, v in OFFLOAD_DEFAULTS.items():
        if getattr(a, k) is None:
            setattr(a, k, v)


def decode_config(a) -> DecodeConfig:
    check_number("--gen-length", a.gen_length, low=1, integer=True)
    check_number("--steps", a.steps, low=1, integer=True)
    check_number("--threshold", a.threshold, low=0, low_open=True, high=1)
    return DecodeConfig(gen_length=a.gen_length, steps=a.steps, threshold=a.threshold, mode=a.mode)


def offload_spec(a, cfg: ModelConfig, dtype: str) -> OffloadSpec | None:
    offload_flags(a)
    if not a.offload:
        return None
    if a.cache_experts is None:
        raise SettingError("--offload needs --cache-experts C (device slots per MoE layer)")
    for flag in ("bandwidth_gbps", "cap_gbps"):
        check_number(f"--{flag.replace('_', '-')}", getattr(a, flag), low=0, low_open=True, allow_none=True)
    s = RunSettings(link=a.link, link_gbps=a.bandwidth_gbps, latency_us=a.latency_us, link_priority=a.link_priority,
                    lookahead=a.lookahead, tau=a.tau)
    eb = cfg.expert_params * DTYPES[dtype].itemsize       # what one expert transfer moves once loaded
    spec = OffloadSpec.from_settings(s, a.cache_experts, a.policy, expert_bytes=eb, cap_gbps=a.cap_gbps)
    spec.check(cfg.num_experts, a.device)
    if check_policy(spec.policy).needs_trace and a.oracle_trace is None:
        raise SettingError(f"policy {spec.policy!r} needs --oracle-trace FILE (a trace of an identical earlier run)")
    if a.oracle_trace is not None and not check_policy(spec.policy).needs_trace:
        users = sorted(n for n, c in POLICIES.items() if c.needs_trace and c.engine_ok)
        raise SettingError(f"--oracle-trace is read only by {users}; policy {spec.policy!r} would ignore it")
    return spec


def check_output(path: Path | None, flag: str, force: bool = False, exists_ok: bool = False) -> None:
    """Before any work: `path` can be written the way artifact.paths.atomic_write_* writes it (a temporary file
    beside it, then a rename). The probe creates and removes such a file in the nearest existing directory
    (so nothing is left when the directories are still to be made), so an unwritable destination fails
    now, not after a finished run. An existing file is refused unless `force` (or `exists_ok`: a resumable
    result file)."""
    if path is None:
        return
    try:
        if path.is_dir():
            raise IsADirectoryError(f"{flag} {path} is a directory; give a file name")
        if path.exists() and not (force or exists_ok):
            raise FileExistsError(f"{path} exists; pass --force to replace it")
        where = path.parent
        while not where.exists():
            where = where.parent
        if not where.is_dir():
            raise NotADirectoryError(f"{flag} {path}: {where} is a file, not a directory")
        fd, probe = tempfile.mkstemp(dir=where, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except (FileExistsError, IsADirectoryError, NotADirectoryError):
        raise                                              # ours above, each naming the path and the fix
    except (OSError, ValueError, OverflowError) as e:     # EACCES, EROFS, ENAMETOOLONG, a NUL byte, ...
        raise ResultFileError(f"{flag} {path}: cannot write there ({getattr(e, 'strerror', None) or e}); "
                              "choose a writable path") from None


@contextlib.contextmanager
def _checkpoint_errors(model: str):
    """The core reports a damaged checkpoint (bad config, missing or misshapen tensor) as a ValueError or
    KeyError that names the file. Here the only input is the user's checkpoint directory, so such an error
    is about it: it becomes a CheckpointError (one line). The tiny model is built by the artifact itself,
    so an error there is a bug and keeps its traceback."""
    if model == "tiny":
        yield
        return
    try:
        yield
    except (ValueError, KeyError) as e:
        if isinstance(e, UserError):
            raise
        raise CheckpointError(e.args[0] if isinstance(e, KeyError) and e.args else str(e)) from e


def model_config(model: str) -> ModelConfig:
    """The architecture, read without loading weights (so arguments are checked first)."""
    if model == "tiny":
        return get_preset("tiny")
    with _checkpoint_errors(model):
        return ModelConfig.from_hf(Path(model))


def torch_dtype(a) -> str:
    dtype = a.dtype or ("float32" if a.model == "tiny" else "bfloat16")
    if dtype not in DTYPES:
        raise SettingError(f"--dtype {dtype!r} unknown; choose one of {sorted(DTYPES)}")
    return dtype


def tokenizer_and_config(model: str, cfg: ModelConfig):
    """The tokenizer and the config with the tokenizer's mask/eos ids (what the loader will use), read
    without the weights: prompt lengths, the oracle trace's prompt ids and config hash, and the tokenizer's
    fit to vocab_size are checked before a long load."""
    root = tiny_checkpoint() if model == "tiny" else Path(model)
    with _checkpoint_errors(model):
        tok = load_tokenizer(root)
        cfg = _with_token_ids(cfg, tok, root)
    if len(tok) > cfg.vocab_size:
        raise CheckpointError(f"{root}: the tokenizer has {len(tok)} tokens but config.json's vocab_size is "
                              f"{cfg.vocab_size}, so ids >= {cfg.vocab_size} have no embedding; use the tokenizer "
                              "that belongs to this checkpoint")
    return tok, cfg


def load(a, cfg: ModelConfig | None = None):
    """The weights. `cfg`, when given, is what the checks used; the loader must arrive at the same one."""
    with _checkpoint_errors(a.model):
        loaded = load_checkpoint(a.model, dtype=torch_dtype(a), device=a.device,
                                 resident=not getattr(a, "offload", False))
    assert cfg is None or loaded.cfg.config_hash() == cfg.config_hash(), "checked another config than loaded"
    return loaded


def check_positions(cfg: ModelConfig, gen_length: int, prompt_lengths: list[int] | None = None) -> None:
    """The decoder's position limit, checked before the model runs (prompt lengths when known, else 1)."""
    n = cfg.block_length
    need = max(-(-(p + gen_length) // n) * n for p in (prompt_lengths or [1]))
    if need > cfg.max_position_embeddings:
        raise SettingError(f"--gen-length {gen_length} with these prompts needs {need} positions > the model's "
                           f"max_position_embeddings {cfg.max_position_embeddings}")


def prompt_id(tokens: list[int]) -> str:
    """A command-line prompt's identity is its tokens (an oracle trace must be of the same prompts)."""
    return "cli/" + hashlib.sha1(json.dumps(tokens).encode()).hexdigest()[:12]


def cmd_generate(a):
    dc = decode_config(a)
    check_device(a.device)
    dtype = torch_dtype(a)
    if not a.record_trace and a.force:
        raise SettingError("--force replaces an existing --record-trace file; give --record-trace too")
    if not 1 <= len(a.prompt) <= MAX_BATCH:
        raise SettingError(f"give 1-{MAX_BATCH} --prompt values (one batch), got {len(a.prompt)}")
    if any(not p.strip() for p in a.prompt):
        raise SettingError("a --prompt is empty" + (" (--raw)" if a.raw else "") + "; give the text to answer")
    cfg = model_config(a.model)
    spec = offload_spec(a, cfg, dtype)
    check_output(a.record_trace, "--record-trace", a.force)
    check_positions(cfg, dc.gen_length)
    tok, cfg = tokenizer_and_config(a.model, cfg)           # the tokenizer only: no weights read yet
    ps = [tok.encode(p) if a.raw else encode(tok, p) for p in a.prompt]
    if any(not p for p in ps):
        raise SettingError("a --prompt encodes to no tokens; give the text to answer")
    check_positions(cfg, dc.gen_length, [len(p) for p in ps])
    ids = [prompt_id(p) for p in ps]
    oracle = None
    if a.oracle_trace:
        oracle = Trace.load(a.oracle_trace, expect_config_hash=cfg.config_hash())
        check_oracle_before_load(oracle, cfg, ids, len(ps), dc)
    loaded = load(a, cfg)
    res = run(loaded, ps, len(ps), dc, spec=spec, device=a.device, oracle=oracle,
              record=bool(a.record_trace), prompt_ids=ids)
    res.stats["threads"] = torch.get_num_threads()
    text = [tok.decode(t, skip_special_tokens=True) for t in res.tokens]
    if a.json:
        print(json.dumps({"tokens": res.tokens, "text": text, "stats": res.stats}))
    else:
        for t in text:
            print(t)
        print(_table(res.stats), file=sys.stderr)
    if a.record_trace:              # after the output: a failing write (disk full) loses the file, not the run
        res.trace.save(a.record_trace)


def cmd_trace(a):
    dc = decode_config(a)
    check_device(a.device)
    torch_dtype(a)
    cfg = model_config(a.model)
    check_output(a.out, "--out", a.force)
    check_number("--batch-size", a.batch_size, low=1, high=MAX_BATCH, integer=True)
    check_number("--seed", a.seed, low=0, integer=True)
    if a.task not in TASKS:
        raise SettingError(f"unknown task {a.task!r}; choose one of {TASKS}")
    available = len(load_task(a.task))
    check_number("--n", a.n, low=1, high=available, integer=True)
    if a.batch_size > a.n:                   # the trace would say batch size B but hold smaller batches
        raise SettingError(f"--batch-size {a.batch_size} needs at least that many prompts; got --n {a.n}")
    check_positions(cfg, dc.gen_length)
    tok, cfg = tokenizer_and_config(a.model, cfg)           # the tokenizer only: no weights read yet
    ids, ps = prompts(tok, a.task, a.n, a.seed)
    check_positions(cfg, dc.gen_length, [len(p) for p in ps])
    loaded = load(a, cfg)
    res = run(loaded, ps, a.batch_size, dc, device=a.device, record=True, prompt_ids=ids, task=a.task)
    res.trace.save(a.out)
    print(f"{a.out}: {len(res.trace)} demands, {res.trace.accesses} expert accesses, "
          f"mean working set W = {mean_working_set(res.trace):.1f} experts/layer/step, "
          f"{res.stats['tokens_per_second']:.1f} tokens/s, {torch.get_num_threads()} torch threads")


def replay_capacities(traces: list[Trace], capacities: list[int], policies: list[str], **options):
    """Like sim.sweep, at absolute capacities C instead of ratios C/W (cache_ratio = C / W per trace), so
    an engine run at --cache-experts C can be replayed by hand."""
    rows = []
    for t in traces:
        W = mean_working_set(t)
        for C in capacities:
            for p in policies:
                row = {"task": t.meta.get("task"), "batch_size": t.meta.get("batch_size"), "trace": str(t.path or ""),
                       "policy": p, "cache_ratio": C / W, "working_set": W, "cache_experts": C}
                row.update(replay(t, p, C, **options))
                rows.append(row)
    df = pd.DataFrame(rows)
    lru = {(r.trace, r.cache_experts): r.demand_misses for r in df.itertuples() if r.policy == "demand"}
    df["misses_vs_lru"] = [m / lru[k] if lru.get(k) else float("nan")
                           for m, k in zip(df.demand_misses, zip(df.trace, df.cache_experts))]
    return df


def cmd_simulate(a):
    if not a.policies:
        raise SettingError("--policies is empty; give at least one of " + ", ".join([*POLICIES, *BOUNDS]))
    for p in a.policies:
        check_spec(p)                       # a policy spec, or the bound `min`
    check_number("--lookahead", a.lookahead, low=1, integer=True)
    check_number("--tau", a.tau, low=1, integer=True)
    if a.cache_experts is not None:
        if not a.cache_experts:
            raise SettingError("--cache-experts is empty; give capacities C, e.g. --cache-experts 40")
    else:
        ratios = a.cache_ratios if a.cache_ratios is not None else list(D.cache_ratios)
        if not ratios:
            raise SettingError("--cache-ratios is empty; give ratios C/W, e.g. --cache-ratios 0.5,1")
        for r in ratios:
            check_number("--cache-ratios", r, low=0, low_open=True)
    for flag, values in (("--trace", [str(t.resolve()) for t in a.trace]), ("--policies", a.policies),
                         ("--cache-ratios", a.cache_ratios or []), ("--cache-experts", a.cache_experts or [])):
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:
            raise SettingError(f"{flag} lists {twice} more than once; give each once")
    check_output(a.csv, "--csv", a.force)
    traces = [Trace.load(t) for t in a.trace]
    if a.cache_experts is not None:
        for t in traces:
            for C in a.cache_experts:
                check_number(f"--cache-experts (trace {t.path})", C, low=1, high=t.meta["num_experts"], integer=True)
        df = replay_capacities(traces, a.cache_experts, a.policies, by_phase=a.by_phase, lookahead=a.lookahead,
                               tau=a.tau)
    else:
        df = sweep(traces, ratios, a.policies, progress=not a.json, by_phase=a.by_phase, lookahead=a.lookahead,
                   tau=a.tau)
    if a.csv:                               # a CSV holds flat columns: <count>_<phase> beside the totals
        atomic_write_text(a.csv, (phase_columns(df) if a.by_phase else df).to_csv(index=False))
        print(f"wrote {len(df)} rows to {a.csv}", file=sys.stderr)
    if a.json:                              # rows keep "by_phase": {"prefill": {...}, "first": {...}, "later": {...}}
        print(df.to_json(orient="records"))
    elif not a.csv:
        cols = ["task", "batch_size", "cache_ratio", "cache_experts", "policy", *COUNTS[1:5], "misses_vs_lru"]
        if a.by_phase:
            print(_phase_table(df, cols[:5], COUNTS[1:5]))
        else:
            print(df[cols].to_string(index=False))


def _phase_table(df, keys: list[str], counts) -> str:
    """One line per (row, phase) and the row's total: the per-phase table of `simulate --by-phase`."""
    rows = []
    for r in df.to_dict("records"):
        for phase in (*PHASES, "total"):
            got = r if phase == "total" else r["by_phase"][phase]
            rows.append({**{k: r[k] for k in keys}, "phase": phase, **{c: got[c] for c in counts}})
    return pd.DataFrame(rows).to_string(index=False)


def _table(stats: dict) -> str:
    lines = []
    for k, v in stats.items():
        if isinstance(v, dict):              # by_phase: one line per phase
            lines += [f"{k + '.' + p:>24}: " + ", ".join(f"{c}={n}" for c, n in d.items()) for p, d in v.items()]
        else:
            lines.append(f"{k:>24}: {v:.4g}" if isinstance(v, float) else f"{k:>24}: {v}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m artifact", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)

    g = sub.add_parser("generate", help="decode prompts (resident or offloaded) and print tokens and stats")
    add_model_args(g)
    add_decode_args(g)
    add_offload_args(g)
    g.add_argument("--prompt", action="append", required=True, help=f"repeat for a batch (1-{MAX_BATCH})")
    g.add_argument("--raw", action="store_true", help="encode prompts as is, without the chat template")
    g.add_argument("--record-trace", type=Path, default=None)
    g.add_argument("--force", action="store_true", help="replace an existing --record-trace file")
    g.add_argument("--json", action="store_true")
    add_threads_arg(g)
    g.set_defaults(fn=cmd_generate)

    t = sub.add_parser("trace", help="record the routing trace of a task run")
    add_model_args(t)
    add_decode_args(t)
    t.add_argument("--task", required=True, help=f"one of {TASKS}")
    t.add_argument("--n", type=int, default=D.trace_n_prompts, help="prompts")
    t.add_argument("--batch-size", type=int, default=1)
    t.add_argument("--seed", type=int, default=D.seed)
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--force", action="store_true")
    add_threads_arg(t)
    t.set_defaults(fn=cmd_trace)

    s = sub.add_parser("simulate", help="replay traces through policies and capacities (exact miss counts)")
    s.add_argument("--trace", type=Path, action="append", required=True)
    cap = s.add_mutually_exclusive_group()
    cap.add_argument("--cache-ratios", type=_floats, default=None,
                     help=f"C/W per trace (default: {','.join(f'{r:g}' for r in D.cache_ratios)})")
    cap.add_argument("--cache-experts", type=_ints, default=None,
                     help="absolute capacities C (slots per MoE layer), e.g. to replay an engine run by hand")
    s.add_argument("--policies", type=split_policies, default=list(D.sim_policies),
                   help="policy specs name[:key=value,...], comma-separated; also the bound min "
                        "(relaxed MIN, the floor of any C-slot demand paging; belady is this cache's floor)")
    s.add_argument("--lookahead", type=int, default=D.lookahead)
    s.add_argument("--tau", type=int, default=D.tau)
    s.add_argument("--by-phase", action="store_true",
                   help="also count per phase (prefill, first = a block's step 0, later): a by_phase object per "
                        "JSON row, <count>_<phase> CSV columns, or a per-phase table")
    s.add_argument("--json", action="store_true")
    s.add_argument("--csv", type=Path, default=None)
    s.add_argument("--force", action="store_true", help="replace an existing --csv file")
    add_threads_arg(s)
    s.set_defaults(fn=cmd_simulate)

    bench.add_cli(sub)
    for name in ("bench", "report", "merge"):
        add_threads_arg(sub.choices[name], bench_like=name == "bench")
    notebooks.add_cli(sub)
    submit.add_cli(sub)
    add_synth_cli(sub)
    for name in ("synth", "fit"):
        add_threads_arg(sub.choices[name])
    return ap


def set_threads(a) -> int | None:
    """torch's intra-op thread count for this command, from --threads or the settings (resolve_threads).
    bench: --threads N is the profile key torch_threads (part of the result file's settings). notebooks run
    in their own kernels, which take it from the profile (runs.setup)."""
    if not hasattr(a, "threads"):      # notebooks, trace-all, run-jobs: kernels and jobs take the profile's key
        return None
    if a.cmd == "bench":
        if a.threads is not None:
            if any(x.partition("=")[0].strip() == "torch_threads" for x in a.set or []):
                raise SettingError("give --threads N or --set torch_threads=N, not both")
            a.set = [*(a.set or []), f"torch_threads={a.threads}"]
        n = _bench_profile(a).threads
    else:
        check_number("--threads", a.threads, low=1, high=1024, integer=True, allow_none=True)
        n = resolve_threads(a.threads, getattr(a, "model", None), getattr(a, "device", "cpu"))
    torch.set_num_threads(n)
    return n


def _bench_profile(a):
    """The profile `bench` will run (as bench.cmd_bench loads it: --set overrides, then --model)."""
    overrides = dict(parse_override(s) for s in a.set or [])
    if a.model is not None:
        overrides["model"] = a.model
    return load_profile(a.profile, overrides)


def check_outputs(a) -> None:
    """Output paths of the commands registered by other modules (bench, report, merge, synth), probed
    before any work."""
    if a.cmd == "bench" and not a.list:
        out = a.out or bench.default_out(_bench_profile(a), bench.parse_shard(a.shard))
        check_output(out, "--out", exists_ok=True)              # an existing result file is resumed
    elif a.cmd == "report":
        check_output(a.csv, "--csv", a.force)
    elif a.cmd == "merge":
        check_output(a.out, "--out", a.force)
    elif a.cmd == "synth":
        check_output(a.out, "--out", a.force)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        set_threads(args)
        check_outputs(args)
        rc = args.fn(args)             # a command may return an exit code (notebooks: failures)
    except (UserError, *USER_OS_ERRORS) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return int(rc or 0)
