"""mixzoo.kernels.causal_conv: the short causal depthwise convolution (with SiLU) as Triton kernels,
on the CPU in Triton's interpreter with the H200's numerics (benchmarks/lla_small_ridge.py; a fresh
process, the interpreter being switched on before triton is imported): against float64 beside the
model's PyTorch form under bf16 autocast; folded under vmap (K models' sequences in one call, each reading its
model's weight); each path of the forward (one row at a time, tiles) and backward (one row at a time, two passes)
against float64 and against each other, and the switches that pick them. Off the GPU the PyTorch form runs,
unchanged."""
import os

import pytest
import torch
from interp import run_interpreted

SCRIPT = r"""
from mixzoo.kernels import causal_conv as C, causal_conv_triton
from mixzoo.models._parts import ConvAct
from mixzoo.models.common import ShortConv
out = {"usable": C.usable(-1)}
g = torch.Generator().manual_seed(0)
rel = lambda a, b: float((a.double() - b).norm() / b.norm())
torch.manual_seed(0)
for name, make, (B, T, Cn) in (("convact", lambda c: ConvAct(c, 4), (2, 45, 70)),
                               ("convact", lambda c: ConvAct(c, 4), (1, 130, 384)),
                               ("shortconv", lambda c: ShortConv(c, 3), (3, 7, 5))):
    m = make(Cn)
    conv = m.conv.conv if name == "convact" else m.conv
    x = torch.randn(B, T, Cn, generator=g)
    dy = torch.randn(B, T, Cn, generator=g)
    ins = [x.double().requires_grad_(), conv.weight.detach().double().squeeze(1).requires_grad_(),
           conv.bias.detach().double().requires_grad_()]
    want = C.causal_conv_torch(*ins, name == "convact")
    wants = torch.autograd.grad(want, ins, dy.double())
    res = {}
    for form, env in (("kernel", None), ("torch", "torch")):
        if env: os.environ["MIXZOO_CONV"] = env
        else: os.environ.pop("MIXZOO_CONV", None)
        xx = x.clone().requires_grad_()
        m.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = m(xx)
        y.float().backward(dy)
        res[form] = dict(dtype=str(y.dtype), out=rel(y, want.detach()), dx=rel(xx.grad, wants[0]),
                         dw=rel(conv.weight.grad.squeeze(1), wants[1]), db=rel(conv.bias.grad, wants[2]))
    os.environ.pop("MIXZOO_CONV", None)
    out[f"{name} {(B, T, Cn)}"] = res
from torch.func import functional_call, stack_module_state, vmap
from mixzoo.train.vmapfold import folding
calls = []
fwd = causal_conv_triton.forward
causal_conv_triton.forward = lambda x, *a: calls.append(list(x.shape)) or fwd(x, *a)
ms = [ConvAct(6, 4) for _ in range(3)]
params, bufs = stack_module_state(ms)
x = torch.randn(3, 2, 9, 6, generator=g).requires_grad_()
with folding():
    y = vmap(lambda p, b, xi: functional_call(ms[0], (p, b), (xi,)))(params, bufs, x)
n_folded = len(calls)
got = torch.autograd.grad(y.square().sum(), (x, params["conv.conv.weight"], params["conv.conv.bias"]))
ref = torch.stack([m(xi) for m, xi in zip(ms, x)])
want = torch.autograd.grad(ref.square().sum(), (x, *[m.conv.conv.weight for m in ms], *[m.conv.conv.bias for m in ms]))
want = (want[0], torch.stack(want[1:4]), torch.stack(want[4:7]))
out["vmap"] = dict(calls=calls[:n_folded], out=float((y - ref).abs().max()),
                   grads=[float((a - b).abs().max()) for a, b in zip(got, want)])
sc = [ShortConv(5, 3) for _ in range(2)]              # the backbone's convolution: width 3, no SiLU, 2 models
sp, sb = stack_module_state(sc)
xs = torch.randn(2, 3, 7, 5, generator=g)
calls.clear()
with folding():
    ys = vmap(lambda p, b, xi: functional_call(sc[0], (p, b), (xi,)))(sp, sb, xs)
out["vmap shortconv"] = dict(calls=list(calls), out=float((ys - torch.stack([m(xi) for m, xi in zip(sc, xs)])).abs().max()))
os.environ["MIXZOO_CONV_FOLD"] = "channels"          # the models in the channels instead, the fold before
calls.clear()
with folding():
    y = vmap(lambda p, b, xi: functional_call(ms[0], (p, b), (xi,)))(params, bufs, x)
n_folded = len(calls)
got = torch.autograd.grad(y.square().sum(), (x, params["conv.conv.weight"], params["conv.conv.bias"]))
os.environ.pop("MIXZOO_CONV_FOLD")
out["vmap channels"] = dict(calls=calls[:n_folded], out=float((y - ref).abs().max()),
                            grads=[float((a - b).abs().max()) for a, b in zip(got, want)])
print("RESULT", json.dumps(out))
"""


