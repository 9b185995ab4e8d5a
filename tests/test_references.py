"""Every reference resolves: each file path, module path and `module.name` the prose names exists today.

Read: the notebooks' markdown cells, docs/*.md and README.md (their code spans and relative link targets), and
the docstrings and comments of the code under artifact/, scripts/, benchmarks/ and examples/ (code spans, and
bare: paths ending in a file suffix, dotted names whose head is a module or no name of the file's code, and
CamelCase names). A path resolves against the files git tracks (or would: new, not ignored), relative to the
root, artifact/, artifact/experiments/, a profile's results folder or a folder the citing file lies in; a bare
file name resolves when some file has that name. `module.name` resolves when some module of the repository
whose last dotted component is `module` defines `name` (a top-level def, class, assignment or import, or a
submodule), or when some class has a member `name` (`spec.capacity`: an object named like its module);
`module.Class.name` when that class has that member. A CamelCase name resolves when the code defines, uses or
writes it, or torch or transformers has it. Commands, options and Python expressions (a head the file's own
code binds) are not references. Every reference that resolves to nothing is printed as file:line: reference.
"""

from __future__ import annotations

import ast
import builtins
import fnmatch
import importlib
import importlib.util
import io
import json
import re
import subprocess
import sys
import tokenize
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The only paths allowed not to exist here: those a run creates, never committed (fnmatch on the reference as
# written, so a concrete path such as data/results/cpu/validation.csv is still looked up).
RUN_CREATED = (
    "results/*",  # a run's working output folder (ARTIFACT_OUTPUT): notebooks, figures, data, claims, jobs
    "data/results/<profile>/*",  # a profile's working grids, locks and traces beside its committed records
    "data/traces/*",  # routing traces a run records (harness.store_traces; ignored by git)
    "<*>/*",  # a folder the run or the user chooses: <out dir>/, <tmp>/, <checkout>/
    "*h200_graphs.json",  # the graphs check's report, written by the next H200 run of scripts/gpu_run.sh
    "*_gpu_run*",  # scripts/gpu_run.sh's reports, step log and archive, written to its --out folder
    "$OUT*",  # the device machine's output folder of scripts/gpu_run.sh
    "run/manifest.json",  # a stored run's manifest, written into its run<k>/ folder as it is recorded
    "*.lock",  # the lock sidecars beside a grid or an output (requirements.lock is tracked: looked up first)
    "*.tmp.ipynb",  # a notebook being executed, renamed into place when it finishes
    "*.shard-I-of-N.csv",  # one shard's grid of a sharded bench run, merged into the grid
    *("NAME.*", "jupyterlab.log", "pytest-of-*"),  # tests/test_browser.py's screenshots, page texts and log
    *("config.json", "tokenizer_config.json", "model.safetensors*", "index.json"),  # a checkpoint's files
    *("model/modeling_llada2_moe.py", "main.py", "eval.sh", "requirements.txt"),  # the TIDE checkout's
)

# Read but not judged against today's tree: a history of the rules, naming files as they were at the commits
# it cites (timed.py, replication.py, stats.py, verdicts.py before their moves).
HISTORY = ("docs/rule_history_before_v3.md",)

# CamelCase words that name no code: products, and the message pip stops with.
WORDS = frozenset({"PyTorch", "GeForce", "JupyterLab", "GitHub", "ResolutionImpossible"})
# The packages whose classes the prose names (transformers' BatchEncoding, torch's OpOverload), imported only
# for a CamelCase name the repository neither defines nor uses.
DEPENDENCIES = ("torch", "transformers")

CODE_DIRS = ("artifact", "scripts", "benchmarks", "examples")
SUFFIXES = (".py", ".md", ".csv", ".json", ".yaml", ".ipynb", ".sh")
SPAN_SUFFIXES = SUFFIXES + (
    ".png",
    ".txt",
    ".toml",
    ".cfg",
    ".lock",
    ".jsonl",
    ".log",
    ".safetensors",
    ".yml",
)
# Where a relative path may start, besides the citing file's folders: the root, the package, the experiments,
# and a profile's results folder (the code names its files relative to it: fresh_runs/decided.csv).
BASES = ("", "artifact/", "artifact/experiments/", "data/results/*/")
PLACEHOLDER = re.compile(r"^(?:[A-Z]|KEY|NAME|VALUE|STEP|PROFILE|DIR|FILE|NN)$")  # slurm.KEY, routing_map.X

SPAN = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
ANGLE = re.compile(r"<[^<>\n]*>")
BARE_PATH = re.compile(r"(?<![\w./<>*{}$-])[\w./<>*{}-]*\w\.(?:py|md|csv|json|yaml|ipynb|sh)\b(?![\w/])")
FILE_WORD = re.compile(
    r"(?<![\w./<>$-])[\w<>.-]*\w\.(?:toml|txt|lock|yml|cfg|log|png|jsonl|safetensors|gz)\b(?![\w/])"
)
BARE_DOTTED = re.compile(r"(?<![\w./<>$-])[A-Za-z_]\w+(?:\.[A-Za-z_]\w*)+(?![\w/-])")
CAMEL = re.compile(r"(?<![\w.])[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]+)+(?!\w)")
DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
IDENT = re.compile(r"[A-Za-z_]\w*")


# ----------------------------------------------------------------------------------------------------------
# the tree and what its code defines


@cache
def tree() -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    """(files, folders, names of both): tracked files and new ones git does not ignore."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    files = {f for f in out.splitlines() if (ROOT / f).exists()}
    folders = {p.as_posix() for f in files for p in Path(f).parents if p.as_posix() != "."}
    names = {Path(p).name for p in files | folders}
    return frozenset(files), frozenset(folders), frozenset(names)


def code_files() -> list[Path]:
    return sorted(p for d in CODE_DIRS for p in (ROOT / d).rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def class_members(cls: ast.ClassDef) -> set[str]:
    """Methods, nested classes, class attributes and fields, and what its methods assign to self."""
    out = set()
    for node in ast.walk(cls):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for n in ast.walk(target):
                    if isinstance(n, ast.Name):
                        out.add(n.id)
                    elif (
                        isinstance(n, ast.Attribute)
                        and isinstance(n.value, ast.Name)
                        and n.value.id == "self"
                    ):
                        out.add(n.attr)
    return out


def is_documented(node) -> bool:
    return (
        isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and bool(node.body)
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
        and isinstance(node.body[0].value.value, str)
    )


class Index:
    """The repository's modules (artifact/, scripts/, benchmarks/, examples/, tests/): their top-level names
    and classes; and, of the code outside tests/, every name it uses and every string it writes."""

    def __init__(self):
        self.modules: dict[str, set[str]] = {}  # dotted module name -> top-level names and submodules
        self.classes: dict[str, dict[str, set[str]]] = {}  # module -> {class: members}
        self.members: dict[str, set[str]] = {}  # class name -> members (over every class of that name)
        self.used: set[str] = set()  # every identifier and attribute name of the code
        self.bound: dict[Path, set[str]] = {}  # per file: every name its code binds or reads
        self.imported: dict[Path, set[str]] = {}  # per file: the names its imports bind
        strings = []
        for path in code_files() + sorted((ROOT / "tests").rglob("*.py")):
            in_code = path.relative_to(ROOT).parts[0] in CODE_DIRS
            module = ast.parse(path.read_text(encoding="utf-8"))
            mod = module_name(path)
            self.modules.setdefault(mod, set())
            self.classes[mod] = {}
            for node in module.body:
                self._top(node, mod)
            self._set_in_a_loop(module)
            docs = {id(n.body[0].value) for n in ast.walk(module) if is_documented(n)}
            names, imported = set(), set()
            for node in ast.walk(module):
                if isinstance(node, ast.Name):
                    names.add(node.id)
                elif isinstance(node, ast.Attribute):
                    names.add(node.attr)
                elif isinstance(node, ast.arg):
                    names.add(node.arg)
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(node.name)
                elif isinstance(node, (ast.Import, ast.ImportFrom)):
                    imported.update((a.asname or a.name).split(".")[0] for a in node.names)
                elif (
                    isinstance(node, ast.Constant)
                    and isinstance(node.value, str)
                    and in_code
                    and id(node) not in docs
                ):
                    strings.append(node.value)
            names |= imported
            self.bound[path], self.imported[path] = names, imported
            if in_code:
                self.used |= names
        self.strings = "\n".join(strings)
        for mod in list(self.modules):  # a package's submodules are names of it
            parent, _, last = mod.rpartition(".")
            if parent:
                self.modules.setdefault(parent, set()).add(last)
        self.by_last: dict[str, list[str]] = {}
        for mod in self.modules:
            self.by_last.setdefault(mod.rpartition(".")[2], []).append(mod)

    def _top(self, node, mod: str) -> None:
        names = self.modules[mod]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
            members = class_members(node)
            self.classes[mod][node.name] = members
            self.members.setdefault(node.name, set()).update(members)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            for sub in node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", []):
                self._top(sub, mod)
            for handler in getattr(node, "handlers", []):
                for sub in handler.body:
                    self._top(sub, mod)

    def _set_in_a_loop(self, module: ast.Module) -> None:
        """Members set by `for f in NAMES: setattr(Class, f, ...)` (plans.CacheCounts' totals)."""
        consts = {
            t.id: [e.value for e in n.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            for n in module.body
            if isinstance(n, ast.Assign) and isinstance(n.value, (ast.Tuple, ast.List))
            for t in n.targets
            if isinstance(t, ast.Name)
        }
        for node in module.body:
            if isinstance(node, ast.For) and isinstance(node.iter, ast.Name) and node.iter.id in consts:
                for call in ast.walk(node):
                    if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "setattr":
                        if call.args and isinstance(call.args[0], ast.Name):
                            self.members.setdefault(call.args[0].id, set()).update(consts[node.iter.id])

    def is_module(self, head: str) -> bool:
        return head in self.by_last

    def defines(self, mod: str, rest: list[str]) -> bool:
        """Module `mod` defines rest[0] (for a class, with rest[1] a member)."""
        if not rest:
            return True
        name = rest[0]
        if name not in self.modules.get(mod, ()):
            return False
        if f"{mod}.{name}" in self.modules:
            return self.defines(f"{mod}.{name}", rest[1:])
        if len(rest) == 1 or name not in self.members:
            return True  # a function's or a value's attribute is not looked into
        return rest[1] in self.classes.get(mod, {}).get(name, self.members[name])

    def is_member(self, name: str) -> bool:
        """A member of some class: `spec.capacity` names an object of that class, named like its module."""
        return any(name in members for members in self.members.values())

    def resolves_dotted(self, ref: str) -> bool:
        parts = ref.split(".")
        if any(PLACEHOLDER.match(p) for p in parts[1:]):
            return True  # a pattern: slurm.KEY, routing_map.X
        if ref in self.strings:
            return True  # a name the code writes: a tensor's, a settings key
        for k in range(len(parts), 1, -1):  # a full module path: artifact.model.checkpoint.expected_shapes
            if ".".join(parts[:k]) in self.modules:
                return self.defines(".".join(parts[:k]), parts[k:])
        if parts[0] in self.by_last:
            if any(self.defines(mod, parts[1:]) for mod in self.by_last[parts[0]]):
                return True
            return all(self.is_member(p) for p in parts[1:])  # `cache.counts.by_phase`
        return parts[0] in self.members and parts[1] in self.members[parts[0]]  # Class.member

    def names_a_class_or_name(self, name: str) -> bool:
        """A name the code defines, uses or writes (MemAvailable), a builtin (ValueErrors too), a word, or a
        name of a dependency's modules."""
        if name in WORDS or name in self.members or name in self.used:
            return True
        if hasattr(builtins, name) or hasattr(builtins, name.removesuffix("s")):
            return True
        if any(name in names for names in self.modules.values()) or re.search(rf"\b{name}\b", self.strings):
            return True
        return external(name)


@cache
def external(name: str) -> bool:
    for top in DEPENDENCIES:
        try:
            importlib.import_module(top)
        except Exception:  # noqa: BLE001 - a package that does not import here names nothing
            continue
        for mod in [m for m in list(sys.modules) if m == top or m.startswith(top + ".")]:
            try:
                if name in dir(sys.modules[mod]):  # not hasattr: torch.ops answers every name
                    return True
            except Exception:  # noqa: BLE001 - a lazy module that fails to load names nothing
                continue
    return False


@cache
def index() -> Index:
    return Index()


# ----------------------------------------------------------------------------------------------------------
# resolving one reference


def globs(ref: str) -> list[str]:
    """`<profile>`, `run<k>`, NN, PROFILE, `{a,b}` and `*` as globs."""
    m = re.search(r"\{([^{}]*,[^{}]*)\}", ref)
    if m:
        return [g for alt in m.group(1).split(",") for g in globs(ref[: m.start()] + alt + ref[m.end() :])]
    ref = ANGLE.sub("*", ref)
    ref = re.sub(
        r"(?<![A-Za-z])NN_name(?![a-z])", "[0-9][0-9]_*", ref
    )  # NN_name.ipynb: 04_capacity_sweep.ipynb
    ref = re.sub(r"(?<![A-Za-z])NN(?![a-z])", "[0-9][0-9]", ref)
    ref = re.sub(r"(?<![A-Za-z])(?:PROFILE|STAGE)(?![a-z])", "*", ref)
    return [re.sub(r"\{[^{}]*\}", "*", ref)]


def exists(rel: str) -> bool:
    files, folders, _ = tree()
    rel = rel.rstrip("/")
    if any(c in rel for c in "*?["):
        return any(fnmatch.fnmatchcase(p, rel) for p in files | folders)
    return rel in files or rel in folders


def normal(path: str) -> str:
    out: list[str] = []
    for part in path.split("/"):
        if part == "..":
            if not out:
                return "/.."  # outside the repository
            out.pop()
        elif part not in ("", "."):
            out.append(part)
    return "/".join(out)


def resolves_path(ref: str, source: Path, link: bool = False) -> bool:
    ref = ref.strip().removeprefix("./")
    here = source.parent.relative_to(ROOT)
    if link:  # a markdown link is relative to its file
        return all(exists(normal(f"{here.as_posix()}/{g}")) for g in globs(ref))
    bases = set(BASES) | {p.as_posix() + "/" for p in [here, *here.parents] if p.as_posix() != "."}
    _, _, names = tree()
    for g in globs(ref):
        if "/" not in g.rstrip("/") and any(fnmatch.fnmatchcase(n, g.rstrip("/")) for n in names):
            return True
        if any(exists(normal(b + g)) for b in bases):
            return True
    return any(fnmatch.fnmatchcase(ref, pattern) for pattern in RUN_CREATED)


def is_path(token: str) -> bool:
    if (
        not re.fullmatch(r"[\w./<>*{},$-]+", token)
        or token.strip("./") == ""
        or re.fullmatch(r"\.\w+", token)
    ):
        return False  # `..`, `/`, a bare suffix (`.py`)
    if token.endswith(SPAN_SUFFIXES) or (token.endswith("/") and "/" in token[:-1].strip(".")):
        return True
    if "/" not in token:
        return token.endswith("/") and len(token) > 2
    head = token.removeprefix("./").split("/")[0]
    if head.startswith("<") or head.startswith("$"):
        return True
    return any(exists(b + head) for b in BASES)  # not `i/n`, `true/false`


def path_and_name(token: str) -> tuple[str, str] | None:
    """`offload/trace_engine.run_virtual` -> (`offload/trace_engine.py`, `run_virtual`)."""
    m = re.fullmatch(r"([\w./]*/\w+)\.([A-Za-z_]\w*)", token)
    if not m or token.endswith(SPAN_SUFFIXES):
        return None
    return m.group(1) + ".py", m.group(2)


# ----------------------------------------------------------------------------------------------------------
# judging one token


def unresolved_span(token: str, source: Path, local: frozenset[str] = frozenset()) -> list[str]:
    """The references of one code span that resolve to nothing (of a command: its file arguments)."""
    ix = index()
    token = re.sub(r"<[^<>\s]*\s[^<>]*>", "<x>", token.strip()).rstrip(",:;")
    if " " in token:  # a command or an expression: only its path arguments are references
        words = [w.strip("\"'") for w in token.split()]
        return [
            w
            for w in words
            if "/" in w and w.endswith(SUFFIXES) and is_path(w) and not resolves_path(w, source)
        ]
    token = re.sub(r"\(.*\)$", "", token)
    if "::" in token:  # tests/test_x.py::test_name
        token = token.split("::")[0]
    pn = path_and_name(token)
    if pn:
        mod = ".".join(Path(normal(pn[0])).with_suffix("").parts)
        candidates = [m for m in ix.modules if m == mod or m.endswith("." + mod)]
        return [] if any(ix.defines(m, [pn[1]]) for m in candidates) else [token]
    if is_path(token):
        return [] if resolves_path(token, source) else [token]
    if DOTTED.fullmatch(token):
        head = token.split(".")[0]
        if ix.is_module(head) or head == "artifact" or head in ix.members:
            return [] if ix.resolves_dotted(token) else [token]
        return []  # an expression of a name the text introduces (`pm.explanation`, `res.stats`)
    if CAMEL.fullmatch(token):
        return [] if ix.names_a_class_or_name(token) or token in local else [token]
    return []


def unresolved_in_prose(text: str, path: Path) -> list[str]:
    """A comment's or docstring's line: its code spans, then its bare paths, dotted names and CamelCase."""
    ix = index()
    out = [r for m in SPAN.finditer(text) for r in unresolved_span(m.group(1), path)]
    text = ANGLE.sub("<x>", SPAN.sub(" ", text))
    for m in BARE_PATH.finditer(text):
        quoted = text[m.start() - 1 : m.start()] in "\"'" and m.start() > 0
        token = m.group(0).rstrip(".")
        if not quoted and not resolves_path(token, path):
            out.append(token)
    text = BARE_PATH.sub(" ", text)
    for m in FILE_WORD.finditer(text):
        if not resolves_path(m.group(0), path):
            out.append(m.group(0))
    text = FILE_WORD.sub(" ", text)
    for m in BARE_DOTTED.finditer(text):
        token = m.group(0)
        head = token.split(".")[0]
        local = head in ix.bound[path] and head not in ix.imported[path]
        if (ix.is_module(head) or head == "artifact" or head in ix.members) and not local:
            if not ix.resolves_dotted(token):
                out.append(token)
        elif local or head in ix.bound[path] or len(head) < 3 or hasattr(builtins, head):
            continue  # an expression of the file's own code (`res.stats`, `spec.capacity`, `np.median`)
        elif text[m.end() : m.end() + 1] == "(" or not head.islower():
            continue  # a call on an object the text introduces: event.query()
        elif head not in sys.stdlib_module_names and importlib.util.find_spec(head) is None:
            out.append(token)  # a module that is not there (`stats.CELL_KEYS`)
    for m in CAMEL.finditer(text):
        if not ix.names_a_class_or_name(m.group(0)):
            out.append(m.group(0))
    return out


# ----------------------------------------------------------------------------------------------------------
# where references are written


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def markdown_spans(text: str):
    """(line number from 1, token, is a link) of the code spans and relative link targets, fences skipped."""
    fenced = False
    for k, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        for m in SPAN.finditer(line):
            yield k, m.group(1), False
        for m in LINK.finditer(SPAN.sub(" ", line)):
            target = m.group(1).split("#")[0]
            if target and not re.match(r"[a-z]+:", target):
                yield k, target, True


def notebook_cells(path: Path):
    """(the file line its source starts on, cell) per cell: nbformat writes one source line per file line."""
    raw = path.read_text(encoding="utf-8")
    starts = [k for k, line in enumerate(raw.splitlines(), 1) if re.match(r'\s*"source": \[', line)]
    cells = json.loads(raw)["cells"]
    if len(starts) != len(cells):
        starts = [0] * len(cells)
    return zip(starts, cells)


def markdown_references():
    """(where, token, is a link, the citing file, names the file's code introduces)."""
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = list(notebook_cells(path))
        code = "\n".join("".join(c["source"]) for _, c in cells if c["cell_type"] == "code")
        local = frozenset(IDENT.findall(code))
        for start, cell in cells:
            if cell["cell_type"] == "markdown":
                for line, token, link in markdown_spans("".join(cell["source"])):
                    yield f"{rel(path)}:{start + line}", token, link, path, local
    for path in sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]:
        if rel(path) not in HISTORY:
            for line, token, link in markdown_spans(path.read_text(encoding="utf-8")):
                yield f"{rel(path)}:{line}", token, link, path, frozenset()


def prose(path: Path):
    """(line, text) of every comment and docstring line of a Python file."""
    src = path.read_text(encoding="utf-8")
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(src)):
        if is_documented(node):
            doc = node.body[0].value
            for k, line in enumerate(doc.value.splitlines()):
                yield doc.lineno + k, line


def unresolved() -> list[str]:
    found = set()
    for where, token, link, source, local in markdown_references():
        if link:
            if not resolves_path(token, source, link=True):
                found.add(f"{where}: {token}")
        else:
            found.update(f"{where}: {r}" for r in unresolved_span(token, source, local))
    for path in code_files():
        for line, text in prose(path):
            found.update(f"{rel(path)}:{line}: {r}" for r in unresolved_in_prose(text, path))

    def order(entry: str):
        file, line, ref = entry.split(":", 2)
        return file, int(line), ref

    return sorted(found, key=order)


# Stale references in files frozen with the stored runs' engine (artifact/model/, artifact/offload/: a byte
# change there fails tests/test_stored_runs_commit.py until the runs are recorded again). Each is fixed with
# the next recording; the list may only shrink.
FROZEN = frozenset(
    {
        "artifact/model/options.py:3: artifact.offload.runner.RunOptions",  # now offload.spec.RunSpec
        "artifact/model/options.py:19: RunOptions",
        "artifact/model/options.py:31: RunOptions",
    }
)


def test_every_reference_resolves():
    missing = [m for m in unresolved() if m not in FROZEN]
    print("\n".join(missing))
    assert not missing, f"{len(missing)} references resolve to nothing:\n" + "\n".join(missing)


@pytest.mark.parametrize(
    "token, ok",
    [
        ("artifact/experiments/verdicts/pooling.py", True),
        ("artifact/experiments/replication.py", False),
        ("replication.py", False),
        ("verdicts/pooling.py", True),
        ("studies/performance_model.py", False),
        ("artifact/experiments/studies/performance_model/", True),
        ("pooling.gather", True),
        ("pairs.CELL_KEYS", True),
        ("pairs.NO_SUCH_NAME", False),
        ("settings.Settings.run_spec", True),
        ("settings.Settings.no_such_method", False),
        ("spec.capacity", True),
        ("artifact.model.checkpoint.expected_shapes", True),
        ("offload/trace_engine.run_virtual", True),
        ("data/results/cpu/validation.csv", False),
        ("data/results/cpu/runs/run<k>/validation.csv", True),
        ("results/<profile>/figures/", True),
        ("RunSpec", True),
        ("OffloadSpec", False),
        ("python -m artifact simulate --policy-module examples/top_count_policy.py", True),
        ("python scripts/no_such_script.py --runs 3", False),
    ],
)
def test_the_check_tells_a_reference_that_resolves_from_one_that_does_not(token, ok):
    assert (unresolved_span(token, ROOT / "README.md") == []) is ok


def test_the_check_reads_bare_references_in_code_prose():
    path = ROOT / "artifact/experiments/settings.py"
    assert unresolved_in_prose("# the grid (stats.CELL_KEYS), see replication.py and RunOptions", path) == [
        "replication.py",
        "stats.CELL_KEYS",
        "RunOptions",
    ]
    assert (
        unresolved_in_prose("# see verdicts/pooling.py, pairs.CELL_KEYS, RunSpec and np.median", path) == []
    )


def test_the_check_reads_code_spans_and_links_of_markdown():
    text = "See `verdicts/pooling.py`, [the rules](../docs/verdicts.md) and [gone](../docs/no_such.md).\n"
    refs = list(markdown_spans("```\n`not/read.py`\n```\n" + text))
    assert refs == [
        (4, "verdicts/pooling.py", False),
        (4, "../docs/verdicts.md", True),
        (4, "../docs/no_such.md", True),
    ]
    source = ROOT / "notebooks" / "04_capacity_sweep.ipynb"
    assert [resolves_path(t, source, link=True) for _, t, _ in refs[1:]] == [True, False]
