"""mixzoo.kernels.ssd_intra: the within-chunk part of Mamba-2's SSD scan as Triton kernels, on the CPU
in Triton's interpreter with the H200's numerics: against float64 (output and every gradient); inside
``simple_gla_chunk`` against the step recurrence, with gradients against the PyTorch form's; a Mamba-2
layer (16 heads of 16, chunks of 64: the mad recipe's) stacked under vmap as one kernel call, the
numbers of a loop over the models. Off the GPU the PyTorch form runs, unchanged."""
import os

import pytest
import torch
from interp import run_interpreted

SCRIPT = r"""
from mixzoo.kernels import ssd_intra as S, ssd_intra_triton as Kt
from mixzoo.models._scan import simple_gla_chunk, simple_gla_recurrent
out = {"usable": S.usable(-1)}
gen = torch.Generator().manual_seed(1)
rel = lambda a, b: float((a.double() - b).norm() / b.norm())
for C, K, V in ((32, 64, 16), (16, 128, 32)):
    B, H, N = 2, 4, 2
    q, k = (torch.randn(B, N, C, K, generator=gen) * K ** -0.5 for _ in range(2))
    v = torch.randn(B, H, N, C, V, generator=gen)
    gc = (-torch.rand(B, H, N, C, generator=gen) * 0.3).cumsum(-1)
    ks = torch.rand(B, H, N, C, generator=gen) + 0.05
    do = torch.randn(B, H, N, C, V, generator=gen)
    ins = [t.double().requires_grad_() for t in (q, k, v, gc, ks)]
    want = S.intra_torch(*ins)
    wants = torch.autograd.grad(want, ins, do.double())
    x = [t.clone().requires_grad_() for t in (q, k, v, gc, ks)]
    y = S.intra(*x)
    y.backward(do)
    out[f"kernel C={C} K={K} V={V}"] = [rel(y, want.detach())] + [rel(a.grad, b) for a, b in zip(x, wants)]
# in simple_gla_chunk (Mamba-2's form: shared q, k; dt as the key scale), T = 100 at chunk 64: a padded chunk
B, H, T, K, V = 2, 3, 100, 16, 16
q1, k1 = torch.randn(B, 1, T, K, generator=gen), torch.randn(B, 1, T, K, generator=gen) * 0.3
v = torch.randn(B, H, T, V, generator=gen)
g = -torch.rand(B, H, T, generator=gen) * 0.5
dts = torch.rand(B, H, T, generator=gen) + 0.1
rec = simple_gla_recurrent(q1.expand(B, H, T, K), k1 * dts.unsqueeze(-1), v, g)
res = {}
for form, env in (("kernel", None), ("torch", "torch")):
    if env: os.environ["MIXZOO_SSD"] = env
    else: os.environ.pop("MIXZOO_SSD", None)
    xs = [t.clone().requires_grad_() for t in (q1, k1, v, g, dts)]
    o = simple_gla_chunk(xs[0], xs[1], xs[2], xs[3], chunk=64, k_scale=xs[4])
    o.square().sum().backward()
    res[form] = (o.detach(), [t.grad for t in xs])
os.environ.pop("MIXZOO_SSD", None)
out["chunk vs recurrence"] = [rel(res["kernel"][0], rec.double()), rel(res["torch"][0], rec.double())]
out["chunk grads vs torch form"] = [rel(a, b.double()) for a, b in zip(res["kernel"][1], res["torch"][1])]
# a Mamba-2 layer at the mad recipe's heads, stacked
from torch.func import functional_call, stack_module_state, vmap
from mixzoo.registry import build_mixer, get_mixer
from mixzoo.train.vmapfold import folding
calls = []
fwd = Kt.forward
Kt.forward = lambda *a: calls.append(list(a[2].shape)) or fwd(*a)
torch.manual_seed(0)
ms = [build_mixer(get_mixer("mamba"), 128, num_heads=16, layer_idx=0, l_max=64) for _ in range(2)]
params, bufs = stack_module_state(ms)
x = torch.randn(2, 2, 64, 128, generator=gen)
with folding():
    y = vmap(lambda p, b, xi: functional_call(ms[0], (p, b), (xi,)))(params, bufs, x)
n_folded = len(calls)
ref = torch.stack([m(xi) for m, xi in zip(ms, x)])
(gy,) = torch.autograd.grad(y.square().sum(), params["A_log"])
gr = torch.stack(torch.autograd.grad(ref.square().sum(), [m.A_log for m in ms]))
out["mamba"] = dict(backend=ms[0].backend, calls=calls[:n_folded], out=rel(y, ref.detach().double()),
                    dA_log=rel(gy, gr.double()))
print("RESULT", json.dumps(out))
"""


def test_ssd_intra_kernels_in_the_interpreter():
    """Full float32 products (``MIXZOO_SSD_DOT=ieee``) against float64 to float32's precision."""
    r = run_interpreted(SCRIPT, {"MIXZOO_SSD_DOT": "ieee"}, drop=("MIXZOO_SSD",))
    assert r["usable"] is True
    for case, errs in r.items():
        if case.startswith("kernel"):
            assert max(errs) < 1e-5, (case, errs)                  # float32 throughout against float64
    assert max(r["chunk vs recurrence"]) < 1e-5, r
    assert max(r["chunk grads vs torch form"]) < 1e-5, r
    m = r["mamba"]
    assert m["backend"] == "torch-chunk" and m["calls"] == [[4, 16, 1, 64, 16]], m   # 2 models x 2 sequences
    assert m["out"] < 1e-5 and m["dA_log"] < 1e-4, m


