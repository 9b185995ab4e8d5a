"""The claim records (data/results/<profile>/NN_*.claims.json, the lines the stored notebook's claim cell
holds) and the tables made of them, a column per profile with records: docs/claims.md's (`render`,
`render_agreement`), a run's beside the stored ones (`render_this_run`). The README's two tables and the
writer of both files' blocks: artifact/experiments/claims_readme.py. tests/test_claims_table.py fails on any
difference."""

from __future__ import annotations

import json
import re
from pathlib import Path

from artifact.errors import ResultFileError
from artifact.experiments.outputs.paths import RECORD_SUFFIX
from artifact.paths import data_dir, repo_root

_SAVE = re.compile(r'save\(fig, df, P, "([^"]+)"\)')
RECORD_KEYS, CLAIM_KEYS = ("notebook", "claims"), ("claim", "verdict")
CLAIMS_DOC = "docs/claims.md"  # the full table and the agreement block, beside the README's compact one


def study(notebook: str) -> str:
    """The module behind a notebook: 04_capacity_sweep -> studies/capacity_sweep.py (or its folder)."""
    name = f"artifact/experiments/studies/{notebook.split('_', 1)[1]}"
    return f"{name}/" if (repo_root() / name).is_dir() else f"{name}.py"


def read_record(path: Path) -> dict:
    """One claim record, or ResultFileError naming the file and what is wrong with it."""
    expected = f"expected a claim cell's record: JSON with {', '.join(RECORD_KEYS)}[{', '.join(CLAIM_KEYS)}]"
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ResultFileError(f"{path}: unreadable ({e}); {expected}") from None
    if (
        not isinstance(doc, dict)
        or any(k not in doc for k in RECORD_KEYS)
        or not isinstance(doc["claims"], list)
    ):
        raise ResultFileError(f"{path}: not a claim record; {expected}")
    for i, c in enumerate(doc["claims"]):
        missing = [k for k in CLAIM_KEYS if k not in c] if isinstance(c, dict) else list(CLAIM_KEYS)
        if missing:
            raise ResultFileError(f"{path}: claim {i + 1} lacks {', '.join(missing)}; {expected}")
    return doc


def read_records(directory: Path) -> list[dict]:
    return [read_record(p) for p in sorted(Path(directory).glob(f"[0-9][0-9]_*{RECORD_SUFFIX}"))]


def records(profile_name: str, results: Path | None = None) -> list[dict]:
    return read_records(Path(results or data_dir() / "results") / profile_name)


def other_profiles(profile_name: str, results: Path | None = None) -> list[str]:
    """Profiles other than `profile_name` with claim records under data/results/ (a GPU profile's run)."""
    root = Path(results or data_dir() / "results")
    if not root.is_dir():
        return []
    return sorted(
        p.name
        for p in root.iterdir()
        if p.is_dir() and p.name != profile_name and any(p.glob(f"[0-9][0-9]_*{RECORD_SUFFIX}"))
    )


def figures(notebook: str, notebook_dir: Path | None = None) -> list[str]:
    """The figure names a notebook saves (its `save(fig, df, P, "name")` calls)."""
    path = Path(notebook_dir or repo_root() / "notebooks") / f"{notebook}.ipynb"
    if not path.is_file():
        return []
    return [m for c in json.loads(path.read_text())["cells"] for m in _SAVE.findall("".join(c["source"]))]


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


def row(cells) -> str:
    return "| " + " | ".join(_cell(x) for x in cells) + " |"


def head(cells) -> list[str]:
    return [row(cells), "|" + "---|" * len(cells)]


def basis(c: dict) -> str:
    pairs = f"{c['pairs']} pairs" if c.get("pairs") is not None else ""
    return "; ".join(p for p in (c.get("counting"), c.get("interval"), pairs) if p)


def verdict(c: dict) -> str:  # with its reason
    return f"{c['verdict']} ({c['reason']})" if c.get("reason") else c["verdict"]


def same_claim(r: dict | None, k: int, c: dict) -> dict | None:
    """Another profile's record of the same claim: by its key when it has one, else by its place."""
    claims = (r or {}).get("claims", [])
    if c.get("key"):
        return next((o for o in claims if o.get("key") == c["key"]), None)
    return claims[k] if k < len(claims) else None


def others(profile_name: str, results: Path | None = None) -> dict[str, dict[str, dict]]:
    """{profile: {notebook: record}} of every other profile with records: a column each."""
    return {p: {r["notebook"]: r for r in records(p, results)} for p in other_profiles(profile_name, results)}


def _run_key(r: dict) -> tuple:
    return (r.get("command", "unknown"), r.get("date", "unknown"), r.get("commit", "unknown"))


