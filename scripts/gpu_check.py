"""The GPU check: one command, at most 6 minutes on one H200, no checkpoint, nothing downloaded.

Seven steps, in this order, each written to the JSON report (--out, atomically) as soon as it ends:
  1. environment     torch, CUDA, the GPU, host; topology where readable: nvidia-smi topo -m, the GPU's
                     NUMA node, its PCIe generation and width
  2. cuda_tests      the CUDA tests of scripts/gpu_tests.py (an explicit list of files, pytest -m cuda), with
                     a time limit; the tests collected first, so a collection failure or fewer tests run
                     than collected is its own exit code
  3. pinned_peak     pinned H2D GB/s at 256 MiB and at one expert's size (back to back), from a fresh
                     pinned buffer and from a store registered in place (pin_host), as the engine copies
  4. capped_link     the CUDA link capped at 0.5x and 0.25x of its measured peak: achieved vs target
  5. moe_layer       one LLaDA2.0-mini-shaped MoE layer, expert_kernel loop vs grouped: host ms, GPU ms,
                     outputs equal within a stated bf16 tolerance (max difference reported)
  6. pinned_store    page-locking a 9 GB host store in place (cudaHostRegister): seconds, bytes pinned
  7. engine          a 6-layer mini-shaped random model at batch 1 and 4, C/W 0.83/1/1.73, demand vs
                     last_step, steady state: one untimed warm-up block first, threshold 1.0 so every
                     forward is a denoising step of a fixed count (steps per block); prefill_ms apart from
                     denoise_ms_per_forward (wall, GPU synchronised at each forward's end),
                     host_ms_per_forward (CPU time from the forward's start to its last launch), stall, link
                     busy / wall, kernel launches per forward, tokens equal to the resident model's

Link utilisation is reported as link busy over wall time (bytes over the summed copy durations reads
~95% whatever happens). Random weights route differently from the trained model: the figures check
the machinery and the link, not the paper's claims.

Exit codes: 0 done; 1 the CUDA tests failed or timed out; 2 bad arguments; 3 no CUDA GPU visible
(nothing was run); 4 a step raised (the report keeps every other step, and the error); 5 the CUDA tests
could not be collected, or fewer ran than were collected.
--device cpu --allow-cpu runs the same steps in miniature with the emulated link (tiny shapes; steps
that need CUDA say why they were skipped): a dry run for machines without a GPU (the tests use it)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check_steps import capped_link, moe_layer, pinned_peak, pinned_store  # noqa: E402
from gpu_profile import ForwardHooks, call_kind  # noqa: E402
from gpu_tests import cuda_tests  # noqa: E402

EXIT_OK, EXIT_TESTS_FAILED, EXIT_USAGE, EXIT_NO_GPU, EXIT_ERROR, EXIT_TESTS_NOT_RUN = 0, 1, 2, 3, 4, 5
ROOT = Path(__file__).resolve().parent.parent
STEPS = ("environment", "cuda_tests", "pinned_peak", "capped_link", "moe_layer", "pinned_store", "engine")
NOTE = (
    "Random weights route differently from the trained LLaDA2.0-mini: the working set W, its "
    "step-to-step reuse and the tokens accepted per forward differ, so these figures check the "
    "machinery and the link on this machine; they do not reproduce the paper's figures."
)
NO_GPU = "gpu_check: no CUDA GPU visible (torch.cuda.is_available() is False); nothing was run."


class OneLineParser(argparse.ArgumentParser):
    """A bad flag or value is one line on stderr and exit 2, as `python -m artifact` refuses one (its
    OneLineParser, which this script does not import: it reads its flags before anything of the package)."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"error: {self.prog}: {message} (see --help)\n")


