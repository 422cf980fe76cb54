"""Views over the store: aggregates are computed here, never stored.

The protocol every view follows:

* only rows with ``state == "COMPLETE"`` count; a task setting is (suite, task, knobs_json)
  at the newest ``task_version`` present for that task;
* a configuration is one ``hparams_json`` of one mechanism in one setting; when a seed of a
  configuration appears more than once (a rerun), its newest row counts;
* the best configuration per (mechanism, setting) is the one with the best mean
  ``val_metric_value`` over its seeds (respecting ``higher_is_better``; ties go to more
  seeds, then to the configuration text, so the choice is deterministic);
* it is reported on test as mean ± sample std (n - 1) over its seeds, with n.

A task's score is the mean over its settings of the best configuration's test mean; the MAD
score is that for each of the six MAD tasks, then the mean over the tasks (×100).
Views are plain Python over row dicts, so the store needs nothing beyond pyarrow.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

MAD_TASKS = ("mad-compression", "mad-fuzzy-recall", "mad-recall", "mad-memorization",
             "mad-noisy-recall", "mad-selective-copy")
MAD_LABELS = {"mad-compression": "Compress", "mad-fuzzy-recall": "Fuzzy", "mad-recall": "In-Context",
              "mad-memorization": "Memorize", "mad-noisy-recall": "Noisy", "mad-selective-copy": "Sel. Copy"}
VIEWS = ("best", "pivot", "mad", "rank", "rows")
PROTOCOL = ("Best configuration per (mechanism, task setting) chosen on the mean validation metric over "
            "its seeds; reported on test as mean ± sample std over those seeds (n = seeds). "
            "Only COMPLETE rows count.")


# -- rows ---------------------------------------------------------------------------------

def as_rows(table) -> list[dict]:
    """Row dicts from a pyarrow Table, a pandas DataFrame or a list of dicts."""
    if isinstance(table, list):
        return table
    if hasattr(table, "to_pylist"):
        return table.to_pylist()
    if hasattr(table, "to_dict"):
        return [{k: (None if _isnan(v) else v) for k, v in r.items()} for r in table.to_dict("records")]
    return list(table)


def _isnan(v) -> bool:
    return isinstance(v, float) and math.isnan(v)


def knobs_of(row: dict) -> dict[str, Any]:
    try:
        k = json.loads(row.get("knobs_json") or "{}")
    except (TypeError, ValueError):
        k = {}
    for name, v in row.items():
        if name.startswith("knob_") and v is not None and name[5:] not in k:
            k[name[5:]] = v
    return k


def knob_value(row: dict, name: str):
    v = row.get(f"knob_{name}")
    return v if v is not None else knobs_of(row).get(name)


def hparams_of(row: dict) -> dict[str, Any]:
    try:
        return json.loads(row.get("hparams_json") or "{}")
    except (TypeError, ValueError):
        return {}


def _same(a, b: str) -> bool:
    if str(a) == b or (isinstance(a, bool) and str(a).lower() == b.lower()):
        return True
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return False


def filter_rows(rows: Iterable[dict], *, suite: str | None = None, task: str | None = None,
                models: Iterable[str] | None = None, where: dict[str, str] | None = None) -> list[dict]:
    """Rows of one suite / task / set of mechanisms whose knobs equal ``where`` (knob -> text)."""
    models = set(models) if models else None
    out = []
    for r in rows:
        if suite and r.get("suite") != suite or task and r.get("task") != task:
            continue
        if models and r.get("model") not in models:
            continue
        if where and not all(_same(knob_value(r, k), v) for k, v in where.items()):
            continue
        out.append(r)
    return out


# -- aggregation --------------------------------------------------------------------------

def mean_std(xs: list[float]) -> tuple[float, float]:
    """Mean and sample std (n - 1; nan for one value)."""
    n = len(xs)
    if n == 0:
        return math.nan, math.nan
    m = sum(xs) / n
    if n == 1:
        return m, math.nan
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))


@dataclass
class Config:
    """One configuration of one mechanism in one task setting, over its seeds."""
    suite: str
    task: str
    knobs_json: str
    model: str
    hparams_json: str
    rows: list[dict]
    higher_is_better: bool = True
    val_mean: float = math.nan
    test_mean: float = math.nan
    test_std: float = math.nan

    @property
    def n(self) -> int:
        return len(self.rows)

    @property
    def tests(self) -> list[float]:
        return [r["metric_value"] for r in self.rows]

    @property
    def knobs(self) -> dict:
        return knobs_of(self.rows[0])


@dataclass
class Best:
    """The best configuration of one mechanism in one setting, and how many were tried."""
    config: Config
    n_configs: int

    def __getattr__(self, name):
        return getattr(self.config, name)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def complete_rows(rows: Iterable[dict]) -> list[dict]:
    """COMPLETE rows with a finite test metric, at each task's newest version."""
    rows = [r for r in rows if r.get("state") == "COMPLETE" and _finite(r.get("metric_value"))]
    newest: dict[str, int] = {}
    for r in rows:
        v = r.get("task_version") or 0
        newest[r["task"]] = max(newest.get(r["task"], v), v)
    return [r for r in rows if (r.get("task_version") or 0) == newest[r["task"]]]


