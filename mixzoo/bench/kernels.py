"""``mixzoo bench kernels``: SDPA, fla's Parallax, our LLA kernels and (when importable) FlashLLA, side by side.

One run, one table: the same bf16 inputs for every mechanism, batch x heads = 16, causal. Times are
medians of ``triton.testing.do_bench`` (CUDA events); "fwd+bwd" is forward plus ``autograd.grad`` of all
inputs. Peak memory is the extra allocation over the inputs during one call (forward under no_grad, and a
forward+backward). A second table gives the accuracy against the float64 reference on bf16-rounded inputs.
"""
from __future__ import annotations

import json
import os

LAM = 10.0          # FlashLLA's default ridge; the speed table uses it for both LLA implementations
BH = (2, 8)         # batch, heads


def _inputs(B, H, T, D, seed=0, dtype=None):
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    dtype = dtype or torch.bfloat16
    return [torch.randn(B, H, T, D, device="cuda", generator=g).to(dtype) for _ in range(4)]


def _bench(fn, fast=False):
    import triton
    return triton.testing.do_bench(fn, warmup=10 if fast else 25, rep=30 if fast else 100, return_mode="median")


def _peak(fn):
    import torch
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def _mechanisms(D):
    """name -> (forward(q, k, v, r) on (B, H, T, D) tensors, or None where unavailable, why)."""
    import torch.nn.functional as F
    mech = {"sdpa": (lambda q, k, v, r: F.scaled_dot_product_attention(q, k, v, is_causal=True), "")}
    try:
        from fla.ops.parallax import parallel_parallax

        def parallax(q, k, v, r):
            t = [x.transpose(1, 2) for x in (q, r, k, v)]
            return parallel_parallax(*t).transpose(1, 2)
        mech["parallax"] = (parallax, "")
    except Exception as e:  # noqa: BLE001
        mech["parallax"] = (None, f"fla not importable: {type(e).__name__}")
    from ..kernels.lla.triton_lla import lla
    mech["lla"] = (lambda q, k, v, r: lla(q, k, v, ridge=LAM), "")
    try:
        import flashlla

        def flash(q, k, v, r):
            B, H, T, Dh = q.shape
            o = flashlla.lla_attention(*(x.reshape(B * H, T, Dh) for x in (q, k, v)), ridge_lambda=LAM)
            return o.reshape(B, H, T, Dh)
        mech["flashlla"] = (flash, "")
    except Exception as e:  # noqa: BLE001
        mech["flashlla"] = (None, f"flashlla not importable: {type(e).__name__}")
    return mech


def _time_one(f, B, H, T, D, fast):
    import torch
    q, k, v, r = _inputs(B, H, T, D)
    r = r * 0.1
    out = {}
    with torch.no_grad():
        f(q, k, v, r)
        out["fwd"] = _bench(lambda: f(q, k, v, r), fast)
        out["mem_fwd"] = _peak(lambda: f(q, k, v, r))
    xs = [t.detach().requires_grad_() for t in (q, k, v, r)]
    g = torch.randn_like(q)

    def step():
        o = f(*xs)
        grads = torch.autograd.grad(o, [x for x in xs[:3]], g)
        return grads
    step()
    out["fwdbwd"] = _bench(step, fast)
    out["mem_fwdbwd"] = _peak(step)
    return out


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def _accuracy(mech, B, H, T, D, lam, peak=1.0):
    """Relative errors of o, dq, dk, dv against float64 autograd of the reference, on bf16-rounded inputs."""
    import torch

    from ..kernels.lla.reference import lla_reference
    q, k, v, _ = _inputs(B, H, T, D, seed=1)
    q = (q.float() * peak).to(torch.bfloat16)
    g = torch.randn_like(q)
    xd = [t.double().requires_grad_() for t in (q, k, v)]
    ref = lla_reference(*xd, ridge=lam)
    rg = torch.autograd.grad(ref, xd, g.double())
    ref = ref.detach()
    res = {}
    for name, f in mech.items():
        xs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        o = f(*xs, lam)
        gs = torch.autograd.grad(o, xs, g)
        o = o.detach()
        res[name] = {"o": _rel(o, ref), "dq": _rel(gs[0], rg[0]), "dk": _rel(gs[1], rg[1]), "dv": _rel(gs[2], rg[2]),
                     "nan": bool(o.isnan().any() or any(x.isnan().any() for x in gs))}
    return res