def check_engine_args(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """The engine step's flags, shared with scripts/gpu_check_graphs.py: parsed in place, or ap.error; the
    run flags by RunSpec's own check (base_spec), before the script looks for a GPU."""
    try:
        a.ratios = [float(r) for r in a.ratios.split(",") if r.strip()]
        a.batches = [int(b) for b in a.batches.split(",") if b.strip()]
    except ValueError:
        ap.error(f"--ratios and --batches must be comma-separated numbers, got {a.ratios!r}, {a.batches!r}")
    if not a.ratios or min(a.ratios) <= 0:
        ap.error(f"--ratios must be positive, got {a.ratios}")
    if not a.batches or not all(1 <= b <= 8 for b in a.batches):
        ap.error(f"--batches must be in [1, 8], got {a.batches}")
    for name in ("prompt_length", "gen_length"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if a.layers < 2:
        ap.error("--layers must be >= 2 (layer 0 is dense)")
    if a.device not in ("cuda", "cpu"):
        ap.error(f"--device must be cuda or cpu, got {a.device!r}")
    if a.device == "cpu" and not a.allow_cpu:
        ap.error("--device cpu is a dry run of the pipeline: add --allow-cpu")
    try:
        base_spec(a, device=a.device, link="cuda" if a.device == "cuda" else "emulated")
    except ImportError as e:
        ap.error(f"cannot import the artifact package ({e}); run scripts/gpu_check.sh from the checkout")
    except ValueError as e:  # artifact.errors.SettingError, naming the flag
        ap.error(str(e))


def engine_parser(doc: str, out: str, ratios: str, which: str) -> argparse.ArgumentParser:
    """The parser with the engine step's flags, shared with scripts/gpu_check_graphs.py (check_engine_args
    checks them): `out` the report's file under results/, `ratios` the default C/W ratios, `which` what the
    help says of the configurations ("of step 7", ", in the order they run"). The caller adds its own
    flags."""
    ap = OneLineParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "results" / out)
    ap.add_argument("--ratios", default=ratios, help=f"C/W ratios{which}")
    ap.add_argument("--batches", default="1,4", help=f"batch sizes{which}")
    ap.add_argument("--prompt-length", type=int, default=64)
    ap.add_argument("--gen-length", type=int, default=64)
    ap.add_argument("--layers", type=int, default=6, help="model layers, layer 0 dense (step 7's model: 6)")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu with --allow-cpu (dry run)")
    ap.add_argument("--allow-cpu", action="store_true", help="dry run on the CPU: tiny shapes, emulated link")
    # The run's options (artifact/offload/spec.py RunSpec); not given: RunSpec's defaults (base_spec), checked
    # by check_engine_args once the flags are read.
    for flag, (kind, what) in RUN_FLAGS.items():
        ap.add_argument(flag, type=kind, default=None, help=f"{what} (default: RunSpec's)")
    return ap


RUN_FLAGS = {
    "--forward": (str, "eager | segmented"),
    "--expert-kernel": (str, "grouped | loop"),
    "--link-priority": (str, "fifo | demand"),
    "--lookahead": (int, "last_step: MoE layers ahead"),
    "--tau": (int, "interval_refresh: steps between refreshes"),
}


def base_spec(a, **fields):
    """The engine step's RunSpec: the run flags given (the rest RunSpec's defaults) and `fields`; a bad
    value is a SettingError naming its flag (check_engine_args refuses it before the run)."""
    from artifact.errors import SettingError, SpecError
    from artifact.offload.spec import RunSpec

    keys = [flag[2:].replace("-", "_") for flag in RUN_FLAGS]
    given = {k: getattr(a, k) for k in keys if getattr(a, k, None) is not None}
    try:
        return RunSpec(**given, **fields)
    except SpecError as e:
        raise SettingError(f"--{e.field.replace('_', '-')}: {e}") from None


def parse_args(argv=None) -> argparse.Namespace:
    ap = engine_parser(__doc__, "gpu_check.json", "0.83,1.0,1.73", " of step 7")
    ap.add_argument("--store-gb", type=float, default=9.0, help="size of the host store pinned in step 6")
    ap.add_argument("--skip-tests", action="store_true", help="skip step 2 (pytest -m cuda)")
    ap.add_argument("--test-timeout", type=int, default=150, help="seconds for step 2")
    a = ap.parse_args(argv)
    check_engine_args(ap, a)
    if not a.store_gb > 0:
        ap.error(f"--store-gb must be > 0, got {a.store_gb}")
    if a.test_timeout < 1:
        ap.error(f"--test-timeout must be >= 1 (seconds), got {a.test_timeout}")
    return a


def log(msg: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --- the steps ------------------------------------------------------------------------------------
def environment(a, torch) -> dict:
    cuda = a.device == "cuda"
    out = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "host": platform.node(),
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "grouped_mm": hasattr(torch, "_grouped_mm"),
        "dry_run_on_cpu": not cuda,
    }
    if cuda:
        free, total = torch.cuda.mem_get_info()
        out.update(capability=list(torch.cuda.get_device_capability()), free_bytes=free, total_bytes=total)
    out["topology"] = topology(cuda)
    return out


def _run(cmd: list[str]) -> str | None:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout if p.returncode == 0 else None


def topology(cuda: bool) -> dict:
    """What is readable about where the GPU sits: None where a source is missing (said so, not guessed)."""
    out = {"nvidia_smi_topo": None, "numa_node": None, "pcie": None, "sources": {}}
    if not cuda:
        out["sources"] = "dry run on the CPU: no GPU to place"
        return out
    out["nvidia_smi_topo"] = _run(["nvidia-smi", "topo", "-m"])
    q = _run(
        [
            "nvidia-smi",
            "--query-gpu=pci.bus_id,pcie.link.gen.current,pcie.link.gen.max,"
            "pcie.link.width.current,pcie.link.width.max",
            "--format=csv,noheader",
        ]
    )
    if q:
        bus, gen, gen_max, width, width_max = (x.strip() for x in q.splitlines()[0].split(","))
        out["pcie"] = {
            "bus_id": bus,
            "gen_current": gen,
            "gen_max": gen_max,
            "width_current": width,
            "width_max": width_max,
        }
        node = Path("/sys/bus/pci/devices") / bus.lower()[-12:] / "numa_node"  # 0000:xx:yy.z
        try:
            out["numa_node"] = int(node.read_text())
        except (OSError, ValueError):
            pass
        out["sources"] = {"pcie": "nvidia-smi --query-gpu", "numa_node": str(node)}
    return out


class ForwardTimer(ForwardHooks):
    """Per forward of the model: wall time (the GPU synchronised at the forward's end, so it is the GPU's
    time as the host sees it), host time (from the forward's start to its return, which is after its last
    launch, minus the time the host spent blocked in the layers' one sync each: the CPU time the forward's
    Python and launches take) and that sync wait, split by kind (prefill / denoise)."""

    def __init__(self, torch, model, cuda: bool):
        super().__init__(model)
        self.torch, self.cuda = torch, cuda
        self.counts = model.routing.host_counts
        self.rows: list[tuple[str, float, float, float]] = []

    def before(self, kind: str) -> None:
        self.kind, self.t0, self.w0 = kind, time.perf_counter(), self.counts.wait_seconds

    def after(self) -> None:
        host = time.perf_counter() - self.t0
        wait = self.counts.wait_seconds - self.w0
        if self.cuda:
            self.torch.cuda.synchronize()
        self.rows.append((self.kind, host - wait, time.perf_counter() - self.t0, wait))

    def summary(self) -> dict:
        pre = [r for r in self.rows if r[0] == "prefill"]
        den = [r for r in self.rows if r[0] == "denoise"]
        return {
            "prefill_forwards": len(pre),
            "prefill_ms": 1e3 * sum(r[2] for r in pre),
            "denoise_forwards": len(den),
            "denoise_ms_per_forward": 1e3 * statistics.mean(r[2] for r in den) if den else None,
            "host_ms_per_forward": 1e3 * statistics.mean(r[1] for r in den) if den else None,
            "sync_wait_ms_per_forward": 1e3 * statistics.mean(r[3] for r in den) if den else None,
            "denoise_seconds": sum(r[2] for r in den),
        }


MEASURES = {
    "prefill_ms": "wall ms of all prefill forwards of the run (the prompt's full blocks; "
    "not a denoising step)",
    "denoise_ms_per_forward": "mean wall ms of a denoising forward, the GPU synchronised at its end",
    "host_ms_per_forward": "mean CPU ms from a denoising forward's start to its return (after its last "
    "launch), less the time blocked in the layers' one sync each (sync_wait_ms_per_forward)",
    "sync_wait_ms_per_forward": "mean ms a denoising forward's host spent blocked in the router-count sync "
    "of its MoE layers (waiting for the GPU to reach that layer)",
    "stall_seconds": "time compute waited for copies (CUDA: event pairs around the compute stream's waits)",
    "link_busy_over_wall": "link busy seconds over the run's wall seconds (prefill and denoising forwards)",
    "launches_per_forward": "CUDA kernel launches per forward of a one-block run (torch.profiler; C/W 1)",
}


def engine(a, torch, cfg, dtype, report) -> dict:
    from artifact.model.decode import DecodeConfig
    from artifact.model.tiny import random_model
    from artifact.offload.replay.sim import capacity_for
    from artifact.offload.replay.trace import mean_working_set
    from artifact.offload.runner import decode_prompts

    cuda = a.device == "cuda"
    run = base_spec(a, device=a.device, link="cuda" if cuda else "emulated")
    out = report["engine"] = {
        "model": cfg.name,
        "layers": cfg.num_hidden_layers,
        "runs": [],
        "measures": MEASURES,
        "run": {
            k: getattr(run, k) for k in ("forward", "expert_kernel", "link_priority", "lookahead", "tau")
        },
    }
    t0 = time.perf_counter()
    loaded = random_model(cfg, seed=0, dtype=dtype, device=a.device, resident=True)
    out["build_seconds"] = time.perf_counter() - t0
    # Steady state: threshold 1.0 accepts no token early, so every block takes exactly `steps` denoising
    # forwards (a fixed count); eos never stops a row early. One untimed warm-up block per configuration.
    steps = cfg.block_length // 4
    dc = DecodeConfig(gen_length=a.gen_length, steps=steps, threshold=1.0, eos_early_stop=False)
    warm = DecodeConfig(gen_length=cfg.block_length, steps=steps, threshold=1.0, eos_early_stop=False)
    blocks = -(-a.gen_length // cfg.block_length)
    out["decode"] = {
        "threshold": 1.0,
        "steps_per_block": steps,
        "gen_length": a.gen_length,
        "warm_up": "one untimed block per configuration",
    }
    for batch in a.batches:
        # Block-aligned prompts: a block holding prompt tokens has fewer masks and ends in fewer steps.
        length = -(-a.prompt_length // cfg.block_length) * cfg.block_length
        prompts = random_prompts(torch, cfg, batch, length, seed=batch, spread=0)
        decode_prompts(loaded, prompts[:1], 1, run.replace(decode=warm))
        with ForwardTimer(torch, loaded.model, cuda) as ft:
            ref = decode_prompts(loaded, prompts, batch, run.replace(decode=dc), record=True)
        W = mean_working_set(ref.trace)
        out.setdefault("resident", []).append(
            {
                "batch": batch,
                "working_set": W,
                **ft.summary(),
                "launches_per_forward": launches_per_forward(
                    torch, a, loaded, prompts, batch, run.replace(decode=warm)
                ),
            }
        )
        for ratio in a.ratios:
            C = capacity_for(ratio, W, cfg.num_experts)
            for policy in ("demand", "last_step"):
                spec = run.replace(capacity=C, policy=policy, decode=dc)
                row = offloaded_row(a, torch, loaded, prompts, batch, ratio, spec, warm, ref, blocks * steps)
                out["runs"].append(row)
                log(
                    f"batch {batch} C/W {ratio} C {C} {policy:9s} prefill {row['prefill_ms']:7.1f} ms, "
                    f"denoise {row['denoise_ms_per_forward']:7.2f} ms/forward (host "
                    f"{row['host_ms_per_forward']:6.2f}), stall {row['stall_seconds']:.3f} s, "
                    f"busy/wall {row['link_busy_over_wall']:.2f}, "
                    f"tokens equal: {row['tokens_equal_resident']}"
                )
    out["all_tokens_equal_resident"] = all(r["tokens_equal_resident"] for r in out["runs"])
    out["all_forwards_denoising_steps"] = all(r["all_forwards_denoising_steps"] for r in out["runs"])
    return out


def offloaded_row(a, torch, loaded, prompts, batch, ratio, spec, warm, ref, forwards: int) -> dict:
    """Step 7's row of RunSpec `spec` (its capacity and policy) at C/W `ratio`: an untimed warm-up block,
    then the timed run; `forwards` the denoising forwards it must take (blocks x steps per block)."""
    from artifact.offload.runner import decode_prompts

    decode_prompts(loaded, prompts[:1], 1, spec.replace(decode=warm))
    with ForwardTimer(torch, loaded.model, a.device == "cuda") as ft:
        res = decode_prompts(loaded, prompts, batch, spec)
    s, f = res.stats.as_dict(), ft.summary()
    return {
        "batch": batch,
        "cache_ratio": ratio,
        "cache_experts": spec.capacity,
        "policy": spec.policy,
        **f,
        "ms_per_forward": 1e3 * s["seconds"] / s["forwards"],
        "forwards": s["forwards"],
        "all_forwards_denoising_steps": f["denoise_forwards"] == s["forwards"] == forwards,
        "stall_seconds": s["stall_seconds"],
        "link_busy_seconds": s["link_busy_seconds"],
        "link_busy_over_wall": s["link_busy_seconds"] / s["seconds"] if s["seconds"] else None,
        "demand_misses": s["demand_misses"],
        "speculative_transfers": s["speculative_transfers"],
        "link_bytes": s["link_bytes"],
        "tokens_equal_resident": res.tokens == ref.tokens,
        "launches_per_forward": launches_per_forward(
            torch, a, loaded, prompts, batch, spec.replace(decode=warm)
        )
        if ratio == 1.0
        else None,
    }


def launches_per_forward(torch, a, loaded, prompts, batch, spec) -> float | None:
    """CUDA kernel launches per forward of a one-block run, counted by torch.profiler (None on CPU)."""
    if a.device != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    from artifact.offload.runner import decode_prompts

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        res = decode_prompts(loaded, prompts, batch, spec)
    launches = sum(ev.count for ev in prof.key_averages() if call_kind(ev.key) == "launches")
    return launches / res.stats.forwards


# --- shapes and prompts -------------------------------------------------------------------------
def model_config(a, layers: int):
    from artifact.model.config import get_preset

    if a.device == "cpu":
        return dataclasses.replace(
            get_preset("tiny"), num_hidden_layers=layers, name=f"tiny-{layers}L-random"
        )
    vocab = 32768  # a smaller embedding and LM head: faster to build, same expert shapes
    return dataclasses.replace(
        get_preset("llada2-mini"),
        num_hidden_layers=layers,
        vocab_size=vocab,
        mask_token_id=vocab - 1,
        eos_token_id=vocab - 4,
        name=f"llada2-mini-shaped-{layers}L-random",
    )


def random_prompts(torch, cfg, n: int, length: int, seed: int = 0, spread: int = 7) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lo, hi = 8, cfg.vocab_size - 8  # clear of the special ids at either end (tiny: 0-5; here: V-4, V-1)
    assert not lo <= cfg.mask_token_id < hi and not lo <= cfg.eos_token_id < hi
    return [torch.randint(lo, hi, (length + spread * i,), generator=g).tolist() for i in range(n)]


def main(argv=None) -> int:
    a = parse_args(argv)  # every flag checked (exit 2) before the GPU is looked for (exit 3)
    t_start = time.perf_counter()
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        print(NO_GPU, file=sys.stderr, flush=True)
        return EXIT_NO_GPU
    try:
        from artifact.paths import atomic_write_text
    except ImportError as e:
        print(
            f"gpu_check: cannot import the artifact package ({e}); run scripts/gpu_check.sh from the "
            "checkout, or pip install -e . first",
            file=sys.stderr,
        )
        return EXIT_USAGE
    cuda = a.device == "cuda"
    # tiny shapes gain nothing from threads; on a shared CPU spinning threads make timings erratic
    if not cuda:
        torch.set_num_threads(1)
    cfg = model_config(a, a.layers)
    dtype = "bfloat16" if cuda else "float32"
    expert_bytes = cfg.expert_params * (2 if cuda else 4)
    report = {
        "note": NOTE,
        "dry_run_on_cpu": not cuda,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
        "steps": [],
    }
    code = EXIT_OK

    def write():
        report["seconds_total"] = time.perf_counter() - t_start
        report["exit_code"] = code
        atomic_write_text(a.out, json.dumps(report, indent=2, default=str))

    steps = {
        "environment": lambda: environment(a, torch),
        "cuda_tests": lambda: {k: v for k, v in cuda_tests(a, torch).items() if k != "log"},
        "pinned_peak": lambda: pinned_peak(a, torch, expert_bytes),
        "capped_link": lambda: capped_link(a, torch, expert_bytes),
        "moe_layer": lambda: torch.no_grad()(moe_layer)(a, torch, cfg, dtype),
        "pinned_store": lambda: pinned_store(a, torch),
        "engine": lambda: engine(a, torch, cfg, dtype, report),
    }
    for i, name in enumerate(STEPS, 1):
        log(f"step {i}/{len(STEPS)}: {name}")
        t0 = time.perf_counter()
        try:
            report[name] = steps[name]()
        except Exception as e:  # keep the other steps: GPU time is scarce
            report[name] = {
                **(report.get(name) or {}),
                "error": {
                    "type": type(e).__name__,
                    "message": str(e),
                    "traceback": traceback.format_exc()[-4000:],
                },
            }
            log(f"{name} failed: {type(e).__name__}: {e}")
            code = EXIT_ERROR
        report[name]["seconds"] = time.perf_counter() - t0
        report["steps"].append(name)
        t = report[name]
        if name == "cuda_tests" and not t.get("skipped") and code == EXIT_OK:
            if not t.get("collection_ok", True) or (
                t.get("collection_ok") and not t.get("timed_out") and not t.get("all_ran", True)
            ):
                code = EXIT_TESTS_NOT_RUN
            elif not t.get("ok"):
                code = EXIT_TESTS_FAILED
        if cuda:
            torch.cuda.empty_cache()
        write()
        log(f"{name}: done in {report[name]['seconds']:.1f} s")
    write()
    log(f"wrote {a.out} in {report['seconds_total']:.0f} s. NOTE: {NOTE}")
    return code


if __name__ == "__main__":
    sys.exit(main())
