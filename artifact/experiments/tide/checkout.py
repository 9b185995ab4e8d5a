"""A TIDE checkout, checked before anything of it runs: its files, the interface the adapter calls (read
from the source with `ast`, never executed), the requirements it imports, the revision it is at (the model
file's git blob id against the pinned one), and finally its model file imported under a private package
name (no sys.path change). tide/released.py runs it (for tide/adapter.py); this module only decides
whether it can run and loads it.
The artifact never vendors or downloads TIDE: the checkout is the path the user gives (profile key tide_path).
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.metadata
import importlib.util
import subprocess
import sys
import types
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from artifact.model.config import ModelConfig

TIDE_REPO = "https://github.com/ims-kdks/TIDE"
TIDE_REVISION = "5611ace31501230f6dece29307b29a9a554a5a01"  # the commit the adapter was written against
WRITTEN_AGAINST = f"ims-kdks/TIDE@{TIDE_REVISION[:7]}"
# git's blob id of model/modeling_llada2_moe.py at TIDE_REVISION (last changed in 76d3dad): a checkout, or
# a copy without .git, holds the pinned model file exactly when its blob id is this one.
PINNED_MODELING_BLOB = "2dc9efdced9508694057e04ee372a1abc43c81ff"
MODELING = "model/modeling_llada2_moe.py"
CONFIGURATION = "model/configuration_llada2_moe.py"
MODEL_CLASS = "LLaDA2MoeModelLM"
OFFLOAD_METHOD = "enable_predictive_expert_offload"
# Arguments the adapter passes; check_tide refuses a checkout whose signatures lack any of them.
OFFLOAD_ARGS = ("max_gpu_experts_per_layer", "collect_stats", "jump_steps")
GENERATE_ARGS = (
    "input_ids",
    "temperature",
    "block_length",
    "steps",
    "gen_length",
    "eos_early_stop",
    "minimal_topk",
    "threshold",
    "eos_id",
    "mask_id",
    "do_sample",
)


@dataclass(frozen=True)
class TideInfo:
    path: Path
    modeling_file: Path
    commit: str | None  # git HEAD of the checkout, when it is a git clone
    offload_defaults: dict  # enable_predictive_expert_offload's parameters -> defaults
    generate_defaults: dict  # generate's parameters -> defaults
    imports: tuple[str, ...]  # third-party modules the model files import
    pins: dict = field(default_factory=dict)  # requirements.txt: name -> line
    modeling_sha: str = ""  # git blob id of the model file (works without .git)

    @property
    def pinned(self) -> bool:
        return self.modeling_sha == PINNED_MODELING_BLOB


def require_cuda() -> None:
    if not torch.cuda.is_available():
        raise RuntimeError(
            "TIDE's released code runs on CUDA only (enable_predictive_expert_offload raises "
            "without a GPU), and torch.cuda.is_available() is False on this machine"
        )


def check_tide(path, device: str = "cuda", import_module: bool = True) -> TideInfo:
    """Validate a TIDE checkout: files and interface (read, not run), requirements installed, CUDA, and
    finally that its model file imports here (a transformers unlike TIDE's pin fails at this point)."""
    if path is None or str(path).strip() == "":
        raise ValueError(
            f"no TIDE checkout given: set the profile key tide_path to a clone of {TIDE_REPO} "
            "(the artifact never downloads it)"
        )
    root = Path(path).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: TIDE checkout not found (tide_path must be a clone of {TIDE_REPO})")
    missing = [f for f in (MODELING, CONFIGURATION) if not (root / f).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{root}: not a TIDE checkout, missing {missing} (expected the layout of {WRITTEN_AGAINST})"
        )
    modeling = root / MODELING
    tree = _parse(modeling)
    methods = _class_methods(tree, MODEL_CLASS, modeling)
    sigs = {}
    for name, needed in ((OFFLOAD_METHOD, OFFLOAD_ARGS), ("generate", GENERATE_ARGS)):
        if name not in methods:
            raise ValueError(
                f"{modeling}: class {MODEL_CLASS} has no method {name}(); this adapter was "
                f"written against {WRITTEN_AGAINST}"
            )
        sigs[name] = _defaults(methods[name])
        lacking = [a for a in needed if a not in sigs[name]]
        if lacking:
            raise ValueError(
                f"{modeling}: {MODEL_CLASS}.{name}() lacks arguments {lacking}; "
                f"this adapter was written against {WRITTEN_AGAINST}"
            )
    _check_sampling(methods, modeling)
    imports = sorted(
        set(_third_party_imports(tree)) | set(_third_party_imports(_parse(root / CONFIGURATION)))
    )
    pins = _pins(root / "requirements.txt")
    absent = [m for m in imports if importlib.util.find_spec(m) is None]
    if absent:
        wanted = ", ".join(pins.get(m.replace("_", "-"), pins.get(m, m)) for m in absent)
        raise ModuleNotFoundError(
            f"TIDE's model ({modeling}) imports {absent}, not installed in this Python "
            f"({sys.executable}); install {wanted} (pinned in "
            f"{root / 'requirements.txt'})",
            name=absent[0],
        )
    if torch.device(device).type == "cuda":
        require_cuda()
    info = TideInfo(
        root,
        modeling,
        _git_head(root),
        sigs[OFFLOAD_METHOD],
        sigs["generate"],
        tuple(imports),
        pins,
        _blob_sha(modeling),
    )
    if not info.pinned:
        warnings.warn(
            f"{modeling} is not the model file of {WRITTEN_AGAINST} (git blob {info.modeling_sha[:12]}, "
            f"pinned {PINNED_MODELING_BLOB[:12]}); its interface checks passed, "
            f"but results may differ from the pinned revision's (git -C {root} checkout {TIDE_REVISION[:7]})",
            stacklevel=2,
        )
    if import_module:
        load_tide_module(info)
    return info


def check_checkpoint(path) -> Path:
    """The user's Hugging Face directory of safetensors (TIDE loads it with from_pretrained)."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(
            f"{root}: checkpoint directory not found (expected a LLaDA2.0 Hugging Face "
            "directory: config.json + *.safetensors)"
        )
    ModelConfig.from_hf(root)  # names a missing config.json or a wrong model_type
    if not ((root / "model.safetensors").is_file() or (root / "model.safetensors.index.json").is_file()):
        pickled = sorted(p.name for p in root.glob("*.bin")) + sorted(p.name for p in root.glob("*.pt"))
        extra = f"; found pickled weights {pickled[:3]}, which are never loaded" if pickled else ""
        raise FileNotFoundError(f"{root}: no model.safetensors or model.safetensors.index.json{extra}")
    return root


def load_tide_module(info: TideInfo) -> types.ModuleType:
    """Import TIDE's model file from the checkout as package `_tide_<hash>` (its relative import of the
    configuration needs a package); nothing is added to sys.path."""
    pkg = "_tide_" + hashlib.sha1(str(info.path.resolve()).encode()).hexdigest()[:10]
    if pkg not in sys.modules:
        mod = types.ModuleType(pkg)
        mod.__path__ = [str(info.modeling_file.parent)]
        sys.modules[pkg] = mod
    try:
        return importlib.import_module(f"{pkg}.{Path(MODELING).stem}")
    except ImportError as e:
        have = {m: _version(m) for m in info.imports}
        sys.modules.pop(pkg, None)  # a later call (after a fix) tries afresh
        raise type(e)(
            f"{info.modeling_file}: importing TIDE's model failed ({e}); TIDE pins "
            f"{sorted(info.pins.values())}, this Python has {have}. Run TIDE in an environment "
            f"made with pip install -r {info.path / 'requirements.txt'}"
        ) from e


# --- helpers -------------------------------------------------------------------------------------
def _parse(path: Path) -> ast.Module:
    try:
        return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except SyntaxError as e:
        raise ValueError(f"{path}: not valid Python ({e})") from None


def _class_methods(tree: ast.Module, cls: str, where: Path) -> dict[str, ast.FunctionDef]:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return {f.name: f for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    raise ValueError(f"{where}: no class {cls}; this adapter was written against {WRITTEN_AGAINST}")


def _defaults(fn: ast.FunctionDef) -> dict:
    """Parameter -> literal default (None when there is none or it is not a literal)."""
    a = fn.args
    pos = a.posonlyargs + a.args
    out = {p.arg: None for p in pos + a.kwonlyargs}
    for p, d in zip(pos[len(pos) - len(a.defaults) :], a.defaults):
        out[p.arg] = _literal(d)
    for p, d in zip(a.kwonlyargs, a.kw_defaults):
        out[p.arg] = _literal(d) if d is not None else None
    out.pop("self", None)
    return out


def _check_sampling(methods: dict[str, ast.FunctionDef], where: Path) -> None:
    """Refuse a TIDE whose generate accepts do_sample but samples whatever it says: the greedy decoding
    the comparison needs (do_sample=False) must reach a sampler that branches on it. TIDE before 0d8c547
    ("add deterministic method") passed no do_sample on and always drew with torch.multinomial."""

    def passes_do_sample(call: ast.Call) -> str | None:
        f = call.func
        if (
            isinstance(f, ast.Attribute)
            and isinstance(f.value, ast.Name)
            and f.value.id == "self"
            and any(k.arg == "do_sample" for k in call.keywords)
        ):
            return f.attr
        return None

    samplers = {passes_do_sample(n) for n in ast.walk(methods["generate"]) if isinstance(n, ast.Call)} - {
        None
    }
    for name in samplers:
        fn = methods.get(name)
        if fn is None or "do_sample" not in _defaults(fn):
            continue
        if any(
            isinstance(n, (ast.If, ast.IfExp))
            and any(isinstance(x, ast.Name) and x.id == "do_sample" for x in ast.walk(n.test))
            for n in ast.walk(fn)
        ):
            return
    raise ValueError(
        f"{where}: {MODEL_CLASS}.generate() accepts do_sample but no sampler it calls branches on it, "
        "so do_sample=False would still sample (TIDE before commit 0d8c547, "
        "'add deterministic method', always drew with torch.multinomial); "
        f"check out {WRITTEN_AGAINST} (git checkout {TIDE_REVISION[:7]}), "
        "the revision this adapter was written against"
    )


def _blob_sha(path: Path) -> str:
    """git's blob id of a file (sha1 of 'blob <size>\\0' + bytes): the same as `git hash-object`."""
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _literal(node):
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


def _third_party_imports(tree: ast.Module) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module.split(".")[0])
    return [n for n in names if n not in sys.stdlib_module_names]


def _pins(path: Path) -> dict:
    if not path.is_file():
        return {}
    lines = [ln.split("#")[0].strip() for ln in path.read_text().splitlines()]
    return {ln.split("=")[0].split("<")[0].split(">")[0].strip().lower(): ln for ln in lines if ln}


def _version(module: str) -> str | None:
    try:
        return importlib.metadata.version(module)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git_head(root: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None
