"""The papers' synthetic experiments as runnable reproductions.

One :class:`~.spec.Figure` per paper figure (``lla-fig3`` .. ``lla-fig6`` from the LLA paper,
``parallax-mad`` and ``parallax-mad-hard`` from the Parallax paper), each with the settings the
paper states, the values it reports, its claims as data, every unstated choice with its reason,
and three scales (``smoke``, ``small``, ``paper``). ``mixzoo reproduce NAME`` runs one through the
sweep engine (resumable) and writes ours beside the paper's, with a verdict per claim.

Why Python data and not TOML beside the sweep specs: a reproduction holds more than a sweep
(paper tables, claims with selectors, reasons), which the sweep loader rightly refuses as unknown
keys; a TOML in ``mixzoo/sweeps/specs/`` would also become a built-in sweep spec, and
``mixzoo compare`` takes the first built-in spec holding its task (``lla-fig5b`` sorts before
``mqar``). Each figure still becomes an ordinary sweep spec (:func:`.spec.sweep_raw`), written as
JSON under ``<results>/reproduce/specs/`` for the engine's workers and for ``mixzoo sweep FILE``.

Nothing here imports torch at import time.
"""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import UsageError
from .spec import REQUIRED_CHOICES, SCALES, TTR_BASELINES, Figure

REFERENCE_ENV = "MIXZOO_REFERENCE"


def figures() -> dict[str, Figure]:
    from . import lla, parallax
    return {f.name: f for f in (*lla.FIGURES, *parallax.FIGURES)}


def get(name: str) -> Figure:
    figs = figures()
    if name not in figs:
        raise UsageError(f"unknown reproduction {name!r}; allowed: {', '.join(figs)}")
    return figs[name]


def validate(fig: Figure) -> None:
    """Every check a spec must pass before it runs; a UsageError names the first problem."""
    from ..registry import get_mixer, mixers
    from .collect import matches, points
    from .spec import KINDS, QUANTIFIERS, QUANTITIES, TESTS
    where = f"reproduction {fig.name!r}"
    if fig.kind not in KINDS:
        raise UsageError(f"{where}: kind {fig.kind!r}; allowed: {', '.join(KINDS)}")
    if tuple(fig.scales) != SCALES:
        raise UsageError(f"{where}: scales {tuple(fig.scales)}; allowed: exactly {', '.join(SCALES)}")
    every = fig.models + fig.extra_models
    if len(set(every)) != len(every):
        raise UsageError(f"{where}: a mechanism is listed twice")
    for m in every:
        if fig.kind == "sweep":
            get_mixer(m)
        elif m not in TTR_BASELINES and (m not in mixers() or mixers()[m].core is None):
            cores = sorted(n for n, s in mixers().items() if s.core is not None)
            raise UsageError(f"{where}: {m!r} has no functional core; allowed: {', '.join(cores + list(TTR_BASELINES))}")
    for m in fig.mixer_knobs:
        if m not in every:
            raise UsageError(f"{where}: mixer_knobs for {m!r}, which is not run")
    keys = {c.key for c in fig.choices}
    for k in REQUIRED_CHOICES[fig.kind]:
        if k not in keys:
            raise UsageError(f"{where}: the unstated choice {k!r} is not written down (a Choice with key {k!r})")
    if fig.scales["small"].seeds != 3 or fig.scales["paper"].seeds != 3:
        raise UsageError(f"{where}: small and paper run 3 seeds (the papers' mean of 3)")
    pts_at = {}
    for name, sc in fig.scales.items():
        if not set(fig.models_at(name)) <= set(every):
            raise UsageError(f"{where} [{name}]: a mechanism outside the figure's lists")
        if fig.kind == "sweep" and not sc.lr:
            raise UsageError(f"{where} [{name}]: no learning-rate grid")
        if fig.kind == "ttr" and (sc.sequences < 1 or sc.tune_sequences < 1):
            raise UsageError(f"{where} [{name}]: sequences and tune_sequences must be >= 1")
        if not sc.settings:
            raise UsageError(f"{where} [{name}]: no settings")
        pts_at[name] = points(fig, name)[0]       # builds and validates the sweep spec / the tasks
    paper = pts_at["paper"]
    known = {k for p in paper for k in p.knobs}
    agg_names = set()
    for a in fig.aggregates:
        for o in a.of:
            if o not in agg_names:
                raise UsageError(f"{where}: aggregate {a.name!r} is made of {o!r}, not defined before it")
        agg_names.add(a.name)
    ids = [c.id for c in fig.claims]
    if len(set(ids)) != len(ids):
        raise UsageError(f"{where}: two claims share an id")
    for c in fig.claims:
        cw = f"{where} claim {c.id!r}"
        if c.source == "" or c.text == "":
            raise UsageError(f"{cw}: needs its source and the paper's words")
        if c.kind not in QUANTITIES or c.test not in TESTS or c.quantifier not in QUANTIFIERS:
            raise UsageError(f"{cw}: kind/test/quantifier {c.kind}/{c.test}/{c.quantifier}; allowed: "
                             f"{QUANTITIES}, {TESTS}, {QUANTIFIERS}")
        if c.kind == "all":
            if not c.of or any(i not in ids[:ids.index(c.id)] for i in c.of):
                raise UsageError(f"{cw}: joins {c.of}; allowed: ids of claims listed before it")
            continue
        if not c.a or (c.kind != "value" and not c.b):
            raise UsageError(f"{cw}: needs a{'' if c.kind == 'value' else ' and b'}")
        for m in (*c.a, *c.b):
            if m not in fig.models:
                raise UsageError(f"{cw}: {m!r} is not among the mechanisms the paper compares ({', '.join(fig.models)})")
        for k in c.where:
            if k not in known:
                raise UsageError(f"{cw}: selects on {k!r}, which no point has; known: {', '.join(sorted(known))}")
        if c.along and c.along not in known:
            raise UsageError(f"{cw}: along {c.along!r}, which no point has")
        if not [p for p in paper if matches(p.knobs, c.where)]:
            raise UsageError(f"{cw}: selects no point at paper scale")
    for r in fig.reference:
        if r.model not in every:
            raise UsageError(f"{where}: a reference value for {r.model!r}, which is not run")
        if not [p for p in paper if matches(p.knobs, r.at)]:
            raise UsageError(f"{where}: the reference value {r.at} for {r.model} matches no point at paper scale")


def reference_dir() -> Path:
    """The repository's published results: ``$MIXZOO_REFERENCE``, else ``results/`` beside the package."""
    env = os.environ.get(REFERENCE_ENV)
    return Path(env) if env else Path(__file__).resolve().parents[2] / "results"


def reference_rows(name: str | None = None, *, directory: str | Path | None = None) -> list[dict]:
    """The reference leaderboard's rows (the GPU runs of these reproductions, committed under
    ``results/leaderboard``), as ``mixzoo.leaderboard`` row dicts; ``name`` keeps one reproduction's.
    Rows of a smoke run are never reference results and are dropped here even if some land there.
    Empty for a figure that has not run there. For ``mixzoo leaderboard show --with-reference``: the views take
    these rows beside a user's own."""
    d = Path(directory) if directory is not None else reference_dir()
    if not (d / "leaderboard").is_dir():
        return []
    from ..leaderboard import read_table
    out = []
    for r in read_table(d).to_pylist():
        study = r.get("study") or ""
        if "[smoke]" in study:
            continue
        if name is not None and not study.startswith(f"{name}["):
            continue
        out.append(r)
    return out


__all__ = ["Figure", "figures", "get", "reference_dir", "reference_rows", "validate"]
