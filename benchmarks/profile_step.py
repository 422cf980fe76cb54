"""Per-kernel breakdown of one training step (torch.profiler), at MAD's baseline shape.

    python benchmarks/profile_step.py [--mixers softmax,gdn] [--shape mad|tiny] [--stacked 8 [--graphed]]
                                      [--steps 3] [--warmup 5] [--top 15] [--by-source] [--out DIR]
    python benchmarks/profile_step.py --layer [--mixers softmax,mamba:backend=torch] ...
    python benchmarks/profile_step.py --plugin benchmarks/floor_mixer.py --mixers floor ...

``--layer``: instead of the training step, one mixer layer's forward+backward as ``mixzoo bench mixers
--shape mad`` times it (``NAME:KEY=V`` variants allowed), so its kernels can be read beside that table.

For each mechanism: the training step as mixzoo's trainer runs it (forward and loss under bf16
autocast on a GPU, backward, clipping, fused AdamW; no Lightning, whose overhead is host-side
and measured by ``mixzoo bench throughput``), and with ``--stacked K`` also K such models as one
stacked step (``mixzoo.train.stacked``), with ``--graphed`` also that step as one CUDA graph (the kernels of
its replays, as stacked+graphed runs them; the host columns then show the replays' launches). After
``--warmup`` steps (autotuning), ``--steps`` steps are profiled, and per step it reports:

* the top kernels by device time (name, launches, total and mean microseconds, share of the step);
* kernel launches per step, device busy time (the kernels' summed time) and the step's wall time,
  so busy / wall is how much of the step the GPU works (a launch-bound step is far below 1);
* host time between launches: the gaps between consecutive kernel-launch calls on the host
  (median, 90th percentile, sum), i.e. what the host spends per launch;
* the top operators (``aten::copy_``, ``aten::mul``, ...) by the device time of the kernels they
  launched, and with ``--by-source`` the Python lines (mixzoo's and fla's) that called them:
  where generic elementwise and copy kernels come from.

On a CPU (``--shape tiny``, the default there) only CPU activities are recorded: the top operators by
self CPU time and the operators per step; there are no kernels or launch gaps. The tables go to stdout
and, with ``--out DIR``, to ``DIR/profile_step.md`` and ``DIR/profile_step.json``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

LAUNCH_NAMES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx",
                "cudaGraphLaunch", "cudaMemcpyAsync", "cudaMemsetAsync")


def plain_step(task, mcfg, mixer: str, data, dev, batch_size: int, steps: int):
    """The trainer's step for one model (train/graphed.py's step, run eagerly)."""
    import torch

    from mixzoo.models import build_model
    from mixzoo.train.config import TrainConfig
    from mixzoo.train.loop import loss_fn
    from mixzoo.train.optim import build_optimizer
    from mixzoo.train.steploop import autocast, precision_of, seed_all, sparse_width, train_data
    cfg = TrainConfig(steps=steps, batch_size=batch_size, lr=1e-3)
    seed_all(0)
    model = build_model(task.backbone, mixer, {}, mcfg, vocab=task.vocab_size).to(dev)
    td = train_data(data, cfg, 0, sparse_width([data["train"].mask], cfg, task, model), dev)
    opt = build_optimizer(model, cfg, fused=dev.type == "cuda")
    amp = autocast(precision_of(cfg, dev), dev)
    state = {"i": 0}

    def step():
        rows = td.order[state["i"] % steps]
        b = td.train.index(rows)
        with amp:
            out = model(b.inputs) if td.sel is None else model(b.inputs, select=td.sel[rows])
            loss = loss_fn(task.kind, out, b)[0]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        state["i"] += 1
    return step, model


def stacked_step(task, mcfg, mixer: str, data, dev, batch_size: int, steps: int, K: int, graphed: bool = False):
    """K models as one stacked step (mixzoo.train.stacked); ``graphed``: as stacked+graphed runs it, the first
    ``mixzoo.train.graphed.WARMUP`` calls eager, then captured once and replayed (no host reads: the step index
    stays within ``steps``)."""
    import itertools

    from mixzoo.train.config import TrainConfig
    from mixzoo.train.stacked import Stack
    from mixzoo.train.vmapfold import folding
    st = Stack(task, mixer, {}, mcfg, [TrainConfig(steps=steps + 2, batch_size=batch_size, lr=1e-3)] * K,
               list(range(K)), dev, data)

    def one():
        with folding():
            st.step()
    if graphed:
        from mixzoo.train.graphed import Stepper
        stepper, count = Stepper(one, dev, capture=True), itertools.count()
        return (lambda: stepper.run(next(count))), st.models[0]

    def step():
        if int(st.idx) >= steps:         # host read between profiled regions only (warm-up bound)
            st.idx.zero_()
        one()
    return step, st.models[0]


def layer_step(entry, dev):
    """(step, module): one mixer layer's forward+backward at ``bench mixers --shape mad``'s shape."""
    import torch

    from mixzoo.bench.mixers import MAD
    from mixzoo.registry import build_mixer, get_mixer
    name, kn = (entry, {}) if isinstance(entry, str) else entry
    torch.manual_seed(0)
    m = build_mixer(get_mixer(name), MAD["d_model"], num_heads=MAD["num_heads"], l_max=MAD["seq_len"], **kn).to(dev)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(MAD["batch"], MAD["seq_len"], MAD["d_model"], generator=g).to(dev).requires_grad_()
    gy = torch.randn(MAD["batch"], MAD["seq_len"], MAD["d_model"], generator=g).to(dev)

    def step():
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            y = m(x)
        y.backward(gy.to(y.dtype))
        m.zero_grad(set_to_none=True)
        x.grad = None
    return step, m


def _gaps(times: list[float]) -> list[float]:
    times = sorted(times)
    return [b - a for a, b in zip(times, times[1:])]


def _source(stack: list[str]) -> str:
    """The innermost frames of a profiler stack that are mixzoo's or fla's code."""
    keep = [f for f in stack if "mixzoo" in f or "/fla/" in f]
    return " <- ".join(f.split("/")[-1] for f in keep[:3]) or "(other)"


def _stack_kwargs(by_source: bool) -> dict:
    """with_stack alone leaves the events' stacks empty in torch 2.11-2.13 (every operator came out as
    "(other)" on the H200); the profiler records them with its verbose experimental config."""
    if not by_source:
        return {}
    try:
        from torch._C._profiler import _ExperimentalConfig
        return dict(with_stack=True, experimental_config=_ExperimentalConfig(verbose=True))
    except (ImportError, TypeError):
        return dict(with_stack=True)


def _by_source(prof, steps: int, total: float, top: int, attr: str) -> list[dict]:
    """The aten operators by the Python lines (mixzoo's, fla's) that called them, by ``attr`` time."""
    src: dict[str, list[float]] = {}
    for a in prof.key_averages(group_by_stack_n=12):
        if a.key.startswith("aten::") and getattr(a, attr) > 0:
            c = src.setdefault(f"{a.key} @ {_source(a.stack)}", [0.0, 0.0])
            c[0] += a.count
            c[1] += getattr(a, attr)
    return [dict(name=k, per_step=c / steps, us_per_step=t / steps, mean_us=t / max(1, c),
                 share=(t / steps) / total if total else 0.0)
            for k, (c, t) in sorted(src.items(), key=lambda kv: -kv[1][1])[:top]]


def profile(step, dev, steps: int, warmup: int, top: int, by_source: bool = False) -> dict:
    import torch
    from torch.profiler import ProfilerActivity
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        step()
    sync()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with torch.profiler.profile(activities=acts, **_stack_kwargs(by_source)) as prof:
        t = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        wall = (time.perf_counter() - t) / steps
    events = prof.events()
    out = {"wall_us": wall * 1e6, "steps": steps}
    if dev.type == "cuda":
        from torch.autograd import DeviceType
        kernels = [e for e in events if e.device_type == DeviceType.CUDA]
        by_name: dict[str, list[float]] = {}
        for e in kernels:
            by_name.setdefault(e.name, []).append(e.time_range.end - e.time_range.start)
        busy = sum(sum(v) for v in by_name.values()) / steps
        launches = [e.time_range.start for e in events
                    if e.device_type == DeviceType.CPU and e.name in LAUNCH_NAMES]
        gaps = _gaps(launches)
        rows = sorted(((n, len(v) / steps, sum(v) / steps, statistics.mean(v)) for n, v in by_name.items()),
                      key=lambda r: -r[2])
        out.update(kind="cuda", launches_per_step=len(kernels) / steps, busy_us=busy,
                   busy_frac=busy / out["wall_us"] if out["wall_us"] else float("nan"),
                   launch_calls_per_step=len(launches) / steps,
                   host_gap_us=dict(median=statistics.median(gaps) if gaps else float("nan"),
                                    p90=statistics.quantiles(gaps, n=10)[-1] if len(gaps) > 10 else float("nan"),
                                    sum_per_step=sum(gaps) / steps),
                   top=[dict(name=n, per_step=c, us_per_step=u, mean_us=m, share=u / busy if busy else 0.0)
                        for n, c, u, m in rows[:top]])
        try:   # operator/source attribution: a profiler API change must not lose the kernel table above
            ops = sorted((a for a in prof.key_averages() if a.key.startswith("aten::") and a.self_device_time_total > 0),
                         key=lambda a: -a.self_device_time_total)
            out["top_ops"] = [dict(name=a.key, per_step=a.count / steps, us_per_step=a.self_device_time_total / steps,
                                   mean_us=a.self_device_time_total / max(1, a.count),
                                   share=(a.self_device_time_total / steps) / busy if busy else 0.0) for a in ops[:top]]
            if by_source:
                out["top_sources"] = _by_source(prof, steps, busy, top, "self_device_time_total")
        except Exception as e:
            out["top_ops_error"] = f"{type(e).__name__}: {e}"
    else:
        ka = prof.key_averages()
        total = sum(a.self_cpu_time_total for a in ka) / steps
        rows = sorted(ka, key=lambda a: -a.self_cpu_time_total)
        out.update(kind="cpu", ops_per_step=sum(a.count for a in ka if a.key.startswith("aten::")) / steps,
                   self_cpu_us=total,
                   top=[dict(name=a.key, per_step=a.count / steps, us_per_step=a.self_cpu_time_total / steps,
                             mean_us=a.self_cpu_time_total / max(1, a.count),
                             share=(a.self_cpu_time_total / steps) / total if total else 0.0) for a in rows[:top]])
        if by_source:
            out["top_sources"] = _by_source(prof, steps, total, top, "self_cpu_time_total")
    return out


def table(name: str, r: dict) -> str:
    if r["kind"] == "cuda":
        g = r["host_gap_us"]
        head = (f"### {name}\n\nstep wall {r['wall_us']:.0f} us, kernels {r['launches_per_step']:.0f} a step "
                f"(launch calls {r['launch_calls_per_step']:.0f}), device busy {r['busy_us']:.0f} us "
                f"= {r['busy_frac']:.2f} of the step; host time between launches: median {g['median']:.1f} us, "
                f"p90 {g['p90']:.1f} us, {g['sum_per_step']:.0f} us a step\n\n"
                "| kernel | per step | us a step | mean us | share of busy |\n|---|---|---|---|---|")
    else:
        head = (f"### {name}\n\nstep wall {r['wall_us']:.0f} us, {r['ops_per_step']:.0f} aten operators a step, "
                f"self CPU {r['self_cpu_us']:.0f} us (CPU activities only: no kernels, no launch gaps)\n\n"
                "| operator | per step | us a step | mean us | share of self CPU |\n|---|---|---|---|---|")
    lines = [head]

    def add(rows):
        for t in rows:
            nm = t["name"] if len(t["name"]) <= 90 else t["name"][:87] + "..."
            lines.append(f"| `{nm}` | {t['per_step']:.1f} | {t['us_per_step']:.1f} | {t['mean_us']:.1f} | "
                         f"{t['share']:.2f} |")
    add(r["top"])
    if r.get("top_ops_error"):
        lines.append(f"\n(operator attribution failed: {r['top_ops_error']})")
    unit, of = ("device us", "busy") if r["kind"] == "cuda" else ("self CPU us", "self CPU")
    for key, what in (("top_ops", "operator"), ("top_sources", "operator @ where it was called")):
        if r.get(key):
            lines.append(f"\n| {what} | per step | {unit} a step | mean us | share of {of} |\n|---|---|---|---|---|")
            add(r[key])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import torch

    from mixzoo.bench.throughput import MODE_SHAPES, _mode_setup
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mixers", default="softmax,gdn")
    ap.add_argument("--shape", choices=sorted(MODE_SHAPES), default=None)
    ap.add_argument("--stacked", type=int, default=0, help="also profile K models as one stacked step")
    ap.add_argument("--graphed", action="store_true",
                    help="with --stacked: also the stacked step captured as one CUDA graph and replayed (stacked+graphed)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--by-source", action="store_true",
                    help="also attribute device time to the mixzoo/fla source lines that called each operator")
    ap.add_argument("--layer", action="store_true",
                    help="profile one mixer layer's forward+backward (bench mixers --shape mad) instead")
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--plugin", action="append", default=[],
                    help="a plugin file registering mixers (benchmarks/floor_mixer.py: the cost floor), repeatable")
    a = ap.parse_args(argv)
    from mixzoo.registry import load_plugin_file
    for f in a.plugin:
        load_plugin_file(f)
    dev = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if a.layer:
        from mixzoo.bench.mixers import label, parse_names
        results, texts = {}, []
        for entry in parse_names([m for m in a.mixers.split(",") if m]):
            step, m = layer_step(entry, dev)
            r = profile(step, dev, a.steps, a.warmup, a.top, a.by_source)
            name = label({"mechanism": entry, "knobs": {}} if isinstance(entry, str)
                         else {"mechanism": entry[0], "knobs": entry[1]})
            key = f"{name} ({getattr(m, 'backend', '?')}), one layer fwd+bwd, bench mixers --shape mad"
            results[key] = r
            texts.append(table(key, r))
            print(texts[-1] + "\n", flush=True)
        return _write(a.out, dev, results, texts, "One mixer layer's forward+backward, per kernel")
    shape = a.shape or ("mad" if dev.type == "cuda" else "tiny")
    bs = MODE_SHAPES[shape]["batch_size"]
    task, mcfg, data = _mode_setup(shape, str(dev))
    total = a.warmup + a.steps
    results, texts = {}, []
    for mixer in [m for m in a.mixers.split(",") if m]:
        variants = [("eager", lambda m=mixer: plain_step(task, mcfg, m, data, dev, bs, total))]
        if a.stacked:
            variants.append((f"stacked K={a.stacked}",
                             lambda m=mixer: stacked_step(task, mcfg, m, data, dev, bs, total, a.stacked)))
        if a.stacked and a.graphed:
            variants.append((f"stacked+graphed K={a.stacked}",
                             lambda m=mixer: stacked_step(task, mcfg, m, data, dev, bs, total, a.stacked, True)))
        for label, make in variants:
            step, model = make()
            r = profile(step, dev, a.steps, a.warmup, a.top, a.by_source)
            backend = "+".join(sorted({getattr(m, "backend", "?") for m in model.trunk.mixers()}))
            key = f"{mixer} ({backend}), {label}, shape {shape}"
            results[key] = r
            texts.append(table(key, r))
            print(texts[-1] + "\n", flush=True)
    return _write(a.out, dev, results, texts, "One training step, per kernel")


def _write(out, dev, results: dict, texts: list[str], title: str) -> int:
    import torch
    if out:
        d = Path(out)
        d.mkdir(parents=True, exist_ok=True)
        name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
        (d / "profile_step.md").write_text(f"# {title} ({name}, torch {torch.__version__})\n\n"
                                           + "\n\n".join(texts) + "\n")
        (d / "profile_step.json").write_text(json.dumps({"device": name, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
