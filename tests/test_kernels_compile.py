"""Every Triton kernel of the backbone compiles for the H200 (CUDA sm_90, down to a cubin) on this
machine without a GPU: what Triton's interpreter (the other CPU tests) accepts but its compiler would
refuse fails here, not in the first minutes of a GPU session. Signatures as the launchers pass them."""
from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")

P = lambda dt: f"*{dt}"                 # noqa: E731  a pointer argument


def _cases():
    from mixzoo.kernels import attn as AT
    from mixzoo.kernels import attn_triton as A
    from mixzoo.kernels import causal_conv_triton as C
    from mixzoo.kernels import gla_steps_triton as G
    from mixzoo.kernels import parallax_prologue_triton as PP
    from mixzoo.kernels import rmsnorm_triton as N
    from mixzoo.kernels import rope_triton as R
    from mixzoo.kernels import ssd_intra_triton as D
    from mixzoo.kernels import swiglu_triton as S
    out = []
    for BT, K, V in ((64, 16, 16), (32, 64, 128)):          # the mad recipe's padded GLA heads; wide ones
        out += [(f"gla dv BT={BT} K={K} V={V}", G._dv_kernel,
                 dict(k=P("bf16"), g=P("fp32"), A=P("fp32"), do=P("bf16"), dh=P("fp32"), dv=P("bf16"), T="i32"),
                 dict(H=16, K=K, V=V, BT=BT, BK=G._tile(K), BV=G._tile(V))),
                (f"gla dqkg BT={BT} K={K} V={V}", G._dqkg_kernel,
                 dict(q=P("bf16"), k=P("bf16"), v=P("bf16"), g=P("fp32"), h=P("fp32"), do=P("bf16"), dh=P("fp32"),
                      dq=P("fp32"), dk=P("fp32"), dq2=P("fp32"), dk2=P("fp32"), dg=P("fp32"), scale="fp32", T="i32"),
                 dict(H=16, K=K, V=V, BT=BT, BK=G._tile(K), BV=G._tile(V))),
                (f"gla o BT={BT} K={K} V={V}", G._o_kernel,
                 dict(q=P("bf16"), v=P("bf16"), g=P("fp32"), h=P("bf16"), A=P("fp32"), o=P("bf16"), scale="fp32", T="i32"),
                 dict(H=16, K=K, V=V, BT=BT, BK=G._tile(K), BV=G._tile(V)))]
    strides = lambda *ts: {f"s{t}{d}": "i32" for t in ts for d in "bht"}      # noqa: E731
    for hd in (8, 16):                                       # the mad recipe's heads; the widest the kernels take
        c = dict(D=hd, DP=AT.padded_dim(hd))
        out += [(f"attention fwd D={hd}", A._fwd_kernel,
                 dict(Q=P("bf16"), K=P("bf16"), V=P("bf16"), OUT=P("bf16"), LSE=P("fp32"), T="i32", H="i32",
                      sc2="fp32", **strides("q", "k", "v")), dict(**c, BM=AT.TILES["fwd"][0], BN=AT.TILES["fwd"][1], VEC=8)),
                (f"attention delta D={hd}", A._delta_kernel,
                 dict(OUT=P("bf16"), DO=P("bf16"), DELTA=P("fp32"), T="i32", H="i32", sdb="i32", sdt="i32", sdh="i32"),
                 dict(**c, BT=128, VEC=8)),
                *[(f"attention {n} D={hd}", fn,
                   dict(Q=P("bf16"), K=P("bf16"), V=P("bf16"), DO=P("bf16"), LSE=P("fp32"), DELTA=P("fp32"),
                        **({"DK": P("bf16"), "DV": P("bf16")} if n == "dkdv" else {"DQ": P("bf16")}), T="i32",
                        H="i32", sc2="fp32", scale="fp32", **strides("q", "k", "v", "d")),
                   dict(**c, BM=AT.TILES[n][0], BN=AT.TILES[n][1], VEC=8)) for n, fn in (("dkdv", A._dkdv_kernel),
                                                                                 ("dq", A._dq_kernel))]]
    for (BC, K, V), form in [(s, f) for s in ((64, 64, 16), (16, 128, 32)) for f in D.FORMS]:
        # the mad recipe's Mamba-2; the widest state; each product form
        sig = dict(q=P("fp32"), k=P("fp32"), v=P("fp32"), gc=P("fp32"), ks=P("fp32"))
        ints = dict(H="i32", N="i32", K="i32", V="i32")
        st = lambda t: {f"s{t}{d}": "i32" for d in "bhnc"}        # noqa: E731  (sequence, head, chunk, position) strides
        bf16 = D.FORMS.index(form)
        out += [(f"ssd intra fwd C={BC} K={K} V={V} {form}", D._fwd_kernel,
                 {**sig, "o": P("fp32"), **ints, **st("v"), **st("o")}, dict(C=BC, BK=K, BV=V, BF16=bf16)),
                (f"ssd intra bwd C={BC} K={K} V={V} {form}", D._bwd_kernel,
                 {**sig, "do": P("fp32"), **{n: P("fp32") for n in ("dq", "dk", "dv", "dgc", "dks")}, **ints,
                  **st("v"), **st("d"), **st("o")}, dict(C=BC, BK=K, BV=V, BF16=bf16))]
    for dt in ("bf16", "fp32"):
        out += [
            ("swiglu fwd " + dt, S._fwd_kernel, dict(h=P(dt), o=P(dt), N="i64", F="i32"), dict(BLOCK=S.TILE[0])),
            ("swiglu bwd " + dt, S._bwd_kernel, dict(h=P(dt), do=P(dt), dh=P(dt), N="i64", F="i32"), dict(BLOCK=S.TILE[0])),
            # the gate after the norm (POST) at the mad recipe's heads of 8: the output and gate bf16, x as given
            *[(f"rmsnorm fwd {dt} gate={gate} res={res} post={post}", N._fwd_kernel,
               dict(x=P(dt), z=P("bf16" if post else dt), w=P("fp32"), y=P("bf16" if res or post else "fp32"),
                    rstd=P("fp32"), res=P("bf16"), s=P(dt), R="i32", D="i32", NB="i32", eps="fp32", ZH="i32",
                    zs_g="i64", zs_t="i32", zs_h="i32"),
               dict(BR=512 if post else 32, BD=8 if post else 128, GATE=gate, RES=res, POST=post))
              for gate, res, post in ((False, False, False), (True, False, False), (False, True, False),
                                      (False, False, True))],
            *[(f"rmsnorm bwd {dt} gate={gate} res={res} post={post}", N._bwd_kernel,
               dict(x=P(dt), z=P("bf16" if post else dt), w=P("fp32"), rstd=P("fp32"),
                    dy=P("bf16" if res or post else "fp32"), dx=P(dt), dz=P("bf16" if post else dt), dwp=P("fp32"),
                    ds=P(dt), dr=P("bf16"), R="i32", D="i32", NB="i32", ZH="i32", zs_g="i64", zs_t="i32",
                    zs_h="i32"),
               dict(BR=512 if not gate else 16, BD=8 if not gate else 256, GATE=gate, HAS_DS=res, RES=res, POST=post))
              for gate, res, post in ((False, False, False), (True, False, False), (False, True, False),
                                      (False, False, True))],
            ("rope " + dt, R._rope_kernel, dict(x=P(dt), y=P(dt), inv_freq=P("fp32"), H="i32", T="i32", sb="i64", sh="i64",
                                                st="i64", HALF="i32", sign="fp32"), dict(BT=256, BH=4)),
            ("conv fwd " + dt, C._fwd_kernel, dict(x=P(dt), w=P("fp32"), bias=P("fp32"), y=P("bf16"), T="i32", C="i32",
                                                BM="i32"),
             dict(W=4, HAS_BIAS=True, SILU=True, BT=C.BT, BC=C.BC, TB=C.TB)),
            ("conv dz " + dt, C._dz_kernel, dict(x=P(dt), w=P("fp32"), bias=P("fp32"), dy=P("bf16"), dz=P("fp32"),
                                                 dwp=P("fp32"), dbp=P("fp32"), T="i32", C="i32", BM="i32"),
             dict(W=4, HAS_BIAS=True, SILU=True, BT=C.DZ_BT, BC=C.BC, BW=4, TB=C.TB)),
            ("conv dz, no bias, no silu " + dt, C._dz_kernel, dict(x=P(dt), w=P("fp32"), bias=P("fp32"), dy=P("fp32"),
                                                                   dz=P("fp32"), dwp=P("fp32"), dbp=P("fp32"), T="i32",
                                                                   C="i32", BM="i32"),
             dict(W=3, HAS_BIAS=False, SILU=False, BT=C.DZ_BT, BC=C.BC, BW=4, TB=C.TB)),
            ("conv dx " + dt, C._dx_kernel, dict(dz=P("fp32"), w=P("fp32"), dx=P(dt), T="i32", C="i32", BM="i32"),
             dict(W=4, BT=C.BT, BC=C.BC, TB=C.TB)),
        ]
        # the prologue at the mad recipe's heads: Parallax's (r normed and rotated) and q, k, v alone (the launchers
        # pass q or dq for the pointers the kernels leave alone)
        BT, BH, _ = PP._blocks(128 * 128, 16, 8)
        for has_r in (True, False):
            aux = "fp32" if has_r else dt
            consts = dict(BT=BT, BH=BH, HALF=4, ROPE_QK=True, NORM_R=has_r, ROPE_R=has_r, HAS_R=has_r)
            out += [(f"prologue fwd {dt} r={has_r}", PP._fwd_kernel,
                     dict(qkv=P(dt), rr=P(dt), w=P(aux), inv_freq=P("fp32"), q=P(dt), k=P(dt), v=P(dt), r=P(dt),
                          rstd=P(aux), R="i32", T="i32", H="i32", C="i32", eps="fp32"), consts),
                    (f"prologue bwd {dt} r={has_r}", PP._bwd_kernel,
                     dict(dq=P(dt), dk=P(dt), dv=P(dt), dr=P(dt), rr=P(dt), w=P(aux), rstd=P(aux), inv_freq=P("fp32"),
                          dqkv=P(dt), drr=P(dt), dwp=P(aux), R="i32", T="i32", H="i32", C="i32", NB="i32"), consts)]
    return out


