"""Bytes each part of one whole training step writes (the memory traffic that bounds a stacked step
once launches are amortized), by module: every non-view PyTorch operator's outputs, counted by
``benchmarks/layer_bytes.py``'s dispatch log, attributed to the innermost module running when the
operator ran: forward through forward hooks, backward through full backward hooks (the operators
between a module's backward pre-hook and its backward hook), the loss and optimizer step by phase.

The model, data and loss are those of ``mixzoo bench throughput --shape mad`` (mad-recall, the mad
recipe: width 128 in 16 heads, 2 blocks, batch 128), under bf16 autocast as on a GPU, with
``torch.optim.AdamW`` (foreach) and gradient clipping as the eager trainer. On a CPU the mixers run
their PyTorch reference paths (softmax: SDPA's CPU kernel), so the mixer rows are those paths'; the
rest of the model (MLP, embedding, head, loss, optimizer) runs the same operators as on a GPU, except
``F.rms_norm``: decomposed into elementwise operators on the CPU (about 6 forward, 14 backward per
norm), one fused kernel on CUDA in an eager step (the H200 profile, benchmarks/h200-2026-12-01/
profile_step-7928ea8.md: ``vectorized_layer_norm_kernel`` 5 a step). Under vmap (stacked steps)
functorch decomposes it on CUDA too (it has no batching rule for it); ``mixzoo.train.vmapfold`` folds
it back into one call of the fused op for all K models.

2-core CPU, 2026-12-01, softmax at batch 128: 1173 MiB in one step; mixer 27 %, the four block norms
and the final one 41 % (decomposed, above), MLP 22 %, residuals 7 %.

    python benchmarks/step_bytes.py softmax [gdn ...] [--batch 128] [--top 8]
"""
from __future__ import annotations

import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


# mixzoo's kernels (the backbone's, Mamba-2's within-chunk SSD, softmax attention's and its q, k, v prologue's, which is
# Parallax's too): (module, launcher) pairs whose outputs count as one operator each
KERNELS = (("mixzoo.kernels.attn", "_launch_fwd"), ("mixzoo.kernels.attn", "_launch_bwd"),
           ("mixzoo.kernels.parallax_prologue_triton", "forward"), ("mixzoo.kernels.parallax_prologue_triton", "backward"),
           ("mixzoo.kernels.swiglu_triton", "forward"), ("mixzoo.kernels.swiglu_triton", "backward"),
           ("mixzoo.kernels.rmsnorm_triton", "forward"), ("mixzoo.kernels.rmsnorm_triton", "backward"),
           ("mixzoo.kernels.rope_triton", "rotate"), ("mixzoo.kernels.causal_conv_triton", "forward"),
           ("mixzoo.kernels.causal_conv_triton", "backward"), ("mixzoo.kernels.ssd_intra_triton", "forward"),
           ("mixzoo.kernels.ssd_intra_triton", "backward"))


