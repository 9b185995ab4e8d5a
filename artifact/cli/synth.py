"""`synth` and `fit`: write a synthetic routing stream, or fit its parameters to a recorded trace
(artifact.offload.replay.synth, artifact.offload.replay.fit)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, fields
from pathlib import Path

from artifact.offload.links.link import REFERENCE_EXPERT_BYTES
from artifact.offload.replay.fit import fit, measure
from artifact.offload.replay.synth import PARAM_HELP, SynthParams, synth
from artifact.offload.replay.trace import Trace
from artifact.paths import refuse_overwrite


def cmd_synth(a: argparse.Namespace) -> None:
    p = SynthParams(**{f.name: getattr(a, f.name) for f in fields(SynthParams)})
    refuse_overwrite(a.out, a.force)
    t = synth(p, a.expert_bytes)
    t.save(a.out)
    got = measure(t)
    print(
        f"{a.out}: {len(t)} demands, {t.accesses} expert accesses; "
        f"measured W {got['w']:.1f} (asked {p.w:g}), spread {got['w_spread']:.3f} ({p.w_spread:g}), "
        f"novelty {got['novelty']:.3f} ({p.novelty:g})"
    )


def cmd_fit(a: argparse.Namespace) -> None:
    t = Trace.load(a.trace)
    p, got = fit(t), measure(t)
    if a.json:
        print(
            json.dumps(
                {
                    "trace": str(a.trace),
                    "params": asdict(p),
                    "measured": got["measured"],
                    "generated_with": t.meta.get("synth"),
                }
            )
        )
        return
    print(p.describe())
    print(f"{'w_cv_total':>14} = {got['measured']['w_cv_total']:.3f}  (all of W's spread: profile and noise)")
    for note in got["measured"]["notes"]:
        print(f"note: {note}", file=sys.stderr)


def add_cli(sub) -> None:
    """Register `synth` and `fit`."""
    s = sub.add_parser("synth", help="write a synthetic routing stream with chosen W, spread and novelty")
    for f in fields(SynthParams):
        s.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f.name,
            type=type(f.default),
            default=f.default,
            help=f"{PARAM_HELP[f.name]} (default {f.default})",
        )
    s.add_argument(
        "--expert-bytes",
        type=int,
        default=REFERENCE_EXPERT_BYTES,
        help="bytes per routed expert (default: LLaDA2.0-mini in bf16)",
    )
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--force", action="store_true", help="replace an existing --out file")
    s.set_defaults(fn=cmd_synth)

    f = sub.add_parser("fit", help="fit the synthetic stream's parameters to a routing trace")
    f.add_argument("trace", type=Path)
    f.add_argument("--json", action="store_true")
    f.set_defaults(fn=cmd_fit)