def main(args) -> int:
    import torch
    if not torch.cuda.is_available():
        print("bench kernels: needs a CUDA GPU; nothing measured")
        return 1
    from ..kernels.lla import triton_lla
    quick = bool(getattr(args, "quick", False))
    B, H = (1, 2) if quick else BH
    lengths = [256, 512] if quick else [1024, 2048, 4096, 8192, 16384]
    dims = [64] if quick else [64, 128]
    flash_max = int(os.environ.get("MIXZOO_FLASHLLA_MAX_LEN", "512" if quick else "4096"))
    flash_min = int(os.environ.get("MIXZOO_FLASHLLA_MIN_LEN", "0"))
    flash_dims = {64, 128} if quick else {int(d) for d in os.environ.get("MIXZOO_FLASHLLA_DIMS", "128").split(",")}
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, batch x heads {B * H} ({B}x{H}), bf16, "
          f"causal, LLA ridge {LAM}, our CG tol {triton_lla.DEFAULTS['tol']} (max {triton_lla.DEFAULTS['max_iter']} it.), "
          f"FlashLLA 32 CG it. for T <= {flash_max}, D in {sorted(flash_dims)}")
    rows = []
    for D in dims:
        mech = _mechanisms(D)
        for T in lengths:
            row = {"T": T, "D": D}
            for name, (f, why) in mech.items():
                if f is None:
                    row[name] = {"skip": why}
                    continue
                if name == "flashlla" and (T > flash_max or T < flash_min or D not in flash_dims):
                    row[name] = {"skip": "not run at this size (slow; see MIXZOO_FLASHLLA_MAX_LEN)"}
                    continue
                try:
                    row[name] = _time_one(f, B, H, T, D, fast=T >= 8192)
                except Exception as e:  # noqa: BLE001
                    row[name] = {"skip": f"{type(e).__name__}: {str(e)[:80]}"}
                torch.cuda.empty_cache()
            row["cg_fwd"] = _cg_iters(triton_lla, B, H, T, D, LAM)
            rows.append(row)
            _print_row(row)
    print()
    print("== speed (ms, median) and peak extra memory (MiB); ratios are LLA / other ==")
    _print_table(rows)
    by_ridge = _ridge_table(triton_lla, B, H, 512 if quick else 4096, 64 if quick else 128,
                            [0.1, LAM] if quick else [0.01, 0.1, 1.0, 3.0, LAM, 100.0])
    acc = {}
    acc_shapes = [(256, 64, B, H)] if quick else [(1024, 128, B, H), (4096, 128, 1, 2)]   # float64 autograd memory
    for T, D, Ba, Ha in acc_shapes:
        mech = _mechanisms(D)
        fns = {n: (lambda q, k, v, lam, f=f, n=n: f(q, k, v, None) if n == "flashlla" else
                   triton_lla.lla(q, k, v, ridge=lam)) for n, (f, _) in mech.items() if n in ("lla", "flashlla") and f}
        if T > flash_max or D not in flash_dims:
            fns.pop("flashlla", None)
        for lam in ([LAM] if T > 1024 else [0.1, 1.0, LAM]):
            use = fns if lam == LAM else {"lla": fns["lla"]}
            for peak in ([1.0] if T > 1024 else [1.0, 4.0]):
                acc[f"T={T} D={D} BH={Ba * Ha} lam={lam} qscale={peak}"] = _accuracy(use, Ba, Ha, T, D, lam, peak)
                torch.cuda.empty_cache()
    print()
    print("== accuracy: relative L2 error vs float64 reference (bf16-rounded inputs), o / dq / dk / dv ==")
    for key, res in acc.items():
        txt = "  ".join(f"{n}: {r['o']:.1e} / {r['dq']:.1e} / {r['dk']:.1e} / {r['dv']:.1e}{' NaN' if r['nan'] else ''}"
                        for n, r in res.items())
        print(f"{key:40s} {txt}")
    if getattr(args, "out", None):
        from ..leaderboard.export import write_atomic
        write_atomic(args.out, json.dumps({"rows": rows, "accuracy": acc, "ridge": LAM, "batch_heads": B * H,
                                           "by_ridge": by_ridge}, indent=1))
    return 0


def _cg_iters(triton_lla, B, H, T, D, lam):
    """Our forward's CG iterations per query tile on the benchmark inputs: [mean, max]."""
    import torch
    q, k, v, _ = _inputs(B, H, T, D)
    qq, kk, vv = (x.reshape(B * H, T, D).contiguous() for x in (q, k, v))
    its = triton_lla.lla_forward(qq, kk, vv, torch.full((B * H, T), lam, device="cuda"), D ** -0.5,
                                 triton_lla.DEFAULTS["tol"], triton_lla.DEFAULTS["max_iter"],
                                 triton_lla.DEFAULTS["jacobi"])[3]
    return [float(its.float().mean()), int(its.max())]


