"""``mixzoo sweep`` and ``mixzoo compare``.

``mixzoo sweep SPEC [--budget smoke|small|paper] [--storage URL] [--workers N]`` sets up one
Optuna study per (mechanism, task setting), starts N worker processes on this host (another
host joins by running the same command against the same storage), waits, and prints a summary.
``mixzoo compare TASK --models a,b --axis knob=v1,v2`` is a sweep over one difficulty axis,
ending with a table and a plot of the metric against the axis.
"""
from __future__ import annotations

import os

from ..errors import UsageError

STORAGE_ENV = "MIXZOO_STORAGE"      # the storage URL, also how workers receive it (never argv)
COMMAND_ENV = "MIXZOO_SWEEP_COMMAND"


def configure(name: str, p) -> None:
    from ..cli import deprecated
    if name == "sweep":
        p.add_argument("spec", help="a spec TOML file or a built-in spec name (mqar, mad, icl-regression, ...)")
        p.add_argument("--budget", help="the spec's budget preset: smoke (CPU, seconds), small (one GPU), paper")
        p.add_argument("--preset", dest="budget", action=deprecated("--budget"), help="old name of --budget")
        p.add_argument("--models", help="only these mechanisms (comma-separated)")
        p.add_argument("--tasks", help="only these tasks of the spec (comma-separated)")
        p.add_argument("--list", action="store_true", help="print the studies the spec expands to, then exit")
        p.add_argument("--worker-index", type=int, default=None, help=argparse_suppress())
    else:
        p.add_argument("task", help="task name (see 'mixzoo tasks')")
        p.add_argument("--models", required=True, help="mechanisms, comma-separated (e.g. softmax,lla)")
        p.add_argument("--axis", required=True, metavar="KNOB=V1,V2,...", help="the difficulty axis and its values")
        p.add_argument("--set", action="append", metavar="KNOB=V", help="a fixed task knob (repeatable)")
        p.add_argument("--preset", "--task-preset", dest="task_preset",
                       help="the task's own preset (see 'mixzoo tasks'), as in 'mixzoo run'")
        p.add_argument("--budget", help="budget preset of the task's built-in spec: smoke, small or paper")
        p.add_argument("--out", help="the plot's path (default <results>/sweeps/compare-<task>-<axis>.png)")
    p.add_argument("--storage", help=f"Optuna storage: a PostgreSQL URL or a journal file path (env {STORAGE_ENV}; "
                                     "default a journal file under the results dir)")
    p.add_argument("--trials", type=int, help="Optuna trials per (mechanism, setting), overriding the spec")
    p.add_argument("--seeds", type=int, help="final seeds of the best configuration (default: the spec's, 3)")
    p.add_argument("--stack", metavar="K|auto",
                   help="train up to K trials of a study at a time as one stacked model (step_mode stacked), "
                        "where its space varies only lr and weight_decay; 1: one at a time; auto: by the run's "
                        "size on a GPU, 1 elsewhere (default: the spec's stack, auto)")
    p.add_argument("--workers", default="1",
                   help="worker processes on this host (default 1: in this process); 'auto': GPUs x the packing "
                        "the run size calls for (several small runs per GPU), 1 without a GPU")


def parse_workers(value) -> int | str:
    """``--workers``: an integer >= 1 or 'auto'; anything else is bad input."""
    if str(value) == "auto":
        return "auto"
    try:
        n = int(value)
    except ValueError:
        raise UsageError(f"--workers {value!r} is not allowed; allowed: an integer >= 1 or 'auto'") from None
    if n < 1:
        raise UsageError(f"--workers {n} is not allowed; allowed: an integer >= 1 or 'auto'")
    return n


def argparse_suppress():
    import argparse
    return argparse.SUPPRESS


def _csv(v: str | None) -> list[str] | None:
    return [x.strip() for x in v.split(",") if x.strip()] if v else None


def main(args) -> int:
    from . import run as runner
    args.workers = parse_workers(args.workers)
    if args.stack is not None and args.stack != "auto":
        try:
            args.stack = int(args.stack)
        except ValueError:
            raise UsageError(f"--stack {args.stack} is not allowed; allowed: an integer >= 1 or auto") from None
    for k in ("trials", "seeds", "stack"):
        v = getattr(args, k)
        if v is not None and v != "auto" and v < 1:
            raise UsageError(f"--{k} {v} is not allowed; allowed: an integer >= 1" + (" or auto" if k == "stack" else ""))
    storage = args.storage or os.environ.get(STORAGE_ENV)
    if args.command == "sweep":
        spec = runner.load_spec(args.spec, args.budget, models=_csv(args.models), tasks=_csv(args.tasks),
                                trials=args.trials, seeds=args.seeds, stack=args.stack)
        if args.list:
            runner.print_plan(spec)
            return 0
        if not spec.units:
            return runner.run_ttr(args, spec)
        if args.worker_index is not None:
            return runner.worker_main(args, spec, storage)
        return runner.coordinate(args, spec, storage, spec_arg=args.spec)
    return runner.compare(args, storage)
