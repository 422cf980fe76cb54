"""Training-free figures (test-time regression): resumable, one leaderboard file per (setting, seed).

The protocol is ``mixzoo ttr``'s (:mod:`mixzoo.train.ttr`): each estimator's functional core
predicts v_i online from the pairs before i with query k_i (:func:`~mixzoo.train.ttr.online_predict`),
its grid (the registry's ``core_grid``) is tuned on sequences of the ``val`` stream, and it is
scored on sequences of the ``test`` stream by MSE per position against the noiseless A_c k_i.
What differs is only the bookkeeping a reproduction needs: the test sequences are drawn in fixed
blocks of :data:`BLOCK` (block b of seed s from seed s + b * 2^32, so 10,000 sequences never sit
in memory at once and the draws do not depend on the device), evaluated in chunks that fit the
device, and every (setting, seed) lands as leaderboard rows (one per estimator) with the
per-position curve in ``metrics_json``, so a rerun skips what is done.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import time
import uuid
from typing import Any

from .spec import TTR_BASELINES, Figure, split_setting, ttr_study

BLOCK = 50                    # test sequences per draw
CHUNK_BYTES = {"cuda": 8 << 30, "cpu": 1 << 29}   # working memory per evaluation chunk


def _chunk(task, device: str) -> int:
    per_seq = max(48 * task.L * task.d * task.d, 16 * task.L * task.L)   # the cores' largest temporaries
    return max(1, min(BLOCK, CHUNK_BYTES["cuda" if device.startswith("cuda") else "cpu"] // per_seq))


def _sse(pred, clean):
    """Sum over sequences of the per-position MSE (mean over coordinates): (L,)."""
    return ((pred.float() - clean.float()) ** 2).mean(-1).sum(0)


def _predict(name: str, cores, cfg, k, v, seed: int, block: int):
    import torch

    from ..train.ttr import online_predict
    if name == "zero":
        return torch.zeros_like(v)
    if name == "random":                      # a N(0, I) guess: the distribution of the values
        g = torch.Generator().manual_seed(seed * 100_003 + block)
        return torch.randn(v.shape, generator=g, dtype=v.dtype).to(v.device)
    with torch.no_grad():
        return online_predict(cores[name][0], k, v, **cfg)


def _grid(grid: dict[str, list]) -> list[dict[str, Any]]:
    import itertools
    keys = sorted(grid)
    return [dict(zip(keys, vals)) for vals in itertools.product(*(grid[k] for k in keys))] or [{}]


def evaluate(task, models: tuple[str, ...], seed: int, sequences: int, tune_sequences: int,
             device: str = "cpu", log=None) -> dict[str, dict[str, Any]]:
    """model -> {"best": knobs, "val": tuning MSE, "per_position": [L], "grid": grid, "seconds"};
    a model none of whose grid points gives a finite MSE gets {"error": reason}."""
    import torch

    from ..registry import mixers
    cores = {n: (s.core, dict(s.core_grid)) for n, s in mixers().items() if s.core is not None}
    dev = torch.device(device)
    chunk = _chunk(task, str(dev))
    tune = task.sample("val", tune_sequences, seed, device=dev)
    out: dict[str, dict[str, Any]] = {}
    for name in models:
        t0 = time.perf_counter()
        grid = {} if name in TTR_BASELINES else cores[name][1]
        best, best_mse = None, math.inf
        for cfg in _grid(grid):
            try:
                sse = sum(_sse(_predict(name, cores, cfg, tune["k"][s:s + chunk], tune["v"][s:s + chunk], seed, -1),
                               tune["clean"][s:s + chunk]).sum().item() for s in range(0, tune_sequences, chunk))
            except Exception as e:           # a core that cannot run a grid point is skipped there
                if log:
                    log(f"  {name} {cfg}: failed ({type(e).__name__}: {e})")
                continue
            m = sse / (tune_sequences * task.L)
            if math.isfinite(m) and m < best_mse:
                best, best_mse = cfg, m
        out[name] = ({"error": "no grid point ran with a finite MSE"} if best is None else
                     {"best": best, "val": best_mse, "grid": grid, "sse": torch.zeros(task.L, device=dev),
                      "seconds": time.perf_counter() - t0})
    for b, start in enumerate(range(0, sequences, BLOCK)):
        n = min(BLOCK, sequences - start)
        data = task.sample("test", n, seed + b * (1 << 32), device=dev)
        for name, o in out.items():
            if "error" in o:
                continue
            t0 = time.perf_counter()
            for s in range(0, n, chunk):
                k, v, c = (data[x][s:s + chunk] for x in ("k", "v", "clean"))
                o["sse"] += _sse(_predict(name, cores, o["best"], k, v, seed, b), c)
            o["seconds"] += time.perf_counter() - t0
    for name, o in out.items():
        if "sse" in o:
            o["per_position"] = (o.pop("sse") / sequences).cpu().tolist()
        if log and "error" not in o:
            log(f"  {name:<8} mse {sum(o['per_position']) / task.L:.4f}  best {o['best']}  ({o['seconds']:.1f} s)")
    return out


def _metrics(per_position: list[float], S: int) -> dict[str, Any]:
    L = len(per_position)
    m: dict[str, Any] = {"mse": sum(per_position) / L, "mse_first_segment": sum(per_position[:S]) / min(S, L)}
    if L > S:
        m["mse_after_switch"] = sum(per_position[S:]) / (L - S)
    m["mse_per_position"] = per_position
    return m


def make_rows(task, study: str, seed: int, res: dict[str, dict], *, sequences: int, tune_sequences: int,
              device: str, wall_s: float, command: str | None) -> list[dict[str, Any]]:
    from ..api import provenance
    from ..leaderboard.schema import SCHEMA_VERSION
    now = _dt.datetime.now(_dt.UTC)
    run_id = uuid.uuid4().hex[:16]
    dev_name = _device_name(device)
    rows = []
    for name, o in res.items():
        ok = "error" not in o
        metrics = _metrics(o["per_position"], task.S) if ok else {}
        row = {"schema_version": SCHEMA_VERSION, "run_id": f"{run_id}-{name}", "created_at": now,
               "suite": task.suite, "task": task.name, "task_version": task.version, "preset": None,
               "model": name, "backend": "baseline" if name in TTR_BASELINES else "torch-core", "recipe": None,
               "seed": seed, "metric_name": "mse", "metric_value": metrics.get("mse"), "higher_is_better": False,
               "val_metric_value": o.get("val"), "state": "COMPLETE" if ok else "FAIL",
               "state_reason": o.get("error"), "study": study, "trial": None,
               "knobs_json": json.dumps(task.knobs(), sort_keys=True),
               # the same for every seed (the tuned point differs: the hp_ columns hold it)
               "hparams_json": json.dumps({"core_grid": o.get("grid", {}), "sequences": sequences,
                                           "tune_sequences": tune_sequences, "protocol": "online, tuned on val"},
                                          sort_keys=True),
               "metrics_json": json.dumps(metrics, sort_keys=True), "steps": 0, "setting": _setting(task),
               "wall_time_s": o.get("seconds", wall_s), "device_name": dev_name, "command": command,
               **provenance()}
        for k, v in task.knobs().items():
            row[f"knob_{k}"] = v
        for k, v in (o.get("best") or {}).items():
            row[f"hp_{k}"] = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v
        rows.append(row)
    return rows


def _write(results, rows: list[dict]) -> None:
    """The store's writer: ``api.write_results`` (every file with the registry's declared columns)
    where it exists, else the leaderboard's ``write_rows``."""
    try:
        from ..api import write_results
    except ImportError:
        from ..leaderboard import write_rows as write_results
    write_results(results, rows)