CASES = _cases()


@pytest.mark.parametrize("name,fn,sig,consts", CASES, ids=[c[0] for c in CASES])
def test_kernel_compiles_for_the_h200(name, fn, sig, consts):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    signature = {**sig, **{k: "constexpr" for k in consts}}
    assert list(signature) == fn.arg_names, (list(signature), fn.arg_names)   # every argument, in order
    k = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=consts), target=GPUTarget("cuda", 90, 32))
    assert k.asm.get("cubin"), name


def ptx_loads(fn, consts: dict, ints: dict, floats=(), pointers: dict | None = None):
    """The load instructions (global loads and cp.async copies, by kind) of ``fn`` compiled for sm_90 with its integer
    arguments ``ints`` specialized as Triton's launcher does (1 becomes a constant, multiples of 16 are marked
    divisible by 16), ``floats`` the fp32 scalars, every other argument a 16-byte aligned pointer (bf16 unless
    ``pointers`` says)."""
    import collections
    import re

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    consts, sig, attrs = dict(consts), {}, {}
    for i, n in enumerate(fn.arg_names):
        if n in consts:
            sig[n] = "constexpr"
        elif n in ints and ints[n] == 1:
            sig[n], consts[n] = "constexpr", 1
        elif n in ints:
            sig[n] = "i32"
            if ints[n] % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif n in floats:
            sig[n] = "fp32"
        else:
            sig[n] = (pointers or {}).get(n, "*bf16")
            attrs[(i,)] = [["tt.divisibility", 16]]
    ptx = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                         target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    return collections.Counter(re.findall(r"(?:ld\.global|cp\.async\.c[ag]\.shared\.global)[.\w]*", ptx))


