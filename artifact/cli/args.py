"""Arguments several commands share: the model and decoding flags, --threads, the profile flags
(--profile/--model/--set/--policy-module, declared and read once here) and the submission flags."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

from artifact.errors import SettingError, SpecError, UserError
from artifact.experiments.settings import Settings, list_profiles, load_profile, parse_override
from artifact.experiments.submit import BACKENDS, POLL_S
from artifact.model.decode import MODES
from artifact.model.experts import EXPERT_KERNELS
from artifact.model.options import FORWARD_MODES
from artifact.offload.links.timeline import PRIORITIES
from artifact.offload.policy.policy_modules import load_policy_modules
from artifact.offload.spec import RunSpec
from artifact.validate import check_number

D = Settings()  # every default comes from the settings dataclass: one source of truth


def floats(s: str) -> list[float]:
    try:
        return [float(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {s!r}") from None


def ints(s: str) -> list[int]:
    try:
        return [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from None


def names(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=D.model, help="'tiny' (built on first use) or a checkpoint directory")
    p.add_argument(
        "--dtype", default=D.dtype, help="float32 | bfloat16 (default: float32 for tiny, bfloat16 otherwise)"
    )
    p.add_argument("--device", default=D.device, help="cpu | cuda")


def add_threads_arg(p: argparse.ArgumentParser, bench_like: bool = False) -> None:
    where = "the profile's torch_threads" if bench_like else "Settings.torch_threads"
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help=f"torch intra-op threads (default: {where}; unset: "
        "1 for the tiny model or no model on the CPU, where more threads only spin, "
        "else torch's default of one per core)",
    )


def add_decode_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gen-length", type=int, default=D.gen_length, help="tokens generated per prompt")
    p.add_argument("--steps", type=int, default=D.steps, help="max denoising steps per 32-token block")
    p.add_argument("--threshold", type=float, default=D.threshold)
    p.add_argument("--mode", choices=MODES, default=D.mode)


def add_profile_args(
    p: argparse.ArgumentParser, set_example: str = "repetitions=5", model: bool = True, after_profile=None
) -> None:
    """--profile, --model and --set: the one declaration of the profile flags. `after_profile` adds flags
    that the help lists between --profile and --model (as the commands always have)."""
    p.add_argument("--profile", default="cpu", help=f"one of {list_profiles()} or a path to a .yaml file")
    if after_profile is not None:
        after_profile(p)
    if model:
        p.add_argument("--model", default=None, help="checkpoint directory (overrides the profile's model)")
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help=f"override a profile key with a YAML value, e.g. --set {set_example} (repeatable)",
    )
    add_policy_module_arg(p, profile=True)


def add_policy_module_arg(p: argparse.ArgumentParser, profile: bool = False) -> None:
    """--policy-module: the user's own policy modules, imported (their code runs) before any policy is
    resolved."""
    p.add_argument(
        "--policy-module",
        action="append",
        default=None,
        metavar="MODULE",
        help="import this module before the policies are resolved: "
        "a path to a .py file or a dotted module name, whose code registers policies (docs/policies.md); "
        "it runs as your code (repeatable" + ("; added to the profile's policy_modules)" if profile else ")"),
    )


def policy_modules_from_args(a) -> None:
    """Import the --policy-module modules (before anything reads a policy name, a profile's among them)."""
    load_policy_modules(getattr(a, "policy_module", None) or [], "--policy-module")


def overrides_from_args(a) -> dict:
    """--set overrides, then --model, then --policy-module."""
    overrides = dict(parse_override(s) for s in a.set or [])
    if getattr(a, "model", None) is not None:
        overrides["model"] = a.model
    if getattr(a, "policy_module", None):  # --policy-module: added to the profile's (or --set's) list
        base = list(overrides.get("policy_modules") or load_profile(a.profile, overrides).policy_modules)
        overrides["policy_modules"] = base + [m for m in dict.fromkeys(a.policy_module) if m not in base]
    return overrides


def profile_from_args(a) -> Settings:
    """The profile the command runs: --profile with --set overrides, then --model."""
    return load_profile(a.profile, overrides_from_args(a))


def add_submit_args(p: argparse.ArgumentParser, shards: bool = True) -> None:
    """--submit and friends, as `bench` takes them."""
    p.add_argument(
        "--submit",
        choices=BACKENDS,
        default=None,
        help="run as jobs through submitit: slurm (a job array) or local (one process per GPU or core)",
    )
    if shards:
        p.add_argument(
            "--shards", type=int, default=None, help="with --submit: how many jobs (shards) to split into"
        )
    p.add_argument(
        "--wait", action="store_true", help="with --submit: wait (progress bar), report failures, merge"
    )
    add_jobs_dir_args(p)


def add_jobs_dir_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--jobs-dir",
        type=Path,
        default=None,
        help="submitit's folders and the jobs' logs (default: results/PROFILE/jobs/)",
    )
    p.add_argument("--poll-seconds", type=float, default=POLL_S, help=argparse.SUPPRESS)


