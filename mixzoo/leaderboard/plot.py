"""PNG figures of the leaderboard (matplotlib, Agg backend, imported when first used).

Every figure carries a footnote saying how it was measured: the selection protocol, the
number of seeds and the code version and device of the rows behind it.
"""
from __future__ import annotations

import json
import math
import os
import uuid
from pathlib import Path

from ..errors import UsageError
from .views import (
    Best,
    as_rows,
    axis_values,
    best_configs,
    filter_rows,
    knobs_of,
    setting_of,
    task_knobs,
    task_scores,
    varying_knobs,
)

# One colour per mechanism, the same in every figure (Okabe-Ito, then tab10).
_KNOWN = ("lla", "parallax", "softmax", "mesa", "gdn", "mamba", "gla", "hyena", "linear")
_PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442",
            "#999999", "#8c564b", "#17becf", "#bcbd22")


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams.update({"figure.dpi": 100, "savefig.dpi": 150, "font.size": 9, "axes.spines.top": False,
                         "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.3, "legend.frameon": False})
    return plt


def color_of(model: str, others: list[str] | None = None) -> str:
    if model in _KNOWN:
        return _PALETTE[_KNOWN.index(model)]
    extra = sorted(set(others or []) - set(_KNOWN))
    i = extra.index(model) if model in extra else abs(hash(model))
    return _PALETTE[(len(_KNOWN) + i) % len(_PALETTE)]


def _out(out, name: str) -> Path:
    out = Path(out)
    if out.suffix.lower() == ".png":
        out.parent.mkdir(parents=True, exist_ok=True)
        return out
    out.mkdir(parents=True, exist_ok=True)
    return out / name


def _save(fig, path: Path) -> Path:
    """Write the figure under a temporary name, then rename it into place."""
    tmp = path.with_name(f".tmp-{uuid.uuid4().hex}-{path.name}")
    try:
        fig.savefig(tmp, format="png", bbox_inches="tight")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
        import matplotlib.pyplot as plt
        plt.close(fig)
    return path


def provenance_line(rows: list[dict]) -> str:
    def few(key, n=2):
        vals = sorted({str(r.get(key)) for r in rows if r.get(key)})
        return ",".join(vals[:n]) + ("…" if len(vals) > n else "") if vals else "?"
    shas = sorted({str(r.get("git_sha"))[:8] for r in rows if r.get("git_sha")})
    return (f"mixzoo {few('mixzoo_version')} @ {','.join(shas[:2]) or '?'}{'…' if len(shas) > 2 else ''}; "
            f"torch {few('torch')}; device {few('device_name')}")


def _footnote(fig, text: str) -> None:
    """A small note under everything already drawn (tick labels included)."""
    fig.canvas.draw()
    bottom = fig.get_tightbbox(fig.canvas.get_renderer()).y0 / fig.get_figheight()
    fig.text(0.01, bottom - 0.015, text, ha="left", va="top", fontsize=6.5, color="#555555")


def _metric_label(b: Best) -> str:
    name = b.rows[0].get("metric_name") or "metric"
    return f"test {name} ({'higher' if b.higher_is_better else 'lower'} is better)"


def plot_metric_vs_axis(table, *, task: str, axis: str, out, models=None) -> Path:
    """Test metric against one task knob: a line per mechanism, mean ± std band, seeds as dots.

    ``table`` is the store's table (pyarrow, pandas or row dicts); ``axis`` a knob of
    ``task``. Each point is the best configuration of that mechanism at that setting,
    chosen on validation. Other knobs are held at one value (the largest such slice).
    """
    rows = filter_rows(as_rows(table), task=task, models=models)
    bests = best_configs(rows)
    if not bests:
        raise UsageError(f"no COMPLETE rows for task {task!r}" + (f" and models {sorted(models)}" if models else ""))
    knobs = task_knobs(rows, task)
    if axis not in knobs:
        raise UsageError(f"unknown axis {axis!r} for task {task!r}; allowed: {', '.join(knobs)}")
    slice_, fixed = axis_values(bests, axis)
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.2, 3.4))
    xs_all = sorted({json.dumps(b.knobs[axis]) for b in slice_})
    vals = [json.loads(x) for x in xs_all]
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals)
    if numeric:
        vals.sort()
        pos = {json.dumps(v): v for v in vals}
        if min(vals) > 0 and max(vals) / min(vals) >= 8:
            ax.set_xscale("log", base=2)
        ax.set_xticks(vals)
        ax.set_xticklabels([f"{v:g}" for v in vals])
        ax.minorticks_off()
    else:
        vals.sort(key=str)
        pos = {json.dumps(v): i for i, v in enumerate(vals)}
        ax.set_xticks(range(len(vals)))
        ax.set_xticklabels([str(v) for v in vals])
    names = sorted({b.model for b in slice_})
    seeds = set()
    for m in names:
        pts = sorted((pos[json.dumps(b.knobs[axis])], b) for b in slice_ if b.model == m)
        x = [p for p, _ in pts]
        mean = [b.test_mean for _, b in pts]
        std = [b.test_std if math.isfinite(b.test_std) else 0.0 for _, b in pts]
        c = color_of(m, names)
        ax.plot(x, mean, "-o", color=c, label=m, lw=1.6, ms=4, zorder=3)
        ax.fill_between(x, [a - s for a, s in zip(mean, std)], [a + s for a, s in zip(mean, std)],
                        color=c, alpha=0.18, lw=0, zorder=2)
        for p, b in pts:
            ax.scatter([p] * b.n, b.tests, s=9, color=c, alpha=0.55, lw=0, zorder=4)
            seeds.add(b.n)
    b0 = slice_[0]
    ax.set_xlabel(axis)
    ax.set_ylabel(_metric_label(b0))
    lo = min(min(b.tests) for b in slice_)
    hi = max(max(b.tests) for b in slice_)
    if 0 <= lo and hi <= 1 and "acc" in (b0.rows[0].get("metric_name") or ""):
        ax.set_ylim(-0.03, 1.03)
    vary = varying_knobs(bests).get(task, [])
    held = ", ".join(f"{k}={v}" for k, v in fixed.items() if k in vary)
    ax.set_title(f"{task}: {b0.rows[0].get('metric_name')} vs {axis}" + (f"  ({held})" if held else ""), fontsize=9.5)
    ax.legend(loc="best", fontsize=8)
    n_txt = "/".join(str(n) for n in sorted(seeds))
    _footnote(fig, f"Line: mean over {n_txt} seeds of the best configuration per point (chosen on validation); "
                   f"band: ± sample std; dots: single seeds.\n{provenance_line([r for b in slice_ for r in b.rows])}")
    return _save(fig, _out(out, f"{task}-{axis}.png"))


