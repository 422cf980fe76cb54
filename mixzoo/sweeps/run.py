"""What ``mixzoo sweep`` and ``mixzoo compare`` do: set up, start workers, wait, summarize.

Exit codes: 0 done; 1 unfinished (rerun to resume); 2 bad input (one line, nothing written);
75 the storage or the results disk failed (a database down past ``MIXZOO_STORAGE_RETRY_S``, a
full disk; one line; rerun to resume once it is fixed); 130 Ctrl-C; 143 SIGTERM. On Ctrl-C or
SIGTERM each worker gives its trial back (re-enqueued) and stops; the coordinator passes a
SIGTERM sent to it alone on to its workers.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from ..errors import UsageError
from . import engine
from .spec import Spec, Unit, budgets_of, builtin_names, load, merge, read_raw
from .storage import (
    EXIT_STORAGE,
    StorageError,
    check_parallel,
    clear_interrupt,
    interrupt,
    mask,
    open_storage,
    resolve,
    retry_window,
    say,
    scrub,
)


def load_spec(spec: str, preset: str | None = None, **kw) -> Spec:
    return load(spec, preset, **kw)


def print_plan(spec: Spec) -> None:
    print(f"spec {spec.name} [{spec.preset or '-'}] ({spec.source}): {len(spec.units)} studies")
    if spec.ttr:
        print(f"  training-free: 'mixzoo ttr' with {spec.ttr}")
    for u in spec.units:
        print(f"  {u.study}  trials {u.trials}, seeds {u.seeds}, space {', '.join(u.space) or '(none)'}")


def run_ttr(args, spec: Spec) -> int:
    """A training-free spec: the 'mixzoo ttr' evaluation with the spec's options (no Optuna:
    the evaluation tunes each core's small grid itself)."""
    import argparse

    from ..train import ttr
    p = argparse.ArgumentParser(prog="mixzoo ttr")
    ttr.configure("ttr", p)
    ns = p.parse_args([])
    for k, v in spec.ttr.items():
        key = k.replace("-", "_")
        if not hasattr(ns, key) or key in ("results", "device", "plugin", "command"):
            allowed = sorted(a.dest for a in p._actions if a.dest != "help")
            raise UsageError(f"spec {spec.name!r} [ttr]: unknown option {k!r}; allowed: {', '.join(allowed)}")
        setattr(ns, key, ",".join(map(str, v)) if isinstance(v, list) else v)
    ns.results, ns.device, ns.plugin, ns.command = args.results, args.device, args.plugin, "ttr"
    print(f"spec {spec.name} [{spec.preset or '-'}]: training-free; running 'mixzoo ttr' with "
          + " ".join(f"--{k.replace('_', '-')} {getattr(ns, k.replace('-', '_'))}" for k in spec.ttr), flush=True)
    return int(ttr.main(ns) or 0)


# ---------------------------------------------------------------------------- logs
class Logs:
    """Terse lines to the screen (and the file); the trainer's lines to the file only. A log file
    that cannot be written (a full disk) is dropped with one warning; the sweep goes on."""

    def __init__(self, results: str, spec: str, url: str, prefix: str = ""):
        d = Path(results) / "sweeps" / "logs"
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in spec)
        self.path = d / f"{safe}-{engine.hostname()}-{os.getpid()}.log"
        self.url, self.prefix = url, prefix
        self._f = None
        try:
            d.mkdir(parents=True, exist_ok=True)
            self._f = open(self.path, "a", buffering=1)
        except OSError as e:
            self._drop(e)

    def _drop(self, e: OSError) -> None:
        if self._f is not None:
            with contextlib.suppress(OSError):
                self._f.close()
        self._f = None
        say(f"{self.prefix}mixzoo: warning: cannot write the worker log {self.path}: {e.strerror or e}; "
            f"logging to the screen only")

    def file(self, msg: str) -> None:
        if self._f is None:
            return
        try:
            self._f.write(f"{_dt.datetime.now():%H:%M:%S} {scrub(msg, self.url)}\n")
        except OSError as e:
            self._drop(e)

    def screen(self, msg: str) -> None:
        msg = scrub(msg, self.url)
        self.file(msg)
        say(f"{self.prefix}{msg}", sys.stdout)

    def note(self, msg: str) -> None:
        """A line about the storage itself (a journal repaired, a database lost and back): stderr."""
        msg = scrub(msg, self.url)
        self.file(msg)
        say(f"{self.prefix}mixzoo: {msg}")