def lla_launch(kernel: str, layout: str):
    """``ptx_loads``' arguments for one of LLA's kernels as its launchers call it for a stacked step at MAD's shape
    (B = 768 sequences, 16 heads of 8, T = 1024, λ per head), the heads handed over ``layout``: ``padded`` (B·H, T,
    16) copies, ``contiguous`` (B, H, T, 8), ``strided`` views of a (B, T, 3·128) projection."""
    import torch

    from mixzoo.kernels.lla import triton_lla as L
    B, H, T, D = 768, 16, 1024, 8
    meta = dict(device="meta", dtype=torch.bfloat16)
    if layout == "padded":
        q = k = v = g = torch.empty(1, B * H, T, 16, **meta)
        o, lam, d, h = q, torch.empty(1, B * H, T, device="meta"), 16, B * H
    else:
        if layout == "contiguous":
            q = k = v = torch.empty(B, H, T, D, **meta)
        else:
            q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in torch.empty(B, T, 3 * H * D, **meta).chunk(3, -1))
        g = torch.empty(B, T, H * D, **meta).view(B, T, H, D).transpose(1, 2)
        o = L._out_like(q, False)
        lam = L._ridge_rows(torch.empty(1, H, 1, device="meta"), B, H, T)
        d, h = D, H
    fn = {"fwd": L._lla_fwd, "bwd_q": L._lla_bwd_q, "bwd_kv": L._lla_bwd_kv}[kernel]
    vec, io = L._io_strides(*((q, k, v, o) if kernel == "fwd" else (q, k, v, g, o)))
    ints = dict(zip([n for n in fn.arg_names if n[:2] in ("sq", "sk", "sv", "sg", "so")], io))
    ints |= dict(zip(("sl_b", "sl_h", "sl_t"), L._strides(lam))) if kernel != "bwd_kv" else {}
    ints |= dict(T=T, NH=h, max_iter=48)
    consts = dict(D=16, BM=64, BN=64, PREC=1, DIN=d, VEC=vec)
    consts |= dict(JACOBI=False, DR=8, DIRECT=True) if kernel != "bwd_kv" else {}
    consts |= dict(STORE_Y=True, ONEPASS=True, STORE_C=True, STORE_M=True) if kernel == "fwd" else {}
    consts |= dict(LOAD_C=True, LOAD_M=True) if kernel == "bwd_q" else {}
    fp32 = {n: "*fp32" for n in fn.arg_names if n not in ("Q", "K", "V", "G", "OUT", "DQ", "DK", "DV")} | {"ITS": "*i32"}
    return fn, consts, ints, ("sc2", "tol2", "scale"), fp32


