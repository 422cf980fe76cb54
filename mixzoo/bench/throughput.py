"""``mixzoo bench throughput``: the harness against a plain PyTorch loop, side by side.

One run measures, on the same model and the same device-resident data:
  * a plain loop (AdamW, warmup-cosine, bf16 autocast on GPU, grad clipping, the vocabulary
    head at every position) and mixzoo's trainer (which applies the head at supervised
    positions only), each eager and compiled, plus the trainer with the full head, eager (the
    harness's own overhead);
  * packing: N trainer processes on one device at once (aggregate steps/s) against one;
  * a projection of device-hours for the MAD suite per mechanism from measured step rates.
Rates exclude a warm-up (compilation, autotuning): the trainer's rate is read between its
first and last validation, the plain loop's after the same number of warm-up steps.
MIXZOO_BENCH_MIXERS (default softmax,gla), MIXZOO_BENCH_STEPS (300) and MIXZOO_BENCH_PACKING=0
(skip packing) narrow a run.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHAPES = {
    # name: task knobs, model, batch; the MQAR shape of the throughput goal and a tiny one
    "mqar": dict(task=dict(V=8192, L=256, kv=16, filler="zero"), d_model=128, num_heads=2, batch_size=256),
    "tiny": dict(task=dict(V=8192, L=128, kv=8, filler="zero"), d_model=64, num_heads=2, batch_size=64),
    "quick": dict(task=dict(V=64, L=32, kv=4), d_model=16, num_heads=2, batch_size=8),
    # MAD's baseline shape (width 128, 2 x (mixer + SwiGLU), batch 128, length 128, small vocabulary)
    "mad": dict(task=dict(V=16, L=128, kv=4), d_model=128, num_heads=16, batch_size=128, mlp="swiglu", norm="rmsnorm"),
}


def _setup(shape: str, mixer: str, device: str, steps: int, seed: int = 0):
    import torch

    from ..models import ModelConfig, build_model
    from ..tasks.mqar import MQAR
    from ..train.loop import batch_order, resolve_device
    s = SHAPES[shape]
    dev = resolve_device(device)
    task = MQAR(**s["task"])
    n = max(4 * s["batch_size"], 2048 if shape != "quick" else 64)
    data = {"train": task.generate("train", n, seed, dev), "val": task.generate("val", s["batch_size"], seed, dev),
            "test": task.generate("test", s["batch_size"], seed, dev)}
    mcfg = ModelConfig(d_model=s["d_model"], num_heads=s["num_heads"], n_layers=2, mlp=s.get("mlp", "none"),
                       norm=s.get("norm", "layernorm"))
    torch.manual_seed(seed)
    model = build_model("lm", mixer, {}, mcfg, vocab=task.vocab_size).to(dev)
    order = batch_order(n, steps, s["batch_size"], seed).to(dev)
    return task, data, mcfg, model, order, dev


def plain_loop(shape: str, mixer: str, device: str, steps: int, warmup: int, compile_mode: str) -> float:
    """Steps/s of a minimal hand-written loop over the same model and data."""
    import torch

    from ..train.config import TrainConfig
    from ..train.loop import loss_fn
    from ..train.optim import build_optimizer, lr_lambda
    task, data, _, model, order, dev = _setup(shape, mixer, device, steps + warmup)
    cfg = TrainConfig(steps=steps + warmup, lr=1e-3, weight_decay=0.1)
    opt = build_optimizer(model, cfg, fused=dev.type == "cuda")
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg))
    fwd = model if compile_mode == "off" else torch.compile(model, mode=compile_mode)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if dev.type == "cuda" else torch.autocast("cpu", enabled=False)

    def step(i):
        b = data["train"].index(order[i])
        with amp:
            out = fwd(b.inputs)
        loss, _ = loss_fn(task.kind, out, b)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
    for i in range(warmup):
        step(i)
    _sync(dev)
    t = time.perf_counter()
    for i in range(warmup, warmup + steps):
        step(i)
    _sync(dev)
    return steps / (time.perf_counter() - t)


def _sync(dev):
    import torch
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def trainer_rate(shape: str, mixer: str, device: str, steps: int, warmup: int, compile_mode: str,
                 sparse_head: bool = True) -> tuple[float, str]:
    """Steps/s of mixzoo's trainer between its first validation (after warm-up) and its last, and
    the backend the mechanism ran."""
    from ..train import TrainConfig, train
    task, data, mcfg, _, _, _ = _setup(shape, mixer, device, 1)
    s = SHAPES[shape]
    cfg = TrainConfig(steps=warmup + steps, batch_size=s["batch_size"], lr=1e-3, eval_every=warmup,
                      compile=compile_mode, eval_batch_size=s["batch_size"], sparse_head=sparse_head)
    # one evaluation at the end of warm-up and one at the end: rate over the steps between
    cfg.eval_every = warmup if steps % warmup == 0 else math.gcd(warmup, steps)
    res = train(task, mixer, {}, mcfg, cfg, seed=0, device=device, data=data)
    h = res.history
    first = next(x for x in h if x["step"] >= warmup)
    last = h[-1]
    return (last["step"] - first["step"]) / max(1e-9, last["train_time_s"] - first["train_time_s"]), res.backend


def _worker(argv: list[str]) -> None:
    """Child process of the packing measurement: wait for a common start, train, report."""
    shape, mixer, device, steps, warmup, start_at, out = argv
    from ..train import TrainConfig, train
    task, data, mcfg, _, _, _ = _setup(shape, mixer, device, 1)
    s = SHAPES[shape]
    # warm up (compile kernels, allocator) before the common start
    train(task, mixer, {}, mcfg, TrainConfig(steps=int(warmup), batch_size=s["batch_size"], eval_every=int(warmup)),
          seed=0, device=device, data=data)
    while time.time() < float(start_at):
        time.sleep(0.005)
    t = time.time()
    res = train(task, mixer, {}, mcfg, TrainConfig(steps=int(steps), batch_size=s["batch_size"], eval_every=int(steps)),
                seed=0, device=device, data=data)
    from ..leaderboard.export import write_atomic
    write_atomic(out, json.dumps({"t0": t, "t1": time.time(), "steps": res.steps, "rate": res.steps_per_s}))


def packed_rate(shape: str, mixer: str, device: str, steps: int, warmup: int, procs: int) -> float:
    """Aggregate steps/s of ``procs`` trainer processes sharing the device, timed together."""
    with tempfile.TemporaryDirectory() as d:
        start_at = time.time() + 20 + 6 * procs
        outs = [os.path.join(d, f"w{i}.json") for i in range(procs)]
        ps = [subprocess.Popen([sys.executable, "-m", "mixzoo.bench.throughput", "--worker", shape, mixer, device,
                                str(steps), str(warmup), str(start_at), o]) for o in outs]
        for p in ps:
            if p.wait() != 0:
                raise RuntimeError(f"packing worker failed with code {p.returncode}")
        rs = [json.loads(Path(o).read_text()) for o in outs]
    if min(r["t0"] for r in rs) < start_at - 0.5:
        raise RuntimeError("a packing worker started late; raise the start delay")
    span = max(r["t1"] for r in rs) - min(r["t0"] for r in rs)
    return sum(r["steps"] for r in rs) / span


# MAD protocol cost (task_specs §2.8): 66 settings; per setting a sweep of `trials` configs
# plus 3 seeds of the best, each run `steps` steps at batch 128.
MAD_SETTINGS = 66


def mad_projection(rate_baseline: float, trials: int = 6, seeds: int = 3, steps: int = 20_000,
                   mean_len_factor: float = 2.3) -> float:
    """Device-hours for the MAD suite at a measured baseline step rate.

    mean_len_factor: the mean sequence length over the 66 settings relative to the baseline
    (lengths 128-1024; step time assumed linear in length).
    """
    runs = MAD_SETTINGS * (trials + seeds)
    return runs * steps * mean_len_factor / rate_baseline / 3600


def main(args) -> int:
    import torch
    gpu = torch.cuda.is_available() and args.device != "cpu"
    device = "cuda" if gpu else "cpu"
    quick = args.quick or not gpu
    shape, tiny = ("quick", "quick") if quick else ("mqar", "tiny")
    steps, warmup = (20, 10) if quick else (int(os.environ.get("MIXZOO_BENCH_STEPS", 300)), 30)
    modes = ["off"] if quick else ["off", "reduce-overhead"]
    mixers = ["softmax"] if quick else os.environ.get("MIXZOO_BENCH_MIXERS", "softmax,gla").split(",")
    rows = []
    print(f"device: {torch.cuda.get_device_name(0) if gpu else 'cpu'}  torch {torch.__version__}"
          f"{'  (CPU: quick shapes only)' if not gpu else ''}", flush=True)
    # packing first: it needs no autotuning, so it is measured even when a later mechanism runs long
    procs = 2 if quick else 4
    if os.environ.get("MIXZOO_BENCH_PACKING", "1") == "0":
        single = packed = float("nan")
    else:
        single = packed_rate(tiny, "softmax", device, steps, warmup, 1)
        packed = packed_rate(tiny, "softmax", device, steps, warmup, procs)
    print(f"  packing ({tiny}, softmax): 1 process {single:.1f} steps/s, {procs} processes {packed:.1f}", flush=True)
    for mixer in mixers:
        for mode in modes:
            try:
                p = plain_loop(shape, mixer, device, steps, warmup, mode)
                t, backend = trainer_rate(shape, mixer, device, steps, warmup, mode)
            except Exception as e:            # one mechanism/mode failing must not lose the others
                print(f"  {shape:<6} {mixer:<8} compile={mode:<16} FAILED: {type(e).__name__}: {e}"[:300], flush=True)
                continue
            rows.append(dict(shape=shape, mixer=mixer, compile=mode, plain=p, mixzoo=t, backend=backend))
            print(f"  {shape:<6} {mixer:<8} compile={mode:<16} plain {p:8.1f} steps/s  mixzoo {t:8.1f} steps/s", flush=True)
            if mixer == mixers[0] and mode == "off":
                # the harness alone: the same loss path as the plain loop (vocabulary head everywhere)
                t, backend = trainer_rate(shape, mixer, device, steps, warmup, mode, sparse_head=False)
                rows.append(dict(shape=shape, mixer=mixer, compile="off, full head", plain=p, mixzoo=t,
                                 backend=backend))
                print(f"  {shape:<6} {mixer:<8} compile=off full head    plain {p:8.1f} steps/s  mixzoo {t:8.1f} steps/s",
                      flush=True)
    base = next((r["plain"] for r in rows if r["compile"] == "off"), float("nan"))
    print("\n| shape | mechanism | compile | plain loop steps/s | mixzoo steps/s | mixzoo / plain | vs plain eager |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        eager = next((x["plain"] for x in rows if x["mixer"] == r["mixer"] and x["compile"] == "off"), float("nan"))
        name = f"{r['mixer']} ({r['backend']})"
        print(f"| {r['shape']} | {name} | {r['compile']} | {r['plain']:.1f} | {r['mixzoo']:.1f} | "
              f"{r['mixzoo'] / r['plain']:.2f}x | {r['mixzoo'] / eager:.2f}x |")
    print(f"\npacking ({tiny} shape, softmax): 1 process {single:.1f} steps/s, {procs} processes "
          f"{packed:.1f} steps/s aggregate = {packed / single:.2f}x")
    print("\nMAD suite projection: 66 settings x (6 trials + 3 seeds) x 20k steps at batch 128, step time\n"
          "linear in length (mean length 2.3x the baseline's), from mixzoo's rate at MAD's baseline shape:")
    mad_rates = {}
    for mixer in mixers:
        try:
            rate, _ = trainer_rate("quick" if quick else "mad", mixer, device, steps, warmup, "off")
        except Exception as e:
            print(f"  {mixer:<8} FAILED: {type(e).__name__}: {e}"[:300], flush=True)
            continue
        mad_rates[mixer] = rate
        print(f"  {mixer:<8} {rate:8.1f} steps/s -> {mad_projection(rate):8.1f} device-hours single process, "
              f"{mad_projection(rate * packed / single):8.1f} if packing x{procs} gains as on the {tiny} shape")
    if args.out:
        from ..leaderboard.export import write_atomic
        write_atomic(args.out, json.dumps({"rows": rows, "single": single, "packed": packed, "procs": procs,
                                              "base_plain": base, "mad_rates": mad_rates}, indent=1))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _worker(sys.argv[2:])
