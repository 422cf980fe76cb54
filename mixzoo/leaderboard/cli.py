"""``mixzoo leaderboard show|plot|export|report``: one subcommand each, with its own ``--help``.

show    print a view as a table (default: best configuration per mechanism and setting)
plot    PNG figures: metric against a knob (axis), bars per task (bars), test-time regression (ttr),
        training curves (curves: loss and validation metric against step)
export  a view as CSV or Markdown
report  one self-contained HTML page of the whole leaderboard (curves included)
"""
from __future__ import annotations

import sys

from ..errors import UsageError

ACTIONS = {"show": "print a view of the leaderboard as a table",
           "plot": "write PNG figures (metric against a knob, bars per task, ttr curves, training curves)",
           "export": "write a view as CSV or Markdown",
           "report": "write one self-contained HTML page of the whole leaderboard"}
VIEWS = ("best", "pivot", "mad", "rank", "rows")
KINDS = ("axis", "bars", "ttr", "curves")


def _filters(p) -> None:
    p.add_argument("--suite", help="only this suite (e.g. mqar, mad)")
    p.add_argument("--task", help="only this task")
    p.add_argument("--models", "--model", dest="model", metavar="A,B",
                   help="only these mechanisms (comma-separated)")
    p.add_argument("--where", action="append", metavar="KNOB=V", help="only settings with this knob value (repeatable)")
    p.add_argument("--with-reference", action="store_true",
                   help="add the published reference rows (the repository's results/, or $MIXZOO_REFERENCE), "
                        "their mechanisms labelled '<name> (reference)'")


def _view(p) -> None:
    p.add_argument("--view", choices=VIEWS, default=None, help="which table (default best)")
    p.add_argument("--axis", help="pivot axis: a task knob (default: the knob with the most values)")
    p.add_argument("--all", action="store_true", help="every row (same as --view rows)")


def _ttr_curves(p) -> None:
    p.add_argument("--curves", metavar="FILE.json", help="per-position MSE curves of test-time regression "
                   "({name: [mse, ...]} or {'curves': {...}, 'segment_len': S}) instead of those in the store")
    p.add_argument("--segment-len", type=int, help="mark segment boundaries every S positions (ttr)")


def configure(name: str, p) -> None:
    from ..cli import _global_options
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True, parser_class=type(p))
    for action, help_ in ACTIONS.items():
        sp = sub.add_parser(action, help=help_, description=help_)
        if action == "show":
            _filters(sp)
            _view(sp)
        elif action == "export":
            _filters(sp)
            _view(sp)
            sp.add_argument("--format", choices=("csv", "md"), default=None,
                            help="csv or md (default from --out's suffix, else csv)")
            sp.add_argument("--out", help="the file to write (.csv or .md)")
        elif action == "plot":
            _filters(sp)
            sp.add_argument("--kind", choices=KINDS, action="append",
                            help="which figure (repeatable; default axis and bars)")
            sp.add_argument("--axis", help="axis plot: a task knob (default: the knob with the most values)")
            _ttr_curves(sp)
            sp.add_argument("--out", help="directory (default <results>/figures)")
        else:
            _ttr_curves(sp)
            sp.add_argument("--out", help="file (default <results>/report.html)")
        _global_options(sp.add_argument_group("global options (also accepted before the command)"), top=False)


def _warn(msg: str) -> None:
    print(f"mixzoo: warning: {msg}", file=sys.stderr)


def _load(args) -> tuple[list[dict], list[dict]]:
    """(all rows, filtered rows); a filter that matches nothing in the store is a usage error."""
    from ..commands import parse_pairs
    from .store import read_table
    from .views import as_rows, filter_rows
    rows = as_rows(read_table(args.results, warn=_warn))
    if getattr(args, "with_reference", False):
        from ..reproduce import reference_dir, reference_rows
        ref = as_rows(reference_rows())
        if not ref:
            _warn(f"no reference rows under {reference_dir()}/leaderboard (published once the GPU runs land)")
        # a mechanism of the reference is its own line beside the user's rows of the same mechanism
        rows = rows + [{**r, "model": f"{r['model']} (reference)"} for r in ref]
    models = [m.strip() for m in args.model.split(",") if m.strip()] if args.model else None
    for what, vals in (("suite", [args.suite] if args.suite else []), ("task", [args.task] if args.task else []),
                       ("model", models or [])):
        present = {r.get(what) for r in rows}
        for v in vals:
            if rows and v not in present:
                raise UsageError(f"no rows with {what} {v!r}; present: {', '.join(sorted(map(str, present)))}")
    where = parse_pairs(args.where, "--where")
    if rows and where:
        from .views import knobs_of
        known = sorted({k for r in rows for k in knobs_of(r)})
        for k in where:
            if k not in known:
                raise UsageError(f"--where {k}={where[k]}: no row has a knob {k!r}; knobs present: "
                                 f"{', '.join(known) or '(none)'}")
    return rows, filter_rows(rows, suite=args.suite, task=args.task, models=models, where=where)


