"""The claims tables, generated from the stored claim outputs: every claim cell records its claims with the
run that printed them (claims.record: data/results/<profile>/<notebook>.claims.json, the same lines the
stored notebook's claim cell holds). Other profiles with records under data/results/ get a column each.

    render_compact(profile_name)           -> the README's table: one row per claim, its notebook, figures,
                                              verdict per profile, and for a timing claim its leave-one-out
                                              stability (k of N), how often a fresh run decides alone (the
                                              calibration table) and the paper's criterion
    render(profile_name)                   -> docs/claims.md's table: one row per claim with the paper's
    figure,
                                              the measured one, the basis (counting, interval, pairs) and
                                              the run it came from (command, date, commit), listed under it
    render_agreement(profile_name)         -> per timing claim, its verdict in each stored run and pooled
    update_readme(readme_path, profile)    -> rewrite the blocks between the profile's markers in the README
                                              and docs/claims.md; True if either changed

Each file holds its block between `<!-- claims:<profile>:begin -->` and `<!-- claims:<profile>:end -->`;
tests/test_claims_table.py regenerates both from the committed records and fails on any difference."""

from __future__ import annotations

import json
import re
from pathlib import Path

from artifact.errors import ResultFileError
from artifact.experiments.outputs.paths import RECORD_SUFFIX
from artifact.experiments.verdicts.judge import paper_ruled
from artifact.paths import atomic_write_text, data_dir, repo_root

_SAVE = re.compile(r'save\(fig, df, P, "([^"]+)"\)')


def study(notebook: str) -> str:
    """The module behind a notebook, named after it: 04_capacity_sweep -> studies/capacity_sweep.py, or the
    package's folder when the study has parts (07_routing_map -> studies/routing_map/)."""
    name = f"artifact/experiments/studies/{notebook.split('_', 1)[1]}"
    return f"{name}/" if (repo_root() / name).is_dir() else f"{name}.py"


def markers(profile_name: str) -> tuple[str, str]:
    return f"<!-- claims:{profile_name}:begin -->", f"<!-- claims:{profile_name}:end -->"


RECORD_KEYS = ("notebook", "claims")
CLAIM_KEYS = ("claim", "verdict")


def read_record(path: Path) -> dict:
    """One claim record (claims.record), or ResultFileError naming the file and what is wrong with it."""
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
    """The claim records in a folder, in notebook order (empty when it has none), each read_record."""
    return [read_record(p) for p in sorted(Path(directory).glob(f"[0-9][0-9]_*{RECORD_SUFFIX}"))]


def records(profile_name: str, results: Path | None = None) -> list[dict]:
    """The profile's claim records, in notebook order (empty when it has none)."""
    return read_records(Path(results or data_dir() / "results") / profile_name)


def other_profiles(profile_name: str, results: Path | None = None) -> list[str]:
    """Profiles other than `profile_name` with claim records under data/results/ (a GPU profile's run)."""
    root = Path(results or data_dir() / "results")
    return (
        sorted(
            p.name
            for p in root.iterdir()
            if p.is_dir() and p.name != profile_name and any(p.glob(f"[0-9][0-9]_*{RECORD_SUFFIX}"))
        )
        if root.is_dir()
        else []
    )


def figures(notebook: str, notebook_dir: Path | None = None) -> list[str]:
    """The figure names a notebook saves (its `save(fig, df, P, "name")` calls)."""
    path = Path(notebook_dir or repo_root() / "notebooks") / f"{notebook}.ipynb"
    if not path.is_file():
        return []
    cells = json.loads(path.read_text())["cells"]
    return [m for c in cells for m in _SAVE.findall("".join(c["source"]))]


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


def basis(c: dict) -> str:
    parts = [c.get("counting") or "", c.get("interval") or ""]
    if c.get("pairs") is not None:
        parts.append(f"{c['pairs']} pairs")
    return "; ".join(p for p in parts if p)


def verdict(c: dict) -> str:
    return f"{c['verdict']} ({c['reason']})" if c.get("reason") else c["verdict"]


def _run_key(r: dict) -> tuple:
    return (r.get("command", "unknown"), r.get("date", "unknown"), r.get("commit", "unknown"))


