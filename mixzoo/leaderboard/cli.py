"""``mixzoo leaderboard show|plot|export|report``."""
from __future__ import annotations

from ..errors import UsageError

ACTIONS = ("show", "plot", "export", "report")


def configure(name: str, p) -> None:
    p.add_argument("action", choices=ACTIONS)
    p.add_argument("--task", help="only this task")
    p.add_argument("--all", action="store_true", help="show every row, not the summary")


def main(args) -> int:
    from .store import read_table
    from .views import print_rows, print_summary
    table = read_table(args.results)
    if args.action == "show":
        if args.all:
            print_rows([r for r in table.to_pylist() if not args.task or r["task"] == args.task])
        else:
            print_summary(table, args.task)
        return 0
    raise UsageError(f"leaderboard {args.action} is not available yet; allowed now: show")
