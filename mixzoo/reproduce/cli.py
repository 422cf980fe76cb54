"""``mixzoo reproduce NAME [--scale smoke|small|paper] [--seeds N] [--workers N]`` and
``mixzoo reproduce --list``.

Runs one paper figure (resumable: a rerun does only what is missing), prints ours beside the
paper's per point and mechanism with a verdict per claim, and writes the same as
``<results>/reproduce/<name>.md``; the rows are ordinary leaderboard rows (``leaderboard
show|report`` read them). Exit codes as ``mixzoo sweep``: 0 done, 1 unfinished (rerun to
resume), 2 bad input, 75 storage or disk failure, 130 Ctrl-C, 143 SIGTERM.
"""
from __future__ import annotations

from ..errors import UsageError

SCALE_CHOICES = ("smoke", "small", "paper")


def configure(name: str, p) -> None:
    p.add_argument("name", nargs="?", help="the reproduction (see --list): lla-fig3, lla-fig4, lla-fig5a, lla-fig5b, "
                                           "lla-fig6, parallax-mad, parallax-mad-hard")
    p.add_argument("--list", action="store_true", help="list the reproductions with settings and cost per scale")
    p.add_argument("--scale", choices=SCALE_CHOICES, default="small",
                   help="smoke (CPU, seconds), small (about half an hour of one H200; the default), paper (the "
                        "stated protocol)")
    p.add_argument("--seeds", type=int, help="final seeds (default: the scale's, 3; smoke 2)")
    p.add_argument("--workers", default="1", help="worker processes on this host (default 1); 'auto': GPUs x packing")
    p.add_argument("--storage", help="Optuna storage (default: a journal file under the results dir; env MIXZOO_STORAGE)")
    p.add_argument("--table", action="store_true", help="only rebuild and print the table from the rows present")


def add_parser(subparsers):
    """Add ``reproduce`` to an argparse subparsers object (``mixzoo.cli`` uses :func:`configure`)."""
    p = subparsers.add_parser("reproduce", help="run a paper figure and check its claims",
                              description="run a paper figure and check its claims")
    configure("reproduce", p)
    return p


def _cost_cell(fig, scale: str, dirs) -> str:
    from . import cost
    m = cost.measured(dirs, fig.name, scale)
    if m is not None:
        return f"{cost.fmt_duration(m['seconds'])} measured ({m['device']}, {m['date']})"
    if scale == "smoke":
        return "not measured (CPU, seconds)"
    c = cost.calibrated(fig, scale, dirs)
    if c is not None:
        return (f"not measured (estimate {cost.fmt_duration(c['seconds'])}, one H200: anchors "
                f"{cost.fmt_duration(c['anchors_seconds'])} x {c['factor']:.2f} as measured at {c['from']})")
    e = cost.estimate(fig, scale)
    return f"not measured (estimate {cost.fmt_duration(e['seconds'])}, one H200)"


def list_main(args) -> int:
    from ..leaderboard.views import format_table
    from . import figures, reference_dir
    dirs = [args.results, reference_dir()]
    body = []
    for fig in figures().values():
        n = "/".join(str(len(fig.scale(s).settings)) for s in SCALE_CHOICES)
        body.append([fig.name, f"{fig.paper.split(' (')[0]}, {fig.figure}", fig.kind,
                     str(len(fig.models)) + (f"+{len(fig.extra_models)}" if fig.extra_models else ""), n,
                     *(_cost_cell(fig, s, dirs) for s in SCALE_CHOICES)])
    print(format_table(["name", "figure", "kind", "mechanisms", "settings smoke/small/paper", "cost smoke",
                        "cost small", "cost paper"], body))
    print("mechanisms: the paper's + ours beside them. Estimates come from the README's H200 anchors "
          "(mixzoo/reproduce/cost.py), scaled by measured/estimated at another scale once one finished on a GPU "
          "('x F as measured at small'); a cost is 'measured' once a run at that scale finished here or in the "
          "reference results.")
    return 0


def main(args) -> int:
    if args.list:
        return list_main(args)
    if not args.name:
        raise UsageError("reproduce needs a NAME or --list; allowed: " + ", ".join(_names()))
    from . import get
    fig = get(args.name)
    if args.seeds is not None and args.seeds < 1:
        raise UsageError(f"--seeds {args.seeds} is not allowed; allowed: an integer >= 1")
    from ..sweeps.cli import parse_workers
    args.workers = parse_workers(args.workers)
    if args.table:
        from . import validate
        from .run import tabulate
        validate(fig)
        text, _ = tabulate(fig, args.results, scale=args.scale, seeds=args.seeds)
        print(text)
        return 0
    from .run import run
    return run(fig, args.scale, seeds=args.seeds, args=args)


def _names() -> list[str]:
    from . import figures
    return list(figures())
