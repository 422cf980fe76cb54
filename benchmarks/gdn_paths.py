"""GDN's PyTorch chunk path on a GPU, variants side by side (one process, same inputs):
eager with the triangular solve, eager with the matmul-product inverse, and both through
torch.compile; chunk 64 and 128. Batch 8, length 1024, width 128, 2 heads, bf16 autocast,
forward+backward of one GatedDeltaNet layer, median of 20 after warm-up.

    python benchmarks/gdn_paths.py

Measured once on an H200 (torch 2.11, Triton 3.6; another benchmark ran on the host's second
GPU at the same time, so launch-bound rates are pessimistic), ms:
    triangular c64 eager 12.2, compiled 12.7 | triangular c128 eager 12.4, compiled 9.8
    product    c64 eager 15.0, compiled 12.0 | product    c128 eager 12.2, compiled 10.6
and check-mixer's compiled-vs-eager comparison (d_model 64, T 100, bf16) found the compiled
scan's A_log gradient off (relative error 1.3e2; output 1.4e-3): compile is not used.
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
                m = gdn_mod.GatedDeltaNet(128, num_heads=2, chunk_size=chunk).to(dev)
                fn = lambda *a, solve=solve, **k: _scan.gated_delta_chunk(*a, solve=solve, **k)
                torch._dynamo.reset()
                gdn_mod.gated_delta_chunk = torch.compile(fn, dynamic=False) if compiled else fn

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
                name = f"{solve} chunk={chunk} {'compiled' if compiled else 'eager'}"
                print(f"{name:<34} {1e3 * statistics.median(ts):8.3f} {warm:10.1f}", flush=True)
    gdn_mod.gated_delta_chunk = _scan.gated_delta_chunk


if __name__ == "__main__":
    main()
