"""What a figure costs at a scale: measured (from the run records a reproduction writes) or, until
then, an estimate from the anchors the README measured on one H200 (2026-11-29 .. 12-01), scaled by
measured/estimated at another scale of the figure once one has finished on a GPU (``calibrated``).

The estimate for a trained figure, per run (every grid point and every final seed of every
(setting, mechanism); no early stop, so an upper bound on steps):

    steps x (A + n_layers x mixer_ms(m)) x max(1, B·T·D / W0)  +  RUN_OVERHEAD_S  (+ data generation)

* mixer_ms(m): one layer's forward+backward at batch 8, length 1024, width 128 (README,
  "Mechanisms" table).
* A = 5.05 ms and the 2 layers' share: fitted to the two trainer rates the README gives at MAD's
  baseline shape (softmax 101.5 steps/s, gdn 58.0); at the MQAR throughput shape (B·T·D = W0 =
  256·256·128) softmax ran 126.4 and gdn 65.7 steps/s, still at that floor, so the step time is
  taken as flat up to W0 and linear beyond.
* Runs are packed on the GPU as ``--workers auto`` packs them (4 per GPU below 2^21 of B·T·D, 2
  below 2^23): 4 processes gave 3.13x and 3.76x the throughput of one (README), taken as 3.1x;
  2 processes were not measured, taken as 1.6x.
* RUN_OVERHEAD_S per run (model build, causality probe, validation and test passes): 2 s. The
  README's one measured sweep (``mixzoo sweep mqar --preset small --workers 2``: 252 s, 2 of its
  24 trials pruned) comes out at 291 s by this formula with its 2 workers (1.6x): within 15%.
* icl-regression's generator: 20.0 s for 100k sequences at L = 256 on the H200 (README), scaled
  by the number of floats generated.
* STARTUP_S once per figure: `import fla` (about 14 s per worker process) and fla's first-call
  autotuning (minutes; the carried cache in scripts/h200-triton-autotune.tgz shortens it).

A training-free figure has no per-step anchor on the GPU; its estimate counts the cores'
floating-point work (the LLA core's (T, T) x (T, D²) products dominate) at an assumed 5 TFLOP/s
of fp32 (the 2-core CPU anchor, `mixzoo ttr` at d = 32 in 21 s, works out at about 10 GFLOP/s).
Every estimate says so; none is a measurement.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from .spec import TTR_BASELINES, Figure, split_setting

MIXER_MS = {"softmax": 2.44, "lla": 3.43, "parallax": 3.95, "mesa": 4.77, "gdn": 6.20, "mamba": 5.65,
            "gla": 4.59, "hyena": 4.67, "linear": 3.67}
A_MS = 5.05
W0 = 256 * 256 * 128
RUN_OVERHEAD_S = 2.0
STARTUP_S = 120.0
GEN_S_PER_FLOAT = 20.0 / (100_000 * 272 * 96)
TTR_FLOPS = 5e12


def _packing(work: int) -> tuple[int, float]:
    if work < 1 << 21:
        return 4, 3.1
    if work < 1 << 23:
        return 2, 1.6
    return 1, 1.0


def estimate(fig: Figure, scale: str, seeds: int | None = None) -> dict:
    """{"seconds", "runs", "steps", "workers", "basis"} of one figure at one scale (one H200)."""
    if fig.kind == "ttr":
        return _estimate_ttr(fig, scale, seeds)
    from ..api import split_hparams
    from ..registry import get_task
    from ..sweeps.spec import load
    from .spec import sweep_raw
    sc = fig.scale(scale)
    n_seeds = int(seeds if seeds is not None else sc.seeds)
    spec = load(fig.name, None, raw=sweep_raw(fig, scale, n_seeds))
    serial, steps_total, runs, workers, gain = 0.0, 0, 0, 4, 3.1
    for u in spec.units:
        task = get_task(u.task).from_knobs(u.knobs, u.task_preset)
        tcfg, mcfg, _ = split_hparams(u.fixed, u.recipe)
        B, T, D, layers = tcfg.batch_size, task.seq_len, mcfg.d_model, mcfg.n_layers
        n_runs = u.trials + len(u.seeds)
        step_s = (A_MS + layers * MIXER_MS.get(u.model, 5.0)) * max(1.0, B * T * D / W0) / 1000
        gen = 0.0
        if task.kind == "regression":
            gen = (tcfg.n_train or task.sizes()["train"]) * T * (task.d_in + task.d_out) * GEN_S_PER_FLOAT
        serial += n_runs * (tcfg.steps * step_s + RUN_OVERHEAD_S + gen)
        steps_total += n_runs * tcfg.steps
        runs += n_runs
        w, g = _packing(B * T * D)
        if w < workers:
            workers, gain = w, g
    return {"seconds": STARTUP_S + serial / gain, "runs": runs, "steps": steps_total, "workers": workers,
            "basis": "estimate from the README's H200 anchors (see mixzoo/reproduce/cost.py), not measured"}


def _ttr_flops(model: str, L: int, d: int) -> float:
    if model == "lla":
        return 2.0 * L * L * d * d + 2.0 * L * d ** 3
    if model == "mesa":
        return 4.0 * L * d * d + 2.0 * L * d ** 3 / 3 + 2.0 * L * d * d
    if model in ("softmax", "linear"):
        return 4.0 * L * L * d
    if model == "gdn":
        return 8.0 * L * d * d + 4.0 * L * 64 * d
    return 1.0 * L * d


def _estimate_ttr(fig: Figure, scale: str, seeds: int | None) -> dict:
    from ..registry import mixers
    from ..tasks.ttr import TTR
    sc = fig.scale(scale)
    n_seeds = int(seeds if seeds is not None else sc.seeds)
    grids = {n: math.prod(len(v) for v in s.core_grid.values()) for n, s in mixers().items() if s.core}
    flops = 0.0
    for s in sc.settings:
        _t, setting, _tags = split_setting(fig, s)
        t = TTR.from_knobs({**fig.knobs, **setting})
        for m in fig.models_at(scale):
            evals = sc.sequences + (0 if m in TTR_BASELINES else grids.get(m, 1) * sc.tune_sequences)
            flops += n_seeds * evals * _ttr_flops(m, t.L, t.d)
    return {"seconds": 30.0 + flops / TTR_FLOPS, "runs": len(sc.settings) * n_seeds, "steps": 0, "workers": 1,
            "basis": f"estimate: {flops / 1e12:.1f} TFLOP at an assumed {TTR_FLOPS / 1e12:g} TFLOP/s (no GPU "
                     "anchor for the ttr cores), not measured"}


# ---------------------------------------------------------------------------- measurements
def record_path(results, name: str) -> Path:
    return Path(results) / "reproduce" / f"{name}.runs.jsonl"


def append_record(results, name: str, rec: dict) -> None:
    p = record_path(results, name)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "a") as f:
        f.write(json.dumps(rec, sort_keys=True, default=str) + "\n")


def records(results, name: str) -> list[dict]:
    p = record_path(results, name)
    if not p.is_file():
        return []
    out = []
    for line in p.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def measured(dirs, name: str, scale: str) -> dict | None:
    """The measured cost of ``name`` at ``scale`` in the first of ``dirs`` where a reproduction at
    that scale finished (exit 0): the wall time of every invocation up to the first that finished,
    summed (one interrupted and resumed costs its pieces; reruns after it, with nothing to do, are
    left out). None until one finished."""
    for d in dirs:
        recs = [r for r in records(d, name) if r.get("scale") == scale]
        done = next((i for i, r in enumerate(recs) if r.get("rc") == 0 and r.get("complete")), None)
        if done is None:
            continue
        used = recs[:done + 1]
        return {"seconds": sum(float(r.get("wall_s") or 0) for r in used), "device": recs[done].get("device"),
                "date": str(recs[done].get("finished", ""))[:10], "invocations": len(used), "where": str(d)}
    return None


def calibrated(fig: Figure, scale: str, dirs) -> dict | None:
    """An estimate of ``fig`` at ``scale`` scaled by a measurement at another scale: the anchors'
    estimate here x (measured / estimated) at the first other non-smoke scale that finished on a GPU.
    The anchors are eager single-process rates; a measured run used the modes a sweep picks on that
    device (stacked+graphed on a GPU) and the run's packing, so the measured/estimated factor carries
    those over (a measurement taken beside other runs on the same GPU makes it an upper bound).
    None until such a measurement exists."""
    for other in ("small", "paper"):
        if other == scale or other not in fig.scales:
            continue
        m = measured(dirs, fig.name, other)
        if m is None or not m["seconds"] or "cpu" in str(m.get("device") or "cpu").lower():
            continue
        e_other, e_here = estimate(fig, other)["seconds"], estimate(fig, scale)["seconds"]
        f = m["seconds"] / e_other
        return {"seconds": e_here * f, "factor": f, "from": other, "anchors_seconds": e_here}
    return None


def fmt_duration(s: float) -> str:
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"