def _recency(r: dict) -> tuple[str, str]:
    return str(r.get("created_at") or ""), str(r.get("run_id") or "")


def configs(rows: Iterable[dict]) -> list[Config]:
    groups: dict[tuple, dict[Any, dict]] = {}
    for r in complete_rows(rows):
        key = (r.get("suite"), r["task"], r.get("knobs_json") or "{}", r["model"], r.get("hparams_json") or "{}")
        per_seed = groups.setdefault(key, {})
        old = per_seed.get(r.get("seed"))
        if old is None or _recency(r) > _recency(old):
            per_seed[r.get("seed")] = r
    out = []
    for key, per_seed in groups.items():
        rs = sorted(per_seed.values(), key=lambda r: (r.get("seed") is None, r.get("seed")))
        c = Config(*key, rows=rs, higher_is_better=rs[0].get("higher_is_better") is not False)
        vals = [r["val_metric_value"] for r in rs if _finite(r.get("val_metric_value"))]
        c.val_mean = sum(vals) / len(vals) if vals else math.nan
        c.test_mean, c.test_std = mean_std(c.tests)
        out.append(c)
    return out


def _choice_key(c: Config):
    v = c.val_mean if math.isfinite(c.val_mean) else (-math.inf if c.higher_is_better else math.inf)
    return (-v if c.higher_is_better else v, -c.n, c.hparams_json)


def best_configs(rows: Iterable[dict]) -> list[Best]:
    """The best configuration per (mechanism, setting), chosen on validation."""
    by: dict[tuple, list[Config]] = {}
    for c in configs(rows):
        by.setdefault((c.suite, c.task, c.knobs_json, c.model), []).append(c)
    out = [Best(min(cs, key=_choice_key), len(cs)) for cs in by.values()]
    out.sort(key=lambda b: (b.suite or "", b.task, _knob_sort(b.knobs), b.model))
    return out


def _sortable(v):
    return (0, v, "") if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, 0, str(v))


def _knob_sort(k: dict):
    return tuple((name, _sortable(v)) for name, v in sorted(k.items()))


def varying_knobs(bests: Iterable[Best]) -> dict[str, list[str]]:
    """Per task, the knobs whose value differs between its settings (in knob order)."""
    seen: dict[str, dict[str, set]] = {}
    for b in bests:
        d = seen.setdefault(b.task, {})
        for k, v in b.knobs.items():
            d.setdefault(k, set()).add(json.dumps(v, sort_keys=True))
    return {t: [k for k, vs in d.items() if len(vs) > 1] for t, d in seen.items()}


def setting_label(knobs: dict, keys: list[str]) -> str:
    """For a row written before rows carried their ``setting``: the knobs that tell a task's
    settings apart; with one setting, its first three knobs."""
    keys = keys or list(knobs)[:3]
    return ", ".join(f"{k}={knobs.get(k)}" for k in keys) or "-"