def count(mixer: str, batch: int = 128, device: str = "cpu", kernels: bool = False) -> dict:
    """``kernels``: the step as a GPU runs it with mixzoo's backbone kernels (Triton's interpreter, which
    must be on: ``TRITON_INTERPRET=1`` before triton is imported); each launch counts as one operator
    writing its outputs, the interpreter's own tensor traffic inside it not at all."""
    import importlib

    import torch
    from layer_bytes import VIEWS
    from torch.utils._python_dispatch import TorchDispatchMode

    from mixzoo.bench.throughput import MODE_SHAPES, _mode_setup
    from mixzoo.models import build_model
    from mixzoo.train.config import TrainConfig
    from mixzoo.train.loop import loss_fn
    from mixzoo.train.optim import build_optimizer
    task, mcfg, data = _mode_setup("mad", device)
    dev = torch.device(device)
    torch.manual_seed(0)
    model = build_model("lm", mixer, {}, mcfg, vocab=task.vocab_size).to(dev)
    opt = build_optimizer(model, TrainConfig(lr=1e-3, weight_decay=0.1), fused=False)
    b = data["train"].index(torch.arange(batch, device=dev) % data["train"].inputs.shape[0])
    assert MODE_SHAPES["mad"]["batch_size"] == 128

    where: list[str] = []              # the innermost module (dotted name) and phase running now
    names = {m: n or "model" for n, m in model.named_modules()}

    def part(name: str) -> str:        # blocks and their parts: trunk.blocks.0.mixer -> mixer
        bits = name.split(".")
        if name == "trunk.norm":
            return "final norm"
        if "blocks" in bits:
            rest = bits[bits.index("blocks") + 2:]
            return rest[0] if rest else "block"
        return bits[0]

    for m, n in names.items():
        if m is model:
            continue
        p = part(n)
        m.register_forward_pre_hook(lambda mod, a, p=p: where.append("fwd " + p))
        m.register_forward_hook(lambda mod, a, o, p=p: where.pop() and None)
        m.register_full_backward_pre_hook(lambda mod, g, p=p: where.append("bwd " + p) and None)
        m.register_full_backward_hook(lambda mod, gi, go, p=p: where.pop() and None)

    paused = [False]

    class Log(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.bytes, self.calls = collections.Counter(), collections.Counter()

        def add(self, out):
            key = where[-1] if where else phase[0]
            for o in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(o, torch.Tensor):
                    self.bytes[key] += o.numel() * o.element_size()
            self.calls[key] += 1

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            op = str(func.overloadpacket).split(".")[-1]
            if op not in VIEWS and not paused[0]:
                key = where[-1] if where else phase[0]
                for o in out if isinstance(out, (tuple, list)) else [out]:
                    if isinstance(o, torch.Tensor):
                        self.bytes[key] += o.numel() * o.element_size()
                self.calls[key] += 1
            return out

    phase = ["?"]

    def step():
        phase[0] = "fwd other"
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            out = model(b.inputs)
        phase[0] = "loss"
        loss, _ = loss_fn(task.kind, out, b)
        phase[0] = "bwd other"
        loss.backward()
        phase[0] = "clip + optimizer"
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    log = Log()
    saved = []
    if kernels:
        import os
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise SystemExit("step_bytes --kernels: run with TRITON_INTERPRET=1 (set before triton is imported)")
        for mod_name, fn in KERNELS:
            mod = importlib.import_module(mod_name)
            f = getattr(mod, fn)

            def counted(*a, f=f, **k):
                paused[0] = True
                try:
                    out = f(*a, **k)
                finally:
                    paused[0] = False
                if logging[0]:
                    log.add(out)
                return out
            saved.append((mod, fn, f))
            setattr(mod, fn, counted)
    logging = [False]
    try:
        step()                            # first step: lazy state (optimizer moments, cached masks, self-checks)
        logging[0] = True
        with log:
            step()
    finally:
        for mod, fn, f in saved:
            setattr(mod, fn, f)
    backend = next((getattr(m, "backend", None) for m in model.modules() if hasattr(m, "backend")), "?")
    return {"mixer": mixer, "backend": backend, "batch": batch, "kernels": kernels, "bytes": dict(log.bytes),
            "calls": dict(log.calls)}


def main(argv=None) -> int:
    import warnings
    warnings.filterwarnings("ignore", message="Full backward hook is firing")   # modules whose inputs need no grad
    from layer_bytes import arg_parser
    ap = arg_parser(__doc__)
    ap.add_argument("--kernels", action="store_true",
                    help="with mixzoo's backbone kernels, in Triton's interpreter (set TRITON_INTERPRET=1)")
    a = ap.parse_args(argv)
    if a.kernels:
        import lla_small_ridge  # noqa: F401  the interpreter with the H200's numerics
        lla_small_ridge.emulate_gpu_numerics()
    for m in a.mixers:
        r = count(m, a.batch, a.device, kernels=a.kernels)
        by, calls = collections.Counter(r["bytes"]), r["calls"]
        total = sum(by.values())
        print(f"{m} ({r['backend']}{', mixzoo kernels' if a.kernels else ''}), batch {a.batch}: {sum(calls.values())} operators, "
              f"{total / 2**20:.0f} MiB written in one training step")
        for key, n in by.most_common(a.top):
            print(f"  {key:24s} {calls[key]:5d} ops {n / 2**20:9.1f} MiB  {100 * n / total:5.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
