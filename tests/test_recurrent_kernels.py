"""mixzoo.kernels.recurrent: the gated delta rule as a recurrent Triton scan at narrow heads (gdn's ``triton-rec``),
on the CPU in Triton's interpreter (a fresh process: the interpreter is switched on before triton is imported):
the kernels against the float64 step-by-step reference (output and every gradient), the reference against
``_scan``'s recurrence, the gdn layer on the kernels against its torch-chunk path, folded under vmap (K models'
sequences in one call), and the switch that turns it off."""
import pytest
import torch
from interp import run_interpreted

# the tilings the interpreted script runs beside the default (each must give its numbers bit for bit)
TILINGS = ((64, 1, False), (256, 1, True), (512, 2, False), (1024, 4, True))

SCRIPT = r"""
import torch.nn.functional as F
from mixzoo.kernels import recurrent as D, recurrent_triton as DT
from mixzoo.models._scan import gated_delta_recurrent
g = torch.Generator().manual_seed(0)
rel = lambda a, b: float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))
out = {"usable": D.usable(-1)}
# (B, T, H, DK, DV, dtype, l2): a partial head block (3 of 4), two blocks of 16 the last partial (20 heads),
# DK != DV without the norm, bf16
for B, T, H, DK, DV, dt, l2 in ((2, 37, 3, 8, 8, "float32", True), (1, 9, 20, 8, 8, "float32", True),
                                (2, 11, 2, 4, 8, "float32", False), (2, 23, 3, 8, 8, "bfloat16", True),
                                (1, 5, 2, 16, 16, "float32", True)):
    dt = getattr(torch, dt)
    q, k = (torch.randn(B, T, H, DK, generator=g) for _ in range(2))
    v = torch.randn(B, T, H, DV, generator=g)
    if not l2:
        k = F.normalize(k, dim=-1)
    gg = -torch.rand(B, T, H, generator=g) * 0.5
    beta = torch.rand(B, T, H, generator=g) * 2
    do = torch.randn(B, T, H, DV, generator=g)
    ins = [t.double().requires_grad_() for t in (q, k, v, gg, beta)]
    want = D.delta_rule_rec_torch(*ins, 0.35, l2)
    wants = torch.autograd.grad(want, ins, do.double())
    got_ins = [t.to(dt).requires_grad_() for t in (q, k, v)] + [t.clone().requires_grad_() for t in (gg, beta)]
    got = D.delta_rule_rec(*got_ins, 0.35, l2)
    gots = torch.autograd.grad(got, got_ins, do.to(dt))
    with torch.no_grad():
        inference = D.delta_rule_rec(*got_ins, 0.35, l2)
    # strided inputs (q, k, v as views of one projection, as the layer hands them) give the same numbers
    qkv = torch.cat([q, k, v], -1).to(dt)
    strided = D.delta_rule_rec(qkv[..., :DK], qkv[..., DK:2 * DK], qkv[..., 2 * DK:], gg, beta, 0.35, l2)
    out[str((B, T, H, DK, DV, str(dt), l2))] = dict(
        tol=2e-2 if dt == torch.bfloat16 else 1e-5, dtypes=[str(t.dtype) for t in (got, *gots)],
        errs=[rel(a, r) for a, r in zip((got, *gots), (want, *wants))],
        inference=float((inference - got).abs().max()), strided=float((strided - got).abs().max()))
    # GLA at the same sizes (no norm; log-decays per key dimension)
    gk = -torch.rand(B, T, H, DK, generator=g) * 0.5
    ins = [t.double().requires_grad_() for t in (q, k, v, gk)]
    want = D.gla_rec_torch(*ins, 0.35)
    wants = torch.autograd.grad(want, ins, do.double())
    got_ins = [t.to(dt).requires_grad_() for t in (q, k, v)] + [gk.clone().requires_grad_()]
    got = D.gla_rec(*got_ins, 0.35)
    gots = torch.autograd.grad(got, got_ins, do.to(dt))
    with torch.no_grad():
        inference = D.gla_rec(*got_ins, 0.35)
    out["gla " + str((B, T, H, DK, DV, str(dt)))] = dict(
        tol=2e-2 if dt == torch.bfloat16 else 1e-5, dtypes=[str(t.dtype) for t in (got, *gots)],
        errs=[rel(a, r) for a, r in zip((got, *gots), (want, *wants))],
        inference=float((inference - got).abs().max()), strided=0.0)
# tilings (heads and warps a program, the next position's loads issued a step early or not;
# benchmarks/recurrent_tiles.py) give the default's numbers: 5 heads in blocks of 1, 4 and 8 (the last partial)
q, k, v = (torch.randn(2, 13, 5, 8, generator=g) for _ in range(3))
gg, beta, gk = -torch.rand(2, 13, 5, generator=g), torch.rand(2, 13, 5, generator=g), -torch.rand(2, 13, 5, 8, generator=g)
do = torch.randn(2, 13, 5, 8, generator=g)

def both(tiles):
    o, st = DT.delta_forward(q, k, v, gg, beta, 0.3, 1e-6, True, True, tiles)
    o2, st2 = DT.gla_forward(q, k, v, gk, 0.3, True, tiles)
    return [o, *DT.delta_backward(q, k, v, gg, beta, st, do, 0.3, 1e-6, True, tiles), o2,
            *DT.gla_backward(q, k, v, gk, st2, do, 0.3, tiles)]
base = both(None)
out["tilings"] = {str(t): max(float((a - b).abs().max()) for a, b in zip(both(t), base))
                  for t in TILINGS}
# the reference against _scan's recurrence ((B, H, T, D) layout, q and k normalized outside)
q, k, v = (torch.randn(2, 30, 3, 8, generator=g, dtype=torch.float64) for _ in range(3))
gg, beta = -torch.rand(2, 30, 3, generator=g, dtype=torch.float64), torch.rand(2, 30, 3, generator=g, dtype=torch.float64)
tt = lambda x: x.transpose(1, 2)
out["vs_scan"] = float((D.delta_rule_rec_torch(q, k, v, gg, beta, 0.3) - tt(gated_delta_recurrent(
    tt(F.normalize(q, dim=-1)), tt(F.normalize(k, dim=-1)), tt(v), tt(gg), tt(beta), scale=0.3))).abs().max())

from mixzoo.models._fla import naive
fla_gla = naive("gla", "naive_recurrent_gla")
gk = -torch.rand(2, 30, 3, 8, generator=g, dtype=torch.float64)
out["gla_vs_fla"] = None if fla_gla is None else float(
    (D.gla_rec_torch(q, k, v, gk, 8 ** -0.5) - fla_gla(q, k, v, gk)[0]).abs().max())     # both (B, T, H, D)

# the layers (4 heads: gdn's of 8, GLA's keys of 4 and values of 8) on the kernels against their PyTorch paths (gdn's
# torch-chunk, GLA's fla's reference), float32; then the switch that turns the scan off (fla needs a GPU)
from mixzoo.registry import build_mixer, get_mixer

def layers(name, switch, **knobs):
    torch.manual_seed(0)
    m = build_mixer(get_mixer(name), 32, num_heads=4, layer_idx=0, l_max=40, **knobs)
    ref = build_mixer(get_mixer(name), 32, num_heads=4, layer_idx=0, l_max=40, backend="torch", **knobs)
    ref.load_state_dict(m.state_dict())
    x = torch.randn(2, 40, 32, generator=g)
    res = {}
    for key, mod in (("rec", m), ("ref", ref)):
        xx = x.clone().requires_grad_()
        y = mod(xx)
        res[key] = (mod.backend, y, torch.autograd.grad(y.square().sum(), [xx, *mod.parameters()]))
    os.environ[switch] = "fla"
    m(x)
    os.environ.pop(switch)
    return dict(backends=[res["rec"][0], res["ref"][0]], out=rel(res["rec"][1], res["ref"][1]),
                grads=max(rel(a, b) for a, b in zip(res["rec"][2], res["ref"][2])), switched=m.backend)
for neg in (False, True):       # β in [0, 1] and [0, 2]
    out[f"layer neg={neg}"] = layers("gdn", "MIXZOO_GDN", allow_neg_eigval=neg)
if fla_gla is not None:
    out["gla layer"] = layers("gla", "MIXZOO_GLA_CORE")

# stacked: 3 models under vmap, the op folded into one call of 3 x 2 sequences
from torch.func import functional_call, stack_module_state, vmap
from mixzoo.train.vmapfold import folding

def stacked(name, entry):
    calls = []
    fwd = getattr(DT, entry)
    setattr(DT, entry, lambda q, *a: calls.append(list(q.shape)) or fwd(q, *a))
    ms = [build_mixer(get_mixer(name), 32, num_heads=4, layer_idx=0, l_max=12) for _ in range(3)]
    params, bufs = stack_module_state(ms)
    x = torch.randn(3, 2, 12, 32, generator=g).requires_grad_()
    with folding():
        y = vmap(lambda p, b, xi: functional_call(ms[0], (p, b), (xi,)))(params, bufs, x)
    n_folded = len(calls)
    got = torch.autograd.grad(y.square().sum(), [x, *params.values()])
    ref = torch.stack([mm(xi) for mm, xi in zip(ms, x)])
    want = torch.autograd.grad(ref.square().sum(), [x, *[p for mm in ms for p in mm.parameters()]])
    nparam = len(params)
    want = [want[0]] + [torch.stack(want[1 + i::nparam]) for i in range(nparam)]
    setattr(DT, entry, fwd)
    return dict(calls=calls[:n_folded], backend=ms[0].backend, out=rel(y, ref),
                grads=max(rel(a, b) for a, b in zip(got, want)))
out["vmap"] = stacked("gdn", "delta_forward")
if fla_gla is not None:                     # GLA's scan folded likewise
    out["gla vmap"] = stacked("gla", "gla_forward")
print("RESULT", json.dumps(out))
""".replace("TILINGS", repr(TILINGS))