def setting_of(row: dict, keys: list[str] | None = None) -> str:
    """The row's task setting label: its ``setting`` column (one text per setting, written with the
    row: the task's first three knobs, then any knob off its default), else the old label."""
    return row.get("setting") or setting_label(knobs_of(row), keys or [])


def task_scores(bests: Iterable[Best]) -> dict[tuple[str, str], dict]:
    """(task, model) -> mean over settings of the best configuration's test mean."""
    acc: dict[tuple[str, str], list[Best]] = {}
    for b in bests:
        acc.setdefault((b.task, b.model), []).append(b)
    out = {}
    for key, bs in acc.items():
        out[key] = {"score": sum(b.test_mean for b in bs) / len(bs), "settings": len(bs),
                    "metric": bs[0].rows[0].get("metric_name"), "higher_is_better": bs[0].higher_is_better,
                    "suite": bs[0].suite}
    return out


# -- views --------------------------------------------------------------------------------

@dataclass
class View:
    """A table: raw records (for CSV) and display columns (for text, Markdown, HTML)."""
    name: str
    title: str
    columns: list[str]
    records: list[dict]
    display: list[tuple[str, Callable[[dict], str]]]
    notes: list[str] = field(default_factory=list)

    def text_rows(self) -> list[list[str]]:
        return [[f(r) for _, f in self.display] for r in self.records]

    @property
    def headers(self) -> list[str]:
        return [h for h, _ in self.display]


def fmt_num(v, digits: int = 4) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, int):
        return str(v)
    if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e5):
        return f"{v:.3e}"
    return f"{v:.{digits}f}".rstrip("0").rstrip(".") if abs(v) >= 10 else f"{v:.{digits}f}"


def fmt_pm(mean, std, n=None) -> str:
    s = fmt_num(mean) + ("" if std is None or (isinstance(std, float) and math.isnan(std)) else f" ± {fmt_num(std)}")
    return s if n is None else f"{s} (n={n})"


def col(name: str) -> Callable[[dict], str]:
    return lambda r: fmt_num(r.get(name))


def searched_keys(row: dict) -> list[str]:
    """The hyperparameters the row's configuration was chosen over: its ``search_space_json`` (a
    sweep's study space; for a single run, the mechanism's registered space), in its order."""
    try:
        space = json.loads(row.get("search_space_json") or "{}")
    except (TypeError, ValueError):
        return []
    return list(space) if isinstance(space, dict) else list(space or [])


def _fmt_hp(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v).lower() if isinstance(v, bool) else str(v)


def config_label(config: Config, group: list[Config]) -> str:
    """What was chosen: every searched hyperparameter of the configuration's rows (mechanism knobs
    included, at their default when not searched away), then any other key in which the
    configurations of its own group (mechanism x setting) differ. Nothing from other rows."""
    hp = hparams_of(config.rows[0])
    keys = [k for k in searched_keys(config.rows[0]) if k in hp]
    seen: dict[str, set] = {}
    for c in group:
        for k, v in hparams_of(c.rows[0]).items():
            seen.setdefault(k, set()).add(json.dumps(v, sort_keys=True))
    keys += sorted(k for k, vs in seen.items() if len(vs) > 1 and k not in keys and k in hp)
    if not keys:
        keys = [k for k in ("lr", "weight_decay") if k in hp]
    return ", ".join(f"{k}={_fmt_hp(hp[k])}" for k in keys)


