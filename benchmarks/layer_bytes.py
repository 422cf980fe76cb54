"""Bytes each PyTorch operator writes in one mixer layer's forward+backward (a proxy for the memory
traffic of a memory-bound layer), counted by a ``TorchDispatchMode`` over the non-view operators'
outputs, at ``bench mixers --shape mad``'s layer (batch 128, length 128, width 128 in 16 heads) or
a smaller batch. Runs where the mechanism's path is plain PyTorch (on a CPU: every reference path).

    python benchmarks/layer_bytes.py NAME[:KEY=V,...] [--batch 128] [--top 12] [--device cpu]
"""
from __future__ import annotations

import argparse
import collections
import sys

VIEWS = {"view", "transpose", "expand", "permute", "_unsafe_view", "detach", "t", "slice", "split", "unsqueeze",
         "squeeze", "select", "alias", "as_strided", "split_with_sizes", "unbind", "chunk", "unflatten", "flatten",
         "_reshape_alias", "reshape", "lift_fresh", "diagonal"}


def count(entry, batch: int = 128, device: str = "cpu") -> tuple[str, collections.Counter, collections.Counter, list]:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from mixzoo.bench.mixers import MAD
    from mixzoo.registry import build_mixer, get_mixer
    name, kn = (entry, {}) if isinstance(entry, str) else entry

    class Log(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.bytes, self.calls, self.outs = collections.Counter(), collections.Counter(), []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            op = str(func.overloadpacket).split(".")[-1]
            if op not in VIEWS:
                for o in out if isinstance(out, (tuple, list)) else [out]:
                    if isinstance(o, torch.Tensor):
                        n = o.numel() * o.element_size()
                        self.bytes[op] += n
                        self.outs.append((n, op, tuple(o.shape), str(o.dtype).replace("torch.", "")))
                self.calls[op] += 1
            return out

    dev = torch.device(device)
    torch.manual_seed(0)
    m = build_mixer(get_mixer(name), MAD["d_model"], num_heads=MAD["num_heads"], l_max=MAD["seq_len"], **kn).to(dev)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, MAD["seq_len"], MAD["d_model"], generator=g).to(dev).requires_grad_()
    gy = torch.randn(batch, MAD["seq_len"], MAD["d_model"], generator=g).to(dev)

    def step():
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            y = m(x)
        y.backward(gy.to(y.dtype))
    step()                                   # first call: lazy set-up, cached masks
    with Log() as log:
        step()
    return getattr(m, "backend", "?"), log.bytes, log.calls, log.outs


def arg_parser(doc: str) -> argparse.ArgumentParser:
    """The command line of this script and of step_bytes.py: mechanisms, batch, rows shown, device."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("mixers", nargs="+")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--device", default="cpu")
    return ap


def main(argv=None) -> int:
    from mixzoo.bench.mixers import label, parse_names
    a = arg_parser(__doc__).parse_args(argv)
    for entry in parse_names(a.mixers):
        backend, by, calls, outs = count(entry, a.batch, a.device)
        name = label({"mechanism": entry, "knobs": {}} if isinstance(entry, str)
                     else {"mechanism": entry[0], "knobs": entry[1]})
        print(f"{name} ({backend}), batch {a.batch}: {sum(calls.values())} operators, "
              f"{sum(by.values()) / 2**20:.0f} MiB written in one forward+backward")
        for op, b in by.most_common(a.top):
            print(f"  {op:32s} {calls[op]:4d} calls {b / 2**20:9.1f} MiB")
        print("  largest outputs:")
        for n, op, shape, dt in sorted(outs, reverse=True)[:a.top]:
            print(f"    {n / 2**20:7.1f} MiB  {op} {shape} {dt}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
