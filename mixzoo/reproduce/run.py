"""What ``mixzoo reproduce NAME`` does: run a figure at a scale (resumable), then tabulate.

A trained figure runs through the sweep engine (:func:`mixzoo.sweeps.run.coordinate`): one study
per (setting, mechanism) in the Optuna storage under the results directory, a rerun resumes
where it stopped and runs nothing already done. A training-free figure runs :mod:`.ttr`, one
leaderboard file per (setting, seed), skipping those present. Either way the table is then
rebuilt from the leaderboard rows, printed, and written to ``<results>/reproduce/<name>.md``,
and the invocation is appended to ``<results>/reproduce/<name>.runs.jsonl`` (what
``--list`` reads as the measured cost).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
import time
from pathlib import Path

from ..errors import UsageError
from . import cost, reference_dir, validate
from .collect import Results, read_rows
from .spec import SCALES, Figure, sweep_raw
from .table import document, section
from .verdict import evaluate_all


def _rows_of(rows: list[dict], fig: Figure, scale: str) -> list[dict]:
    prefix = f"{fig.name}[{scale}]/"
    return [r for r in rows if (r.get("study") or "").startswith(prefix)]


def _meta(rows: list[dict], results, recs: list[dict]) -> dict:
    shas = sorted({(r.get("git_sha") or "?")[:8] + ("+dirty" if r.get("git_dirty") else "") for r in rows})
    times = sorted(str(r.get("created_at"))[:16] for r in rows if r.get("created_at") is not None)
    return {"rows": len(rows), "results": str(results),
            "devices": ", ".join(sorted({str(r.get("device_name")) for r in rows if r.get("device_name")})),
            "git": ", ".join(shas), "command": recs[-1].get("command") if recs else None,
            "when": f"rows written {times[0]} .. {times[-1]} UTC" if times else ""}


def tabulate(fig: Figure, results, *, scale: str, seeds: int | None, out: bool = True) -> tuple[str, list]:
    """(this scale's section, its verdicts); rewrites ``<results>/reproduce/<name>.md`` with a
    section for every scale that has rows here."""
    rows = read_rows(results)
    recs = cost.records(results, fig.name)
    sections, mine, verdicts = [], "", []
    for sc in SCALES:
        these = _rows_of(rows, fig, sc)
        if not these and sc != scale:
            continue
        res, vs, meta = _scale_result(fig, sc, these, results, recs, seeds, own=sc == scale)
        text = section(fig, res, vs, meta)
        if these:
            sections.append(text)
        if sc == scale:
            mine, verdicts = text, vs
    if out:
        d = Path(results) / "reproduce"
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".{fig.name}.md.tmp"
        tmp.write_text(document(fig, sections))
        os.replace(tmp, d / f"{fig.name}.md")
    return mine, verdicts


def _scale_result(fig: Figure, scale: str, these: list[dict], results, recs: list[dict],
                  seeds: int | None = None, own: bool = False) -> tuple[Results, list, dict]:
    """One scale's results from its rows, the claims' verdicts and the provenance. The seeds: ``seeds``
    for the scale being run (``own``; None: the scale's own), else as the last run at that scale recorded."""
    mine = [r for r in recs if r.get("scale") == scale]
    n = seeds if own else (mine[-1].get("seeds") if mine else None)
    res = Results(fig, scale, these, n)
    return res, evaluate_all(fig.claims, res), _meta(these, results, mine)


def scale_results(rows: list[dict], results) -> list[tuple[Figure, str, Results, list, dict]]:
    """Every (figure, scale) with rows among ``rows``: its results, the claims' verdicts and the
    provenance, as ``tabulate`` computes them (what the HTML report shows beside the leaderboard)."""
    from . import figures
    out = []
    for fig in figures().values():
        recs = cost.records(results, fig.name) if results else []
        for sc in SCALES:
            these = _rows_of(rows, fig, sc)
            if these:
                out.append((fig, sc, *_scale_result(fig, sc, these, results, recs)))
    return out


def _device_name(device: str | None) -> str:
    try:
        import torch
        if device in (None, "auto", "cuda") or str(device).startswith("cuda"):
            if torch.cuda.is_available():
                return torch.cuda.get_device_name(0)
    except Exception:
        pass
    import platform
    return f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def run(fig: Figure, scale: str, *, seeds: int | None, args) -> int:
    from ..api import check_results_dir, command_line
    results = check_results_dir(args.results)
    if scale == "smoke" and results.resolve() == reference_dir().resolve():
        raise UsageError(f"--results {args.results!r} is the reference leaderboard; smoke rows are never reference "
                         "results; allowed: another results directory")
    validate(fig)
    sc = fig.scale(scale)
    n_seeds = int(seeds if seeds is not None else sc.seeds)
    before = len(_rows_of(read_rows(results), fig, scale))
    started = _dt.datetime.now(_dt.UTC)
    t0 = time.time()
    command = command_line()
    print(f"reproduce {fig.name} [{scale}]: {fig.paper}, {fig.figure}; {len(sc.settings)} settings x "
          f"{len(fig.models_at(scale))} mechanisms, {n_seeds} seeds; results {results}", flush=True)
    dev = _device_name(args.device)
    if scale != "smoke" and dev.startswith("cpu"):
        print(f"note: scale {scale} is sized for one H200 (see --list); on this CPU it takes far longer",
              file=sys.stderr, flush=True)
    if fig.kind == "sweep":
        rc = _sweep(fig, scale, n_seeds, args, results)
    else:
        from . import ttr
        rc, _ = ttr.run(fig, scale, list(range(n_seeds)), results, args.device, command)
    wall = time.time() - t0
    rows_now = len(_rows_of(read_rows(results), fig, scale))
    cost.append_record(results, fig.name, {
        "scale": scale, "seeds": n_seeds, "started": started.isoformat(timespec="seconds"),
        "finished": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"), "wall_s": round(wall, 1), "rc": rc,
        "complete": rc == 0, "new_rows": rows_now - before, "device": dev,
        "workers": str(getattr(args, "workers", 1)), "command": command})
    text, _ = tabulate(fig, results, scale=scale, seeds=n_seeds)
    print()
    print(text)
    print(f"table written to {Path(results) / 'reproduce' / (fig.name + '.md')} ({wall:.0f} s)", flush=True)
    if rc != 0:
        print(f"reproduce {fig.name} [{scale}] not complete (exit code {rc}; see above); the same command "
              "resumes what is unfinished", file=sys.stderr)
    return rc


def _sweep(fig: Figure, scale: str, n_seeds: int, args, results: Path) -> int:
    from ..sweeps.cli import STORAGE_ENV
    from ..sweeps.run import coordinate
    from ..sweeps.spec import load
    raw = sweep_raw(fig, scale, n_seeds)
    spec = load(fig.name, None, raw=raw)
    d = results / "reproduce" / "specs"
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{fig.name}-{scale}.json"          # the workers load it (and `mixzoo sweep FILE` can)
    path.write_text(json.dumps(raw, indent=1, default=str))
    ns = argparse.Namespace(results=str(results), device=args.device, plugin=list(args.plugin or []),
                            workers=args.workers, command="reproduce", seeds=n_seeds, models=None, tasks=None,
                            trials=None)
    return coordinate(ns, spec, args.storage or os.environ.get(STORAGE_ENV), spec_arg=str(path))