def best_view(rows: list[dict]) -> View:
    bests = best_configs(rows)
    vary = varying_knobs(bests)
    groups: dict[tuple, list[Config]] = {}
    for c in configs(rows):
        groups.setdefault((c.suite, c.task, c.knobs_json, c.model), []).append(c)
    recs = []
    for b in bests:
        r0 = b.rows[0]
        recs.append({
            "suite": b.suite, "task": b.task, "setting": setting_of(r0, vary.get(b.task, [])),
            "model": b.model, "backend": ",".join(sorted({str(r.get("backend")) for r in b.rows})),
            "metric": r0.get("metric_name"), "higher_is_better": b.higher_is_better,
            "test_mean": b.test_mean, "test_std": b.test_std, "n_seeds": b.n, "val_mean": b.val_mean,
            "n_configs": b.n_configs, "config": config_label(b.config, groups[(b.suite, b.task, b.knobs_json, b.model)]),
            "params": r0.get("params"), "state_size": r0.get("state_size"),
            "steps_per_s": mean_std([r["steps_per_s"] for r in b.rows if _finite(r.get("steps_per_s"))])[0],
            "seeds": ",".join(str(r.get("seed")) for r in b.rows),
            "knobs_json": b.knobs_json, "hparams_json": b.hparams_json,
            "run_ids": ",".join(str(r.get("run_id")) for r in b.rows),
            "command": "; ".join(sorted({r["command"] for r in b.rows if r.get("command")})),
        })
    # best first within each setting
    order = {}
    for i, r in enumerate(recs):
        order.setdefault((r["task"], r["setting"]), i)
    recs.sort(key=lambda r: (order[(r["task"], r["setting"])],
                             -r["test_mean"] if r["higher_is_better"] else r["test_mean"]))
    arrow = lambda r: f"{r['metric']}{'↑' if r['higher_is_better'] else '↓'}"
    display = [("task", lambda r: r["task"]), ("setting", lambda r: r["setting"]), ("model", lambda r: r["model"]),
               ("backend", lambda r: r["backend"]), ("metric", arrow),
               ("test (mean ± std)", lambda r: fmt_pm(r["test_mean"], r["test_std"])),
               ("n", lambda r: str(r["n_seeds"])), ("val", col("val_mean")),
               ("configs", lambda r: str(r["n_configs"])), ("best config", lambda r: r["config"]),
               ("params", col("params")), ("steps/s", lambda r: fmt_num(r["steps_per_s"], 1))]
    cols = list(recs[0]) if recs else ["suite", "task", "setting", "model", "test_mean", "test_std", "n_seeds"]
    return View("best", "Best configuration per mechanism and task setting", cols, recs, display, [PROTOCOL])


def axis_values(bests: list[Best], axis: str) -> tuple[list[Best], dict]:
    """The settings along ``axis`` with every other knob held fixed (the largest such slice)."""
    slices: dict[str, list[Best]] = {}
    for b in bests:
        if axis not in b.knobs:
            continue
        others = {k: v for k, v in b.knobs.items() if k != axis}
        slices.setdefault(json.dumps(others, sort_keys=True), []).append(b)
    if not slices:
        return [], {}
    key = max(slices, key=lambda k: (len({json.dumps(b.knobs[axis]) for b in slices[k]}), len(slices[k]), k))
    return slices[key], json.loads(key)


def default_axis(bests: list[Best]) -> str | None:
    vary = varying_knobs(bests)
    best, most = None, 1
    for b in bests:
        for k in vary.get(b.task, []):
            n = len({json.dumps(x.knobs.get(k)) for x in bests if x.task == b.task})
            if n > most:
                best, most = k, n
    return best


def task_knobs(rows: list[dict], task: str) -> list[str]:
    names: list[str] = []
    for r in rows:
        if r.get("task") == task:
            names += [k for k in knobs_of(r) if k not in names]
    return names


def _pm_cell(label: str) -> Callable[[dict], str]:
    return lambda r: "-" if r[label] is None else fmt_pm(r[label], r[f"{label} std"])


