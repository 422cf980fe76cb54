"""``mixzoo check-zoo``: every built-in mechanism and variant trains on every task family and recipe.

A cell is (mechanism, task, recipe, head width, learning rate): a short training run through the
public API (``mixzoo.api.run``), which lands a leaderboard row. A cell passes when the run ends
COMPLETE (finite loss at every validation, finite test metric). Its line reports the backend used,
the test metric, steps/s between the first and the last validation (after warm-up and Triton
autotuning; validation passes included) and peak device memory.

Cells run in worker processes (``--workers``; several share one GPU well for these small models),
each taking whole mechanisms so that a mechanism's kernels autotune once per process. Exit code 1
if any cell fails; cells that cannot run here (Mamba-1 without mamba-ssm's CUDA kernels) are listed
as ``skip`` with the reason and do not pass.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .errors import UsageError

# (label, mechanism, constructor knobs): every built-in and its variants
MECHANISMS = [
    ("softmax", "softmax", {}), ("lla", "lla", {}), ("parallax", "parallax", {}), ("mesa", "mesa", {}),
    ("gdn", "gdn", {}), ("gdn-neg", "gdn", {"allow_neg_eigval": True}), ("mamba", "mamba", {}),
    ("mamba-neg", "mamba", {"allow_neg_eigval": True}), ("mamba1", "mamba", {"version": 1}),
    ("gla", "gla", {}), ("hyena", "hyena", {}), ("linear", "linear", {}),
]

# (label, task, task knobs, recipe, model keys): every task family with the recipes it is run with;
# head widths 8 (mad: 16 heads of 8), 16, 64 and 128 at width 128
SETTINGS = [
    ("mqar/zoology/w64", "mqar", dict(V=8192, L=128, kv=8), "zoology", dict(d_model=128, num_heads=2)),
    ("mqar/based/w16", "mqar", dict(V=8192, L=128, kv=8), "based", dict(d_model=128, num_heads=8)),
    *((f"{t}/mad/w8", t, {}, "mad", {}) for t in (
        "mad-recall", "mad-fuzzy-recall", "mad-noisy-recall", "mad-selective-copy", "mad-compression",
        "mad-memorization")),
    ("icl-regression/zoology/w128", "icl-regression", dict(L=64, S=16), "zoology", dict(d_model=128, num_heads=1)),
    ("state-tracking/zoology/w64", "state-tracking", dict(N=12), "zoology", dict(d_model=128, num_heads=2)),
]


@dataclass
class Cell:
    mechanism: str            # label, e.g. gdn-neg
    model: str
    knobs: dict
    setting: str
    task: str
    task_knobs: dict
    recipe: str
    hp: dict
    lr: float
    state: str = "PENDING"
    reason: str = ""
    backend: str = ""
    metric: str = ""
    value: float | None = None
    steps_per_s: float | None = None
    peak_mib: float | None = None
    wall_s: float | None = None


def configure(name: str, p) -> None:
    p.add_argument("--models", help="comma-separated mechanism labels (default: all): "
                   + ",".join(m[0] for m in MECHANISMS))
    p.add_argument("--settings", help="comma-separated setting labels or task names (default: all)")
    p.add_argument("--lrs", default="1e-3,3e-3", help="learning rates (default 1e-3,3e-3)")
    p.add_argument("--steps", type=int, default=300, help="training steps per cell (default 300)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--optimizer", default="adamw", choices=("adamw", "muon"),
                   help="the optimizer of every cell (default adamw; muon: torch.optim.Muon on hidden matrices)")
    p.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    p.add_argument("--out", help="write the cells as JSON here")
    p.add_argument("--list", action="store_true", help="list the cells and exit")


def build_cells(models: str | None, settings: str | None, lrs: str, steps: int, batch: int,
                optimizer: str = "adamw") -> list[Cell]:
    mech = {m[0]: m for m in MECHANISMS}
    chosen = [s.strip() for s in models.split(",")] if models else list(mech)
    for m in chosen:
        if m not in mech:
            raise UsageError(f"unknown mechanism {m!r}; allowed: {', '.join(mech)}")
    sets = SETTINGS
    if settings:
        want = [s.strip() for s in settings.split(",")]
        known = {s[0] for s in SETTINGS} | {s[1] for s in SETTINGS}
        for w in want:
            if w not in known:
                raise UsageError(f"unknown setting {w!r}; allowed: {', '.join(sorted(known))}")
        sets = [s for s in SETTINGS if s[0] in want or s[1] in want]
    try:
        lr_values = [float(x) for x in lrs.split(",")]
    except ValueError:
        raise UsageError(f"--lrs {lrs!r} is not a comma-separated list of numbers") from None
    if steps < 1 or batch < 1 or any(not lr > 0 for lr in lr_values):
        raise UsageError("--steps and --batch-size must be >= 1 and learning rates > 0")
    evals = max(1, steps // 5)
    cells = []
    for label in chosen:
        _, model, knobs = mech[label]
        for slabel, task, tknobs, recipe, mkeys in sets:
            for lr in lr_values:
                hp = dict(mkeys, steps=steps, batch_size=batch, lr=lr, eval_every=evals,
                          n_train=steps * batch, n_val=256, n_test=512, warmup_frac=0.1, optimizer=optimizer)
                cells.append(Cell(label, model, dict(knobs), slabel, task, dict(tknobs), recipe, hp, lr))
    return cells


def _skip_reason(cell: Cell, cuda: bool) -> str | None:
    if cell.knobs.get("version") == 1:
        from .models.mamba import _selective_scan_cuda
        if not cuda or _selective_scan_cuda() is None:
            return "mamba-ssm's CUDA kernels are not built here (Mamba-1 would run the step-by-step scan)"
    return None


def run_cell(cell: Cell, results: str, device: str) -> Cell:
    import torch

    from .api import run
    cuda = device != "cpu" and torch.cuda.is_available()
    why = _skip_reason(cell, cuda)
    if why:
        cell.state, cell.reason = "skip", why
        return cell
    marks: list[tuple[int, float]] = []
    t0 = time.perf_counter()
    try:
        rows = run(cell.task, cell.model, knobs=cell.task_knobs, hparams={**cell.hp, **cell.knobs},
                   recipe=cell.recipe, seeds=(0,), results=results, device=device,
                   command=f"mixzoo check-zoo ({cell.mechanism} {cell.setting} lr {cell.lr:g})",
                   on_eval=lambda step, val: marks.append((step, time.perf_counter())))
    except Exception as e:  # a crash is this cell's failure, not the matrix's
        cell.state, cell.reason = "FAIL", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        cell.wall_s = time.perf_counter() - t0
        return cell
    row = rows[0]
    cell.state, cell.reason, cell.backend = row["state"], row["state_reason"] or "", row["backend"]
    cell.metric, cell.value = row["metric_name"], row["metric_value"]
    if len(marks) >= 2 and marks[-1][1] > marks[0][1]:
        cell.steps_per_s = (marks[-1][0] - marks[0][0]) / (marks[-1][1] - marks[0][1])
    cell.peak_mib = row["peak_mem_bytes"] / 2**20 if row["peak_mem_bytes"] else None
    cell.wall_s = time.perf_counter() - t0
    return cell


FAULT_EXIT = 3       # a worker whose CUDA context a kernel fault poisoned exits with this
WORKER = [sys.executable, "-m", "mixzoo.zoo"]     # + CELLS.json OUT.jsonl RESULTS DEVICE


def _poisoned(c: Cell) -> bool:
    return c.state == "FAIL" and ("AcceleratorError" in c.reason or "CUDA error" in c.reason)


def _worker(cells_file: str, out_file: str, results: str, device: str) -> int:
    cells = [Cell(**c) for c in json.loads(Path(cells_file).read_text())]
    with open(out_file, "a") as f:
        for c in cells:
            c = run_cell(c, results, device)
            f.write(json.dumps(asdict(c)) + "\n")
            f.flush()
            print(line(c), flush=True)
            if _poisoned(c):          # every later cell of this process would fail the same way
                return FAULT_EXIT
    return 0


def make_shards(cells: list[Cell], workers: int) -> list[list[Cell]]:
    """Cells for each worker: whole mechanisms (its kernels then autotune once, in one process), or,
    with more workers than mechanisms, each mechanism's cells split over as many workers as it takes
    to use them all (each piece autotunes the mechanism's kernels again, in parallel)."""
    groups: dict[str, list[Cell]] = {}
    for c in cells:
        groups.setdefault(c.mechanism, []).append(c)
    parts = max(1, workers // max(1, len(groups)))
    pieces = [g[i::parts] for g in groups.values() for i in range(min(parts, len(g)))]
    shards: list[list[Cell]] = [[] for _ in range(min(workers, len(pieces)))]
    for piece in sorted(pieces, key=len, reverse=True):         # largest first, onto the lightest shard
        min(shards, key=len).extend(piece)
    return shards


def _key(c: Cell) -> tuple:
    return (c.mechanism, c.setting, c.lr)


def _run_shards(shards: list[list[Cell]], res_dir: Path, device: str) -> list[Cell]:
    """Run each shard in a worker process; a worker that dies (a kernel fault poisons its CUDA
    context, or a crash) is replaced by a fresh one for the cells it had not reported."""
    done: list[Cell] = []
    with tempfile.TemporaryDirectory(prefix="mixzoo-zoo-") as tmp:
        def start(i: int, n: int, cells: list[Cell]):
            cf, of = Path(tmp) / f"cells{i}-{n}.json", Path(tmp) / f"out{i}-{n}.jsonl"
            cf.write_text(json.dumps([asdict(c) for c in cells]))
            cmd = [*WORKER, str(cf), str(of), str(res_dir), device]
            return subprocess.Popen(cmd, env=os.environ.copy()), of, cells, i, n
        running = [start(i, 0, sh) for i, sh in enumerate(shards) if sh]
        while running:
            still = []
            for p, of, cells, i, n in running:
                rc = p.poll()
                if rc is None:
                    still.append((p, of, cells, i, n))
                    continue
                got = [Cell(**json.loads(x)) for x in of.read_text().splitlines()] if of.exists() else []
                done.extend(got)
                seen = {_key(c) for c in got}
                rest = [c for c in cells if _key(c) not in seen]
                if rest and rc != FAULT_EXIT:   # died inside a cell: that cell failed, the rest go on
                    rest[0].state, rest[0].reason = "FAIL", f"worker exited with code {rc} during this cell"
                    done.append(rest[0])
                    print(line(rest[0]), flush=True)
                    rest = rest[1:]
                if rest:
                    still.append(start(i, n + 1, rest))
            running = still
            if running:
                time.sleep(0.5)
    return done


def line(c: Cell) -> str:
    v = "-" if c.value is None else f"{c.value:.4f}"
    r = "-" if c.steps_per_s is None else f"{c.steps_per_s:.1f}"
    m = "-" if c.peak_mib is None else f"{c.peak_mib:.0f}"
    return (f"{c.state:<8} {c.mechanism:<10} {c.setting:<30} lr {c.lr:<6g} {c.backend:<28} "
            f"{c.metric} {v:>7}  {r:>7} steps/s  {m:>6} MiB  {c.reason}")


def main(args) -> int:
    cells = build_cells(args.models, args.settings, args.lrs, args.steps, args.batch_size,
                        getattr(args, "optimizer", "adamw"))
    if args.list:
        for c in cells:
            print(f"{c.mechanism:<10} {c.setting:<30} lr {c.lr:g}")
        print(f"{len(cells)} cells")
        return 0
    if args.workers < 1:
        raise UsageError(f"--workers {args.workers} must be >= 1")
    from .api import check_results_dir
    res_dir = check_results_dir(args.results)
    shards = make_shards(cells, args.workers)
    t0 = time.time()
    done = _run_shards(shards, res_dir, args.device)
    order = {_key(c): i for i, c in enumerate(cells)}
    done.sort(key=lambda c: order[_key(c)])
    print(f"\n{'state':<8} {'mechanism':<10} {'setting':<30} {'lr':<9} {'backend':<28} metric")
    for c in done:
        print(line(c))
    n_fail = sum(c.state not in ("COMPLETE", "skip") for c in done)
    n_skip = sum(c.state == "skip" for c in done)
    print(f"\n{len(done) - n_fail - n_skip} of {len(done)} cells COMPLETE, {n_fail} failed, {n_skip} skipped; "
          f"{time.time() - t0:.0f} s with {len(shards)} workers; rows under {res_dir}/leaderboard/")
    if args.out:
        tmp_out = Path(args.out).with_suffix(".tmp")
        tmp_out.write_text(json.dumps([asdict(c) for c in done], indent=1))
        tmp_out.replace(args.out)
    return 1 if n_fail else 0


if __name__ == "__main__":
    raise SystemExit(_worker(*sys.argv[1:5]))
