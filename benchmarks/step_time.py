"""Seconds per denoising step of the tiny model, cached vs full decoding, and tokens/s.
Printed, not asserted: run it before and after a change to compare.

    .venv/bin/python benchmarks/step_time.py [--gen-length 64] [--threads 1]

A bad flag or value is refused in one line naming it, exit 2, before anything runs.
"""

import torch

from artifact.cli import OneLineParser
from artifact.cli.args import add_run_spec_args, refused_in_one_line, run_spec_of
from artifact.model.checkpoint import load_checkpoint
from artifact.model.decode import DecodeConfig
from artifact.model.tasks import TASKS, prompts
from artifact.model.tiny import tiny_checkpoint
from artifact.offload.runner import decode_prompts
from artifact.validate import check_number

MODES = ("cached", "full")  # each batch decodes in both


def main(argv=None):
    ap = OneLineParser(description=__doc__)
    ap.add_argument("--gen-length", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--task", choices=TASKS, default="gsm8k")
    add_run_spec_args(ap)
    a = ap.parse_args(argv)
    with refused_in_one_line(ap):  # every value, before the checkpoint is loaded
        check_number("--threads", a.threads, low=1, high=1024, integer=True)
        run = run_spec_of(a)
        for mode in MODES:  # both modes: --forward segmented cannot decode mode full
            run.replace(decode=DecodeConfig(gen_length=a.gen_length, mode=mode))
    torch.set_num_threads(a.threads)
    loaded = load_checkpoint(tiny_checkpoint())
    print(f"tiny model, {a.task}, gen_length {a.gen_length}, {a.threads} thread(s)")
    print(f"{'mode':>7} {'batch':>5} {'forwards':>8} {'s/step':>8} {'tokens/s':>9} {'tok/fwd':>7}")
    for batch in (1, 4):
        _, ps = prompts(loaded.tokenizer, a.task, batch, seed=0, max_prompt_tokens=64)
        decode_prompts(loaded, ps, batch, run.replace(decode=DecodeConfig(gen_length=32)))  # warm-up
        for mode in MODES:
            spec = run.replace(decode=DecodeConfig(gen_length=a.gen_length, mode=mode))  # full: eager only
            s = decode_prompts(loaded, ps, batch, spec).stats
            print(
                f"{mode:>7} {batch:>5} {s.forwards:>8} {s.seconds / s.forwards:>8.4f} "
                f"{s.tokens_per_second:>9.1f} {s.tokens_per_forward:>7.2f}"
            )


if __name__ == "__main__":
    main()
