"""Accuracy of the Triton LLA kernel at small ridge, on the CPU, in the Triton interpreter with GPU numerics.

    TRITON_INTERPRET=1 is set by this script; run it as
    .venv/bin/python benchmarks/lla_small_ridge.py [--module PATH] [--T 64,160,300] [--D 32,64,128]
        [--lam 0.01,0.1,1,10,100] [--qscale 1,4] [--bh 1x2] [--early] [--fp16] [--prec N] [--tol X] [--max-iter N]

Prints one row per case: relative L2 errors of o / dq / dk / dv (and of the first 8 rows of o and dv) against
float64 autograd of ``lla_reference`` on the same bf16-rounded inputs (as tests/gpu/test_lla_kernel.py::_case;
seed D + int(10 λ), CPU generator, so not the GPU test's numbers), and the CG iterations (forward / backward
solve; mean and max over query tiles). A case is "ok" within the GPU tests' tolerances: 1e-2 (o, o[:8]) and
2e-2 (dq, dk, dv, dv[:8]). ``--early`` adds test_early_positions' shape (1 x 4, T = 96, D = 64, q x 4).
``--module`` loads another copy of triton_lla.py (e.g. ``git show HEAD:mixzoo/kernels/lla/triton_lla.py``) to
compare before / after; ``--prec`` forces a precision level (module docstring of triton_lla).
The interpreter runs one program at a time on the CPU: a T = 300, D = 128 case at λ = 0.01 takes a few minutes.

Why the interpreter needs patching (checked with a tiny kernel, triton 3.6): out of the box it stores bf16 as
uint16 bit patterns and ``tl.dot`` multiplies those integers (errors ~1e10), fp32 -> bf16 casts truncate
instead of rounding to nearest even, and fp32 ``tl.dot`` is full fp32 whatever ``input_precision`` says. So
``emulate_gpu_numerics()`` makes the interpreter do what the H200 does:
  * bf16 (and fp16) operands of tl.dot: exact upcast to fp32, products and fp32 accumulation (what the tensor
    cores do with bf16 inputs and an fp32 accumulator; the summation order differs);
  * fp32 operands: "tf32" keeps 10 mantissa bits (truncated: the MMA ignores the low bits), "tf32x3" is the
    big/small tf32 split with three products, "ieee" is fp32;
  * fp32 -> bf16 casts round to nearest even (cvt.rn.bf16.f32);
  * elementwise arithmetic on two bf16 values is done in fp32 and rounded back (the interpreter would compute
    on the bit patterns);
  * scalar loop bounds work under numpy 2 (``int()`` of a one-element array).
The self-check at start-up (``check_emulation``) prints the dot and cast errors.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
import warnings

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter as _itp  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from mixzoo.kernels.lla.reference import lla_reference  # noqa: E402

# --------------------------------------------------------------------------------------------------------------
# GPU numerics in the interpreter


def _bf16_bits_to_f32(u16):
    return (np.asarray(u16, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16_bits(f32):
    t = torch.from_numpy(np.ascontiguousarray(f32, dtype=np.float32)).to(torch.bfloat16)
    return t.view(torch.int16).numpy().view(np.uint16)


def _tf32_trunc(x):
    return (np.ascontiguousarray(x, dtype=np.float32).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)


def _tf32_rna(x):
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def emulate_gpu_numerics():
    B = _itp.InterpreterBuilder
    if getattr(B, "_lla_emulated", False):
        return
    P = _itp._ir.INPUT_PRECISION
    orig_binary_op, orig_cast, orig_fp_to_fp = B.binary_op, B.cast_impl, B.create_fp_to_fp

    def operand(h):
        if h.dtype.scalar == tl.bfloat16:
            return _bf16_bits_to_f32(h.data), True
        if h.dtype.scalar == tl.float16:
            return np.asarray(h.data, dtype=np.float16).astype(np.float32), True
        if h.dtype.scalar == tl.float32:
            return np.asarray(h.data, dtype=np.float32), False
        raise TypeError(f"emulated dot: unsupported operand type {h.dtype}")

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        (A, a16), (Bm, b16) = operand(a), operand(b)
        if not (a16 and b16):
            if a16 != b16:
                raise TypeError("emulated dot: mixed bf16 / fp32 operands")
            if input_precision == P.TF32:
                A, Bm = _tf32_trunc(A), _tf32_trunc(Bm)
            elif input_precision == P.TF32x3:
                Ab, Bb = _tf32_rna(A), _tf32_rna(Bm)
                As, Bs = _tf32_trunc(A - Ab), _tf32_trunc(Bm - Bb)
                out = np.matmul(Ab, Bs) + np.matmul(As, Bb) + np.matmul(Ab, Bb)
                return _itp.TensorHandle((out + d.data).astype(np.float32), d.dtype.scalar)
            elif input_precision != P.IEEE:
                raise TypeError(f"emulated dot: input precision {input_precision} not emulated")
        out = np.matmul(A, Bm, dtype=np.float32)
        return _itp.TensorHandle((out + d.data).astype(np.float32), d.dtype.scalar)

    def binary_op(self, lhs, rhs, op):
        if lhs.dtype.scalar == tl.bfloat16 and rhs.dtype.scalar == tl.bfloat16:
            out = op(_bf16_bits_to_f32(lhs.data), _bf16_bits_to_f32(rhs.data))
            if out.dtype == np.bool_:
                return _itp.TensorHandle(out, tl.int1)
            return _itp.TensorHandle(_f32_to_bf16_bits(out), tl.bfloat16)
        if lhs.dtype.scalar == tl.bfloat16 or rhs.dtype.scalar == tl.bfloat16:
            raise TypeError("mixed bf16 arithmetic not emulated")
        return orig_binary_op(self, lhs, rhs, op)

    def cast(self, src, dst_type):
        s, t = src.dtype.scalar, dst_type.scalar
        if s == tl.float32 and t == tl.bfloat16:
            return _itp.TensorHandle(_f32_to_bf16_bits(src.data), tl.bfloat16)
        if s == tl.bfloat16 and t == tl.float32:
            return _itp.TensorHandle(_bf16_bits_to_f32(src.data), tl.float32)
        return orig_cast(self, src, dst_type)

    def fp_to_fp(self, src, dst_type, rounding_mode):
        if src.dtype.scalar in (tl.float32, tl.bfloat16) and dst_type.scalar in (tl.float32, tl.bfloat16):
            return cast(self, src, dst_type)
        return orig_fp_to_fp(self, src, dst_type, rounding_mode)

    B.create_dot, B.binary_op, B.cast_impl, B.create_fp_to_fp = create_dot, binary_op, cast, fp_to_fp
    for name in ("create_fp_ext", "create_fp_trunc"):
        setattr(B, name, lambda self, src, dst_type: cast(self, src, dst_type))
    # numpy 2 refuses int() of a one-element 1-d array, which the interpreter uses for scalar loop bounds
    orig_patch_tensor = _itp._patch_lang_tensor

    def patch_tensor(tensor, scope):
        orig_patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

    _itp._patch_lang_tensor = patch_tensor
    B._lla_emulated = True


@triton.jit
def _check_kernel(A, Bp, X, O1, O2, O3, O4, N: tl.constexpr):
    r = tl.arange(0, N)
    off = r[:, None] * N + r[None, :]
    a = tl.load(A + off)
    b = tl.load(Bp + off)
    x = tl.load(X + off)
    tl.store(O1 + off, tl.dot(a, b))
    tl.store(O2 + off, x.to(tl.bfloat16))
    tl.store(O3 + off, tl.dot(x, x))
    tl.store(O4 + off, tl.dot(x, x, input_precision="tf32x3"))


def check_emulation():
    N = 32
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(N, N, generator=g).bfloat16() for _ in range(2))
    x = torch.randn(N, N, generator=g)
    o1, o3, o4 = (torch.empty(N, N) for _ in range(3))
    o2 = torch.empty(N, N, dtype=torch.bfloat16)
    _check_kernel[(1,)](a, b, x, o1, o2, o3, o4, N=N)
    ref = a.double() @ b.double()
    xx = x.double() @ x.double()
    e1 = float((o1.double() - ref).abs().max() / ref.abs().max())
    e3 = float((o3.double() - xx).abs().max() / xx.abs().max())
    e4 = float((o4.double() - xx).abs().max() / xx.abs().max())
    rne = bool((o2 == x.bfloat16()).all())
    print(f"interpreter emulation: bf16 dot rel err {e1:.1e} (fp32 accumulation of exact products), "
          f"fp32->bf16 cast RNE {rne}, fp32 dot tf32 {e3:.1e}, tf32x3 {e4:.1e}")
    assert e1 < 1e-6 and rne and 1e-5 < e3 < 1e-2 and e4 < 1e-6


# --------------------------------------------------------------------------------------------------------------
# cases


def load_module(path):
    if path is None:
        from mixzoo.kernels.lla import triton_lla
        return triton_lla
    spec = importlib.util.spec_from_file_location(f"lla_under_test_{abs(hash(path))}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm())


def run_case(K, B, H, T, D, lam, qscale, seed, tol=None, max_iter=None, prec=None, dtype=torch.bfloat16):
    """As tests/gpu/test_lla_kernel.py::_case on the CPU; returns the errors and the CG iterations."""
    g = torch.Generator().manual_seed(seed)
    q, k, v, go = (torch.randn(B, H, T, D, generator=g) for _ in range(4))
    q, k, v = (q * qscale).to(dtype), k.to(dtype), v.to(dtype)
    go = go.to(dtype)
    xd = [t.double().requires_grad_() for t in (q, k, v)]
    ref = lla_reference(*xd, ridge=lam)
    rg = torch.autograd.grad(ref, xd, go.double())
    its = {}
    f0, b0 = K.lla_forward, K.lla_backward

    def fwd(*a, **kw):
        r = f0(*a, **kw)
        its["f"] = r[-1]
        return r

    def bwd(*a, **kw):
        r = b0(*a, **kw)
        its["b"] = r[-1]
        return r

    K.lla_forward, K.lla_backward = fwd, bwd
    try:
        xs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        kw = {} if prec is None else {"prec": prec}          # (older copies of the kernel have no prec)
        out = K.lla(*xs, ridge=lam, tol=tol, max_iter=max_iter, **kw)
        gs = torch.autograd.grad(out, xs, go)
    finally:
        K.lla_forward, K.lla_backward = f0, b0
    finite = bool(torch.isfinite(out).all()) and all(bool(torch.isfinite(t).all()) for t in gs)
    errs = [_rel(out, ref)] + [_rel(a, b) for a, b in zip(gs, rg)]
    e8 = min(8, T)
    early = [_rel(out[..., :e8, :], ref[..., :e8, :]), _rel(gs[2][..., :e8, :], rg[2][..., :e8, :])]
    itf, itb = its["f"].float(), its["b"].float()
    return errs, early, finite, (itf.mean().item(), int(itf.max()), itb.mean().item(), int(itb.max()))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--module", default=None, help="path of a triton_lla.py to test (default: the package's)")
    ap.add_argument("--T", default="300")
    ap.add_argument("--D", default="32,64,128")
    ap.add_argument("--lam", default="0.01,0.1,1,10,100")
    ap.add_argument("--qscale", default="1,4")
    ap.add_argument("--bh", default="1x2")
    ap.add_argument("--tol", type=float, default=None)
    ap.add_argument("--max-iter", type=int, default=None)
    ap.add_argument("--prec", type=int, default=None, help="force a precision level 0..3 (default: chosen from λ)")
    ap.add_argument("--fp16", action="store_true", help="fp16 inputs instead of bf16")
    ap.add_argument("--early", action="store_true", help="add the early-position case (T=96, D=64, q x4, 1x4)")
    a = ap.parse_args(argv)
    warnings.filterwarnings("ignore", category=RuntimeWarning)   # 0/0 in lanes that tl.where then discards
    emulate_gpu_numerics()
    check_emulation()
    torch.set_num_threads(1)
    K = load_module(a.module)
    B, H = (int(x) for x in a.bh.split("x"))
    cases = [(B, H, T, D, lam, qs) for T in map(int, a.T.split(",")) for D in map(int, a.D.split(","))
             for lam in map(float, a.lam.split(",")) for qs in map(float, a.qscale.split(","))]
    if a.early:
        cases += [(1, 4, 96, 64, lam, 4.0) for lam in map(float, a.lam.split(","))]
    cap = a.max_iter or K.DEFAULTS["max_iter"]
    raised = f" (raised to >= {K.SMALL_RIDGE_ITERS_PER_DIM} D at PREC >= 2)" if hasattr(K, "SMALL_RIDGE_ITERS_PER_DIM") else ""
    print(f"module {K.__file__}; tol {a.tol or K.DEFAULTS['tol']}, max_iter {cap}{raised}")
    print("| BxH | T | D | λ | q× | o | dq | dk | dv | o[:8] | dv[:8] | CG it fwd mean/max | bwd mean/max | ok | s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    n_bad = 0
    for (B, H, T, D, lam, qs) in cases:
        t0 = time.time()
        errs, early, finite, it = run_case(K, B, H, T, D, lam, qs, seed=D + int(10 * lam), tol=a.tol,
                                           max_iter=a.max_iter, prec=a.prec,
                                           dtype=torch.float16 if a.fp16 else torch.bfloat16)
        ok = finite and errs[0] <= 1e-2 and max(errs[1:]) <= 2e-2 and early[0] <= 1e-2 and early[1] <= 2e-2
        n_bad += not ok
        mark = lambda e, lim: f"**{e:.1e}**" if e > lim else f"{e:.1e}"  # noqa: E731
        print(f"| {B}x{H} | {T} | {D} | {lam:g} | {qs:g} | {mark(errs[0], 1e-2)} | "
              + " | ".join(mark(e, 2e-2) for e in errs[1:])
              + f" | {mark(early[0], 1e-2)} | {mark(early[1], 2e-2)} | {it[0]:.1f}/{it[1]} | {it[2]:.1f}/{it[3]} | "
              + f"{'yes' if ok else 'NO' + ('' if finite else ' (non-finite)')} | {time.time() - t0:.0f} |", flush=True)
    print(f"{len(cases) - n_bad}/{len(cases)} cases within 1e-2 (o) / 2e-2 (gradients)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
