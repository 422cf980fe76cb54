"""GDN's PyTorch chunk path on a GPU, variants side by side (one process, same inputs):
eager with the triangular solve, eager with the matmul-product inverse, and both through
torch.compile; chunk 64 and 128. Batch 8, length 1024, width 128, 2 heads, bf16 autocast,
forward+backward of one GatedDeltaNet layer, median of 20 after warm-up.

    python benchmarks/gdn_paths.py
"""
import statistics
import time

import torch

import mixzoo.models.gdn as gdn_mod
from mixzoo.models import _scan


def main():
    dev = torch.device("cuda")
    x = torch.randn(8, 1024, 128, device=dev, requires_grad=True)
    gy = torch.randn(8, 1024, 128, device=dev)
    print(f"{'variant':<34} {'ms':>8} {'warm-up s':>10}")
    for solve in ("triangular", "product"):
        for chunk in (64, 128):
            for compiled in (False, True):
                torch.manual_seed(0)
                m = gdn_mod.GatedDeltaNet(128, num_heads=2, chunk_size=chunk, compile_scan=compiled).to(dev)
                fn = lambda *a, solve=solve, **k: _scan.gated_delta_chunk(*a, solve=solve, **k)
                gdn_mod.gated_delta_chunk = fn
                gdn_mod._compiled_scan.cache_clear()
                torch._dynamo.reset()

                def step():
                    with torch.autocast("cuda", dtype=torch.bfloat16):
                        y = m(x)
                    y.backward(gy.to(y.dtype))
                    m.zero_grad(set_to_none=True)
                    x.grad = None
                t0 = time.perf_counter()
                for _ in range(3):
                    step()
                torch.cuda.synchronize()
                warm = time.perf_counter() - t0
                ts = []
                for _ in range(20):
                    torch.cuda.synchronize()
                    t = time.perf_counter()
                    step()
                    torch.cuda.synchronize()
                    ts.append(time.perf_counter() - t)
                name = f"{solve} chunk={chunk} {m.backend}"
                print(f"{name:<34} {1e3 * statistics.median(ts):8.3f} {warm:10.1f}", flush=True)
    gdn_mod.gated_delta_chunk = _scan.gated_delta_chunk


if __name__ == "__main__":
    main()
