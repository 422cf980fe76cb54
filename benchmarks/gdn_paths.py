"""GDN's GPU paths side by side (one process, same inputs and weights): the PyTorch chunk path (chunk
64 and 128) and fla's chunk kernels, with the backward step fla refuses on Hopper/Triton < 3.7.1
replaced by mixzoo's PyTorch version (``fla-chunk+torch-dqkwg``). Batch 8, length 1024, width 128,
2 heads, bf16 autocast, forward + backward of one GatedDeltaNet layer, median of 20 after warm-up;
the last columns compare each path's output and input gradient with the first row's.

    python benchmarks/gdn_paths.py

Earlier H200 measurements (torch 2.11, Triton 3.6, another benchmark on the host's second GPU):
torch-chunk triangular c64 eager 12.2 ms, compiled c128 9.8 ms; torch.compile of the scan gave a
wrong A_log gradient in check-mixer (relative error 1.3e2), so compile is not used. The chunk
path then also offered a series inverse of its triangular system (since removed: it loses every
digit in float32 when keys are correlated), which may have been the cause; on the CPU, compiling
the layer's triangular-solve path gives every gradient within 5.2e-6 of eager.
2026-11-30, H200 with the other GPU busy: torch-chunk c64 9.16 ms; fla+torch-dqkwg 5.80 ms with
the L2 norm, gate and β inside fla's kernels (as the layer now does), 5.88 with the layer
computing them first (the variant then compared, since removed).
"""
import statistics
import time

import torch

from mixzoo.models.gdn import GatedDeltaNet


def main():
    dev = torch.device("cuda")
    torch.manual_seed(0)
    x0 = torch.randn(8, 1024, 128, device=dev)
    gy = torch.randn(8, 1024, 128, device=dev)
    variants = [("torch-chunk c64", "torch", 64),
                ("torch-chunk c128", "torch", 128),
                ("fla (auto)", "auto", 64)]
    print(f"{'variant':<30} {'backend':<24} {'ms':>8} {'warm-up s':>10} {'rel d(out)':>11} {'rel d(dx)':>10}")
    base = None
    for name, backend, chunk in variants:
        torch.manual_seed(1)
        m = GatedDeltaNet(128, num_heads=2, chunk_size=chunk, backend=backend).to(dev)
        x = x0.clone().requires_grad_()

        def step(m=m, x=x):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                y = m(x)
            y.backward(gy.to(y.dtype))
            return y
        t0 = time.perf_counter()
        for _ in range(3):
            m.zero_grad(set_to_none=True)
            x.grad = None
            y = step()
        torch.cuda.synchronize()
        warm = time.perf_counter() - t0
        out, dx = y.float().detach(), x.grad.float().clone()
        ts = []
        for _ in range(20):
            m.zero_grad(set_to_none=True)
            x.grad = None
            torch.cuda.synchronize()
            t = time.perf_counter()
            step()
            torch.cuda.synchronize()
            ts.append(time.perf_counter() - t)
        if base is None:
            base = (out, dx)
        rel = lambda a, b: ((a - b).norm() / b.norm()).item()
        print(f"{name:<30} {m.backend:<24} {1e3 * statistics.median(ts):8.3f} {warm:10.1f} "
              f"{rel(out, base[0]):11.2e} {rel(dx, base[1]):10.2e}", flush=True)


if __name__ == "__main__":
    main()
