"""Verdicts on a paper's claims, from per-seed values.

The rule (also printed under every table):

* For each point (a setting or an aggregate) and each pair of mechanisms the claim names, the
  quantity q is computed **per seed**, pairing the mechanisms' runs of the same seed (the seed
  fixes the data of every split, so both saw the same examples): the metric of ``a``, the
  difference a - b oriented so that positive means ``a`` is better, or the ratio a / b. A trend
  (``along``) is q at the last value of the knob minus q at the first, per seed.
* Over the n seeds both have, the mean of q and its two-sided 95% Student-t interval
  (mean ± t(0.975, n - 1) · s / √n).
* ``above t``: **holds** if the whole interval is above t, **fails** if the whole interval is
  below t, otherwise **inconclusive**. ``below t``: the mirror image. ``within t`` (|q| < t):
  holds if the interval lies inside (-t, t), fails if it lies wholly outside, else inconclusive.
  Fewer than 2 paired seeds, or a missing mechanism: inconclusive. A point where the claim's
  metric does not exist (the error after a switch in a sequence of one segment) is n/a, left out.
* Over points and pairs: a claim made for ``every`` one holds if all hold and fails if any
  fails; one made for ``some`` holds if any holds and fails only if all fail; otherwise it is
  inconclusive. A claim none of whose points exist at this scale is inconclusive. A joined
  claim (``all``: a crossover, one side at some points and the other elsewhere) holds if all
  its parts hold and fails if one fails.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from .spec import Claim

RULE = ("Per point and pair of mechanisms, the claimed quantity is computed per seed (paired: a seed "
        "fixes the data), and its mean gets a two-sided 95% Student-t interval over the n seeds. "
        "holds: the whole interval is on the claimed side of the threshold; fails: the whole interval is "
        "on the other side; inconclusive: it straddles the threshold, or n < 2, or a value is missing. "
        "'every' point/pair must hold (one failure fails the claim); 'some' needs one to hold (fails "
        "only if all fail).")

# t(0.975, df) for df = 1..30; beyond, the Cornish-Fisher expansion (error < 1e-3 at df > 30)
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
         2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
         2.052, 2.048, 2.045, 2.042)


def t975(df: int) -> float:
    if df < 1:
        raise ValueError("df must be >= 1")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def interval(xs: list[float]) -> tuple[float, float, int]:
    """(mean, half-width of the 95% t-interval, n); the half-width is nan for n < 2."""
    n = len(xs)
    if n == 0:
        return math.nan, math.nan, 0
    m = sum(xs) / n
    if n < 2:
        return m, math.nan, 1
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    return m, t975(n - 1) * sd / math.sqrt(n), n


def judge(test: str, threshold: float, lo: float, hi: float) -> str:
    if test == "above":
        return "holds" if lo > threshold else "fails" if hi < threshold else "inconclusive"
    if test == "below":
        return "holds" if hi < threshold else "fails" if lo > threshold else "inconclusive"
    t = abs(threshold)
    if -t < lo and hi < t:
        return "holds"
    return "fails" if lo > t or hi < -t else "inconclusive"


def combine(verdicts: list[str], quantifier: str) -> str:
    verdicts = [v for v in verdicts if v != "n/a"]
    if not verdicts:
        return "inconclusive"
    if quantifier == "every":
        return "fails" if "fails" in verdicts else "holds" if all(v == "holds" for v in verdicts) else "inconclusive"
    return "holds" if "holds" in verdicts else "fails" if all(v == "fails" for v in verdicts) else "inconclusive"


@dataclass
class Part:
    """The claim at one point (or trend group) for one pair."""
    where: str
    pair: str
    mean: float = math.nan
    half: float = math.nan
    n: int = 0
    verdict: str = "inconclusive"
    note: str = ""

    def text(self) -> str:
        if self.n == 0 or self.verdict == "n/a":
            return f"{self.where} {self.pair}: {self.note or 'no values'}"
        if self.n < 2:
            return f"{self.where} {self.pair}: {self.mean:.3g} (n=1, no interval)"
        return (f"{self.where} {self.pair}: {self.mean:.3g} [{self.mean - self.half:.3g}, "
                f"{self.mean + self.half:.3g}] n={self.n} {self.verdict}")


@dataclass
class ClaimResult:
    claim: Claim
    verdict: str
    parts: list[Part] = field(default_factory=list)
    note: str = ""


def _pairs(c: Claim) -> list[tuple[str, str | None]]:
    if c.kind == "value":
        return [(a, None) for a in c.a]
    return [(a, b) for a in c.a for b in c.b if a != b]


def _pair_label(c: Claim, a: str, b: str | None) -> str:
    if b is None:
        return a
    return f"{a}/{b}" if c.kind == "ratio" else f"{a}-{b}"


def quantity(c: Claim, res, label: str, a: str, b: str | None) -> dict[int, float]:
    """Per-seed values of the claim's quantity at one point (``res``: :class:`.collect.Results`)."""
    va = res.series(label, a, c.metric)
    if c.kind == "value":
        return dict(va)
    vb = res.series(label, b, c.metric)
    out = {}
    for s in sorted(set(va) & set(vb)):
        if c.kind == "diff":
            out[s] = (va[s] - vb[s]) * (1.0 if res.higher_is_better(label) else -1.0)
        elif vb[s] != 0:
            out[s] = va[s] / vb[s]
    return out