@contextlib.contextmanager
def interrupts_raise():
    """While inside: SIGTERM raises :class:`engine.Terminated` where the main thread is (once: a
    repeat while stopping is ignored), as Ctrl-C raises KeyboardInterrupt; either waits for a
    journal append under way to finish (:func:`storage.uninterrupted`), and is raised again at the
    worker's safe points should the code it landed in swallow it (:func:`storage.raise_if_interrupted`)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired: list[int] = []

    def on_sigterm(signum, frame):
        if not fired:
            fired.append(signum)
            interrupt(engine.Terminated())

    def on_sigint(signum, frame):
        interrupt(KeyboardInterrupt())
    clear_interrupt()
    old = {signal.SIGTERM: signal.signal(signal.SIGTERM, on_sigterm)}
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        old[signal.SIGINT] = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        clear_interrupt()


def _stopped(e: BaseException) -> tuple[str, int]:
    """The line and exit code of a sweep stopped by Ctrl-C or SIGTERM."""
    if isinstance(e, engine.Terminated):
        return "terminated (SIGTERM); rerun the same command to resume", engine.Terminated.exit_code
    return "interrupted; rerun the same command to resume", 130


def _context(args, storage_url: str, spec: Spec, prefix: str = "", retry_s: float = 0.0) -> engine.Context:
    logs = Logs(args.results, spec.name, storage_url, prefix)
    from ..api import command_line
    command = os.environ.get("MIXZOO_SWEEP_COMMAND") or mask(command_line())
    storage = open_storage(storage_url, log=logs.note, retry_s=retry_s)
    return engine.Context(storage=storage, storage_url=storage_url, results=str(args.results),
                          device=args.device, command=scrub(command, storage_url), log=logs.screen,
                          trainer_log=logs.file)


def _storage_failed(e: StorageError, url: str, prefix: str = "") -> int:
    say(f"{prefix}mixzoo: error: {scrub(str(e), url)}")
    return EXIT_STORAGE


def worker_main(args, spec: Spec, storage: str | None) -> int:
    url = resolve(storage, args.results)
    prefix = f"[w{args.worker_index}] "
    with interrupts_raise():
        try:
            # the coordinator has reached the storage already: a worker waits out a restart
            ctx = _context(args, url, spec, prefix=prefix, retry_s=retry_window())
            engine.work(ctx, spec.units)
        except StorageError as e:
            return _storage_failed(e, url, prefix)
        except KeyboardInterrupt as e:
            return _stopped(e)[1]
    return 0


# ---------------------------------------------------------------------------- coordinator
def _worker_argv(args, spec: Spec, spec_arg: str, index: int) -> list[str]:
    p = Path(spec_arg)
    spec_arg = str(p.resolve()) if (p.suffix in (".toml", ".json") or p.is_file()) else spec_arg
    argv = [sys.executable, "-m", "mixzoo", "--results", str(Path(args.results).resolve()), "--device", str(args.device)]
    for plugin in args.plugin:
        argv += ["--plugin", str(Path(plugin).resolve())]
    argv += ["sweep", spec_arg, "--worker-index", str(index)]
    if spec.preset:
        argv += ["--budget", spec.preset]
    for k in ("models", "tasks", "trials", "seeds", "stack"):
        v = getattr(args, k, None)
        if v is not None and not (args.command == "compare" and k == "models"):
            argv += [f"--{k}", str(v)]
    return argv


def _gpu_env(device: str | None, index: int) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES for worker ``index``: the GPUs this process may use (all of them, or the
    ones CUDA_VISIBLE_DEVICES already names: "2,3" puts workers on 2, 3, 2, ...) taken round-robin.
    Nothing with one GPU or none, or when the run is pinned to a device other than cuda/auto."""
    if device not in (None, "auto", "cuda"):
        return {}
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [x.strip() for x in visible.split(",") if x.strip()]
    else:
        try:
            import torch
            n = torch.cuda.device_count()
        except Exception:
            n = 0
        ids = [str(i) for i in range(n)]
    return {"CUDA_VISIBLE_DEVICES": ids[index % len(ids)]} if len(ids) > 1 else {}