PATHS = r"""
from mixzoo.kernels import causal_conv as C, causal_conv_triton as K
g = torch.Generator().manual_seed(0)
rel = lambda a, b: float((a.double() - b).norm() / b.norm().clamp_min(1e-30))
out = {}
# (B, T, C, W, M models, SiLU, bias, dtype, one-row tiles: channels, warps, positions per program, stages, unrolling)
CASES = [(1, 75, 6, 4, 1, True, True, "bfloat16", (8, 1, 32, 2, 4)),      # 3 spans, the last partial
         (6, 21, 6, 3, 3, False, True, "float32", (8, 1, 16, 1, 1)),     # 3 models of 2; spans of 16, the last partial
         (2, 2, 5, 4, 1, True, False, "bfloat16", None),                 # T < W, the default tiles
         (3, 11, 5, 4, 3, True, True, "bfloat16", (4, 2, 2, 3, 3)),      # spans of 2 < W - 1: the halo crosses 2
                                                                          # spans; 2 channel blocks
         (4, 19, 7, 2, 2, False, False, "float32", (4, 1, 8, 2, 2)),     # W = 2
         (2, 9, 5, 1, 1, True, True, "float32", (8, 1, 4, 1, 1))]        # W = 1
for B, T, Cn, W, M, silu, has_bias, dt, tiles in CASES:
    dt = getattr(torch, dt)
    x = torch.randn(B, T, Cn, generator=g).to(dt)
    w = torch.randn(M, Cn, W, generator=g) * 0.5
    b = torch.randn(M, Cn, generator=g) * 0.1 if has_bias else None
    dy = torch.randn(B, T, Cn, generator=g).to(dt)
    ins = [x.double().requires_grad_(), w.double().requires_grad_()] + ([b.double().requires_grad_()] if has_bias else [])
    xs = ins[0].view(M, B // M, T, Cn)
    want = torch.cat([C.causal_conv_torch(xs[m], ins[1][m], ins[2][m] if has_bias else None, silu) for m in range(M)])
    wants = torch.autograd.grad(want, ins, dy.double())
    if M == 1:
        w, b, wants = w[0], (b[0] if has_bias else None), [wants[0], wants[1][0]] + ([wants[2][0]] if has_bias else [])
    fs = K.forward_seq(x, w, b, silu, dt, tiles)
    ft = K.forward_tiles(x, w, b, silu, dt)
    bs = [t for t in K.backward_seq(x, w, b, silu, dy, tiles) if t is not None]
    bt = [t for t in K.backward_two_pass(x, w, b, silu, dy) if t is not None]
    out[str((B, T, Cn, W, M, silu, has_bias, str(dt), tiles))] = dict(
        tol=1e-2 if dt == torch.bfloat16 else 1e-5, dtypes=[str(t.dtype) for t in (fs, ft, bs[0], bt[0])],
        fwd=[rel(fs, want.detach()), rel(ft, want.detach()), rel(fs, ft.double())],
        seq=[rel(a, r) for a, r in zip(bs, wants)], two=[rel(a, r) for a, r in zip(bt, wants)],
        between=[rel(a, r.double()) for a, r in zip(bs, bt)], n=[len(bs), len(bt), len(wants)])
# the switches: the first value is the default; each path asked for by name; a width over 4 takes the two passes
x, w, b = torch.randn(2, 9, 5, generator=g), torch.randn(5, 4, generator=g), torch.randn(5, generator=g)
dy = torch.randn(2, 9, 5, generator=g)
same = lambda p, q: all(torch.equal(s, t) for s, t in zip(p, q))
sw = {"default": same(K.backward(x, w, b, True, dy), K.backward_seq(x, w, b, True, dy))
                 and torch.equal(K.forward(x, w, b, True, torch.float32), K.forward_seq(x, w, b, True, torch.float32))}
os.environ["MIXZOO_CONV_BWD"], os.environ["MIXZOO_CONV_FWD"] = "two-pass", "tiles"
sw["named"] = (same(K.backward(x, w, b, True, dy), K.backward_two_pass(x, w, b, True, dy))
               and torch.equal(K.forward(x, w, b, True, torch.float32), K.forward_tiles(x, w, b, True, torch.float32)))
os.environ["MIXZOO_CONV_BWD"], os.environ["MIXZOO_CONV_FWD"] = "seq", "seq"
sw["seq"] = same(K.backward(x, w, b, True, dy), K.backward_seq(x, w, b, True, dy))
w5 = torch.randn(5, 5, generator=g)
sw["wide"] = (same(K.backward(x, w5, b, True, dy), K.backward_two_pass(x, w5, b, True, dy))
              and torch.equal(K.forward(x, w5, b, True, torch.float32), K.forward_tiles(x, w5, b, True, torch.float32)))
for fn, args in ((K.backward_seq, (x, w5, b, True, dy)), (K.forward_seq, (x, w5, b, True, torch.float32))):
    try:
        fn(*args)
        sw[fn.__name__ + " wide"] = "ran"
    except ValueError:
        sw[fn.__name__ + " wide"] = "ValueError"
os.environ["MIXZOO_CONV_BWD"] = "fused"
try:
    K.backward(x, w, b, True, dy)
    sw["unknown"] = "ran"
except ValueError as e:
    sw["unknown"] = str(e)
out["switches"] = sw
print("RESULT", json.dumps(out))
"""


