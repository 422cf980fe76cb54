"""One self-contained HTML page of the whole leaderboard.

Tables and figures are embedded (figures as PNG data URIs); the page loads nothing from the
network (a Content-Security-Policy says so) and runs no script. It ends with the provenance
of the rows (versions, git sha, device) and the command that produced each result.
"""
from __future__ import annotations

import base64
import datetime as _dt
import html
import sys
import tempfile
from collections import Counter
from pathlib import Path

from .export import write_atomic
from .views import (
    MAD_TASKS,
    PROTOCOL,
    View,
    _numeric,
    as_rows,
    best_configs,
    best_view,
    col,
    complete_rows,
    default_axis,
    mad_view,
    pivot_view,
    rank_view,
    rows_view,
)

CSS = """
body{font:14px/1.45 -apple-system,"Segoe UI",Helvetica,Arial,sans-serif;color:#1b1b1b;max-width:1180px;
 margin:24px auto;padding:0 18px}
h1{font-size:24px;margin:0 0 4px}h2{font-size:19px;margin:30px 0 8px;border-bottom:1px solid #ddd;padding-bottom:3px}
h3{font-size:15px;margin:18px 0 6px}
table{border-collapse:collapse;margin:6px 0 4px;font-size:12.5px}
th,td{border-bottom:1px solid #e4e4e4;padding:3px 9px;text-align:left;vertical-align:top;white-space:nowrap}
th{background:#f4f4f4;font-weight:600}td.num{text-align:right;font-variant-numeric:tabular-nums}
tr:hover td{background:#fafafa}.note{color:#555;font-size:12.5px;margin:2px 0}
.warn{background:#fff4e5;border-left:4px solid #e69f00;padding:6px 10px;margin:8px 0}
figure{margin:10px 0 18px}figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{color:#555;font-size:12.5px}code{font-size:12px;background:#f4f4f4;padding:1px 4px;border-radius:3px}
td.cmd{white-space:normal;font-family:monospace;font-size:11.5px;max-width:560px;word-break:break-all}
details summary{cursor:pointer;color:#0b5394}.scroll{overflow-x:auto}
"""


def _e(s) -> str:
    return html.escape("" if s is None else str(s))


def _plain_table(headers: list[str], rows: list[list[str]]) -> str:
    """Header and text rows as an HTML table (numbers right-aligned)."""
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f'<td class="num">{_e(c)}</td>' if _numeric(c) else f"<td>{_e(c)}</td>"
                                    for c in r) + "</tr>" for r in rows)
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def table_html(v: View, extra: list[tuple[str, str]] | None = None) -> str:
    """A view as an HTML table, with its notes below."""
    if not v.records:
        return '<p class="note">(no rows)</p>'
    notes = "".join(f'<p class="note">{_e(n)}</p>' for n in v.notes)
    return _plain_table(v.headers, v.text_rows()) + notes


def _img(path: Path, caption: str) -> str:
    raw = path.read_bytes()
    width = int.from_bytes(raw[16:20], "big") * 2 // 3     # saved at 150 dpi, shown at 100
    data = base64.b64encode(raw).decode()
    return (f'<figure><img alt="{_e(caption)}" width="{width}" src="data:image/png;base64,{data}">'
            f"<figcaption>{_e(caption)}</figcaption></figure>")


def _provenance(rows: list[dict]) -> View:
    keys = ("mixzoo_version", "git_sha", "git_dirty", "python", "torch", "triton", "fla", "device_name")
    count = Counter(tuple(r.get(k) for k in keys) for r in rows)
    recs = [dict(zip(keys, k), rows=n) for k, n in sorted(count.items(), key=lambda x: -x[1])]
    display = [(k, col(k)) for k in (*keys, "rows")]
    return View("provenance", "Provenance", list(keys) + ["rows"], recs, display)


def _diagnostics(rows: list[dict]) -> View | None:
    """The mechanisms' diagnostics at each run's last validation (COMPLETE rows that have any)."""
    import json
    recs = []
    for r in complete_rows(rows):
        if r.get("diagnostics_json"):
            d = json.loads(r["diagnostics_json"])
            recs.append({"task": r.get("task"), "model": r.get("model"), "optimizer": r.get("optimizer") or "adamw",
                         "schedule": r.get("schedule") or "cosine", "seed": r.get("seed"), **d})
    if not recs:
        return None
    names = sorted({k for rec in recs for k in rec} - {"task", "model", "optimizer", "schedule", "seed"})
    recs.sort(key=lambda x: (str(x["task"]), str(x["model"]), x["optimizer"], x["seed"] or 0))
    keys = ["task", "model", "optimizer", "schedule", "seed", *names]
    return View("diagnostics", "Mechanism diagnostics", keys, recs, [(k, col(k)) for k in keys],
                ["At each run's last validation, on its mixers' inputs for a few validation examples "
                 "(layer<i>/<name>; e.g. Parallax's correction-to-output ratio and the stable rank of W_R)."])