def _setting(task) -> str:
    try:
        from ..spec import setting_label
    except ImportError:
        return ", ".join(f"{k}={v}" for k, v in task.knobs().items())
    return setting_label(task.name, task.knobs())


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch
        return torch.cuda.get_device_name(torch.device(device))
    return "cpu"


def run(fig: Figure, scale: str, seeds: list[int], results, device: str | None, command: str | None,
        log=print) -> tuple[int, int]:
    """Run every (setting, seed) that has no rows yet; returns (exit code, rows files written).
    Ctrl-C or SIGTERM stop between (setting, seed) units: 130 / 143; a rerun resumes."""
    import torch

    from ..sweeps.engine import Terminated, existing_rows
    from ..sweeps.run import interrupts_raise
    from ..sweeps.storage import raise_if_interrupted
    from ..tasks.ttr import TTR
    sc = fig.scale(scale)
    models = fig.models_at(scale)
    dev = ("cuda" if torch.cuda.is_available() else "cpu") if device in (None, "auto") else str(device)
    written = 0
    with interrupts_raise():
        try:
            for s in sc.settings:
                _task, setting, _tags = split_setting(fig, s)
                task = TTR.from_knobs({**fig.knobs, **setting})
                study = ttr_study(fig, scale, setting, task.knobs(), models, sc)
                have = existing_rows(results, "ttr", study)
                for seed in seeds:
                    if seed in have:
                        continue
                    raise_if_interrupted()     # one the code it landed in swallowed
                    log(f"{fig.name} [{scale}] ttr {setting} seed {seed}: {sc.sequences} test sequences on {dev}")
                    t0 = time.perf_counter()
                    res = evaluate(task, models, seed, sc.sequences, sc.tune_sequences, dev, log=log)
                    _write(results, make_rows(task, study, seed, res, sequences=sc.sequences,
                                                  tune_sequences=sc.tune_sequences, device=dev,
                                                  wall_s=time.perf_counter() - t0, command=command))
                    written += 1
        except KeyboardInterrupt as e:
            log("interrupted; rerun the same command to resume")
            return (143 if isinstance(e, Terminated) else 130), written
    return 0, written