def _along_key(v, order: tuple):
    if order:
        return order.index(v) if v in order else len(order)
    return v if isinstance(v, (int, float)) else str(v)


def _groups(c: Claim, points) -> list[tuple[str, str, str]]:
    """(group label, first point label, last point label) for a trend claim: the points equal on
    every knob but ``along``, ordered along it."""
    groups: dict[tuple, list] = {}
    for p in points:
        if c.along in p.knobs:
            rest = tuple(sorted((k, json.dumps(v, default=str)) for k, v in p.knobs.items() if k != c.along))
            groups.setdefault(rest, []).append(p)
    varying = sorted({k for rest in groups for k, v in rest
                      if any(dict(other).get(k) != v for other in groups)})
    out = []
    for ps in groups.values():
        ps = sorted(ps, key=lambda p: _along_key(p.knobs[c.along], c.order))
        v0, v1 = ps[0].knobs[c.along], ps[-1].knobs[c.along]
        if len(ps) < 2 or v0 == v1:
            continue
        at = ", ".join(f"{k}={ps[0].knobs.get(k)}" for k in varying)
        out.append((f"{c.along} {v0}->{v1}" + (f" at {at}" if at else ""), ps[0].label, ps[-1].label))
    return out


def evaluate_all(claims, res) -> list[ClaimResult]:
    """Every claim's verdict, in order (a claim of kind ``all`` joins earlier ones)."""
    done: dict[str, ClaimResult] = {}
    for c in claims:
        done[c.id] = evaluate(c, res, done)
    return list(done.values())


def evaluate(c: Claim, res, earlier: dict[str, ClaimResult] | None = None) -> ClaimResult:
    """The verdict of one claim on the values in ``res`` (a :class:`.collect.Results`)."""
    if c.kind == "all":
        subs = [(earlier or {}).get(i) for i in c.of]
        if any(s is None for s in subs):
            return ClaimResult(c, "inconclusive", note="a joined claim was not evaluated first")
        parts = [Part(s.claim.id, "", verdict=s.verdict, note=s.verdict) for s in subs]
        return ClaimResult(c, combine([s.verdict for s in subs], "every"), parts,
                           note=", ".join(f"{s.claim.id}: {s.verdict}" for s in subs))
    pts = res.select(c.where)
    if not pts:
        return ClaimResult(c, "inconclusive", note="no matching point at this scale")
    groups = _groups(c, pts) if c.along else []
    if c.along and not groups:
        return ClaimResult(c, "inconclusive", note=f"fewer than two values of {c.along} at this scale")
    parts: list[Part] = []
    for a, b in _pairs(c):
        missing = [m for m in (a, b) if m is not None and m not in res.models]
        if missing:
            parts.append(Part("-", _pair_label(c, a, b), note=f"{', '.join(missing)} not run at this scale"))
            continue
        if c.along:
            for gname, first, last in groups:
                if not (res.defined(first, a, c.metric) and res.defined(last, a, c.metric)):
                    parts.append(Part(gname, _pair_label(c, a, b), verdict="n/a", note=f"{c.metric} not defined"))
                    continue
                q0, q1 = quantity(c, res, first, a, b), quantity(c, res, last, a, b)
                xs = [q1[s] - q0[s] for s in sorted(set(q0) & set(q1))]
                parts.append(_part(c, gname, _pair_label(c, a, b), xs))
        else:
            for p in pts:
                if not res.defined(p.label, a, c.metric):
                    parts.append(Part(p.label, _pair_label(c, a, b), verdict="n/a", note=f"{c.metric} not defined"))
                    continue
                xs = list(quantity(c, res, p.label, a, b).values())
                parts.append(_part(c, p.label, _pair_label(c, a, b), xs))
    return ClaimResult(c, combine([p.verdict for p in parts], c.quantifier), parts)


def _part(c: Claim, where: str, pair: str, xs: list[float]) -> Part:
    xs = [x for x in xs if math.isfinite(x)]
    m, h, n = interval(xs)
    if n == 0:
        return Part(where, pair, note="no paired values")
    if n < 2:
        return Part(where, pair, m, h, n, "inconclusive", "n=1")
    return Part(where, pair, m, h, n, judge(c.test, c.threshold, m - h, m + h))


def describe(c: Claim) -> str:
    """The claim as a test, in words: 'lla minus softmax (> 0: lla better) > 0, at every point'."""
    if c.kind == "all":
        return "all of: " + ", ".join(c.of)
    a, b = ", ".join(c.a), ", ".join(c.b)
    q = {"value": f"{a}", "diff": f"{a} minus {b} (> 0: {c.a[0] if len(c.a) == 1 else 'the first'} better)",
         "ratio": f"{a} / {b}"}[c.kind]
    if c.metric:
        q += f" on {c.metric}"
    if c.along:
        q = f"change of [{q}] from the first to the last {c.along}"
    t = {"above": f"> {c.threshold:g}", "below": f"< {c.threshold:g}", "within": f"within ±{abs(c.threshold):g}"}[c.test]
    return f"{q} {t}, at {c.quantifier} point"