def _auto_workers(args, spec: Spec) -> int:
    from ..registry import get_task
    from ..train.packing import auto_workers
    n = 0
    if args.device in (None, "auto", "cuda") or str(args.device).startswith("cuda"):
        try:
            import torch
            n = torch.cuda.device_count()
        except Exception:
            n = 0
    sizes = [(u.fixed, get_task(u.task).from_knobs(u.knobs, u.task_preset).seq_len) for u in spec.units]
    return auto_workers(sizes, n)


def coordinate(args, spec: Spec, storage: str | None, spec_arg: str) -> int:
    if args.workers == "auto":
        args.workers = _auto_workers(args, spec)
    url = resolve(storage, args.results)
    check_parallel(url, args.workers)
    retry_window()   # a bad MIXZOO_STORAGE_RETRY_S is bad input: one line, exit code 2, before anything runs
    ctx = _context(args, url, spec)
    where = mask(url)
    print(f"sweep {spec.name} [{spec.preset or '-'}]: {len(spec.units)} studies "
          f"({len(spec.units[0].seeds) if spec.units else 0} final seeds each), storage {where}, "
          f"{args.workers} worker(s); worker logs under {Path(args.results) / 'sweeps' / 'logs'}", flush=True)
    with interrupts_raise():
        return _run_workers(args, spec, spec_arg, ctx, url)


def _run_workers(args, spec: Spec, spec_arg: str, ctx: engine.Context, url: str) -> int:
    t0 = time.time()
    failed_workers = []
    procs: list[subprocess.Popen] = []
    try:
        engine.setup(ctx, spec.units)
        if args.workers <= 1:
            engine.work(ctx, spec.units)
        else:
            env = {**os.environ, "MIXZOO_STORAGE": url, "MIXZOO_SWEEP_COMMAND": ctx.command or ""}
            for i in range(args.workers):
                procs.append(subprocess.Popen(_worker_argv(args, spec, spec_arg, i),
                                              env={**env, **_gpu_env(args.device, i)}))
            print(f"started workers (pids {', '.join(str(p.pid) for p in procs)})", flush=True)
            for i, p in enumerate(procs):
                if p.wait() != 0:
                    failed_workers.append((i, p.returncode))
        status = [engine.unit_status(ctx, u) for u in spec.units]
    except StorageError as e:
        return _storage_failed(e, url)
    except KeyboardInterrupt as e:
        # Ctrl-C reaches every worker from the terminal; a SIGTERM may have been sent to this
        # process alone (a scheduler, kill PID): pass it on. Each worker gives its trial back.
        if isinstance(e, engine.Terminated):
            for p in procs:
                if p.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait()
        line, rc = _stopped(e)
        print(line, file=sys.stderr)
        return rc
    print_summary(ctx, status, time.time() - t0)
    try:
        export_trials(ctx, spec, status)
    except (OSError, StorageError) as e:
        print(f"mixzoo: warning: cannot write the trial table under {Path(ctx.results) / 'sweeps' / 'trials'}: "
              f"{getattr(e, 'strerror', None) or e}", file=sys.stderr)
    for i, rc in failed_workers:
        why = f"signal {-rc}" if rc < 0 else f"exit code {rc}"
        print(f"worker {i} stopped with {why}", file=sys.stderr)
    incomplete = [s for s in status if not s["done"]]
    if incomplete:
        print(f"sweep incomplete: {len(incomplete)} of {len(status)} studies unfinished; "
              f"rerun the same command to resume", file=sys.stderr)
        return EXIT_STORAGE if any(rc == EXIT_STORAGE for _, rc in failed_workers) else 1
    empty = [s for s in status if s["done"] and s["best"] is None]
    for st in empty:    # its search finished with no COMPLETE trial: nothing was run over seeds
        c = st["counts"]
        print(f"mixzoo: study {st['unit'].study} completed no trial ({c.get('PRUNED', 0)} pruned, "
              f"{c.get('FAIL', 0)} failed of {st['unit'].trials}): no best configuration, no rows; the reasons "
              f"are in {Path(ctx.results) / 'sweeps' / 'trials'}", file=sys.stderr)
    if empty:
        print(f"sweep done, but {len(empty)} of {len(status)} studies completed no trial", file=sys.stderr)
        return 1
    return 0


