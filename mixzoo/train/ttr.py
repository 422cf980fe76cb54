"""``mixzoo ttr``: training-free piecewise test-time regression.

Every registered mechanism with a functional core ``core(q, k, v, **knobs)`` is scored as an
online regressor, beside two baselines of our own (``random``: a N(0, I) guess, the value
distribution; ``zero``). Online protocol, exact: the prediction for pair i is the core's
output at position i-1 of the sequence ``q = (k_1, ..., k_{L-1}, 0)``, ``k = (k_0, ...,
k_{L-1})``, ``v = (v_0, ..., v_{L-1})``: a causal core at position i-1 sees pairs j <= i-1
only, and its query is k_i. Pair 0 has nothing to learn from and is predicted as 0 by every
mechanism. Each core's grid (``core_grid``) is tuned per setting on tuning sequences (the
``val`` seed stream) and scored on test sequences (the ``test`` stream) by MSE per position
against the noiseless target A_c k_i.
"""
from __future__ import annotations

import itertools
import json
import math
import time
from collections.abc import Callable
from typing import Any

from ..errors import UsageError

BASELINES = ("random", "zero")


def online_predict(core: Callable, k, v, **knobs):
    """(..., L, Dv) predictions: row i from pairs j < i with query k_i (row 0 is zero)."""
    import torch
    q = torch.cat([k[..., 1:, :], torch.zeros_like(k[..., :1, :])], dim=-2)
    o = core(q, k, v, **knobs)
    return torch.cat([torch.zeros_like(o[..., :1, :]), o[..., :-1, :]], dim=-2)


def _baseline(name: str, k, v, seed: int):
    import torch
    if name == "zero":
        return torch.zeros_like(v)
    g = torch.Generator().manual_seed(seed)
    return torch.randn(v.shape, generator=g, dtype=v.dtype)


def _mse_per_position(pred, clean):
    return ((pred.float() - clean.float()) ** 2).mean(-1).mean(0)          # (L,)


def _grid(grid: dict[str, list]) -> list[dict[str, Any]]:
    if not grid:
        return [{}]
    keys = sorted(grid)
    return [dict(zip(keys, vals)) for vals in itertools.product(*(grid[k] for k in keys))]