def plot_bars(table, *, out, tasks=None, models=None) -> Path:
    """Grouped bars: the per-task score of each mechanism (mean over settings of the best
    configuration's test mean); dots are the single settings. One panel per metric."""
    rows = as_rows(table)
    if tasks:
        rows = [r for r in rows if r.get("task") in set(tasks)]
    rows = filter_rows(rows, models=models)
    bests = best_configs(rows)
    if not bests:
        raise UsageError("no COMPLETE rows to plot")
    scores = task_scores(bests)
    metrics = sorted({(s["metric"], s["higher_is_better"]) for s in scores.values()}, key=str)
    plt = _plt()
    ntask = {m: len({t for (t, _), s in scores.items() if (s["metric"], s["higher_is_better"]) == m}) for m in metrics}
    widths = [max(2.0, 1.2 * ntask[m]) for m in metrics]
    fig, axes = plt.subplots(1, len(metrics), figsize=(max(5.2, sum(widths) + 1), 3.4), squeeze=False,
                             gridspec_kw={"width_ratios": widths})
    names = sorted({m for _, m in scores})
    handles = {}
    for ax, (metric, hib) in zip(axes[0], metrics):
        ts = sorted({t for (t, _), s in scores.items() if (s["metric"], s["higher_is_better"]) == (metric, hib)})
        per = {t: [m for m in names if (t, m) in scores] for t in ts}
        w = 0.8 / max(len(v) for v in per.values())
        for i, t in enumerate(ts):
            for j, m in enumerate(per[t]):       # only the mechanisms present, centred on the task
                x = i + w * (j - (len(per[t]) - 1) / 2)
                handles[m] = ax.bar([x], [scores[(t, m)]["score"]], width=w * 0.92, color=color_of(m, names),
                                    label=m, zorder=2)
                pts = [b.test_mean for b in bests if b.task == t and b.model == m]
                ax.scatter([x] * len(pts), pts, s=7, color="#222222", alpha=0.6, lw=0, zorder=3)
        ax.set_xticks(range(len(ts)))
        rot = len(ts) > 3 or max(len(t) for t in ts) > 12
        ax.set_xticklabels(ts, rotation=25 if rot else 0, ha="right" if rot else "center")
        ax.set_ylabel(f"test {metric} ({'higher' if hib else 'lower'} is better)")
        ax.set_xlim(-0.6, len(ts) - 0.4)
        ax.grid(axis="x", visible=False)
    axes[0][-1].legend([handles[m] for m in names], names, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.suptitle("Score per task", fontsize=10)
    _footnote(fig, "Bar: mean over a task's settings of the best configuration's test mean over seeds (chosen on "
                   f"validation); dots: single settings.\n{provenance_line(rows)}")
    return _save(fig, _out(out, "tasks-bars.png"))


def plot_ttr_curves(curves: dict[str, list[float]], out, segment_len: int | None = None,
                    title: str = "Test-time regression: MSE per position") -> Path:
    """Per-position MSE of each estimator (log scale); dotted lines mark segment starts."""
    if not curves:
        raise UsageError("no test-time regression curves to plot")
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.0, 3.4))
    names = list(curves)
    length = 0
    for m in names:
        ys = [float(v) if v is not None else math.nan for v in curves[m]]
        xs = [i for i, y in enumerate(ys) if math.isfinite(y) and y > 0]
        length = max(length, len(ys))
        finite = [ys[i] for i in xs]
        mean = sum(finite) / len(finite) if finite else math.nan
        ax.plot(xs, finite, lw=1.1, color=color_of(m, names), label=f"{m} (mean {mean:.3g})")
    ax.set_yscale("log")
    if segment_len and length and length // segment_len <= 64:
        for s in range(segment_len, length, segment_len):
            ax.axvline(s, color="#888888", lw=0.6, ls=":", zorder=1)
    ax.set_xlim(0, max(length - 1, 1))
    from matplotlib.ticker import MaxNLocator, MultipleLocator
    if segment_len and length // segment_len >= 2:      # ticks on segment starts, at most about 9
        ax.xaxis.set_major_locator(MultipleLocator(segment_len * 2 ** max(0, math.ceil(math.log2(length / segment_len / 8)))))
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("position in sequence")
    ax.set_ylabel("MSE (log scale, lower is better)")
    ax.set_title(title + (f"  (segment {segment_len})" if segment_len else ""), fontsize=9.5)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7.5)
    _footnote(fig, "Training-free: each estimator predicts v_i from the pairs before i; MSE against the noiseless "
                   "target, averaged over sequences\n(as the ttr evaluation reports it)."
                   + ("  Dotted: segment boundaries." if segment_len else ""))
    return _save(fig, _out(out, "ttr-mse.png"))