def pivot_view(rows: list[dict], task: str, axis: str | None = None) -> View:
    bests = [b for b in best_configs(rows) if b.task == task]
    axis = axis or default_axis(bests)
    if axis is None:
        axis = next(iter(bests[0].knobs), "?") if bests else "?"
    slice_, fixed = axis_values(bests, axis)
    values = sorted({json.dumps(b.knobs[axis]) for b in slice_}, key=lambda s: _sortable(json.loads(s)))
    models = sorted({b.model for b in slice_})
    recs = []
    for m in models:
        rec = {"task": task, "axis": axis, "model": m}
        for v in values:
            hit = [b for b in slice_ if b.model == m and json.dumps(b.knobs[axis]) == v]
            label = f"{axis}={json.loads(v)}"
            rec[label] = hit[0].test_mean if hit else None
            rec[f"{label} std"] = hit[0].test_std if hit else None
            rec[f"{label} n"] = hit[0].n if hit else None
        recs.append(rec)
    labels = [f"{axis}={json.loads(v)}" for v in values]
    display = [("model", lambda r: r["model"])] + [(lb, _pm_cell(lb)) for lb in labels]
    metric = slice_[0].rows[0].get("metric_name") if slice_ else "metric"
    hib = slice_[0].higher_is_better if slice_ else True
    fixed_txt = ", ".join(f"{k}={v}" for k, v in fixed.items() if k in varying_knobs(bests).get(task, []))
    notes = [f"Test {metric} ({'higher' if hib else 'lower'} is better), best configuration per cell, "
             f"mean ± std over seeds" + (f"; other knobs fixed at {fixed_txt}" if fixed_txt else "") + "."]
    cols = ["task", "axis", "model"] + [c for lb in labels for c in (lb, f"{lb} std", f"{lb} n")]
    return View("pivot", f"{task}: mechanisms against {axis}", cols, recs, display, notes)


def mad_view(rows: list[dict]) -> View:
    bests = [b for b in best_configs(rows) if b.task in MAD_TASKS]
    scores = task_scores(bests)
    models = sorted({m for _, m in scores})
    present = [t for t in MAD_TASKS if any(t == k[0] for k in scores)]
    recs = []
    for m in models:
        rec: dict[str, Any] = {"model": m}
        got = []
        for t in MAD_TASKS:
            s = scores.get((t, m))
            rec[t] = 100 * s["score"] if s else None
            rec[f"{t} settings"] = s["settings"] if s else 0
            if s:
                got.append(rec[t])
        rec["tasks"] = len(got)
        rec["mad_score"] = sum(got) / len(got) if got else None
        recs.append(rec)
    recs.sort(key=lambda r: -(r["mad_score"] or -1))
    cell = lambda t: lambda r: "-" if r[t] is None else f"{r[t]:.1f} ({r[f'{t} settings']})"
    display = ([("model", lambda r: r["model"])] + [(MAD_LABELS[t], cell(t)) for t in MAD_TASKS]
               + [("MAD score", lambda r: "-" if r["mad_score"] is None else f"{r['mad_score']:.1f}"
                   + ("" if r["tasks"] == 6 else f" ({r['tasks']}/6 tasks)"))])
    notes = ["MAD score ×100: per task, mean over its settings of the best configuration's test accuracy "
             "(settings in parentheses); overall, mean over the six tasks. Configurations chosen on validation "
             "(mad-lab picks on test)."]
    if len(present) < 6:
        missing = [t for t in MAD_TASKS if t not in present]
        notes.append(f"Incomplete: {len(present)}/6 MAD tasks present; missing: {', '.join(missing) or '-'}. "
                     "The overall score averages the tasks present.")
    cols = ["model"] + [c for t in MAD_TASKS for c in (t, f"{t} settings")] + ["tasks", "mad_score"]
    return View("mad", "MAD score", cols, recs, display, notes)


def rank_view(rows: list[dict]) -> View:
    bests = best_configs(rows)
    scores = task_scores(bests)
    n_settings = {t: len({b.knobs_json for b in bests if b.task == t}) for t in {b.task for b in bests}}
    recs = []
    for task in sorted(n_settings):
        items = [(m, s) for (t, m), s in scores.items() if t == task]
        items.sort(key=lambda x: (-x[1]["score"] if x[1]["higher_is_better"] else x[1]["score"], x[0]))
        prev, rank = None, 0
        for i, (m, s) in enumerate(items, 1):
            if s["score"] != prev:
                rank, prev = i, s["score"]
            recs.append({"suite": s["suite"], "task": task, "rank": rank, "model": m, "metric": s["metric"],
                         "higher_is_better": s["higher_is_better"], "score": s["score"],
                         "settings": s["settings"], "settings_total": n_settings[task]})
    display = [("task", lambda r: r["task"]), ("rank", lambda r: str(r["rank"])), ("model", lambda r: r["model"]),
               ("metric", lambda r: f"{r['metric']}{'↑' if r['higher_is_better'] else '↓'}"),
               ("score", col("score")), ("settings", lambda r: f"{r['settings']}/{r['settings_total']}")]
    notes = ["Score: mean over the task's settings of the best configuration's test mean."]
    if any(r["settings"] < r["settings_total"] for r in recs):
        notes.append("Some mechanisms cover fewer settings than others (settings column); "
                     "their scores average over different settings.")
    cols = ["suite", "task", "rank", "model", "metric", "higher_is_better", "score", "settings", "settings_total"]
    return View("rank", "Ranking per task", cols, recs, display, notes)