def evaluate_ttr(task=None, *, mechanisms: list[str] | None = None, seed: int = 0,
                 sequences: int = 32, tune_sequences: int = 4, device: str = "cpu",
                 extra_cores: dict[str, tuple[Callable, dict[str, list]]] | None = None,
                 log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Score every registered core (and the baselines) on one TTR setting.

    Returns ``{"task": knobs, "segments": C, "mse": {mech: overall}, "per_segment": {mech:
    [C floats]}, "per_position": {mech: [L floats]}, "best": {mech: knobs}, "skipped": {mech:
    reason}}``. ``extra_cores`` adds cores by name (e.g. in tests) beside the registry's.
    """
    import torch

    from ..registry import mixers
    from ..tasks.ttr import TTR
    task = task or TTR()
    cores: dict[str, tuple[Callable, dict[str, list]]] = {
        name: (spec.core, dict(spec.core_grid)) for name, spec in mixers().items() if spec.core is not None}
    cores.update(extra_cores or {})
    wanted = list(mechanisms) if mechanisms else list(cores) + list(BASELINES)
    unknown = [m for m in wanted if m not in cores and m not in BASELINES]
    if unknown:
        raise UsageError(f"ttr: no core for {', '.join(unknown)}; allowed: "
                         f"{', '.join(sorted(cores) + list(BASELINES))}")
    dev = torch.device(device)
    tune = task.sample("val", tune_sequences, seed)
    test = task.sample("test", sequences, seed)
    kt, vt, ct = (tune[x].to(dev) for x in ("k", "v", "clean"))
    ks, vs, cs = (test[x].to(dev) for x in ("k", "v", "clean"))
    C, S = task.L // task.S, task.S
    out: dict[str, Any] = {"task": task.knobs(), "segments": C, "sequences": sequences,
                           "tune_sequences": tune_sequences, "seed": seed, "mse": {},
                           "per_segment": {}, "per_position": {}, "best": {}, "skipped": {},
                           "seconds": {}}
    for name in wanted:
        t0 = time.perf_counter()
        if name in BASELINES:
            pp = _mse_per_position(_baseline(name, ks, vs, seed), cs)
            best: dict[str, Any] = {}
        else:
            core, grid = cores[name]
            best, best_mse = None, math.inf
            for cfg in _grid(grid):
                try:
                    with torch.no_grad():
                        m = float(_mse_per_position(online_predict(core, kt, vt, **cfg), ct).mean())
                except Exception as e:  # a core that cannot run a config is skipped, not fatal
                    if log:
                        log(f"  {name} {cfg}: failed ({type(e).__name__}: {e})")
                    continue
                if math.isfinite(m) and m < best_mse:
                    best, best_mse = cfg, m
            if best is None:
                out["skipped"][name] = "no grid point ran with a finite MSE"
                continue
            with torch.no_grad():
                pp = _mse_per_position(online_predict(core, ks, vs, **best), cs)
        pp = pp.cpu()
        out["per_position"][name] = pp.tolist()
        out["per_segment"][name] = pp.view(C, S).mean(1).tolist()
        out["mse"][name] = float(pp.mean())
        out["best"][name] = best
        out["seconds"][name] = time.perf_counter() - t0
        if log:
            log(f"  {name:<10} mse {out['mse'][name]:.4f}  best {best}  ({out['seconds'][name]:.1f} s)")
    return out


def format_table(results: list[dict[str, Any]]) -> str:
    """Rows: mechanisms; columns: segment index (one setting) or S (several settings)."""
    if len(results) == 1:
        r = results[0]
        C = r["segments"]
        groups = min(C, 16)
        bounds = [round(i * C / groups) for i in range(groups + 1)]
        heads = [f"seg {a}" if b - a == 1 else f"seg {a}-{b - 1}" for a, b in zip(bounds, bounds[1:])]
        rows = {m: [sum(v[a:b]) / (b - a) for a, b in zip(bounds, bounds[1:])] + [r["mse"][m]]
                for m, v in r["per_segment"].items()}
        title = (f"ttr: per-segment MSE (d={r['task']['d']}, L={r['task']['L']}, S={r['task']['S']}, "
                 f"{r['sequences']} test sequences, seed {r['seed']})")
    else:
        heads = [f"S={r['task']['S']}" for r in results]
        mechs = list(dict.fromkeys(m for r in results for m in r["mse"]))
        rows = {m: [r["mse"].get(m, float("nan")) for r in results] for m in mechs}
        r = results[0]
        title = (f"ttr: MSE by segment length (d={r['task']['d']}, L={r['task']['L']}, "
                 f"{r['sequences']} test sequences, seed {r['seed']})")
        heads = heads[:-1] + [heads[-1]]
    if len(results) == 1:
        heads = heads + ["all"]
    w = max(9, *(len(h) + 1 for h in heads))
    lines = [title, f"{'mechanism':<12}" + "".join(f"{h:>{w}}" for h in heads)]
    for m, vals in sorted(rows.items(), key=lambda kv: kv[1][-1]):
        lines.append(f"{m:<12}" + "".join(f"{x:>{w}.4f}" for x in vals))
    return "\n".join(lines)


def configure(name: str, p) -> None:
    p.add_argument("--dim", type=int, default=32, help="key/value dimension d (default 32)")
    p.add_argument("--seq-len", type=int, default=1024, help="sequence length L (default 1024)")
    p.add_argument("--segment", default="128",
                   help="segment length S, or a comma list (one column per S); default 128")
    p.add_argument("--noise", type=float, default=0.1, help="value noise std (default 0.1)")
    p.add_argument("--cone-width", type=float, default=0.15, help="spread of a segment's keys (default 0.15)")
    p.add_argument("--sequences", type=int, default=32, help="test sequences (default 32)")
    p.add_argument("--tune-sequences", type=int, default=4, help="tuning sequences (default 4)")
    from ..cli import deprecated
    p.add_argument("--models", dest="mechanisms", metavar="A,B",
                   help="comma list of mechanisms (default: every core, plus random and zero)")
    p.add_argument("--mechanisms", dest="mechanisms", action=deprecated("--models"), help="old name of --models")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write the results (per-position MSE included) to this JSON file")


def main(args) -> int:
    import torch

    from ..tasks.ttr import TTR
    try:
        segs = [int(s) for s in str(args.segment).split(",") if s.strip()]
    except ValueError:
        raise UsageError(f"ttr: --segment {args.segment!r} is not an integer or a comma list of integers")
    if not segs:
        raise UsageError("ttr: --segment needs at least one value")
    for name, v, lo in (("--sequences", args.sequences, 1), ("--tune-sequences", args.tune_sequences, 1)):
        if v < lo:
            raise UsageError(f"ttr: {name}={v} out of range; allowed: >= {lo}")
    tasks = [TTR.from_knobs({"d": args.dim, "L": args.seq_len, "S": s, "noise": args.noise,
                             "cone_width": args.cone_width}) for s in segs]
    mechs = [m.strip() for m in args.mechanisms.split(",")] if args.mechanisms else None
    device = "cpu" if args.device in (None, "auto") and not torch.cuda.is_available() else (
        "cuda" if args.device in (None, "auto") else args.device)
    results = []
    for t in tasks:
        print(f"ttr: S={t.S} ({t.L // t.S} segments), tuning on {args.tune_sequences} sequences", flush=True)
        results.append(evaluate_ttr(t, mechanisms=mechs, seed=args.seed, sequences=args.sequences,
                                    tune_sequences=args.tune_sequences, device=device,
                                    log=lambda s: print(s, flush=True)))
    print()
    print(format_table(results))
    for r in results:
        for m, why in r["skipped"].items():
            print(f"skipped {m} at S={r['task']['S']}: {why}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f)
        print(f"results written to {args.out}")
    return 0