def test_each_path_against_float64_and_each_other():
    """Both forwards and both backwards: T across spans (the backward's halo into a partial span, and across two
    spans when they are shorter than W - 1), T < W, one and three models, with and without bias and SiLU, W 1 to
    4, several channel blocks; the switches MIXZOO_CONV_FWD / MIXZOO_CONV_BWD."""
    r = run_interpreted(PATHS, drop=("MIXZOO_CONV", "MIXZOO_CONV_FWD", "MIXZOO_CONV_BWD"))
    sw = r.pop("switches")
    assert sw == {"default": True, "named": True, "seq": True, "wide": True, "backward_seq wide": "ValueError",
                  "forward_seq wide": "ValueError", "unknown": sw["unknown"]}, sw
    assert "MIXZOO_CONV_BWD='fused'" in sw["unknown"], sw
    assert len(r) == 6
    for case, res in r.items():
        tol = res["tol"]
        assert res["n"][0] == res["n"][1] == res["n"][2], (case, res)
        assert len(set(res["dtypes"])) == 1, (case, res)
        for q in ("fwd", "seq", "two", "between"):
            assert max(res[q]) <= tol, (case, q, res)


def test_kernels_against_float64_beside_the_pytorch_form_and_folded():
    r = run_interpreted(SCRIPT, drop=("MIXZOO_CONV",))
    assert r["usable"] is True
    for case, res in r.items():
        if case.startswith("vmap") or case == "usable":
            continue
        k, t = res["kernel"], res["torch"]
        assert k["dtype"] == t["dtype"] == "torch.bfloat16", (case, res)
        for q in ("out", "dx", "dw", "db"):                    # one bf16 rounding where the form has two or more
            assert k[q] <= 1.1 * t[q] + 1e-6, (case, q, res)
    v = r["vmap"]
    assert v["calls"] == [[6, 9, 6]], v                       # 3 models' 2 sequences: one call, models in the batch
    assert v["out"] < 1e-5 and max(v["grads"]) < 1e-4, v
    v = r["vmap shortconv"]
    assert v["calls"] == [[6, 7, 5]] and v["out"] < 1e-5, v
    v = r["vmap channels"]
    assert v["calls"] == [[2, 9, 18]], v                      # MIXZOO_CONV_FOLD=channels: 3 models' 6 channels
    assert v["out"] < 1e-5 and max(v["grads"]) < 1e-4, v