def ttr_curves_from_rows(rows: list[dict]) -> tuple[dict[str, list[float]], int | None]:
    """Per-position curves stored in ``metrics_json`` of test-time regression rows (if any)."""
    curves: dict[str, list[float]] = {}
    seg = None
    for r in rows:
        if r.get("task") != "ttr" or r.get("state") not in (None, "COMPLETE"):
            continue
        try:
            m = json.loads(r.get("metrics_json") or "{}")
        except ValueError:
            continue
        for k, v in m.items():
            if isinstance(v, list) and len(v) > 1 and all(isinstance(x, (int, float)) or x is None for x in v):
                label = r.get("model") or "?"
                curves[label if k in ("mse_per_position", "per_position_mse", "mse") else f"{label} {k}"] = v
                kn = knobs_of(r)
                seg = seg or kn.get("segment") or kn.get("S") or kn.get("segment_len")
    return curves, seg


MAX_CURVE_PANELS = 4     # settings drawn side by side in one training-curves figure


def _seed_mean(per_seed: list[dict[int, float]]) -> tuple[list[int], list[float]]:
    steps = sorted(set().union(*per_seed)) if per_seed else []
    xs, ys = [], []
    for s in steps:
        vals = [c[s] for c in per_seed if s in c and math.isfinite(c[s])]
        if vals:
            xs.append(s)
            ys.append(sum(vals) / len(vals))
    return xs, ys