def render(
    profile_name: str = "cpu",
    results: Path | None = None,
    notebook_dir: Path | None = None,
    root: str = "../",
) -> str:
    """The full claims block for `profile_name` (docs/claims.md): a Markdown table, one row per recorded
    claim, and its runs. `root`: the repository root as seen from the file that holds the block (its
    links)."""
    recs = records(profile_name, results)
    if not recs:
        return f"No claim records for profile {profile_name} (run `./run_all.sh {profile_name}`)."
    others = {
        p: {r["notebook"]: r for r in records(p, results)} for p in other_profiles(profile_name, results)
    }
    runs: list[tuple] = []
    for r in recs:
        if _run_key(r) not in runs:
            runs.append(_run_key(r))
    head = [
        "notebook (module, figures)",
        "claim",
        "paper",
        f"measured ({profile_name})",
        f"verdict ({profile_name})",
        "basis (counting; interval; pairs)",
        "run",
    ]
    head += [f"{p}: verdict (measured)" for p in others]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in recs:
        nb = r["notebook"]
        num = nb.split("_")[0]
        where = f"{num} ([{Path(study(nb)).stem}]({root}{study(nb)}))"
        figs = figures(nb, notebook_dir)
        if figs:
            where += ": " + ", ".join(f"[{f}]({root}figures/{profile_name}/{f}.png)" for f in figs)
        run = f"run {runs.index(_run_key(r)) + 1}"
        for k, c in enumerate(r["claims"]):
            measured = c.get("measured", "") + (f" (margin: {c['margin']})" if c.get("margin") else "")
            row = [
                where if k == 0 else "",
                c["claim"],
                c.get("paper", ""),
                measured,
                verdict(c),
                basis(c),
                run,
            ]
            for by_nb in others.values():
                oc = by_nb.get(nb, {}).get("claims", [])
                row.append(f"{verdict(oc[k])} ({oc[k].get('measured', '')})" if k < len(oc) else "not run")
            lines.append("| " + " | ".join(_cell(x) for x in row) + " |")
    lines.append("")
    for i, (command, date, commit) in enumerate(runs, 1):
        nbs = ", ".join(r["notebook"].split("_")[0] for r in recs if _run_key(r) == (command, date, commit))
        lines.append(f"- run {i}: `{command}` on {date}, commit `{commit}` (notebooks {nbs})")
    for p, by_nb in others.items():
        prun = sorted({_run_key(r) for r in by_nb.values()})
        lines.append(f"- {p}: " + "; ".join(f"`{c}` on {d}, commit `{h}`" for c, d, h in prun))
    return "\n".join(lines)


# data/results/<profile>/calibration.csv: `python -m artifact calibrate --out`
CALIBRATION = "calibration.csv"
AS_STORED = "as stored"  # its scenario whose truth is the stored runs' own estimates


def fresh_decides(profile_name: str, results: Path | None = None) -> dict:
    """{timing claim key: % of fresh runs that decide alone} from the committed calibration table (scenario
    "as stored": a fresh run of this commit, the truth being what the stored runs measured); {} without
    one."""
    path = Path(results or data_dir() / "results") / profile_name / CALIBRATION
    if not path.is_file():
        return {}
    lines = path.read_text().splitlines()
    head = lines[0].split(",") if lines else []
    if not {"claim", "scenario", "fresh_decides"} <= set(head):
        raise ResultFileError(
            f"{path}: not a calibration table (expected the columns claim, scenario and "
            "fresh_decides of `python -m artifact calibrate --out`)"
        )
    out = {}
    for line in lines[1:]:
        row = dict(zip(head, line.split(",")))
        if row["scenario"] == AS_STORED:
            out[row["claim"]] = float(row["fresh_decides"])
    return out