def render(
    profile_name="cpu", results: Path | None = None, notebook_dir: Path | None = None, root="../"
) -> str:
    """docs/claims.md's block: a row per recorded claim, then its runs. `root`: the repository root as seen
    from the file that holds the block (its links)."""
    recs = records(profile_name, results)
    if not recs:
        return f"No claim records for profile {profile_name} (run `./run_all.sh {profile_name}`)."
    by_profile = others(profile_name, results)
    runs = list(dict.fromkeys(_run_key(r) for r in recs))
    cols = ["notebook (module, figures)", "claim", "paper", f"measured ({profile_name})"]
    cols += [f"verdict ({profile_name})", "basis (counting; interval; pairs)", "run"]
    lines = head(cols + [f"{p}: verdict (measured)" for p in by_profile])
    for r in recs:
        nb = r["notebook"]
        where = f"{nb.split('_')[0]} ([{Path(study(nb)).stem}]({root}{study(nb)}))"
        figs = figures(nb, notebook_dir)
        if figs:
            where += ": " + ", ".join(f"[{f}]({root}figures/{profile_name}/{f}.png)" for f in figs)
        for k, c in enumerate(r["claims"]):
            measured = c.get("measured", "") + (f" (margin: {c['margin']})" if c.get("margin") else "")
            run = f"run {runs.index(_run_key(r)) + 1}"
            cells = [
                where if k == 0 else "",
                c["claim"],
                c.get("paper", ""),
                measured,
                verdict(c),
                basis(c),
                run,
            ]
            for by_nb in by_profile.values():
                o = same_claim(by_nb.get(nb), k, c)
                cells.append(f"{verdict(o)} ({o.get('measured', '')})" if o else "not run")
            lines.append(row(cells))
    lines.append("")
    for i, (command, date, commit) in enumerate(runs, 1):
        nbs = ", ".join(r["notebook"][:2] for r in recs if _run_key(r) == (command, date, commit))
        lines.append(f"- run {i}: `{command}` on {date}, commit `{commit}` (notebooks {nbs})")
    for p, by_nb in by_profile.items():
        prun = sorted({_run_key(r) for r in by_nb.values()})
        lines.append(f"- {p}: " + "; ".join(f"`{c}` on {d}, commit `{h}`" for c, d, h in prun))
    return "\n".join(lines)


def k_of_n(c: dict) -> str:
    """'k of N' stored runs whose own verdict is the pooled one, the opposite ones counted."""
    runs, pooled = c.get("per_run") or [], c.get("pooled") or c["verdict"]
    other = sum(v not in (pooled, "inconclusive") for v in runs)
    return f"{sum(v == pooled for v in runs)} of {len(runs)}" + (f" ({other} opposite)" if other else "")


def render_agreement(profile_name: str = "cpu", results: Path | None = None) -> str:
    """Per timing claim: each stored run's own verdict (ruled alone), the pooled one, and k of N."""
    recs = [
        (r["notebook"], c) for r in records(profile_name, results) for c in r["claims"] if c.get("per_run")
    ]
    n = max((len(c["per_run"]) for _, c in recs), default=0)
    if n < 2:
        return "Fewer than two stored runs: nothing to compare."
    lines = head(["notebook", "claim", *(f"run {i}" for i in range(1, n + 1)), "pooled", "k of N"])
    for nb, c in recs:
        runs = list(c["per_run"]) + ["not run"] * (n - len(c["per_run"]))
        lines.append(row([nb[:2], c["claim"], *runs, c.get("pooled") or "", k_of_n(c)]))
    holds = sum("opposite" not in k_of_n(c) for _, c in recs)
    return "\n".join(
        [*lines, "", f"In {holds} of {len(recs)} timing claims no stored run says the opposite."]
    )


def render_this_run(profile_name: str, run_data: Path, results: Path | None = None) -> str:
    """A run's timing verdicts (its claim records in `run_data`) beside the stored ones, matched by the
    claim's key, never by its place; records of another profile are refused."""
    mine = read_records(run_data)
    if not mine:
        raise ResultFileError(f"{run_data}: no claim records (NN_*{RECORD_SUFFIX}); expected a run's records")
    other = sorted({str(r.get("profile")) for r in mine} - {profile_name})
    if other:
        raise ResultFileError(f"{run_data}: records of profile {', '.join(other)}, not of {profile_name}")
    stored = {c.get("key"): c for r in records(profile_name, results) for c in r["claims"] if c.get("key")}
    lines = head(["notebook", "claim", "this run", "stored", "this run against the stored verdict"])
    for r in mine:
        for c in (c for c in r["claims"] if c.get("timing") and c.get("key")):
            ref = stored.get(c["key"], {}).get("verdict", "not stored")
            says = c.get("agreement") or ("agrees" if c["verdict"] == ref else "differs")
            lines.append(row([r["notebook"][:2], c["claim"], c["verdict"], ref, says]))
    return "\n".join(lines)