def rows_view(rows: list[dict]) -> View:
    vary: dict[str, list[str]] = {}
    for r in rows:
        vary.setdefault(r["task"], [])
    for t in vary:
        kn = [knobs_of(r) for r in rows if r["task"] == t]
        vary[t] = [k for k in (kn[0] if kn else {}) if len({json.dumps(x.get(k)) for x in kn}) > 1]
    recs = []
    for r in sorted(rows, key=lambda r: (r.get("task") or "", r.get("model") or "", str(r.get("created_at")),
                                         r.get("seed") or 0)):
        rec = {k: v for k, v in r.items() if not k.startswith(("knob_", "hp_"))}
        rec["setting"] = setting_of(r, vary[r["task"]])
        recs.append(rec)
    display = [("task", lambda r: r["task"]), ("setting", lambda r: r["setting"]), ("model", lambda r: r["model"]),
               ("backend", lambda r: str(r.get("backend"))), ("seed", col("seed")),
               ("trial", col("trial")), ("metric", lambda r: str(r.get("metric_name"))),
               ("test", col("metric_value")), ("val", col("val_metric_value")), ("steps", col("steps")),
               ("steps/s", lambda r: fmt_num(r.get("steps_per_s"), 1)), ("params", col("params")),
               ("state", lambda r: str(r.get("state")))]
    cols = list(recs[0]) if recs else ["task", "model", "seed", "metric_value"]
    return View("rows", "Every row", cols, recs, display)


def build_views(rows: list[dict], view: str = "best", *, task: str | None = None, axis: str | None = None) -> list[View]:
    """The named view over ``rows`` (already filtered); ``pivot`` gives one table per task."""
    if view == "best":
        return [best_view(rows)]
    if view == "pivot":
        tasks = [task] if task else sorted({r["task"] for r in complete_rows(rows)})
        return [pivot_view(rows, t, axis) for t in tasks]
    if view == "mad":
        return [mad_view(rows)]
    if view == "rank":
        return [rank_view(rows)]
    if view == "rows":
        return [rows_view(rows)]
    raise ValueError(f"unknown view {view!r}; allowed: {', '.join(VIEWS)}")


# -- plain text ---------------------------------------------------------------------------

def format_table(headers: list[str], rows: list[list]) -> str:
    cells = [[c if isinstance(c, str) else fmt_num(c) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    out = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip(),
           "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.rjust(w) if _numeric(c) else c.ljust(w) for c, w in zip(r, widths)).rstrip()
            for r in cells]
    return "\n".join(out)


def _numeric(s: str) -> bool:
    try:
        float(s.split(" ")[0])
        return True
    except ValueError:
        return False


def format_view(v: View) -> str:
    if not v.records:
        return f"{v.title}\n(no rows)"
    return "\n".join([v.title, format_table(v.headers, v.text_rows())] + [f"  {n}" for n in v.notes])


def print_rows(rows: list[dict]) -> None:
    """Rows as written by one run (one line per seed)."""
    v = rows_view(rows)
    print(format_table(v.headers, v.text_rows()))


def print_summary(table, task: str | None = None) -> None:
    """The best-configuration table (of one task, when given)."""
    rows = filter_rows(as_rows(table), task=task)
    if not complete_rows(rows):
        print("(leaderboard is empty)" if not rows else "(no COMPLETE rows)")
        return
    print(format_view(best_view(rows)))