def test_recurrent_scan_kernels():
    r = run_interpreted(SCRIPT, drop=("MIXZOO_GDN",))
    assert r.pop("usable") is True
    assert r.pop("tilings") == {str(t): 0.0 for t in TILINGS}
    assert r.pop("vs_scan") < 1e-6
    v = r.pop("vmap")
    assert v["calls"] == [[6, 12, 4, 8]] and v["backend"] == "triton-rec", v   # 3 models' 2 sequences, one call
    assert v["out"] < 1e-5 and v["grads"] < 1e-4, v
    gla_vs_fla = r.pop("gla_vs_fla")
    if gla_vs_fla is None:
        pytest.skip("fla not installed: GLA's reference path")
    assert gla_vs_fla < 1e-5                                  # fla computes in float32
    v = r.pop("gla vmap")
    assert v["calls"] == [[6, 12, 4, 4]] and v["backend"] == "triton-rec", v
    assert v["out"] < 1e-5 and v["grads"] < 1e-4, v
    lay = r.pop("gla layer")
    assert lay["backends"] == ["triton-rec", "torch-recurrent"], lay
    assert lay["out"] < 1e-5 and lay["grads"] < 1e-4, lay
    assert lay["switched"] == "torch-recurrent", lay           # MIXZOO_GLA_CORE=fla: off the kernels
    for neg in (False, True):
        lay = r.pop(f"layer neg={neg}")
        assert lay["backends"] == ["triton-rec", "torch-chunk"], lay
        assert lay["out"] < 1e-5 and lay["grads"] < 1e-4, lay
        assert lay["switched"] == "torch-chunk", lay           # MIXZOO_GDN=fla: off the kernels
    assert len(r) == 10, sorted(r)
    for case, res in r.items():
        assert max(res["errs"]) <= res["tol"], (case, res)
        assert res["inference"] == 0.0 and res["strided"] == 0.0, (case, res)
        dt = "torch.bfloat16" if "bfloat16" in case else "torch.float32"
        n_f32 = 1 if case.startswith("gla") else 2               # GLA's dg; the delta rule's dg and dβ
        assert res["dtypes"] == [dt] * 4 + ["torch.float32"] * n_f32, (case, res)


def test_off_the_gpu_gdn_keeps_its_pytorch_path():
    import os
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the interpreter is on in this process")
    from mixzoo.registry import build_mixer, get_mixer
    m = build_mixer(get_mixer("gdn"), 32, num_heads=4, layer_idx=0, l_max=16)
    m(torch.randn(1, 16, 32))
    assert m.backend == "torch-chunk"