def test_off_the_gpu_the_pytorch_form_runs_unchanged():
    import torch.nn.functional as F

    from mixzoo.kernels import causal_conv
    from mixzoo.models._parts import ConvAct
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the interpreter is on in this process")
    m = ConvAct(6, 4)
    x = torch.randn(2, 9, 6)
    assert not causal_conv.runs_on(x)
    c = m.conv.conv
    want = F.silu(F.conv1d(x.transpose(1, 2), c.weight, c.bias, padding=3, groups=6)[..., :9].transpose(1, 2))
    assert torch.equal(m(x), want)


@pytest.mark.parametrize("dt", ["bf16", "fp32"])
def test_one_row_kernels_compile_for_the_h200_with_their_row_loop_pipelined(dt):
    """The one-row kernels at their default tilings compile for sm_90 down to a cubin (as tests/test_kernels_compile
    does for the others), and with the pointers and sizes divisible by 16, as a launch at 384 channels specializes
    them, the row loop's loads become cp.async copies (Triton's pipeliner takes the loop only when it is unrolled at
    least W - 1 times: otherwise it yields its carried rows unchanged, which the pipeliner refuses)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the interpreter is on in this process")
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from mixzoo.kernels import causal_conv_triton as K
    P = lambda d: f"*{d}"                                     # noqa: E731  a pointer argument
    ints = dict(T="i32", C="i32", BM="i32")
    for fn, sig, tiles in (
            (K._bwd_seq_kernel, dict(x=P(dt), w=P("fp32"), bias=P("fp32"), dy=P(dt), dx=P(dt), dwp=P("fp32"),
                                     dbp=P("fp32"), **ints), (K.SEQ_BC, K.SEQ_WARPS, K.SEQ_TB, K.SEQ_STAGES, K.SEQ_UNROLL)),
            (K._fwd_seq_kernel, dict(x=P(dt), w=P("fp32"), bias=P("fp32"), y=P(dt), **ints),
             (K.SEQ_FWD_BC, K.SEQ_FWD_WARPS, K.SEQ_FWD_TB, K.SEQ_FWD_STAGES, K.SEQ_FWD_UNROLL))):
        for W, has_bias, silu in ((4, True, True), (3, False, False)):
            bc, warps, tb, ns, uf = tiles
            consts = dict(W=W, HAS_BIAS=has_bias, SILU=silu, BC=bc, TB=tb, NS=ns, UF=uf)
            signature = {**sig, **{k: "constexpr" for k in consts}}
            assert list(signature) == fn.arg_names, (list(signature), fn.arg_names)
            attrs = {(i,): [["tt.divisibility", 16]] for i, (n, v) in enumerate(sig.items()) if v[0] == "*" or n in ("T", "C")}
            k = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=consts, attrs=attrs),
                               target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps))
            assert k.asm.get("cubin"), (fn.__name__, W)
            if ns > 1 and uf >= W - 1:
                assert "async_copy_global_to_local" in k.asm["ttgir"], (fn.__name__, W, tiles)