def _ridge_table(triton_lla, B, H, T, D, lams):
    """Our kernel's cost by ridge: smaller λ makes the systems worse conditioned, so the kernel
    raises its precision level (triton_lla.precision_level) and CG needs more iterations."""
    import torch
    print()
    print(f"== our LLA by ridge (T={T}, D={D}, batch x heads {B * H}); ratio to λ={LAM} ==")
    print(f"{'ridge':>8} {'prec':>4} {'fwd ms':>8} {'f+b ms':>8} {'f+b ratio':>9} {'CG it. fwd mean/max':>20}")
    out = []
    for lam in lams:
        f = lambda q, k, v, r, lam=lam: triton_lla.lla(q, k, v, ridge=lam)
        try:
            t = _time_one(f, B, H, T, D, fast=False)
        except Exception as e:  # noqa: BLE001
            print(f"{lam:8g} failed: {type(e).__name__}: {str(e)[:80]}")
            continue
        out.append({"ridge": lam, "prec": triton_lla.precision_level(lam), "fwd": t["fwd"],
                    "fwdbwd": t["fwdbwd"], "cg_fwd": _cg_iters(triton_lla, B, H, T, D, lam)})
        torch.cuda.empty_cache()
    base = next((r["fwdbwd"] for r in out if r["ridge"] == LAM), None)
    for r in out:
        ratio = f"{r['fwdbwd'] / base:8.2f}x" if base else "      -"
        print(f"{r['ridge']:8g} {r['prec']:4d} {r['fwd']:8.3f} {r['fwdbwd']:8.3f} {ratio:>9} "
              f"{r['cg_fwd'][0]:13.1f}/{r['cg_fwd'][1]}")
    return out


def _fmt(x, nd=3):
    return "-" if x is None else (f"{x:.{nd}f}" if x < 100 else f"{x:.1f}")


def _print_row(row):
    parts = [f"T={row['T']} D={row['D']}"]
    for n in ("sdpa", "parallax", "lla", "flashlla"):
        r = row.get(n, {})
        parts.append(f"{n}: " + (r["skip"] if "skip" in r else f"{_fmt(r['fwd'])}/{_fmt(r['fwdbwd'])} ms "
                                 f"{r['mem_fwd']:.0f}/{r['mem_fwdbwd']:.0f} MiB"))
    parts.append(f"CG it fwd mean/max {row['cg_fwd'][0]:.1f}/{row['cg_fwd'][1]}")
    print(" | ".join(parts), flush=True)


def _print_table(rows):
    hdr = ("T", "D", "sdpa f", "sdpa f+b", "plx f", "plx f+b", "lla f", "lla f+b", "flla f", "flla f+b",
           "lla/sdpa f+b", "lla/plx f+b", "flla/lla f+b", "mem sdpa f", "mem lla f", "mem sdpa f+b", "mem lla f+b")
    print(" | ".join(hdr))
    print(" | ".join("---" for _ in hdr))
    for r in rows:
        def g(n, key, r=r):
            x = r.get(n, {})
            return x.get(key) if "skip" not in x else None

        def ratio(a, b):
            return f"{a / b:.2f}x" if a is not None and b else "-"
        lla_fb = g("lla", "fwdbwd")
        cells = [r["T"], r["D"], _fmt(g("sdpa", "fwd")), _fmt(g("sdpa", "fwdbwd")), _fmt(g("parallax", "fwd")),
                 _fmt(g("parallax", "fwdbwd")), _fmt(g("lla", "fwd")), _fmt(lla_fb), _fmt(g("flashlla", "fwd")),
                 _fmt(g("flashlla", "fwdbwd")), ratio(lla_fb, g("sdpa", "fwdbwd")), ratio(lla_fb, g("parallax", "fwdbwd")),
                 ratio(g("flashlla", "fwdbwd"), lla_fb),
                 _fmt(g("sdpa", "mem_fwd"), 0), _fmt(g("lla", "mem_fwd"), 0),
                 _fmt(g("sdpa", "mem_fwdbwd"), 0), _fmt(g("lla", "mem_fwdbwd"), 0)]
        print(" | ".join(str(c) for c in cells))


__all__ = ["main"]
