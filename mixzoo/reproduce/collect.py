"""The points of a figure at one scale, and our per-seed values at them, read from leaderboard rows.

A point is a task setting (one study per mechanism) or an aggregate of settings (a MAD task
score, the MAD average). Values are read from the rows whose ``study`` is the point's study for
that mechanism, COMPLETE, at a final seed of the run; a row's value is its primary metric, or
a key of its ``metrics_json``.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from .spec import TRAIN_LIKE, Figure, split_setting, sweep_raw, ttr_study


@dataclass
class Point:
    label: str
    knobs: dict[str, Any]                          # what claims and references select on
    studies: dict[str, str] = field(default_factory=dict)   # mechanism -> study (settings)
    members: list[str] = field(default_factory=list)        # aggregates: member labels
    aggregate: bool = False
    higher_is_better: bool = True
    metric: str = ""


def matches(knobs: dict[str, Any], where: dict[str, Any]) -> bool:
    if ("aggregate" in where) != ("aggregate" in knobs):
        return False
    for k, v in where.items():
        if k not in knobs:
            return False
        allowed = v if isinstance(v, (list, tuple)) else [v]
        if knobs[k] not in allowed:
            return False
    return True


def points(fig: Figure, scale: str, seeds: int | None = None) -> tuple[list[Point], list[int]]:
    """The figure's points at ``scale`` (settings, then aggregates) and the final seeds."""
    from ..registry import get_task
    sc = fig.scale(scale)
    n_seeds = int(seeds if seeds is not None else sc.seeds)
    out: list[Point] = []
    models = fig.models_at(scale)
    if fig.kind == "sweep":
        from ..sweeps.spec import load
        spec = load(fig.name, None, raw=sweep_raw(fig, scale, n_seeds))
        tags_of = {}
        for s in sc.settings:
            task, setting, tags = split_setting(fig, s)
            tags_of[(task, json.dumps(setting, sort_keys=True))] = tags
        by_label: dict[str, Point] = {}
        multi_task = any("task" in s for x in fig.scales.values() for s in x.settings)
        for u in spec.units:
            tags = tags_of[(u.task, json.dumps(u.setting, sort_keys=True))]
            own = {k: v for k, v in u.setting.items() if k not in TRAIN_LIKE}     # the budget does not name it
            body = own["preset"] if set(own) == {"preset"} else ",".join(f"{k}={v}" for k, v in own.items())
            label = f"{u.task} {body}" if multi_task else body
            p = by_label.get(label)
            if p is None:
                t = get_task(u.task).from_knobs(u.knobs, u.task_preset)
                knobs = {"task": u.task, **t.knobs(), **{k: v for k, v in u.setting.items() if k != "preset"},
                         **tags}
                p = by_label[label] = Point(label, knobs, higher_is_better=u.direction == "maximize",
                                            metric=u.metric)
                out.append(p)
            p.studies[u.model] = u.study
    else:
        from ..tasks.ttr import TTR
        for s in sc.settings:
            _task, setting, tags = split_setting(fig, s)
            t = TTR.from_knobs({**fig.knobs, **setting})
            label = ",".join(f"{k}={v}" for k, v in setting.items())
            study = ttr_study(fig, scale, setting, t.knobs(), models, sc)
            out.append(Point(label, {"task": "ttr", **t.knobs(), **tags}, {m: study for m in models},
                             higher_is_better=False, metric="mse"))
    settings = list(out)
    for agg in fig.aggregates:
        label = agg.name + (f" [{', '.join(f'{k}={v}' for k, v in agg.tags.items())}]" if agg.tags else "")
        if agg.of:
            members = [p.label for p in out if p.aggregate and p.knobs.get("aggregate") in agg.of
                       and all(p.knobs.get(k) == v for k, v in agg.tags.items())]
        else:
            members = [p.label for p in settings if matches(p.knobs, agg.where)]
        if not members:
            continue
        first = next(p for p in out if p.label == members[0])
        out.append(Point(label, {"aggregate": agg.name, **agg.tags}, members=members, aggregate=True,
                         higher_is_better=first.higher_is_better, metric=first.metric))
    return out, list(range(n_seeds))


class Results:
    """Per-seed values of every (point, mechanism) from the rows of a results directory."""

    def __init__(self, fig: Figure, scale: str, rows: list[dict], seeds: int | None = None):
        self.fig, self.scale = fig, scale
        self.points, self.seeds = points(fig, scale, seeds)
        self.by_label = {p.label: p for p in self.points}
        self.models = list(fig.models_at(scale))
        want = {(study, m) for p in self.points for m, study in p.studies.items()}
        studies = {s for s, _ in want}
        self._rows: dict[tuple[str, str, int], dict] = {}
        for r in rows:
            if r.get("study") not in studies or r.get("state") != "COMPLETE" or r.get("seed") not in self.seeds:
                continue
            key = (r["study"], r["model"], int(r["seed"]))
            if (r["study"], r["model"]) not in want:
                continue
            old = self._rows.get(key)
            if old is None or str(r.get("created_at") or "") > str(old.get("created_at") or ""):
                self._rows[key] = r
        self._cache: dict[tuple, dict[int, float]] = {}

    def higher_is_better(self, label: str) -> bool:
        return self.by_label[label].higher_is_better

    def select(self, where: dict[str, Any]) -> list[Point]:
        return [p for p in self.points if matches(p.knobs, where)]

    def rows_of(self, label: str, model: str) -> list[dict]:
        p = self.by_label[label]
        study = p.studies.get(model)
        return [self._rows[k] for k in sorted(self._rows) if k[0] == study and k[1] == model]

    def defined(self, label: str, model: str, metric: str | None) -> bool:
        """False when ``model`` has rows at the setting ``label`` but none carries ``metric`` (e.g.
        the error after a segment switch of a sequence with one segment): the claim does not apply
        there. True otherwise (missing rows are missing values, not an inapplicable point)."""
        p = self.by_label.get(label)
        if metric is None or p is None:
            return True
        if p.aggregate:
            return all(self.defined(m, model, metric) for m in p.members)
        rows = self.rows_of(label, model)
        return not rows or any(_value(r, metric) is not None for r in rows)

    def series(self, label: str, model: str, metric: str | None = None) -> dict[int, float]:
        """seed -> value of ``model`` at the point ``label`` (aggregates: the mean over members,
        for the seeds every member has)."""
        key = (label, model, metric)
        if key in self._cache:
            return self._cache[key]
        p = self.by_label.get(label)
        out: dict[int, float] = {}
        if p is None:
            pass
        elif p.aggregate:
            parts = [self.series(m, model, metric) for m in p.members]
            common = set(self.seeds)
            for s in parts:
                common &= set(s)
            out = {s: sum(x[s] for x in parts) / len(parts) for s in sorted(common)}
        else:
            for r in self.rows_of(label, model):
                v = _value(r, metric)
                if v is not None and math.isfinite(v):
                    out[int(r["seed"])] = v
        self._cache[key] = out
        return out


def _value(row: dict, metric: str | None) -> float | None:
    if metric is None:
        v = row.get("metric_value")
    else:
        try:
            v = json.loads(row.get("metrics_json") or "{}").get(metric)
        except (TypeError, ValueError):
            v = None
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def read_rows(results) -> list[dict]:
    from ..leaderboard import read_table
    return read_table(results).to_pylist()