FORMS = r"""
from mixzoo.kernels import RAN, ssd_intra as S
from mixzoo.models._scan import simple_gla_chunk
out = {"form": S.form(), "usable": S.usable(-1)}
for f in ("ieee", "bf16"):
    out[f] = [errs for _, errs in S.errors_here(-1, f)]
gen = torch.Generator().manual_seed(2)
q, k = (torch.randn(1, 2, 32, 16, generator=gen) for _ in range(2))
v = torch.randn(1, 2, 2, 32, 16, generator=gen)
gc = (-torch.rand(1, 2, 2, 32, generator=gen) * 0.3).cumsum(-1)
ks = torch.rand(1, 2, 2, 32, generator=gen) + 0.05
RAN.clear()
x = [t.clone().requires_grad_() for t in (q, k, v, gc, ks)]
S.intra(*x).sum().backward()
out["ran"] = sorted(RAN)
# in simple_gla_chunk (Mamba-2's form, 2 chunks of 64), bf16 products against the PyTorch form in float64
B, H, T, K, V = 2, 3, 128, 64, 16
q1, k1 = torch.randn(B, 1, T, K, generator=gen) * K ** -0.5, torch.randn(B, 1, T, K, generator=gen) * K ** -0.5
vm = torch.randn(B, T, H, V, generator=gen)
g = -torch.rand(B, H, T, generator=gen) * 0.1
dts = torch.rand(B, H, T, generator=gen) + 0.1
res = {}
for form, env in (("bf16", None), ("f64", "torch")):
    if env: os.environ["MIXZOO_SSD"] = env
    xs = [t.clone().to(torch.float64 if env else torch.float32).requires_grad_() for t in (q1, k1, vm, g, dts)]
    o = simple_gla_chunk(xs[0], xs[1], xs[2].transpose(1, 2), xs[3], chunk=64, k_scale=xs[4])
    o.square().sum().backward()
    res[form] = [o.detach()] + [t.grad for t in xs]
rel = lambda a, b: float((a.double() - b).norm() / b.norm())
out["chunk bf16 vs float64"] = [rel(a, b) for a, b in zip(res["bf16"], res["f64"])]
print("RESULT", json.dumps(out))
"""


def test_bf16_products_within_bfloat16s_tolerance_of_float64():
    """The default form, bf16 (``MIXZOO_SSD_DOT`` unset): every product's operands rounded to bfloat16 for the
    tensor cores, accumulated in float32 (mamba-ssm's precision in bfloat16 training): the self-check's cases
    (chunks of 16 and 64, strided values) and Mamba-2's form inside simple_gla_chunk within bfloat16's tolerance of
    float64 for the output and every gradient, and measurably not float32's (the form is what runs); the device
    check runs in that form and a run records it."""
    r = run_interpreted(FORMS, drop=("MIXZOO_SSD", "MIXZOO_SSD_DOT"))
    assert r["form"] == "bf16" and r["usable"] is True, r
    for ieee, bf in zip(r["ieee"], r["bf16"]):
        assert max(ieee) < 1e-6, r["ieee"]
        assert 1e-4 < max(bf) < 2e-2, r["bf16"]
    assert r["ran"] == ["ssd_intra-bf16"], r
    assert max(r["chunk bf16 vs float64"]) < 2e-2, r["chunk bf16 vs float64"]


def test_a_wrong_product_form_is_refused_at_the_command_line(tmp_path, capsys, monkeypatch):
    from mixzoo.cli import main
    monkeypatch.setenv("MIXZOO_SSD_DOT", "tf32")
    assert main(["--results", str(tmp_path / "res"), "run", "mqar", "--preset", "demo", "--model", "mamba"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "MIXZOO_SSD_DOT='tf32'; allowed: bf16, ieee" in err, err
    assert not (tmp_path / "res").exists()


def test_off_the_gpu_the_pytorch_form_runs():
    from mixzoo.kernels import ssd_intra
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the interpreter is on in this process")
    q = torch.randn(2, 1, 64, 16)
    v = torch.randn(2, 3, 1, 64, 16)
    assert not ssd_intra.runs_on(q, v)


FRESH_STACKED = r"""
from mixzoo.models import RECIPES, ModelConfig
from mixzoo.tasks.mqar import MQAR
from mixzoo.train import TrainConfig
from mixzoo.train.stacked import train_stacked
task = MQAR(V=32, L=32, kv=2)     # small: the interpreter runs every kernel (the convolutions take most of it)
cfg = TrainConfig(steps=2, batch_size=2, eval_every=2, n_train=8, n_val=2, n_test=2, eval_batch_size=2, lr=1e-3)
res = train_stacked(task, "mamba", {}, ModelConfig(**RECIPES["mad"]), [cfg, cfg], [0, 1], device="cpu")
print("RESULT", json.dumps([[r.step_mode, r.kernels] for r in res]))
"""


def test_a_fresh_stacked_process_runs_every_kernel():
    """A fresh process whose first kernel call is inside a stacked (vmapped) step: each kernel's
    self-check runs in its own thread, so vmap there does not refuse its gradients (it did, and every
    kernel stayed off for the process)."""
    r = run_interpreted(FRESH_STACKED, drop=("MIXZOO_SSD", "MIXZOO_SSD_DOT", "MIXZOO_RMSNORM", "MIXZOO_SWIGLU",
                                             "MIXZOO_CONV", "MIXZOO_EAGER_KERNELS"))
    assert r == [["stacked", "causal_conv,rmsnorm,ssd_intra-bf16,swiglu"]] * 2, r
