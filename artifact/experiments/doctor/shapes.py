"""A published model's shape without its weights (`python -m artifact doctor --shape NAME`): a header-only
checkpoint.

`header_only_checkpoint(root, cfg)` writes a checkpoint directory whose safetensors header is real (every
tensor the loader reads, by its checkpoint name, with its shape and dtype: checkpoint.expected_shapes) and
whose data section is a hole in a sparse file (truncate: nothing written), so its apparent size is the
checkpoint's (32.5 GB for LLaDA2.0-mini) and its size on disk the header's. Beside it: config.json from the
config (ModelConfig.to_hf) and the tiny checkpoint's tokenizer files. The doctor and the loader's header check
read it as they read a real checkpoint, and never a weight.

SHAPES are the published models whose public configuration artifact/model/config.py holds as presets (the
table in docs/DESIGN.md, "LLaDA2.0 reference facts"). The tokenizer is the tiny checkpoint's (2,048 tokens,
trained on the bundled prompts; LLaDA2.0's own is not here): it cuts a prompt into more tokens than a
157,184-token vocabulary would, so the prompt lengths, and the KV cache and activations sized from them, lean
high (TOKENIZER_NOTE).
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

from artifact.errors import SettingError
from artifact.model.checkpoint import expected_shapes
from artifact.model.config import get_preset
from artifact.model.tiny import tiny_checkpoint

SHAPES = ("llada2-mini", "llada2-flash")  # --shape: the model.config presets of the published models
DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4}  # safetensors dtype names
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
TOKENIZER_NOTE = (
    "prompt lengths come from the tiny checkpoint's tokenizer (LLaDA2.0's is not here): more tokens per "
    "prompt than LLaDA2.0's own, so the KV cache and activations lean high"
)
# --shape without a GPU plans for the profile's GPU, from the datasheets: H200 141 GB, RTX A5000 24 GB
PLANNED_GPU_GB = {"h200": 141.0, "a5000": 24.0}


def shape_config(name: str):
    """The preset of a published model (SHAPES); any other name is a SettingError naming the choices."""
    if name not in SHAPES:
        raise SettingError(f"--shape: unknown shape {name!r}; choose one of {', '.join(SHAPES)}")
    return get_preset(name)


def header_only_checkpoint(
    root: Path, cfg, dtype: str = "BF16", shapes: dict[str, tuple[int, ...]] | None = None
) -> Path:
    """Write a checkpoint of `cfg` (tensor `shapes`, default expected_shapes(cfg)) into the new directory
    `root`, with a real header and no weight bytes on disk (module docstring); returns `root`."""
    if dtype not in DTYPE_BYTES:
        raise SettingError(f"dtype {dtype!r}: choose one of {', '.join(DTYPE_BYTES)}")
    root = Path(root)
    root.mkdir(parents=True)
    table, offset = {}, 0
    for name, shape in sorted((expected_shapes(cfg) if shapes is None else shapes).items()):
        n = DTYPE_BYTES[dtype]
        for d in shape:
            n *= d
        table[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    head = json.dumps(table).encode()
    head += b" " * (-len(head) % 8)
    with open(root / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        f.truncate(8 + len(head) + offset)  # sparse: no weight bytes on disk
    (root / "config.json").write_text(json.dumps(cfg.to_hf(), indent=2))
    tiny = tiny_checkpoint()  # built on first use, into the cache
    for name in TOKENIZER_FILES:
        if (tiny / name).is_file():
            shutil.copy(tiny / name, root / name)
    return root