# ---------------------------------------------------------------------------- summary
def _mean_std(vals: list[float]) -> tuple[float, float]:
    m = sum(vals) / len(vals)
    s = math.sqrt(sum((v - m) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0
    return m, s


def final_values(ctx: engine.Context, u: Unit) -> list[float]:
    rows = engine.existing_rows(ctx.results, u.task, u.study)
    return [r["metric_value"] for s, r in sorted(rows.items())
            if r["state"] == "COMPLETE" and r["metric_value"] is not None and s in u.seeds]


def print_summary(ctx: engine.Context, status: list[dict], elapsed: float) -> None:
    from ..leaderboard.views import format_table
    body = []
    for st in status:
        u: Unit = st["unit"]
        c = st["counts"]
        best = st["best"]
        vals = final_values(ctx, u)
        test = f"{_mean_std(vals)[0]:.4f} ± {_mean_std(vals)[1]:.4f}" if vals else "-"
        hp = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in (best.params if best else {}).items())
        body.append([u.task, u.setting_label, u.model,
                     f"{c.get('COMPLETE', 0)}/{c.get('PRUNED', 0)}/{c.get('FAIL', 0)}", st["stale"],
                     f"{best.value:.4f}" if best else "-", hp or "-", test, f"{len(vals)}/{len(u.seeds)}",
                     "done" if st["done"] else "unfinished"])
    print(format_table(["task", "setting", "model", "trials C/P/F", "retried", "best val", "best hparams",
                        "test (mean ± std)", "seeds", "state"], body))
    print(f"({elapsed:.0f} s; leaderboard rows under {Path(ctx.results) / 'leaderboard'})", flush=True)


def export_trials(ctx: engine.Context, spec: Spec, status: list[dict]) -> Path | None:
    """Every trial of the spec's studies (pruned, failed and retried ones included) as one Parquet
    file, ``<results>/sweeps/trials/<spec>[-<preset>].parquet``, replaced at each run."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    rows: list[dict[str, Any]] = []
    for st in status:
        u: Unit = st["unit"]
        for name, kind in ((u.study, "search"), (u.final_study, "final")):
            sid = engine.study_id(ctx.storage, name)
            if sid is None:
                continue
            for t in ctx.storage.get_all_trials(sid, deepcopy=False):
                ua = t.user_attrs
                rows.append({"spec": u.spec, "preset": u.preset, "study": u.study, "phase": kind, "task": u.task,
                             "setting": u.setting_label, "model": u.model, "trial": t.number, "slot": ua.get("slot"),
                             "seed": ua.get("seed", u.search_seed if kind == "search" else None),
                             "state": t.state.name, "value": t.value, "reason": ua.get("reason"),
                             "params_json": json.dumps(t.params, sort_keys=True, default=str),
                             "retry_of": ua.get("retry_of"), "stale": bool(ua.get("stale", False)),
                             "step_mode": ua.get("step_mode"),      # set for a trial of a stacked batch
                             "duration_s": t.duration.total_seconds() if t.duration else None})
    if not rows:
        return None
    d = Path(ctx.results) / "sweeps" / "trials"
    d.mkdir(parents=True, exist_ok=True)
    out = d / f"{spec.name}{'-' + spec.preset if spec.preset else ''}.parquet"
    tmp = d / f".tmp-{uuid.uuid4().hex}.parquet"
    try:
        pq.write_table(pa.Table.from_pylist(rows), tmp)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


# ---------------------------------------------------------------------------- compare
GENERIC = {"trials": 8, "seeds": 3, "train": {"steps": 1000, "eval_every": 200}}


def _spec_for_task(task: str) -> tuple[dict, str]:
    """The raw built-in spec whose tasks include ``task`` (its name), or a generic budget."""
    for name in builtin_names():
        raw, _, _ = read_raw(name)
        if task in raw.get("tasks", {}):
            return raw, name
    return dict(GENERIC), "generic"


def compare(args, storage: str | None) -> int:
    from ..commands import literal, parse_pairs
    from ..registry import get_task
    get_task(args.task)
    if "=" not in args.axis or not args.axis.split("=", 1)[0] or not args.axis.split("=", 1)[1]:
        raise UsageError(f"--axis {args.axis!r} is not KNOB=V1,V2,...")
    axis, vals = args.axis.split("=", 1)
    values = [literal(v) for v in vals.split(",") if v.strip()]
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not models:
        raise UsageError("--models is empty; allowed: a comma-separated list, e.g. softmax,lla")
    raw, base = _spec_for_task(args.task)
    presets, default = budgets_of(raw, base)
    for k in ("presets", "budgets", "default_preset", "default_budget"):
        raw.pop(k, None)
    task_presets = get_task(args.task).presets
    if args.task_preset is not None and args.task_preset not in task_presets and args.task_preset in presets \
            and args.budget is None:
        # the old spelling: compare's --preset was the budget; a task preset is what it names now
        print(f"mixzoo: warning: compare --preset {args.task_preset} names a budget, not a preset of task "
              f"{args.task}; use --budget {args.task_preset} (--preset is the task preset, as in 'mixzoo run')",
              file=sys.stderr, flush=True)
        args.budget, args.task_preset = args.task_preset, None
    if args.task_preset is not None and args.task_preset not in task_presets:
        raise UsageError(f"unknown preset {args.task_preset!r} of task {args.task}; allowed: "
                         f"{', '.join(sorted(task_presets)) or '(none)'} (a budget is --budget: "
                         f"{', '.join(sorted(presets)) or '(none)'})")
    preset = args.budget or default
    if preset is not None:
        if preset not in presets:
            raise UsageError(f"unknown budget {preset!r} for task {args.task} (built-in spec {base}); "
                             f"allowed: {', '.join(sorted(presets)) or '(none)'}")
        raw = merge(raw, presets[preset])
    tt = dict(raw.get("tasks", {}).get(args.task, {}))
    fixed = {**tt.get("knobs", {}), **{k: literal(v) for k, v in parse_pairs(args.set, "--set").items()}}
    fixed.pop(axis, None)
    tt.update({"knobs": fixed, "grid": {axis: values}, "settings": [{}]})
    tt.pop("models", None)
    if args.task_preset:
        tt["preset"] = args.task_preset
    raw.update({"name": f"compare-{args.task}-{axis}", "tasks": {args.task: tt}, "models": models})
    raw.update({"default_budget": preset, "budgets": {preset: {}}} if preset else {})
    raw.pop("ttr", None)
    spec = load(raw["name"], None, raw=raw, trials=args.trials, seeds=args.seeds, stack=getattr(args, "stack", None))
    d = Path(args.results) / "sweeps" / "compare"
    d.mkdir(parents=True, exist_ok=True)
    spec_file = d / f"{spec.name}{'-' + preset if preset else ''}.json"
    spec_file.write_text(json.dumps({k: v for k, v in raw.items()}, indent=1, default=str))
    args.budget = None
    rc = coordinate(args, spec, storage, spec_arg=str(spec_file))
    rows = compare_rows(args.results, spec)
    print()
    print_compare(rows, spec, axis, values, models)
    if rows:
        out = Path(args.out) if args.out else Path(args.results) / "sweeps" / f"compare-{args.task}-{axis}.png"
        out = plot(rows, task=args.task, axis=axis, out=out, models=models)
        print(f"plot: {out}")
    return rc


def compare_rows(results: str, spec: Spec) -> list[dict]:
    from ..leaderboard import read_table
    studies = {u.study: u for u in spec.units}
    out = []
    for r in read_table(results).to_pylist():
        u = studies.get(r.get("study"))
        if u is not None and r["seed"] in u.seeds:
            out.append({**r, "_setting": u.setting})
    return out


def print_compare(rows: list[dict], spec: Spec, axis: str, values: list, models: list[str]) -> None:
    from ..leaderboard.views import format_table
    metric = spec.units[0].metric if spec.units else "metric"
    body = []
    for m in models:
        line = [m]
        for v in values:
            vals = [r["metric_value"] for r in rows if r["model"] == m and r["_setting"].get(axis) == v
                    and r["state"] == "COMPLETE" and r["metric_value"] is not None]
            line.append(f"{_mean_std(vals)[0]:.4f} ± {_mean_std(vals)[1]:.4f}" if vals else "-")
        body.append(line)
    print(f"test {metric} (mean ± std over seeds) against {axis}:")
    print(format_table(["model", *[f"{axis}={v}" for v in values]], body))
    labels = {}
    for u in spec.units:        # the settings by the label every leaderboard view gives them
        labels.setdefault(json.dumps(u.setting.get(axis), default=str), u.setting_label)
    for v in values:
        lab = labels.get(json.dumps(v, default=str))
        if lab:
            print(f"  {axis}={v}: setting {lab}")


def plot(rows: list[dict], *, task: str, axis: str, out: Path, models: list[str]) -> Path:
    """The leaderboard's plot when it is there; otherwise a plain matplotlib line per mechanism."""
    import pyarrow as pa
    clean = [{k: v for k, v in r.items() if k != "_setting"} for r in rows]
    for r, src in zip(clean, rows):
        r.setdefault(f"knob_{axis}", src["_setting"].get(axis))
    try:
        from ..leaderboard.plot import plot_metric_vs_axis
    except ImportError:
        plot_metric_vs_axis = None
    if plot_metric_vs_axis is not None:
        try:
            return Path(plot_metric_vs_axis(pa.Table.from_pylist(clean), task=task, axis=axis, out=out, models=models))
        except UsageError:
            pass  # an axis that is not a task knob (d_model, ...): the plain plot below
    return _plot_fallback(rows, task=task, axis=axis, out=out, models=models)


def _plot_fallback(rows: list[dict], *, task: str, axis: str, out: Path, models: list[str]) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5, 3.5))
    metric = rows[0]["metric_name"] if rows else "metric"
    for m in models:
        pts: dict[Any, list[float]] = {}
        for r in rows:
            if r["model"] == m and r["state"] == "COMPLETE" and r["metric_value"] is not None:
                pts.setdefault(r["_setting"].get(axis), []).append(r["metric_value"])
        xs = sorted(pts, key=lambda x: (isinstance(x, str), x))
        if not xs:
            continue
        ms = [_mean_std(pts[x]) for x in xs]
        ax.errorbar([str(x) if isinstance(x, str) else x for x in xs], [a for a, _ in ms], yerr=[b for _, b in ms],
                    marker="o", capsize=3, label=m)
    ax.set_xlabel(axis)
    ax.set_ylabel(f"test {metric}")
    ax.set_title(f"{task}: {metric} against {axis} (mean ± std over seeds)")
    ax.legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