def _commands(rows: list[dict]) -> str:
    v = rows_view(rows)
    head = "".join(f"<th>{_e(h)}</th>" for h in v.headers + ["run_id", "created (UTC)", "command"])
    body = []
    for rec, cells in zip(v.records, v.text_rows()):
        tds = "".join(f'<td class="num">{_e(c)}</td>' if _numeric(c) else f"<td>{_e(c)}</td>" for c in cells)
        created = rec.get("created_at")
        created = created.strftime("%Y-%m-%d %H:%M:%S") if hasattr(created, "strftime") else (created or "-")
        cmd = rec.get("command") or "(not recorded: run from the Python API)"
        body.append(f"<tr>{tds}<td>{_e(rec.get('run_id'))}</td><td>{_e(created)}</td>"
                    f'<td class="cmd">{_e(cmd)}</td></tr>')
    opened = " open" if len(v.records) <= 200 else ""
    return (f"<details{opened}><summary>{len(v.records)} rows (every seed of every run, all states)</summary>"
            f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'
            "</details>")


def _reproductions(rows: list[dict], results: str) -> list[tuple[str, str, str]]:
    """(anchor, title, HTML) per reproduced figure and scale among ``rows``: ours beside the paper's
    per point and mechanism, and each claim's verdict, the tables `mixzoo reproduce` writes."""
    from ..reproduce.run import scale_results
    from ..reproduce.table import claim_rows, value_rows
    from ..reproduce.verdict import RULE
    out = []
    for fig, scale, res, verdicts, meta in scale_results(rows, results):
        h, vrows = value_rows(fig, res)
        claims = [[c.replace("**", "") for c in r] for r in claim_rows(verdicts)]
        body = (f'<p class="note">{_e(fig.paper)}, {_e(fig.figure)}: {_e(fig.title)}. {len(res.seeds)} seeds; '
                f"{meta['rows']} rows; devices: {_e(meta.get('devices') or '-')}; git: {_e(meta.get('git') or '-')}; "
                f"produced by <code>{_e(meta.get('command') or '-')}</code>; {_e(meta.get('when', ''))}.</p>"
                + _plain_table(h, vrows) + "<h3>Claims</h3>"
                + _plain_table(["claim", "the paper's words", "source", "tested", "verdict", "detail"], claims)
                + f'<p class="note">{_e(RULE)}</p>')
        out.append((f"repro-{fig.name}-{scale}", f"{fig.name} (scale {scale})", body))
    return out


