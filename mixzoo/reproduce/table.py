"""The reproduction's tables: ours beside the paper's per point and mechanism, the claims'
verdicts, and the protocol (stated settings with their sources, our choices with their reasons),
as Markdown (printed, and written to ``<results>/reproduce/<name>.md``)."""
from __future__ import annotations

import math

from .collect import Results, matches
from .spec import Figure
from .verdict import RULE, ClaimResult, describe, interval


def _md_table(headers: list[str], rows: list[list[str]]) -> str:
    def esc(c) -> str:
        return str(c).replace("|", "\\|").replace("\n", " ")
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def fmt(v: float) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "—"
    return f"{v:.3e}" if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e4) else f"{v:.3f}"


def ours_cell(values: list[float]) -> tuple[str, int]:
    m, h, n = interval(values)
    if n == 0:
        return "—", 0
    return (fmt(m) if n < 2 else f"{fmt(m)} ± {fmt(h)}"), n


def value_rows(fig: Figure, res: Results) -> tuple[list[str], list[list[str]]]:
    columns = list(dict.fromkeys(r.column for r in fig.reference))
    headers = ["point", "mechanism", "ours (mean ± 95% t)", "n", *columns]
    rows = []
    for p in res.points:
        for m in res.models:
            cell, n = ours_cell(list(res.series(p.label, m, None).values()))
            refs = []
            for col in columns:
                hit = [r for r in fig.reference if r.column == col and r.model == m and matches(p.knobs, r.at)]
                refs.append(("≈ " if hit[0].approx else "") + f"{hit[0].value:g}" if hit else "—")
            if n == 0 and all(r == "—" for r in refs) and p.aggregate:
                continue
            rows.append([p.label, m + ("" if m in fig.models else " (ours only)"), cell, str(n), *refs])
    return headers, rows


def claim_rows(results: list[ClaimResult]) -> list[list[str]]:
    out = []
    for r in results:
        counts = {}
        for p in r.parts:
            counts[p.verdict] = counts.get(p.verdict, 0) + 1
        detail = r.note or ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))
        out.append([r.claim.id, r.claim.text, r.claim.source, describe(r.claim), f"**{r.verdict}**", detail])
    return out


def section(fig: Figure, res: Results, verdicts: list[ClaimResult], meta: dict) -> str:
    """One scale's section: the header, the values table, the claims, their details."""
    sc = fig.scale(res.scale)
    metric = fig.metric or (res.points[0].metric if res.points else "metric")
    lines = [f"## Scale `{res.scale}` ({len(res.seeds)} seeds)", ""]
    better = "higher" if res.points and res.points[0].higher_is_better else "lower"
    lines += [f"- scale: {sc.why}", f"- metric: test `{metric}` ({better} is better); ours: mean ± half-width "
              "of the 95% Student-t interval over n seeds",
              f"- rows: {meta.get('rows', 0)} from `{meta.get('results', '')}`; devices: {meta.get('devices') or '—'}; "
              f"git: {meta.get('git') or '—'}; produced by: `{meta.get('command') or '—'}`; {meta.get('when', '')}", ""]
    h, rows = value_rows(fig, res)
    lines += [_md_table(h, rows), "", "### Claims", "",
              _md_table(["claim", "the paper's words", "source", "tested", "verdict", "detail"], claim_rows(verdicts)), "",
              f"Rule: {RULE}", "", "<details><summary>Per point and pair</summary>", ""]
    for r in verdicts:
        lines.append(f"- **{r.claim.id}** ({r.verdict}): " + ("; ".join(p.text() for p in r.parts) or r.note))
    lines += ["", "</details>", ""]
    return "\n".join(lines)


def protocol(fig: Figure) -> str:
    who = (f"Mechanisms the paper compares: {', '.join(fig.models)}" if fig.kind == "sweep" else
           f"Estimators the paper compares: {', '.join(fig.models)}")
    if fig.extra_models:
        who += f"; run beside them (ours only, in no claim): {', '.join(fig.extra_models)}"
    who += f". Recipe `{fig.recipe}`, trained." if fig.kind == "sweep" else ". Training-free."
    lines = ["## Protocol", "", who, ""]
    lines += ["Stated by the paper (or the harness it follows):", "",
              _md_table(["what", "value", "source"], [[s.what, s.value, s.source] for s in fig.stated]), "",
              "Not stated; our choice, fixed before any run:", "",
              _md_table(["choice", "value", "why"], [[c.key, c.value, c.why] for c in fig.choices]), ""]
    if fig.mixer_knobs:
        lines += ["Constructor knobs fixed: " + "; ".join(f"{m}: {kn}" for m, kn in fig.mixer_knobs.items()), ""]
    lines += ["Scales: " + "; ".join(f"`{n}`: {s.why}" for n, s in fig.scales.items()), ""]
    if fig.notes:
        lines += [fig.notes, ""]
    lines += ["Sources (file:line): PR = paper_results.md, TS = task_specs.md, the project's reference notes "
              "(shared/reference/, beside the repository).", ""]
    return "\n".join(lines)


def document(fig: Figure, sections: list[str]) -> str:
    head = [f"# {fig.name}: {fig.paper}, {fig.figure}", "", fig.title, "",
            "Written by `mixzoo reproduce`; one section per scale with rows in this results directory. "
            "Rebuilt from the leaderboard rows at every run.", ""]
    return "\n".join(head + (sections or ["(no rows yet)", ""]) + [protocol(fig)])
