"""The ``mixzoo`` command line. Every command lives in a module with ``configure(parser)``
and ``main(args) -> int``; heavy imports happen inside ``main``, so ``--help`` is fast.
Bad input (a ``UsageError``) prints one line and exits with code 2, writing nothing.
The global options (``--results``, ``--plugin``, ``--device``) may also come after the command.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from .errors import UsageError

# command -> (module, help). Modules must import nothing heavy at top level.
COMMANDS = {
    "demo": ("mixzoo.commands", "the main job: small MQAR models with softmax and LLA, CPU-sized"),
    "tasks": ("mixzoo.commands", "list the registered tasks with their knobs"),
    "models": ("mixzoo.commands", "list the registered mechanisms, backends and sizes"),
    "run": ("mixzoo.commands", "train one mechanism on one task and write leaderboard rows"),
    "check-mixer": ("mixzoo.check", "check a mechanism against the mixer contract"),
    "check-zoo": ("mixzoo.zoo", "train every mechanism on every task family and recipe, briefly"),
    "sweep": ("mixzoo.sweeps.cli", "Optuna sweep from a spec; best config over seeds"),
    "compare": ("mixzoo.sweeps.cli", "sweep mechanisms over one difficulty axis"),
    "reproduce": ("mixzoo.reproduce.cli", "run a paper figure at a scale; ours beside the paper's, a verdict per claim"),
    "ttr": ("mixzoo.train.ttr", "training-free piecewise test-time regression"),
    "leaderboard": ("mixzoo.leaderboard.cli", "show, plot, export or report the leaderboard"),
    "bench": ("mixzoo.bench.cli", "benchmarks: kernels, mixers, throughput"),
}


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage error on one line, with exit code 2."""

    def error(self, message: str):
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def deprecated(new: str, note: str = ""):
    """An argparse action for an old option name: stores like ``new`` and says so on stderr once."""
    class Deprecated(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            sys.stderr.write(f"mixzoo: warning: {option_string} is deprecated; use {new}{note} "
                             f"(the old spelling goes in the next release)\n")
            setattr(namespace, self.dest, values)
    return Deprecated


def _global_options(p, *, top: bool) -> None:
    """``--results``, ``--plugin`` and ``--device``: on the top-level parser with their defaults; on
    each command's parser too, with no default (argparse.SUPPRESS), so that given after the command
    they override the value before it (``--plugin`` adds to it: see ``main``)."""
    def default(value) -> dict:
        return {"default": value if top else argparse.SUPPRESS}
    p.add_argument("--results", **default(os.environ.get("MIXZOO_RESULTS", "mixzoo-results")),
                   help="results directory (env MIXZOO_RESULTS; default ./mixzoo-results)")
    p.add_argument("--plugin", action="append", dest="plugin" if top else "plugin_after", **default([]),
                   metavar="PATH.py", help="a Python file registering mechanisms or tasks (repeatable)")
    p.add_argument("--device", **default("auto"), help="cpu, cuda, cuda:N or auto (default)")


def build_parser() -> Parser:
    p = Parser(prog="mixzoo", description="Benchmark sequence-mixing mechanisms on synthetic tasks.")
    _global_options(p, top=True)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name, (mod, help_) in COMMANDS.items():
        sp = sub.add_parser(name, help=help_, description=help_)
        m = importlib.import_module(mod)
        m.configure(name, sp)
        _global_options(sp.add_argument_group("global options (also accepted before the command)"), top=False)
        sp.set_defaults(_module=mod)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    args.plugin = [*args.plugin, *vars(args).pop("plugin_after", [])]
    if extra:
        # a command may take trailing positionals after its options (``bench mixers --quick gdn``):
        # argparse fills a nargs="*" positional before the options and leaves the rest over
        dest = getattr(importlib.import_module(args._module), "TRAILING", None) if args.command else None
        if dest is None or any(e.startswith("-") for e in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        setattr(args, dest, [*(getattr(args, dest) or []), *extra])
    if not args.command:
        parser.print_help()
        return 0
    try:
        from .kernels import switch_error
        if switch_error():
            raise UsageError(switch_error())
        from .registry import load_plugin_file
        for path in args.plugin:
            load_plugin_file(path)
        return int(importlib.import_module(args._module).main(args) or 0)
    except UsageError as e:
        sys.stderr.write(f"mixzoo: error: {e}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("mixzoo: interrupted\n")
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