RUN_SPEC_FLAGS = {  # field: (type, choices, help)
    "forward": (str, FORWARD_MODES, "eager | segmented"),
    "expert_kernel": (str, EXPERT_KERNELS, "grouped | loop"),
    "link_priority": (str, PRIORITIES, "fifo | demand"),
    "lookahead": (int, None, "last_step / oracle: MoE layers ahead"),
    "tau": (int, None, "interval_refresh: steps between refreshes"),
}


def add_run_spec_args(p: argparse.ArgumentParser, sweeps: tuple[str, ...] = ()) -> None:
    """The run options a script or benchmark takes besides its own (RUN_SPEC_FLAGS), defaulting to RunSpec's;
    read them with run_spec_of. `sweeps`: the fields the caller sets itself per run (no flag for them)."""
    run = RunSpec()
    for field, (kind, choices, what) in RUN_SPEC_FLAGS.items():
        if field not in sweeps:
            flag = "--" + field.replace("_", "-")
            p.add_argument(flag, type=kind, choices=choices, default=getattr(run, field), help=what)


def run_spec_of(a, **fields) -> RunSpec:
    """A RunSpec of add_run_spec_args' flags and `fields` (device, decode, link, ...; a field the caller
    sweeps); a bad value is refused naming its flag."""
    flags = {k: getattr(a, k) for k in RUN_SPEC_FLAGS if hasattr(a, k)}
    try:
        return RunSpec(**{**flags, **fields})
    except SpecError as e:
        raise SettingError(f"--{e.field.replace('_', '-')}: {e}") from None


@contextlib.contextmanager
def refused_in_one_line(ap: argparse.ArgumentParser):
    """Around the checks a script or benchmark makes of its flags before any work (run_spec_of, a
    DecodeConfig of its decoding flags, check_number of its counts): a bad value is the parser's error, one
    line and exit 2 with `python -m artifact`'s OneLineParser, naming the flag: a SpecError by its field's
    flag when the parser has one (DecodeConfig's gen_length: --gen-length), any other UserError in its own
    words (run_spec_of's and check_number's name the flag already)."""
    try:
        yield
    except SpecError as e:
        flag = "--" + e.field.replace("_", "-")
        ap.error(f"{flag}: {e}" if flag in ap._option_string_actions else str(e))
    except UserError as e:
        ap.error(str(e))


def positive_floats(name: str, values: list[float]) -> list[float]:
    """A comma-separated flag's numbers (`floats`), each > 0 (C/W ratios), or a SettingError naming it."""
    if not values:
        raise SettingError(f"{name}: expected at least one number")
    return [check_number(name, v, low=0, low_open=True) for v in values]


def add_policy_knob_args(p: argparse.ArgumentParser) -> None:
    """--lookahead and --tau of a command that replays or models policies (simulate, export-trace, model)."""
    run = RunSpec()
    p.add_argument("--lookahead", type=int, default=run.lookahead, help=f"default: {run.lookahead}")
    p.add_argument("--tau", type=int, default=run.tau, help=f"default: {run.tau}")


def policy_knobs(a) -> dict:
    """add_policy_knob_args' flags, checked by RunSpec's one validator: {"lookahead": ..., "tau": ...}."""
    knobs = {k: getattr(a, k) for k in ("lookahead", "tau")}
    try:
        RunSpec(**knobs)
    except SpecError as e:
        raise SettingError(f"--{e.field}: {e}") from None
    return knobs
