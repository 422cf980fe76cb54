"""``mixzoo bench throughput``: training throughput, side by side.

With ``--shape`` (mechanism names after it) or ``--project``: the step modes (eager,
graphed, stacked, packed processes and their combinations) per mechanism and shape, and the MAD
protocol projected from them; see "step modes, side by side" below. Without: the harness against a
plain PyTorch loop, as follows. One run measures, on the same model and the same device-resident data:
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


def harness_main(args) -> int:
    """The harness against a plain loop (the original ``bench throughput``)."""
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


# ------------------------------------------------------------------ step modes, side by side
#
# ``mixzoo bench throughput --shape mad,mqar512 [NAMES]``: for each mechanism and shape, the
# aggregate training rate (steps of one model, summed over every model trained at once) of
#   * one process, eager (the Lightning trainer: the baseline of every ratio),
#   * one process, ``step_mode=graphed`` (the step as one CUDA graph),
#   * one process, ``stacked`` / ``stacked+graphed`` K models as one batched model (K in --K),
#   * P processes on the device at once (P in --procs), each running one of the --pack cells
#     (a step mode, with K for the stacked ones): packing, alone and combined with the others,
# with the peak memory of each (torch's peak allocation on a GPU, summed over the processes of a
# packed cell; the CUDA contexts are not counted; on a CPU the process's peak RSS, which says
# little). Rates are read between the validation after --warmup steps and the last one (warm-up,
# autotuning and graph capture excluded; validation time excluded). A packed cell's processes
# warm up first, wait at a common barrier, and report their own rates; the aggregate is their sum,
# with the overlap of their timed windows (1.0: fully concurrent). The JSON (``--out``) is
# rewritten after every cell, so a run cut short keeps what it measured; ``--budget-s`` stops
# starting cells after that many seconds. ``--project FILE``: the MAD-protocol projection from such
# a JSON (``project_mad``), without measuring.

MODE_SHAPES = {
    # a CPU smoke shape: seconds for the whole matrix
    "tiny": dict(task="mqar", knobs=dict(V=32, L=16, kv=2), recipe="zoology", model=dict(d_model=16, num_heads=2),
                 batch_size=4, n_train=64),
    # MAD's baseline: mad-recall (V 16, L 128), the mad recipe (width 128 in 16 heads, 2 blocks of mixer +
    # SwiGLU, RMSNorm, untied head), batch 128
    "mad": dict(task="mad-recall", knobs={}, recipe="mad", model={}, batch_size=128, n_train=2048),
    # the MQAR paper's longest setting: V 8192, L 512, 64 pairs, zoology recipe at width 128, batch 128
    "mqar512": dict(task="mqar", knobs=dict(V=8192, L=512, kv=64, filler="zero"), recipe="zoology",
                    model=dict(d_model=128, num_heads=2), batch_size=128, n_train=2048),
}
# MAD's baseline at the protocol's other lengths (task_specs §2.8: recall, fuzzy and noisy recall at 256, 512
# and 1024, selective copying at 256 to 1024): 78 % of the protocol's model-steps x length is at L >= 256,
# so the projection reads each setting's step time off rates measured at these lengths, not the baseline's.
# Also the shorter ones (compression at 32 and 64, memorization at 32: 6 % of the model-steps): a step has a part
# that does not shrink with L, so below the measured lengths the projection extrapolates (``step_time_at``)
MAD_LENGTHS = {"mad": 128, "mad32": 32, "mad64": 64, "mad256": 256, "mad512": 512, "mad1024": 1024}
for _name, _L in MAD_LENGTHS.items():
    if _name != "mad":
        MODE_SHAPES[_name] = dict(MODE_SHAPES["mad"], knobs=dict(L=_L))
STEP_MODES = ("eager", "graphed", "stacked", "stacked+graphed")


def parse_cell(text: str) -> tuple[str, int]:
    """``MODE[:K]`` -> (mode, K); K defaults to 1 (eager, graphed) or 4 (stacked modes)."""
    from ..errors import UsageError
    mode, _, k = text.partition(":")
    if mode not in STEP_MODES:
        raise UsageError(f"bench throughput: step mode {mode!r}; allowed: {', '.join(STEP_MODES)}")
    try:
        K = int(k) if k else (4 if mode.startswith("stacked") else 1)
    except ValueError:
        raise UsageError(f"bench throughput: {text!r}: K must be an integer") from None
    if K < 1 or (K > 1 and not mode.startswith("stacked")):
        raise UsageError(f"bench throughput: {text!r}: K > 1 needs a stacked mode")
    return mode, K


def cells_of(modes: list[str], Ks: list[int], procs: list[int], pack: list[str]) -> list[tuple[str, int, int]]:
    """(mode, K, P) cells: eager first (the baseline), then each mode (stacked ones at every K), then
    each --pack cell at every P."""
    out = [("eager", 1, 1)]
    for m in modes:
        for K in (Ks if m.startswith("stacked") else [1]):
            if (m, K, 1) not in out:
                out.append((m, K, 1))
    for P in procs:
        for c in pack:
            m, K = parse_cell(c)
            out.append((m, K, P))
    return out


def cell_label(mode: str, K: int, P: int) -> str:
    return mode + (f" K={K}" if mode.startswith("stacked") else "") + (f" x {P} procs" if P > 1 else "")


def _mode_setup(shape: str, device: str, seed: int = 0):
    """Task, model config and one set of device-resident splits for a MODE_SHAPES shape."""
    from ..models import RECIPES, ModelConfig
    from ..registry import get_task, load_builtins
    from ..train.loop import resolve_device
    load_builtins()
    s = MODE_SHAPES[shape]
    dev = resolve_device(device)
    task = get_task(s["task"])(**s["knobs"])
    mcfg = ModelConfig(**{**RECIPES[s["recipe"]], **s["model"]})
    data = {"train": task.generate("train", s["n_train"], seed, dev),
            "val": task.generate("val", s["batch_size"], seed, dev),
            "test": task.generate("test", s["batch_size"], seed, dev)}
    return task, mcfg, data


def _dims(shape: str) -> tuple[int, int, int]:
    """(batch, length, width) of a MODE_SHAPES shape."""
    from ..models import RECIPES, ModelConfig
    from ..registry import get_task, load_builtins
    load_builtins()
    s = MODE_SHAPES[shape]
    mcfg = ModelConfig(**{**RECIPES[s["recipe"]], **s["model"]})
    return s["batch_size"], get_task(s["task"])(**s["knobs"]).seq_len, mcfg.d_model


def _window(history: list[dict], warmup: int) -> tuple[float, float, float]:
    """(steps/s, train time at the first and the last validation) between the validation after
    ``warmup`` steps and the last."""
    first = next(h for h in history if h["step"] >= warmup)
    last = history[-1]
    dt = last["train_time_s"] - first["train_time_s"]
    return (last["step"] - first["step"]) / dt if dt > 0 else float("nan"), first["train_time_s"], last["train_time_s"]


def variant_label(mixer: str, knobs: dict | None) -> str:
    """``mamba`` or, with knobs, ``mamba chunk_size=128`` (a row's ``mixer``: each variant is its own row)."""
    return " ".join([mixer, *(f"{k}={v}" for k, v in (knobs or {}).items())])


def run_cell(shape: str, mixer: str, mode: str, K: int, device: str, steps: int, warmup: int,
             setup=None, on_first_eval=None, knobs: dict | None = None) -> dict:
    """One process's cell: ``mode`` with K models; its model-steps/s (K x the run's steps/s).
    ``knobs``: the mechanism's (a variant, e.g. {"chunk_size": 128})."""
    from ..train import TrainConfig, train
    from ..train.stacked import train_stacked
    task, mcfg, data = setup or _mode_setup(shape, device)
    s = MODE_SHAPES[shape]
    total = warmup * (1 + -(-steps // warmup))            # evaluations at warmup, 2 warmup, ...
    cfg = TrainConfig(steps=total, batch_size=s["batch_size"], lr=1e-3, eval_every=warmup,
                      eval_batch_size=s["batch_size"], step_mode=mode)
    stamps: list[tuple[int, float]] = []

    def hook(step, val):
        stamps.append((step, time.time()))
    if mode.startswith("stacked"):
        res = train_stacked(task, mixer, dict(knobs or {}), mcfg, [cfg] * K, list(range(K)), device=device,
                            data=data, on_eval=[hook] + [None] * (K - 1))[0]
    else:
        res = train(task, mixer, dict(knobs or {}), mcfg, cfg, seed=0, device=device, data=data, on_eval=hook)
    row = dict(shape=shape, mixer=variant_label(mixer, knobs), mechanism=mixer, knobs=dict(knobs or {}), mode=mode,
               K=K, P=1, backend=res.backend, state=res.state,
               ran=getattr(res, "step_mode", mode), note=getattr(res, "step_mode_reason", "") or res.reason,
               peak_mem_bytes=res.peak_mem_bytes, steps=res.steps)
    if res.state != "COMPLETE" or not res.history:
        return {**row, "model_steps_per_s": float("nan")}
    rate, _, _ = _window(res.history, warmup)
    first = next((t for st, t in stamps if st >= warmup), None)
    # a stacked cell that fell back trained its K models one after another: their summed rate is
    # one model's
    n_at_once = K if row["ran"].startswith("stacked") else 1
    return {**row, "model_steps_per_s": n_at_once * rate, "t_first": first, "t_last": stamps[-1][1] if stamps else None}


def _mode_worker(spec_json: str) -> None:
    """A packed cell's process: warm up, wait at the barrier, run the cell, write its row."""
    spec = json.loads(spec_json)
    setup = _mode_setup(spec["shape"], spec["device"])
    # a first, short run compiles/autotunes every kernel of this mode before the common start
    kn = spec.get("knobs") or {}
    run_cell(spec["shape"], spec["mixer"], spec["mode"], spec["K"], spec["device"], spec["warmup"], spec["warmup"], setup,
             knobs=kn)
    Path(spec["ready"]).write_text("1")
    t_end = time.time() + spec["wait_s"]
    while not Path(spec["go"]).exists():
        if time.time() > t_end:
            raise SystemExit("packing worker: no start signal")
        time.sleep(0.005)
    row = run_cell(spec["shape"], spec["mixer"], spec["mode"], spec["K"], spec["device"], spec["steps"],
                   spec["warmup"], setup, knobs=kn)
    from ..leaderboard.export import write_atomic
    write_atomic(spec["out"], json.dumps(row))


def packed_cell(shape: str, mixer: str, mode: str, K: int, P: int, device: str, steps: int, warmup: int,
                wait_s: float = 900.0, knobs: dict | None = None) -> dict:
    """P processes running one cell at once; the aggregate of their model-steps/s."""
    row = dict(shape=shape, mixer=variant_label(mixer, knobs), mechanism=mixer, knobs=dict(knobs or {}), mode=mode,
               K=K, P=P)
    with tempfile.TemporaryDirectory() as d:
        go = os.path.join(d, "go")
        specs = [dict(shape=shape, mixer=mixer, knobs=dict(knobs or {}), mode=mode, K=K, device=device, steps=steps,
                      warmup=warmup,
                      ready=os.path.join(d, f"r{i}"), go=go, out=os.path.join(d, f"w{i}.json"), wait_s=wait_s)
                 for i in range(P)]
        # on a CPU, one thread a process: P processes of several OpenMP threads each thrash
        env = {**os.environ, **({"OMP_NUM_THREADS": "1"} if device == "cpu" else {})}
        ps = [subprocess.Popen([sys.executable, "-m", "mixzoo.bench.throughput", "--mode-worker", json.dumps(sp)],
                               env=env) for sp in specs]
        t_end = time.time() + wait_s
        try:
            while not all(Path(sp["ready"]).exists() for sp in specs):
                if any(p.poll() not in (None, 0) for p in ps) or time.time() > t_end:
                    raise RuntimeError("a packing worker failed before the start")
                time.sleep(0.01)
            Path(go).write_text("1")
            for p in ps:
                if p.wait() != 0:
                    raise RuntimeError(f"a packing worker failed with code {p.returncode}")
        finally:
            for p in ps:
                if p.poll() is None:
                    p.kill()
        rs = [json.loads(Path(sp["out"]).read_text()) for sp in specs]
    return packed_row(row, rs)


def packed_row(row: dict, rs: list[dict]) -> dict:
    """A packed cell's row from its P workers' rows: rates and memory summed, the overlap of their
    timed windows, and every worker's backend (a worker that took another path is named)."""
    P = len(rs)
    firsts = [r.get("t_first") for r in rs]
    lasts = [r.get("t_last") for r in rs]
    overlap = float("nan")
    if all(t is not None for t in firsts + lasts):
        span = sum(b - a for a, b in zip(firsts, lasts)) / P
        overlap = max(0.0, min(lasts) - max(firsts)) / span if span > 0 else float("nan")
    notes = sorted({r["note"] for r in rs if r.get("note")})
    backends = sorted({r["backend"] for r in rs})      # every worker's: one that took another path shows
    if len(backends) > 1:
        notes.append("workers ran different backends: " + ", ".join(backends))
    return {**row, "backend": "|".join(backends), "state": "COMPLETE" if all(r["state"] == "COMPLETE" for r in rs)
            else "FAIL", "ran": rs[0]["ran"], "note": "; ".join(notes),
            "model_steps_per_s": sum(r["model_steps_per_s"] for r in rs),
            "peak_mem_bytes": sum(int(r["peak_mem_bytes"] or 0) for r in rs), "overlap": overlap}


def modes_table(rows: list[dict]) -> str:
    """The side-by-side Markdown table: one row per (shape, mechanism, cell)."""
    base = {(r["shape"], r["mixer"]): r["model_steps_per_s"] for r in rows
            if r["mode"] == "eager" and r["K"] == 1 and r["P"] == 1}
    out = ["| shape | mechanism (backend) | mode | K | procs | model-steps/s | x single eager | peak MiB | note |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        b = base.get((r["shape"], r["mixer"]), float("nan"))
        rate = r.get("model_steps_per_s", float("nan"))
        note = r.get("note") or ""
        if r.get("ran") and r["ran"] != r["mode"]:
            note = f"ran {r['ran']}: {note}"
        if r.get("overlap") is not None and r["P"] > 1:
            note = (note + "; " if note else "") + f"overlap {r['overlap']:.2f}"
        mem = r.get("peak_mem_bytes")
        out.append(f"| {r['shape']} | {r['mixer']} ({r.get('backend', '')}) | {r['mode']} | {r['K']} | {r['P']} | "
                   f"{rate:.1f} | {rate / b:.2f}x | {(mem or 0) / 2**20:.0f} | {note[:120]} |")
    return "\n".join(out)


# -- the MAD protocol, projected --------------------------------------------------------------

def mad_protocol(variant: str = "readme", trials: int = 6, seeds: int = 3, steps: int = 20_000,
                 len_factor: float = 2.3) -> float:
    """The MAD protocol's work in baseline-step equivalents (steps of one model at MAD's baseline
    length 128, step time taken as linear in length).

    ``readme``: the README's projection, 66 settings x (trials + seeds) x ``steps``, at a mean length
    ``len_factor`` x the baseline's. ``settings``: each of MAD's 66 settings at its own length, for the
    steps that ``mixzoo reproduce parallax-mad --scale paper`` trains it (``mad_paper_runs``), capped at
    ``steps``."""
    if variant == "readme":
        return MAD_SETTINGS * (trials + seeds) * steps * len_factor
    return sum(n * L / 128 for L, n in mad_setting_steps(variant, trials, seeds, steps))


def mad_paper_runs(steps: int = 20_000) -> list[dict]:
    """One run of each MAD setting as the paper scale of the ``parallax-mad`` figure trains it: its length,
    steps (200 epochs of its training set at batch 128, capped at ``steps``), validation passes (every
    ``eval_every`` steps and after the last, over ``n_val`` sequences) and the test pass (``n_test``)."""
    from ..registry import get_task
    from ..reproduce.parallax import MAD
    scale = MAD.scale("paper")
    train = {**MAD.train, **scale.train}
    out = []
    for st in scale.settings:
        n = min(steps, st["steps"])
        every = st["eval_every"]
        out.append(dict(task=st["task"], preset=st["preset"], L=get_task(st["task"]).presets[st["preset"]]["L"],
                        steps=n, evals=n // every + (n % every != 0), n_val=train["n_val"], n_test=train["n_test"],
                        batch_size=train["batch_size"]))
    return out


def mad_setting_steps(variant: str = "settings", trials: int = 6, seeds: int = 3,
                      steps: int = 20_000) -> list[tuple[int, int]]:
    """(length, model-steps) per MAD setting under the ``settings`` work model: trials + seeds runs of each
    as ``mad_paper_runs`` has it."""
    from ..errors import UsageError
    if variant != "settings":
        raise UsageError(f"MAD projection: variant {variant!r}; allowed: readme, settings")
    return [(r["L"], (trials + seeds) * r["steps"]) for r in mad_paper_runs(steps)]


def mad_eval_work(trials: int = 6, seeds: int = 3, steps: int = 20_000) -> dict:
    """What the ``settings`` projection does not count: each run's validation passes and its test pass, forward
    only. In sequences times length / 128 (baseline-sequence equivalents), beside the training's (each step
    ``batch_size`` sequences, forward and backward); and the number of passes."""
    runs = mad_paper_runs(steps)
    n = trials + seeds
    evals = sum(n * (r["evals"] * r["n_val"] + r["n_test"]) * r["L"] / 128 for r in runs)
    trained = sum(n * r["steps"] * r["batch_size"] * r["L"] / 128 for r in runs)
    return dict(eval_sequences=evals, train_sequences=trained, share=evals / trained,
                passes=sum(n * (r["evals"] + 1) for r in runs), runs=n * len(runs))


VALIDATION_PATHS = {"models_ms": "one model at a time", "vmapped_ms": "vmapped"}


def validation_hours(rows, device: str | None = None, trials: int = 6, seeds: int = 3, steps: int = 20_000) -> dict:
    """Device-hours of the validation and test passes ``mad_eval_work`` counts, per mechanism and validation path,
    from ``benchmarks/validation_time.py`` rows (a list, or a JSON file of one): ms a model's pass at MAD's lengths
    (shapes of ``MAD_LENGTHS``), read off at each setting's length as ``step_time_at`` reads step times. A test pass
    (no diagnostics, no clone) is counted as a validation pass. Rows from another card than ``device`` are refused."""
    from ..errors import UsageError
    if not isinstance(rows, list):
        rows = json.loads(Path(rows).read_text())
    cards = sorted({str(r.get("card")) for r in rows})
    if device is not None and cards != [device]:
        raise UsageError(f"bench throughput --validation: measured on {', '.join(cards)}, the rates on "
                         f"{device}; a projection takes its times from one kind of device")
    pts: dict[str, dict[str, dict[int, float]]] = {}
    for r in rows:
        if r.get("shape") not in MAD_LENGTHS:
            continue
        for path in VALIDATION_PATHS:
            if isinstance(r.get(path), (int, float)) and math.isfinite(r[path]):
                pts.setdefault(r["mixer"], {}).setdefault(path, {})[MAD_LENGTHS[r["shape"]]] = r[path] / 1e3
    runs = mad_paper_runs(steps)
    n = trials + seeds
    return {m: {path: sum(n * (r["evals"] + 1) * step_time_at(p, r["L"])[0] for r in runs) / 3600
                for path, p in paths.items()} for m, paths in pts.items()}


def step_time_at(points: dict[int, float], L: int) -> tuple[float, bool]:
    """Seconds a model-step at length ``L`` from measured (length -> seconds) points: the measured value,
    linear in L between the two measured lengths around it; beyond the longest, the longest's time scaled linearly
    in L (the README's assumption); below the shortest, the line through the two shortest measured lengths, but no
    less than the shortest's time scaled linearly in L (the only model when one length was measured). A step has a
    part that does not shrink with L (launches, the optimizer, the weights' reads): the floor's step on the H200,
    0.485 ms a model at 128 and 0.875 at 256, is 0.095 ms + 3.05 µs a token, so at length 32 it is 0.19 ms, not the
    0.12 ms that scaling 128's time down in L gives; a mechanism whose cost grows faster than L (LLA's) has a line
    below that scaling, which then holds. Also whether L was outside the measured range."""
    Ls = sorted(points)
    if L in points:
        return points[L], False
    if Ls[0] < L < Ls[-1]:
        hi = next(x for x in Ls if x > L)
        lo = max(x for x in Ls if x < L)
        w = (L - lo) / (hi - lo)
        return (1 - w) * points[lo] + w * points[hi], False
    if L < Ls[0]:
        t = points[Ls[0]] * L / Ls[0]
        if len(Ls) > 1:
            l1, l2 = Ls[0], Ls[1]
            t = max(t, points[l1] + (L - l1) * (points[l2] - points[l1]) / (l2 - l1))
        return t, True
    return points[Ls[-1]] * L / Ls[-1], True


def _rows_of(rates) -> dict:
    """One rates dict from a dict, a path, or a list of them (their rows together). They must have been measured
    on one kind of device: rates from two cards (an H100's and an H200's) in one projection would mix machines
    cell by cell, so that is refused (UsageError)."""
    if isinstance(rates, (list, tuple)):
        from ..errors import UsageError
        parts = [_rows_of(r) for r in rates]
        devices = sorted({p["device"] for p in parts if p.get("device")})
        if len(devices) > 1:
            raise UsageError(f"bench throughput --project: the files were measured on {' and '.join(devices)}; "
                             "a projection takes its rates from one kind of device")
        return {"device": devices[0] if devices else None, "rows": [r for p in parts for r in p["rows"]]}
    return rates if isinstance(rates, dict) else json.loads(Path(rates).read_text())


def project_mad(rates, shape: str = "mad", variant: str = "readme", validation=None, **kw) -> dict:
    """Device-hours of the MAD protocol per mechanism and cell, from ``bench throughput`` JSON (a dict, a
    path, or a list of them): work / model-steps per second. Rates come from the rows at ``shape``; with
    ``variant="settings"`` and ``shape="mad"``, also from rows at MAD's longer lengths (``MAD_LENGTHS``):
    each setting's step time is read off the lengths measured for that cell (``step_time_at``). Also, per
    cell, the mechanisms together, and each mechanism at its fastest cell. ``validation``: ``validation_hours``' rows
    (``settings`` only), whose hours are shown beside the table, not added to it."""
    rates = _rows_of(rates)
    work = mad_protocol(variant, **kw)
    lengths_of = dict(MAD_LENGTHS) if (variant == "settings" and shape == "mad") else {shape: 128}
    per_setting = mad_setting_steps(variant, **kw) if variant == "settings" else None
    # (mixer, cell) -> {length: seconds a model-step}
    points: dict[str, dict[str, dict[int, float]]] = {}
    stacks: dict[str, tuple[int, int]] = {}          # cell -> (K, P)
    for r in rates["rows"]:
        rate = r.get("model_steps_per_s")
        if r.get("shape") not in lengths_of or r.get("state") != "COMPLETE" or not rate or not math.isfinite(rate):
            continue
        if r.get("ran", r["mode"]) != r["mode"]:          # a fallback measured another mode than its label
            continue
        cell = cell_label(r["mode"], r["K"], r["P"])
        points.setdefault(r["mixer"], {}).setdefault(cell, {})[lengths_of[r["shape"]]] = 1.0 / rate
        stacks[cell] = (r["K"], r["P"])
    trials, seeds = kw.get("trials", 6), kw.get("seeds", 3)
    sweep_cell = f"sweep: stacked+graphed K={trials}, then K={seeds}"

    def hours(pts: dict[int, float], share: float = 1.0) -> tuple[float, float]:
        """(device-hours, the share of the work at lengths outside the measured range) for one cell."""
        if per_setting is None:
            return share * work * pts[128] / 3600, 0.0
        total = outside = 0.0
        for L, n in per_setting:
            t, out = step_time_at(pts, L)
            total += share * n * t
            outside += share * n * L / 128 if out else 0.0
        return total / 3600, outside
    table: dict[str, dict[str, float]] = {}
    measured: dict[str, dict[str, list[int]]] = {}
    outside_share: dict[str, dict[str, float]] = {}
    for m, cells in points.items():
        for cell, pts in cells.items():
            if 128 not in pts:                     # the baseline anchors every cell
                continue
            h, out = hours(pts)
            table.setdefault(m, {})[cell] = h
            measured.setdefault(m, {})[cell] = sorted(pts)
            outside_share.setdefault(m, {})[cell] = out / work if per_setting else 0.0
        # as a sweep's worker runs a study: its trials stacked (K = trials), then its seeds (K = seeds), one
        # process, each share of the work at the rate measured for that K (at each length where both were)
        at = [cells.get(cell_label("stacked+graphed", k, 1)) for k in (trials, seeds)]
        if all(a is not None and 128 in a for a in at):
            common = sorted(set(at[0]) & set(at[1]))
            h1, o1 = hours({L: at[0][L] for L in common}, trials / (trials + seeds))
            h2, o2 = hours({L: at[1][L] for L in common}, seeds / (trials + seeds))
            table.setdefault(m, {})[sweep_cell] = h1 + h2
            measured.setdefault(m, {})[sweep_cell] = common
            outside_share.setdefault(m, {})[sweep_cell] = (o1 + o2) / work if per_setting else 0.0
            stacks[sweep_cell] = (trials, 1)
    cells = list(dict.fromkeys(c for t in table.values() for c in t))
    # the fastest cell of a mechanism among those measured at the most lengths: a cell measured at the baseline
    # alone is the linear model's guess for the longer settings, not comparable with measured ones
    best_cell = {}
    for m, t in table.items():
        most = max(len(v) for v in measured[m].values())
        best_cell[m] = min((c for c in t if len(measured[m][c]) == most), key=t.get)
    best = {m: table[m][c] for m, c in best_cell.items()}
    # where each mechanism's hours go, by the settings' lengths, at its fastest cell (never the sweep column, which
    # lies between its K = trials and K = seeds cells)
    by_length: dict[str, dict[int, float]] = {}
    if per_setting is not None:
        for m, c in best_cell.items():
            row = by_length.setdefault(m, {})
            for L, n in per_setting:
                row[L] = row.get(L, 0.0) + n * step_time_at(points[m][c], L)[0] / 3600
    total = {c: sum(t[c] for t in table.values()) if all(c in t for t in table.values()) else float("nan")
             for c in cells}
    # a sweep's worker stacks the trials of one study at a time: MAD's 6 (and then its 3 seeds)
    over = sorted({c for c in best_cell.values() if stacks[c][0] > trials})
    return dict(variant=variant, work_baseline_steps=work, shape=shape, cells=cells, hours=table, best=best,
                best_cell=best_cell, total=total, total_best=sum(best.values()), device=rates.get("device"),
                by_length=by_length, eval_work=mad_eval_work(**kw) if per_setting is not None else None,
                validation=(validation_hours(validation, rates.get("device"), **kw)
                            if validation is not None and per_setting is not None else None),
                over_stacked=over, trials=trials, seeds=seeds, lengths=measured, outside_share=outside_share)


def projection_table(p: dict) -> str:
    cells = p["cells"]
    if not cells:
        return f"MAD protocol: no completed measurement at shape {p['shape']!r} to project from"
    out = [f"MAD protocol ({p['variant']}: {p['work_baseline_steps']:.3g} baseline-step equivalents per mechanism), "
           f"device-hours from the rates at shape {p['shape']!r}" + (f" on {p['device']}" if p.get("device") else ""),
           "", "| mechanism | " + " | ".join(cells) + " | fastest" +
           (" (of the cells measured at the most lengths)" if p["variant"] == "settings" else "") + " |",
           "|---" * (len(cells) + 2) + "|"]
    fmt = lambda v: "—" if v is None or not math.isfinite(v) else f"{v:.1f}"     # noqa: E731
    for m, t in p["hours"].items():
        out.append(f"| {m} | " + " | ".join(fmt(t.get(c)) for c in cells) + f" | {fmt(p['best'][m])} ({p['best_cell'][m]}) |")
    out.append("| all | " + " | ".join(fmt(p["total"][c]) for c in cells) + f" | {fmt(p['total_best'])} |")
    if p["variant"] == "settings":
        # which lengths each cell's hours were read off, and how much of the work lay outside them
        by: dict[tuple, dict[str, list[str]]] = {}
        n_all = sum(len(t) for t in p.get("lengths", {}).values())
        for m, t in p.get("lengths", {}).items():
            for c, Ls in t.items():
                key = (tuple(Ls), round(100 * p["outside_share"][m][c]))
                by.setdefault(key, {}).setdefault(c, []).append(m)
        out.append("")
        for (Ls, pct), cs in sorted(by.items(), key=lambda kv: (-len(kv[0][0]), kv[0])):
            n = sum(len(ms) for ms in cs.values())
            who = "every cell" if n == n_all else "; ".join(f"{c}: {', '.join(ms)}" for c, ms in cs.items())
            out.append(f"Step times measured at lengths {', '.join(map(str, Ls))} ({who}); the {pct} % of the "
                       f"work at other lengths: below the shortest measured on the line through the two shortest (at "
                       f"least the shortest's time scaled linearly in length), above the longest scaled linearly.")
    if p.get("by_length"):
        Ls = sorted({L for row in p["by_length"].values() for L in row})
        out += ["", "Device-hours by the settings' length, each mechanism at its fastest cell:", "",
                "| mechanism | " + " | ".join(map(str, Ls)) + " | all |", "|---" * (len(Ls) + 2) + "|"]
        for m, row in p["by_length"].items():
            out.append(f"| {m} | " + " | ".join(fmt(row.get(L)) for L in Ls) + f" | {fmt(sum(row.values()))} |")
        out.append("| all | " + " | ".join(fmt(sum(r.get(L, 0.0) for r in p["by_length"].values())) for L in Ls)
                   + f" | {fmt(p['total_best'])} |")
    if p.get("eval_work"):
        e = p["eval_work"]
        out += ["", f"Not counted above: no early stop (MAD stops a run at accuracy 0.999); each run's validation passes "
                    f"and test pass, {e['passes']} passes over the {e['runs']} runs, forward only, over "
                    f"{100 * e['share']:.1f} % as many sequences (times length) as the training steps take forward and "
                    f"backward."]
    if p.get("validation"):
        v = p["validation"]
        paths = [q for q in VALIDATION_PATHS if any(q in h for h in v.values())]
        out += ["", "Those passes timed (benchmarks/validation_time.py; a test pass counted as a validation), device-hours "
                    "beside each mechanism's fastest cell:", "",
                "| mechanism | fastest cell | " + " | ".join(f"validation, {VALIDATION_PATHS[q]}" for q in paths) + " |",
                "|---" * (len(paths) + 2) + "|"]
        fmt_h = lambda x: "—" if x is None else f"{x:.2f}"     # noqa: E731
        for m, h in v.items():
            out.append(f"| {m} | {fmt(p['best'].get(m))} | " + " | ".join(fmt_h(h.get(q)) for q in paths) + " |")
    for c in p.get("over_stacked", []):
        then = (f"the {p['trials']} trials, then the seeds," if p["seeds"] else f"the {p['trials']} runs")
        rate = (f"the 'sweep:' column, where measured, is one worker's rate as it runs a study (`--K "
                f"{p['trials']},{p['seeds']}`)" if p["seeds"] else
                f"one worker's rate as it runs a study is its stacked+graphed K={p['trials']} cell")
        out.append(f"\nNote: {c} stacks more models per process than a sweep's worker does here (it stacks {then} "
                   f"of one study at a time); that rate is reached only with several workers per GPU adding up to it "
                   f"(measure a `--pack stacked+graphed:{p['trials']}` cell with --procs); {rate}.")
    return "\n".join(out)


def modes_main(args) -> int:
    import torch

    from ..errors import UsageError
    if getattr(args, "project", None):
        p = project_mad(args.project, variant=args.protocol, trials=args.trials, seeds=args.seeds,
                        validation=getattr(args, "validation", None))
        text = projection_table(p)
        print(text)
        if args.md:
            from ..leaderboard.export import write_atomic
            write_atomic(args.md, text + "\n")
        return 0
    shapes = [s for s in (args.shape or "mad,mqar512").split(",") if s]
    for s in shapes:
        if s not in MODE_SHAPES:
            raise UsageError(f"bench throughput: shape {s!r}; allowed: {', '.join(MODE_SHAPES)}")
    ints = lambda text, what: [int(x) for x in text.split(",") if x] if text else []    # noqa: E731
    try:
        Ks, procs = ints(args.K, "K"), ints(args.procs, "procs")
    except ValueError:
        raise UsageError("bench throughput: --K and --procs take integers, e.g. 4,8,16") from None
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in STEP_MODES:
            raise UsageError(f"bench throughput: step mode {m!r}; allowed: {', '.join(STEP_MODES)}")
    pack = [c for c in args.pack.split(",") if c]
    for c in pack:
        parse_cell(c)
    from ..registry import load_builtins
    from .mixers import parse_names
    load_builtins()
    # NAME or NAME:KEY=V,... (a variant: its own rows, its own eager baseline)
    variants = [(v, {}) if isinstance(v, str) else v
                for v in parse_names(list(args.names) or os.environ.get("MIXZOO_BENCH_MIXERS", "softmax,gdn").split(","))]
    gpu = torch.cuda.is_available() and args.device != "cpu"
    device = "cuda" if gpu else "cpu"
    dev_name = torch.cuda.get_device_name(0) if gpu else "cpu"
    steps, warmup = args.steps, args.warmup
    cells = cells_of(modes, Ks, procs, pack)
    print(f"device: {dev_name}  torch {torch.__version__}  {len(shapes)} shapes x {len(variants)} mechanisms x "
          f"{len(cells)} cells, {steps} timed steps after {warmup}", flush=True)
    t_start, rows = time.time(), []
    # the MIXZOO_ switches a run was made under (e.g. MIXZOO_FOLD_RMS_NORM=0, MIXZOO_DQKWG=torch)
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith("MIXZOO_") and k != "MIXZOO_BENCH_MIXERS"}
    out = {"device": dev_name, "torch": torch.__version__, "steps": steps, "warmup": warmup, "env": env, "rows": rows}

    def save():            # after every cell: a run cut short keeps what it measured
        from ..leaderboard.export import write_atomic
        if args.out:
            write_atomic(args.out, json.dumps(out, indent=1))
        if args.md:
            write_atomic(args.md, modes_table(rows) + "\n")
    from ..train.packing import procs_per_gpu
    out["packing_policy"] = {}
    for shape in shapes:
        out["packing_policy"][shape] = procs_per_gpu(*_dims(shape))
        print(f"  {shape}: train/packing.py packs {out['packing_policy'][shape]} processes per GPU at this shape",
              flush=True)
        setup = None                          # the shape's data, shared by its in-process cells
        for mixer, knobs in variants:
            name = variant_label(mixer, knobs)
            for mode, K, P in cells:
                label = f"  {shape:<8} {name:<9} {cell_label(mode, K, P):<30}"
                if args.budget_s and time.time() - t_start > args.budget_s:
                    rows.append(dict(shape=shape, mixer=name, mechanism=mixer, knobs=knobs, mode=mode, K=K, P=P,
                                     state="SKIPPED", note="time budget spent", model_steps_per_s=float("nan")))
                    continue
                try:
                    if P == 1:
                        setup = setup or _mode_setup(shape, device)
                        r = run_cell(shape, mixer, mode, K, device, steps, warmup, setup, knobs=knobs)
                    else:
                        r = packed_cell(shape, mixer, mode, K, P, device, steps, warmup, knobs=knobs)
                except Exception as e:        # one cell failing must not lose the others
                    r = dict(shape=shape, mixer=name, mechanism=mixer, knobs=knobs, mode=mode, K=K, P=P, state="FAIL",
                             note=f"{type(e).__name__}: {e}"[:300], model_steps_per_s=float("nan"))
                rows.append(r)
                print(f"{label} {r['model_steps_per_s']:9.1f} model-steps/s  {r['state']}"
                      f"{'  ran ' + r['ran'] if r.get('ran') and r['ran'] != mode else ''}"
                      f"{'  ' + r['note'][:100] if r.get('note') else ''}", flush=True)
                save()
            if gpu:
                torch.cuda.empty_cache()
    text = modes_table(rows)
    print("\n" + text)
    if "mad" in shapes:
        for variant in ("readme", "settings"):
            proj = projection_table(project_mad(out, variant=variant))
            print("\n" + proj)
            text += "\n\n" + proj
    save()
    if args.md:
        from ..leaderboard.export import write_atomic
        write_atomic(args.md, text + "\n")
    return 0


def main(args) -> int:
    if any(getattr(args, k, None) for k in ("shape", "project")):
        return modes_main(args)
    return harness_main(args)

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _worker(sys.argv[2:])
    elif len(sys.argv) > 1 and sys.argv[1] == "--mode-worker":
        _mode_worker(sys.argv[2])