def render(rows: list[dict], *, results: str = "", warnings: list[str] | None = None,
           figdir: Path | None = None, ttr: tuple[dict, int | None] | None = None,
           curves: list[dict] | None = None) -> str:
    """The report page for ``rows`` (all of the store's rows) as an HTML string; ``curves``: the
    store's curves table (row dicts), drawn per task (training loss and validation metric)."""
    from . import plot
    warnings = list(warnings or [])
    done = complete_rows(rows)
    bests = best_configs(rows)
    tasks = sorted({b.task for b in bests})
    states = Counter(r.get("state") for r in rows)
    now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    figdir = Path(figdir or tempfile.mkdtemp(prefix="mixzoo-report-"))
    parts = [f"<h1>mixzoo leaderboard</h1><p class=\"note\">Generated {now} from <code>{_e(results)}</code>: "
             f"{len(rows)} rows ({', '.join(f'{n} {s}' for s, n in sorted(states.items(), key=str))}), "
             f"{len({r.get('run_id', '').rsplit('-s', 1)[0] for r in rows})} runs, {len(tasks)} tasks, "
             f"{len({b.model for b in bests})} mechanisms.</p>",
             f'<p class="note">{_e(PROTOCOL)}</p>']
    try:
        repro = _reproductions(rows, results)
    except Exception as e:  # a reproduction that cannot be tabulated must not lose the report
        warnings.append(f"reproduction tables not built: {type(e).__name__}: {e}")
        repro = []
    for w in warnings:
        parts.append(f'<div class="warn">{_e(w)}</div>')
    toc = ([("mad", "MAD score")] if any(b.task in MAD_TASKS for b in bests) else []) + \
        ([("rank", "Ranking per task")] if bests else []) + [(f"task-{t}", t) for t in tasks] + \
        ([("repro", "Reproductions of the papers")] if repro else []) + \
        [("provenance", "Provenance"), ("commands", "Every result and its command")]
    parts.append('<p class="note">Contents: ' + " · ".join(f'<a href="#{_e(a)}">{_e(t)}</a>' for a, t in toc) + "</p>")

    def figure(fn, caption, **kw):
        try:
            return _img(fn(**kw), caption)
        except Exception as e:  # a figure that cannot be drawn must not lose the report
            warnings.append(f"figure '{caption}' not drawn: {type(e).__name__}: {e}")
            return f'<div class="warn">{_e(warnings[-1])}</div>'

    if any(b.task in MAD_TASKS for b in bests):
        parts += ['<h2 id="mad">MAD score</h2>', table_html(mad_view(rows))]
    if bests:
        parts += ['<h2 id="rank">Ranking per task</h2>', table_html(rank_view(rows)),
                  figure(plot.plot_bars, "Score per task: bars are the mean over settings; dots single settings.",
                         table=rows, out=figdir / "tasks-bars.png")]
    for t in tasks:
        trows = [r for r in rows if r.get("task") == t]
        tb = [b for b in bests if b.task == t]
        parts += [f'<h2 id="task-{_e(t)}">{_e(t)}</h2>', table_html(best_view(trows))]
        axis = default_axis(tb)
        if axis:
            parts += [f"<h3>Against {_e(axis)}</h3>", table_html(pivot_view(trows, t, axis)),
                      figure(plot.plot_metric_vs_axis, f"{t}: test metric against {axis}, one line per mechanism.",
                             table=trows, task=t, axis=axis, out=figdir / f"{t}-{axis}.png")]
        runs = {r.get("run_id") for b in tb for r in b.rows}
        tcurves = [c for c in curves or [] if c.get("run_id") in runs]
        if tcurves:
            parts += ["<h3>Training curves</h3>",
                      figure(plot.plot_training_curves, f"{t}: training loss and validation metric against the "
                             "step, best configuration per mechanism and setting.",
                             table=trows, curves=tcurves, task=t, out=figdir / f"{t}-curves.png")]
    curves, seg = ttr if ttr is not None else plot.ttr_curves_from_rows(rows)
    if curves:
        parts += ["<h2>Test-time regression</h2>",
                  figure(plot.plot_ttr_curves, "Per-position MSE of each estimator (log scale).",
                         curves=curves, out=figdir / "ttr-mse.png", segment_len=seg)]
    if not rows:
        parts.append('<p class="note">The leaderboard is empty.</p>')
    elif not done:
        parts.append('<p class="note">No COMPLETE rows yet.</p>')
    if repro:
        parts.append('<h2 id="repro">Reproductions of the papers</h2><p class="note">Per figure and scale '
                     "(<code>mixzoo reproduce NAME</code>): ours beside the paper's value per point and "
                     "mechanism, then each claim's verdict. " + " · ".join(
                         f'<a href="#{_e(a)}">{_e(t)}</a>' for a, t, _ in repro) + "</p>")
        parts += [f'<h3 id="{_e(a)}">{_e(t)}</h3>{b}' for a, t, b in repro]
    diag = _diagnostics(rows)
    if diag is not None:
        parts += ['<h2 id="diagnostics">Mechanism diagnostics</h2>', table_html(diag)]
    parts += ['<h2 id="provenance">Provenance</h2>', table_html(_provenance(rows)),
              '<h2 id="commands">Every result and the command that produced it</h2>', _commands(rows)]
    csp = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            '<link rel="icon" href="data:,"><title>mixzoo leaderboard</title>'
            f"<style>{CSS}</style></head><body>\n" + "\n".join(parts) + "\n</body></html>\n")


def build_report(results: str | Path, out: str | Path | None = None, *, warn=None,
                 ttr: tuple[dict, int | None] | None = None) -> Path:
    """Read the store (skipping damaged files, with a warning) and write the report."""
    from .store import read_table
    warnings: list[str] = []

    def _warn(msg: str) -> None:
        warnings.append(msg)
        (warn or (lambda m: print(f"mixzoo: warning: {m}", file=sys.stderr)))(msg)

    from .store import read_curves
    rows = as_rows(read_table(results, warn=_warn))
    curves = read_curves(results, warn=_warn).to_pylist()
    out = Path(out) if out else Path(results) / "report.html"
    with tempfile.TemporaryDirectory(prefix="mixzoo-report-") as d:
        page = render(rows, results=str(results), warnings=warnings, figdir=Path(d), ttr=ttr, curves=curves)
    return write_atomic(out, page)
