"""AdamW against Muon on the MAD baseline settings: softmax attention and Parallax (and Parallax with
its probe gate, ``gate_r``), 3 seeds, with the mechanism diagnostics of the last validation.

    python benchmarks/optimizer_mad.py [--steps 1000] [--workers 12] [--results DIR] [--out FILE.json]

Protocol (fixed before running; the Parallax paper states Muon with WSD and weight-decay annealing,
gamma = 2, and not Muon's learning rate, momentum or Newton-Schulz steps):
  tasks       the six MAD tasks at their baseline settings (mixzoo's task defaults)
  model       the mad recipe: width 128, 2 blocks, 16 heads of 8
  optimizers  adamw | muon (torch.optim.Muon on hidden matrices, lr matched to AdamW's RMS;
              mixzoo/train/optim.py); everything else identical:
  schedule    wsd, decay over the last 20 %, weight decay 0.1 annealed by (1 - t)^2 in the decay
  lr          1e-3 for both (MAD's search range is 1e-4..1e-3; one value, no search)
  budget      --steps steps of batch 128 (MAD's protocol is 20k; this is a budget-reduced check)
  seeds       0, 1, 2
  gate        parallax gate_r=True on mad-recall only (the paper's gate evidence)
Every run is ``mixzoo.api.run`` (a leaderboard row under --results). Prints one Markdown table:
test accuracy mean ± sd over seeds per (task, mechanism, optimizer), and Parallax's diagnostics.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

TASKS = ["mad-recall", "mad-fuzzy-recall", "mad-noisy-recall", "mad-selective-copy", "mad-compression",
         "mad-memorization"]
MECHS = [("softmax", "softmax", {}), ("parallax", "parallax", {})]
GATED = ("parallax+gate", "parallax", {"gate_r": True})


def cells(steps: int, seeds) -> list[dict]:
    out = []
    for label, model, knobs in MECHS:
        for task in TASKS:
            for opt in ("adamw", "muon"):
                for s in seeds:
                    out.append(dict(label=label, model=model, knobs=knobs, task=task, optimizer=opt, seed=s))
    for task in TASKS[:1]:
        for opt in ("adamw", "muon"):
            for s in seeds:
                out.append(dict(label=GATED[0], model=GATED[1], knobs=GATED[2], task=task, optimizer=opt, seed=s))
    # seeds outermost: a run cut by its time limit loses the last seeds, not whole tasks
    out.sort(key=lambda c: (c["seed"], c["label"] == GATED[0], TASKS.index(c["task"]), c["label"], c["optimizer"]))
    for c in out:
        c["hp"] = dict(optimizer=c["optimizer"], schedule="wsd", decay_frac=0.2, wd_anneal_gamma=2.0, lr=1e-3,
                       weight_decay=0.1, batch_size=128, steps=steps, eval_every=max(1, steps // 4), **c["knobs"])
    return out


def run_cell(args):
    c, results = args
    from mixzoo.api import run
    t0 = time.time()
    try:
        row = run(c["task"], c["model"], hparams=c["hp"], recipe="mad", seeds=(c["seed"],), results=results,
                  device="cuda")[0]
        out = {"state": row["state"], "reason": row.get("state_reason"), "value": row.get("metric_value"),
               "metric": row.get("metric_name"), "diagnostics": json.loads(row["diagnostics_json"] or "{}"),
               "steps_per_s": row.get("steps_per_s"), "backend": row.get("backend")}
    except Exception as e:  # one failed cell is reported, the others go on
        out = {"state": "FAIL", "reason": f"{type(e).__name__}: {e}"}
    out["wall_s"] = time.time() - t0
    res = {**c, **out}
    print(json.dumps({k: res[k] for k in ("label", "task", "optimizer", "seed", "state", "value", "wall_s")
                      if k in res}), flush=True)
    return res


def table(done: list[dict]) -> str:
    lines = ["| task | mechanism | AdamW | Muon | diagnostics (AdamW → Muon, mean over seeds) |",
             "|---|---|---|---|---|"]
    groups: dict = {}
    for r in done:
        groups.setdefault((r["task"], r["label"]), {}).setdefault(r["optimizer"], []).append(r)

    def cell(rs):
        ok = [r["value"] for r in rs if r.get("state") == "COMPLETE" and r.get("value") is not None]
        bad = len(rs) - len(ok)
        if not ok:
            return f"– ({bad} failed)"
        sd = statistics.stdev(ok) if len(ok) > 1 else 0.0
        return f"{statistics.mean(ok):.3f} ± {sd:.3f} (n={len(ok)}{f', {bad} failed' if bad else ''})"

    def diag(rs):
        keys = sorted({k for r in rs for k in (r.get("diagnostics") or {})})
        return {k: statistics.mean([r["diagnostics"][k] for r in rs if k in (r.get("diagnostics") or {})])
                for k in keys}
    for (task, label), by in sorted(groups.items(), key=lambda kv: (TASKS.index(kv[0][0]), kv[0][1])):
        da, dm = diag(by.get("adamw", [])), diag(by.get("muon", []))
        d = ", ".join(f"{k} {da.get(k, float('nan')):.3g} → {dm.get(k, float('nan')):.3g}"
                      for k in sorted(set(da) | set(dm)))
        lines.append(f"| {task} | {label} | {cell(by.get('adamw', []))} | {cell(by.get('muon', []))} | {d} |")
    means = {}
    for (_task, label), by in groups.items():
        for opt, rs in by.items():
            ok = [r["value"] for r in rs if r.get("state") == "COMPLETE" and r.get("value") is not None]
            if ok and label != GATED[0]:
                means.setdefault((label, opt), []).append(statistics.mean(ok))
    for label in sorted({lb for lb, _ in means}):
        av = {opt: (statistics.mean(means[(label, opt)]), len(means[(label, opt)]))
              for opt in ("adamw", "muon") if (label, opt) in means}
        lines.append(f"| average (tasks) | {label} | " + " | ".join(
            f"{av[o][0]:.3f} ({av[o][1]} tasks)" if o in av else "–" for o in ("adamw", "muon")) + " | |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--workers", type=int, default=12)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--results", default="optimizer-mad-results")
    p.add_argument("--out", default="optimizer-mad.json")
    p.add_argument("--table", metavar="JSON", help="print the table of a finished (or cut) run's JSON, then exit")
    a = p.parse_args(argv)
    if a.table:
        print(table(json.loads(Path(a.table).read_text())))
        return 0
    todo = cells(a.steps, range(a.seeds))
    t0 = time.time()
    done = []
    ctx = mp.get_context("spawn")
    with ctx.Pool(a.workers) as pool:
        for r in pool.imap_unordered(run_cell, [(c, a.results) for c in todo]):
            done.append(r)
            tmp = Path(a.out).with_suffix(".tmp")
            tmp.write_text(json.dumps(done, indent=1, default=str))
            tmp.replace(a.out)
    print(f"{len(done)} runs in {time.time() - t0:.0f} s with {a.workers} workers, {a.steps} steps each")
    print(table(done))
    return 0


if __name__ == "__main__":
    sys.exit(main())
