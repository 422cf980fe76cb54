"""What a stacked run's validations cost: its K models one at a time, eagerly, against one vmapped forward of them.

A stacked run (``mixzoo.train.stacked``) validates its K models one after another by default
(``MIXZOO_STACKED_EVAL=models``): model k's weights are loaded into the template, ``loop.evaluate`` runs over the
validation split at ``eval_batch_size``, then the mixers' diagnostics, and on an improvement the best weights are
cloned (``Book.validate``). With ``MIXZOO_STACKED_EVAL=vmapped`` the metrics of the K models come from one vmapped
forward a batch (``evaluate_stack``), then each model's diagnostics and clone as before. This times both paths
themselves, on K models built as ``train_stacked`` builds them (``Stack``) at a ``mixzoo bench throughput`` shape,
with MAD's validation split (1,280 sequences, batches of 256, as ``mixzoo reproduce parallax-mad --scale paper``
validates), in ms a model.

The MAD protocol makes 11,871 such passes per mechanism (``mixzoo.bench.throughput.mad_eval_work``), about 20 per
run; multiplied by the time here they give the hours the projection does not count.

    python benchmarks/validation_time.py mamba lla [--shape mad,mad1024] [--K 6] [--n-val 1280] [--reps 3]
"""
from __future__ import annotations

import argparse
import json
import time


def measure(mixer: str, shape: str = "mad", K: int = 6, n_val: int = 1280, eval_batch: int = 256, reps: int = 3,
            device: str = "auto") -> dict:
    import torch

    from mixzoo.bench.throughput import MODE_SHAPES, _mode_setup
    from mixzoo.train.config import RunResult, TrainConfig
    from mixzoo.train.loop import resolve_device
    from mixzoo.train.stacked import Stack, evaluate_stack
    from mixzoo.train.steploop import Book
    from mixzoo.train.vmapfold import folding
    dev = resolve_device(device)
    task, mcfg, data = _mode_setup(shape, str(dev))
    data = dict(data, val=task.generate("val", n_val, 0, dev))
    s = MODE_SHAPES[shape]
    cfg = TrainConfig(steps=1000, batch_size=s["batch_size"], lr=1e-3, eval_every=50, eval_batch_size=eval_batch)
    st = Stack(task, mixer, {}, mcfg, [cfg] * K, [0] * K, dev, data)     # the trials of one study: one seed
    books = [Book(task, cfg, st.precision, RunResult(state="COMPLETE")) for _ in range(K)]
    split = st.by_seed[0]

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def validate(step: int, vmapped: bool) -> None:      # stacked._run's validation of its K models
        vals = evaluate_stack(st.sm, task, [split["val"]] * K, eval_batch, st.precision) if vmapped else [None] * K
        for k, b in enumerate(books):
            b.validate(st.sm.load_into(k, st.sm.template), split, step, 0.0, 0.0, val=vals[k])

    out, step = {}, 0
    with folding():
        for name, vm in (("models_ms", False), ("vmapped_ms", True)):
            step += 50
            validate(step, vm)              # compiles, autotunes, the first clone of the best weights
            sync()
            best = float("inf")
            for _ in range(reps):
                step += 50
                t = time.perf_counter()
                validate(step, vm)
                sync()
                best = min(best, time.perf_counter() - t)
            out[name] = 1e3 * best / K      # per model
    # every timed round validated each model (a failed validation leaves no history entry)
    return dict(mixer=mixer, shape=shape, K=K, n_val=n_val, eval_batch=eval_batch, device=str(dev),
                validations=[len(b.res.history) for b in books],
                card=torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", **out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mixers", nargs="+")
    ap.add_argument("--shape", default="mad", help="comma-separated MODE_SHAPES names")
    ap.add_argument("--K", type=int, default=6)
    ap.add_argument("--n-val", type=int, default=1280)
    ap.add_argument("--eval-batch", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--json", help="write the rows here too")
    a = ap.parse_args(argv)
    rows = []
    print("| mechanism | shape | K | one model at a time, ms a model | vmapped, ms a model |")
    print("|---|---|---|---|---|")
    for shape in a.shape.split(","):
        for m in a.mixers:
            r = measure(m, shape, a.K, a.n_val, a.eval_batch, a.reps, a.device)
            rows.append(r)
            print(f"| {m} | {shape} | {a.K} | {r['models_ms']:.1f} | {r['vmapped_ms']:.1f} |", flush=True)
    if a.json:
        from mixzoo.leaderboard.export import write_atomic
        write_atomic(a.json, json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