def plot_training_curves(table, curves, *, task: str, out) -> Path | None:
    """Training loss and the validation metric against the step, one line per mechanism (its best
    configuration per setting, mean over its seeds; faint lines: single seeds), one column per
    setting (the first few). ``curves``: the curves table (pyarrow, pandas or row dicts with
    run_id, step, metric, value). None when the store holds no curves of these runs."""
    rows = filter_rows(as_rows(table), task=task)
    bests = best_configs(rows)
    by_run: dict[str, dict[str, dict[int, float]]] = {}
    for c in as_rows(curves):
        if c.get("value") is None or c.get("step") is None:
            continue
        by_run.setdefault(c["run_id"], {}).setdefault(c["metric"], {})[int(c["step"])] = float(c["value"])
    bests = [b for b in bests if any(r.get("run_id") in by_run for r in b.rows)]
    if not bests:
        return None
    vary = varying_knobs(bests).get(task, [])
    settings: list[str] = []
    for b in bests:
        lab = setting_of(b.rows[0], vary)
        if lab not in settings:
            settings.append(lab)
    shown = settings[:MAX_CURVE_PANELS]
    metric = bests[0].rows[0].get("metric_name") or "metric"
    panels = (("train_loss", "training loss (log scale)"), (f"val/{metric}", f"validation {metric}"))
    plt = _plt()
    fig, axes = plt.subplots(2, len(shown), figsize=(3.4 * len(shown) + 1.2, 5.0), squeeze=False, sharex="col")
    names = sorted({b.model for b in bests})
    seeds = set()
    for j, lab in enumerate(shown):
        for b in bests:
            if setting_of(b.rows[0], vary) != lab:
                continue
            c = color_of(b.model, names)
            for i, (key, _) in enumerate(panels):
                per_seed = [by_run[r["run_id"]][key] for r in b.rows
                            if r.get("run_id") in by_run and key in by_run[r["run_id"]]]
                if not per_seed:
                    continue
                seeds.add(len(per_seed))
                ax = axes[i][j]
                if len(per_seed) > 1:
                    for cur in per_seed:
                        xs = sorted(cur)
                        ax.plot(xs, [cur[x] for x in xs], color=c, lw=0.6, alpha=0.3)
                xs, ys = _seed_mean(per_seed)
                ax.plot(xs, ys, color=c, lw=1.6, label=b.model if i == 0 else None)
        axes[0][j].set_title(lab, fontsize=8.5)
        axes[1][j].set_xlabel("step")
    for i, (key, ylabel) in enumerate(panels):
        axes[i][0].set_ylabel(ylabel)
        if key == "train_loss":
            for ax in axes[i]:
                lines = [ln for ln in ax.get_lines() if len(ln.get_ydata())]
                if lines and all(min(ln.get_ydata()) > 0 for ln in lines):
                    ax.set_yscale("log")
    handles, labels = axes[0][0].get_legend_handles_labels()
    for ax in axes[0][1:]:
        h, lb = ax.get_legend_handles_labels()
        for hh, ll in zip(h, lb):
            if ll not in labels:
                handles.append(hh)
                labels.append(ll)
    axes[0][-1].legend(handles, labels, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.suptitle(f"{task}: training curves", fontsize=10)
    more = f" {len(settings) - len(shown)} more setting(s) not drawn." if len(settings) > len(shown) else ""
    n_txt = "/".join(str(n) for n in sorted(seeds))
    _footnote(fig, f"Best configuration per mechanism and setting (chosen on validation); line: mean over {n_txt} "
                   f"seed(s) at each validation step, faint: single seeds; training loss averaged since the previous "
                   f"validation.{more}\n{provenance_line([r for b in bests for r in b.rows])}")
    return _save(fig, _out(out, f"{task}-curves.png"))
