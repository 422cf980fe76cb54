"""Where GDN's gradients differ between paths on a GPU: every path against float64 autograd of the
PyTorch chunk path, per parameter (norm-relative error), at check-mixer's shape (B 2, T 100, width
64, 2 heads). Paths: torch-chunk fp32 / bf16 autocast; fla's kernels with mixzoo's dqkwg fp32 /
bf16 (L2 norm, gate and β inside fla's kernels); fla's kernels with fla's own Triton dqkwg (its
Hopper guard lifted) fp32 / bf16. Then the dqkwg step alone on random inputs: mixzoo's and fla's
Triton kernel against float64.

    python benchmarks/gdn_grad_check.py
"""
import contextlib
import inspect

import torch

from mixzoo.kernels import fla_dqkwg
from mixzoo.models.gdn import GatedDeltaNet


def grads(backend, dtype, autocast, x0, w0):
    torch.manual_seed(0)
    m = GatedDeltaNet(64, num_heads=2, backend=backend).cuda().to(dtype)
    x = x0.to(dtype).clone().requires_grad_()
    ctx = torch.autocast("cuda", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with ctx:
        y = m(x)
    (y.to(dtype) * w0.to(dtype)).sum().backward()
    out = {"output": y.detach().double(), "dx": x.grad.double()}
    out.update({n: p.grad.double() for n, p in m.named_parameters() if p.grad is not None})
    return m.backend, out


def rel(a, b):
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def main():
    g = torch.Generator().manual_seed(3)
    x0, w0 = torch.randn(2, 100, 64, generator=g).cuda(), torch.randn(2, 100, 64, generator=g).cuda()
    _, ref = grads("torch", torch.float64, False, x0, w0)
    import fla.ops.common.chunk_o as co
    rows = []
    for label, backend, dtype, ac, triton_dqkwg in [
            ("torch fp32", "torch", torch.float32, False, False),
            ("torch bf16", "torch", torch.float32, True, False),
            ("fla+ours fp32", "auto", torch.float32, False, False),
            ("fla+ours bf16", "auto", torch.float32, True, False),
            ("fla+triton fp32", "auto", torch.float32, False, True),
            ("fla+triton bf16", "auto", torch.float32, True, True)]:
        saved = (co.IS_NVIDIA_HOPPER, fla_dqkwg.triton_refused)
        if triton_dqkwg:
            co.IS_NVIDIA_HOPPER = False
            fla_dqkwg.triton_refused = lambda: False
        try:
            name, got = grads(backend, dtype, ac, x0, w0)
            rows.append((label, name, {k: rel(got[k], ref[k]) for k in ref}))
        except Exception as e:  # noqa: BLE001
            print(f"{label}: {type(e).__name__}: {str(e)[:200]}")
        finally:
            co.IS_NVIDIA_HOPPER, fla_dqkwg.triton_refused = saved
    keys = list(ref)
    print(f"{'path':<22} {'backend':<22} " + " ".join(f"{k[:9]:>9}" for k in keys))
    for label, name, e in rows:
        print(f"{label:<22} {name:<22} " + " ".join(f"{e[k]:9.1e}" for k in keys))

    # the dqkwg step alone
    torch.manual_seed(1)
    B, T, H, K, V, BT = 2, 256, 2, 64, 64, 64
    NT = T // BT
    mk = lambda *s: torch.randn(*s, device="cuda")
    q, k, w = mk(B, T, H, K), mk(B, T, H, K), mk(B, T, H, K)
    v, do, dv = mk(B, T, H, V), mk(B, T, H, V), mk(B, T, H, V)
    h, dh = mk(B, NT, H, K, V), mk(B, NT, H, K, V)
    graw = -torch.rand(B, T, H, device="cuda") * 0.2
    gl2 = torch.cat([graw[:, c * BT:(c + 1) * BT].cumsum(1) for c in range(NT)], 1) / 0.6931471805599453
    args = dict(q=q, k=k, v=v, w=w, g=gl2, h=h, dv=dv, do=do, dh=dh, scale=K ** -0.5)
    d64 = fla_dqkwg.chunk_bwd_dqkwg_torch(**{a: (t.double() if torch.is_tensor(t) else t) for a, t in args.items()})
    for dt in (torch.float32, torch.bfloat16):
        a16 = {a: (t.to(dt) if torch.is_tensor(t) and a != "g" else t) for a, t in args.items()}
        ours = fla_dqkwg.chunk_bwd_dqkwg_torch(**a16)
        co.IS_NVIDIA_HOPPER = False
        try:
            tri = inspect.unwrap(co.chunk_bwd_dqkwg)(**a16)
        except Exception as e:  # noqa: BLE001
            tri = None
            print("triton dqkwg failed:", type(e).__name__, str(e)[:200])
        finally:
            co.IS_NVIDIA_HOPPER = True
        for label, res in (("ours", ours), ("fla triton", tri)):
            if res is None:
                continue
            print(f"dqkwg {str(dt)[6:]:<9} {label:<11} " + " ".join(
                f"{n} {rel(r.double(), d.double()):.1e}" for n, r, d in zip(("dq", "dk", "dw", "dg"), res, d64)))


if __name__ == "__main__":
    main()