def render_compact(
    profile_name: str = "cpu", results: Path | None = None, notebook_dir: Path | None = None
) -> str:
    """The README's claims block: one row per claim with its notebook, the notebook's first figure (first
    row), the verdict of every profile with records, and, for a timing claim, its leave-one-out stability
    (loo_text), how often a fresh run decides alone (the calibration harness) and the paper's criterion."""
    recs = records(profile_name, results)
    if not recs:
        return f"No claim records for profile {profile_name} (run `./run_all.sh {profile_name}`)."
    others = {
        p: {r["notebook"]: r for r in records(p, results)} for p in other_profiles(profile_name, results)
    }
    decides = fresh_decides(profile_name, results)
    head = (
        ["notebook", "claim", "figure", f"{profile_name}"]
        + list(others)
        + ["paper's result, ruled here", "leave one out", "a fresh run decides"]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in recs:
        nb = r["notebook"]
        figs = [f"[{f}](figures/{profile_name}/{f}.png)" for f in figures(nb, notebook_dir)][:1]
        for k, c in enumerate(r["claims"]):
            row = [
                f"[{nb[:2]}](notebooks/{nb}.ipynb)" if k == 0 else "",
                c["claim"],
                "".join(figs) if k == 0 else "",
                c["verdict"],
            ]
            for by_nb in others.values():
                oc = by_nb.get(nb, {}).get("claims", [])
                row.append(oc[k]["verdict"] if k < len(oc) else "not run")
            key = c.get("key") or ""
            row += [paper_ruled(key) if key else "", loo_text(c), decides.get(key, "")]
            lines.append("| " + " | ".join(_cell(x) for x in row) + " |")
    return "\n".join(lines)


def loo_text(c: dict) -> str:
    """'k of N': with each stored run left out in turn, how many of the N pooled verdicts over the others are
    the pooled verdict ("" for a claim that is not timed or has no leave-one-out views)."""
    views = c.get("leave_one_out") or []
    if not c.get("timing") or not views:
        return ""
    pooled = c.get("pooled") or c["verdict"]
    return f"{sum(v == pooled for v in views)} of {len(views)}"


# --- how stable the timing verdicts are ------------------------------------------------------------
# A timing claim's record holds the verdict each stored run gets on its own (`per_run`, replication.py) beside
# the
# pooled one: the README counts them (k of N), docs/claims.md lists them.
def k_of_n(c: dict) -> str:
    """'k of N' stored runs whose own verdict is the pooled one, with the count of opposite verdicts when
    there are any; "" for a claim that is not timed, "one run" for a timing claim without stored runs."""
    if not c.get("timing"):
        return ""
    runs = c.get("per_run") or []
    if not runs:
        return "one run"
    pooled = c.get("pooled") or c["verdict"]
    same = sum(v == pooled for v in runs)
    other = sum(v not in (pooled, "inconclusive") for v in runs)
    return f"{same} of {len(runs)}" + (f" ({other} opposite)" if other else "")


def render_agreement(profile_name: str = "cpu", results: Path | None = None) -> str:
    """Per timing claim: each stored run's own verdict, the pooled verdict, and k of N; then the count of
    claims where no run gave the opposite of the pooled verdict (a single run's verdict is the pooled one or
    inconclusive)."""
    recs = [
        (r["notebook"], c) for r in records(profile_name, results) for c in r["claims"] if c.get("timing")
    ]
    n = max((len(c.get("per_run") or []) for _, c in recs), default=0)
    if n < 2:
        return "Fewer than two stored runs: nothing to compare."
    head = ["notebook", "claim"] + [f"run {i}" for i in range(1, n + 1)] + ["pooled", "k of N"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    holds = 0
    for nb, c in recs:
        runs = list(c.get("per_run") or []) + ["not run"] * (n - len(c.get("per_run") or []))
        holds += "opposite" not in k_of_n(c)
        lines.append(
            "| "
            + " | ".join(
                _cell(x) for x in [nb.split("_")[0], c["claim"], *runs, c.get("pooled") or "", k_of_n(c)]
            )
            + " |"
        )
    lines += [
        "",
        f"In {holds} of {len(recs)} timing claims no stored run's own verdict is the opposite of "
        "the "
        "pooled one.",
    ]
    return "\n".join(lines)


def render_this_run(profile_name: str, run_data: Path, results: Path | None = None) -> str:
    """A run's timing verdicts (its claim records in `run_data`, e.g. results/<profile>/data/) beside the
    stored pooled ones: per claim whether the single-run property holds (the run's verdict is the pooled one
    or inconclusive, never the other one), and the count."""
    mine = read_records(run_data)
    if not mine:
        raise ResultFileError(
            f"{run_data}: no claim records (NN_*{RECORD_SUFFIX}); expected a run's "
            "records, e.g. "
            f"results/{profile_name}/data/"
        )
    stored = {r["notebook"]: r for r in records(profile_name, results)}
    head = ["notebook", "claim", "this run", "pooled (stored)", "holds"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    holds = total = 0
    for r in mine:
        ref = stored.get(r["notebook"], {}).get("claims", [])
        for k, c in enumerate(r["claims"]):
            if not c.get("timing"):
                continue
            pooled = (ref[k].get("pooled") or ref[k]["verdict"]) if k < len(ref) else "not stored"
            mine_v = c.get("this_run") or c["verdict"]
            ok = mine_v in (pooled, "inconclusive")
            holds, total = holds + ok, total + 1
            lines.append(
                "| "
                + " | ".join(
                    _cell(x) for x in [r["notebook"][:2], c["claim"], mine_v, pooled, "yes" if ok else "NO"]
                )
                + " |"
            )
    lines += ["", f"The single-run property holds for {holds} of {total} timing claims."]
    return "\n".join(lines)


def agreement_markers(profile_name: str) -> tuple[str, str]:
    return f"<!-- agreement:{profile_name}:begin -->", f"<!-- agreement:{profile_name}:end -->"


def replace_block(text: str, profile_name: str, block: str, marks: tuple[str, str] | None = None) -> str:
    begin, end = marks or markers(profile_name)
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise ValueError(f"expected one {begin} ... {end} pair in the file")
    head, rest = text.split(begin)
    _, tail = rest.split(end)
    return f"{head}{begin}\n{block}\n{end}{tail}"


CLAIMS_DOC = "docs/claims.md"  # the full table and the agreement block, beside the README's compact one


def update_readme(
    readme_path: Path | str | None = None, profile_name: str = "cpu", claims_doc: Path | str | None = None
) -> bool:
    """Rewrite the README's compact block for `profile_name` and docs/claims.md's full and agreement blocks
    (beside that README) from the records, atomically; True when either changed."""
    path = Path(readme_path or repo_root() / "README.md")
    doc = Path(claims_doc or path.parent / CLAIMS_DOC)
    changed = _rewrite(path, lambda t: replace_block(t, profile_name, render_compact(profile_name)))
    if doc.is_file():

        def full(text: str) -> str:
            new = replace_block(text, profile_name, render(profile_name))
            if agreement_markers(profile_name)[0] in new:
                new = replace_block(
                    new, profile_name, render_agreement(profile_name), agreement_markers(profile_name)
                )
            return new

        changed = _rewrite(doc, full) or changed
    return changed


def _rewrite(path: Path, edit) -> bool:
    text = path.read_text()
    new = edit(text)
    if new == text:
        return False
    atomic_write_text(path, new)
    return True