def _views(args, rows):
    from .views import build_views, complete_rows, task_knobs
    view = args.view or ("rows" if getattr(args, "all", False) else "best")
    if view == "pivot" and args.axis:
        tasks = [args.task] if args.task else sorted({r["task"] for r in complete_rows(rows)})
        having = [t for t in tasks if args.axis in task_knobs(rows, t)]
        if not having:
            knobs = sorted({k for t in tasks for k in task_knobs(rows, t)})
            where = f"task {args.task!r}" if args.task else "any task"
            raise UsageError(f"unknown axis {args.axis!r} for {where}; allowed: {', '.join(knobs)}")
        return [v for t in having for v in build_views(rows, view, task=t, axis=args.axis)]
    return build_views(rows, view, task=args.task, axis=args.axis)


def _curves(args, rows):
    import json
    from pathlib import Path

    from .plot import ttr_curves_from_rows
    if not getattr(args, "curves", None):
        curves, seg = ttr_curves_from_rows(rows)
        return curves, args.segment_len or seg
    try:
        data = json.loads(Path(args.curves).read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot read curves file {args.curves!r}: {e}")
    seg = args.segment_len
    if isinstance(data, dict) and isinstance(data.get("curves"), dict):
        seg = seg or data.get("segment_len")
        data = data["curves"]
    if not isinstance(data, dict) or not all(isinstance(v, list) for v in data.values()):
        raise UsageError(f"curves file {args.curves!r} must map names to lists of numbers")
    return data, seg


def main(args) -> int:
    if args.action == "report":
        from .report import build_report
        ttr = _curves(args, []) if args.curves else None
        path = build_report(args.results, args.out, warn=_warn, ttr=ttr)
        print(f"report written to {path}")
        return 0
    rows, sel = _load(args)
    if args.action == "show":
        from .views import format_view
        if not rows:
            print(f"(leaderboard is empty: no rows under {args.results}/leaderboard/)")
            return 0
        print("\n\n".join(format_view(v) for v in _views(args, sel)))
        return 0
    if args.action == "export":
        from .export import export, format_of
        if not args.out:
            raise UsageError("export needs --out PATH (a .csv or .md file)")
        fmt = format_of(args.out, args.format)
        print(f"{args.view or 'best'} view written to {export(_views(args, sel), fmt, args.out)}")
        return 0
    return _plot(args, rows, sel)


def _plot(args, rows, sel) -> int:
    from pathlib import Path

    from . import plot
    from .views import best_configs, default_axis, task_knobs
    out = Path(args.out) if args.out else Path(args.results) / "figures"
    kinds = args.kind or ["axis", "bars"]
    written = []
    if "curves" in kinds:
        from .store import read_curves
        from .views import best_configs as _bests
        tasks = [args.task] if args.task else sorted({b.task for b in _bests(sel)})
        curves = read_curves(args.results, warn=_warn).to_pylist()
        for t in tasks:
            got = plot.plot_training_curves(sel, curves, task=t, out=out)
            if got is not None:
                written.append(got)
            else:
                print(f"{t}: no training curves in the store (rows written before curves were kept)",
                      file=sys.stderr)
    if "ttr" in kinds:
        curves, seg = _curves(args, sel)
        if not curves:
            raise UsageError("no test-time regression curves in the store; give --curves FILE.json")
        written.append(plot.plot_ttr_curves(curves, out, segment_len=seg))
    bests = best_configs(sel)
    if ("axis" in kinds or "bars" in kinds) and not bests:
        if "ttr" not in kinds:
            raise UsageError("no COMPLETE rows match; nothing to plot")
    else:
        if "bars" in kinds:
            written.append(plot.plot_bars(sel, out=out))
        if "axis" in kinds:
            tasks = [args.task] if args.task else sorted({b.task for b in bests})
            for t in tasks:
                if args.axis and not args.task and args.axis not in task_knobs(sel, t):
                    continue
                axis = args.axis or default_axis([b for b in bests if b.task == t])
                if axis is None:
                    print(f"{t}: one setting only; no axis to plot against", file=sys.stderr)
                    continue
                written.append(plot.plot_metric_vs_axis(sel, task=t, axis=axis, out=out,
                                                        models=None))
    for p in written:
        print(f"figure written to {p}")
    return 0