@pytest.mark.parametrize("kernel", ["fwd", "bwd_q", "bwd_kv"])
def test_lla_heads_of_8_load_in_vectors(kernel):
    """LLA's kernels read a head of 8 handed over contiguous per head, or as views of the projection, with the loads
    they use for the padded copies: rows of 16 bytes in one vector, pipelined through shared memory (cp.async). Passed
    as they are, strides of 8 are not known to keep rows 16-byte aligned (the launcher marks multiples of 16 only),
    and the compiler read each row element by element without cp.async (ld.global.b16), 0.84-0.89x the training step
    at length 1024 on an H200 and an H100 (benchmarks/calls-2026-12-06e); the strides now come in units of the rows'
    alignment (``triton_lla._io_strides``)."""
    def loads(layout):
        return ptx_loads(*lla_launch(kernel, layout))
    want = loads("padded")
    assert want and not any(".b16" in op or ".u16" in op for op in want), want
    for layout in ("contiguous", "strided"):
        assert loads(layout) == want, (layout, loads(layout), want)


def test_softmax_attention_aligned_strides_load_in_vectors(monkeypatch):
    """softmax's attention launch at MAD's heads of 8 (q, k contiguous per head from the rotation kernel, v a view of
    the (B, T, 384) projection) with ``MIXZOO_ATTN_STRIDES=aligned`` (the default) compiles its forward to the loads of
    rows known 16-byte aligned (16-byte vectors through cp.async), as for strides in multiples of 16; as they are
    (``plain``) the rows load element by element (benchmarks/ptx_loads.py)."""
    from mixzoo.kernels import attn as AT
    from mixzoo.kernels import attn_triton as A
    H, T, D = 16, 1024, 8
    names = ["sqb", "sqh", "sqt", "skb", "skh", "skt", "svb", "svh", "svt"]
    launch = (H * T * D, T * D, D, H * T * D, T * D, D, T * 3 * H * D, D, 3 * H * D)

    def loads(strides):
        vec, st = AT._strides(strides)
        consts = dict(D=D, DP=AT.padded_dim(D), BM=AT.TILES["fwd"][0], BN=AT.TILES["fwd"][1], VEC=vec)
        return ptx_loads(A._fwd_kernel, consts, dict(zip(names, st)) | dict(T=T, H=H), ("sc2",), {"LSE": "*fp32"})
    monkeypatch.setenv("MIXZOO_ATTN_STRIDES", "plain")
    plain = loads(launch)
    assert any(".b16" in op for op in plain), plain
    want = loads((H * T * 16, T * 16, 16) * 3)
    monkeypatch.delenv("MIXZOO_ATTN_STRIDES")          # the default
    assert loads(launch) == want and not any(".b16" in op for op in want), (loads(launch), want)
