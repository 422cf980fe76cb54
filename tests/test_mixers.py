"""The built-in mechanisms: contract checks, references against oracles, functional cores."""
from __future__ import annotations

import copy
import sys

import pytest
import torch

from mixzoo.check import check_mixer
from mixzoo.registry import mixers

BUILTINS = ["lla", "parallax", "softmax", "mesa", "gdn", "mamba", "gla", "hyena", "linear"]


def test_every_builtin_is_registered_with_search_space_and_state():
    reg = mixers()
    for name in BUILTINS:
        spec = reg[name]
        kind, lo, hi = spec.search_space["lr"]
        assert kind == "log" and lo <= 1e-4 and hi >= 1e-2
        m = spec.cls(32, num_heads=2, layer_idx=0)
        assert m.state_size(64) > 0 and sum(p.numel() for p in m.parameters()) > 0
    for name in ["softmax", "linear", "lla", "mesa", "gdn"]:
        assert reg[name].core is not None and reg[name].core_grid


@pytest.mark.parametrize("name,knobs", [(n, {}) for n in BUILTINS] + [
    ("gdn", {"allow_neg_eigval": True}), ("mamba", {"allow_neg_eigval": True}),
    ("mamba", {"version": 1}), ("mamba", {"version": 1, "allow_neg_eigval": True})])
def test_builtin_passes_check_mixer(name, knobs):
    results = check_mixer(name, knobs=knobs, seq_len=33, d_model=32)
    assert {r.check for r in results} >= {"build", "forward", "causal", "gradients", "deterministic", "train"}
    assert all(r.ok for r in results), [r for r in results if not r.ok]


def test_no_fla_package_import_on_cpu_paths():
    """Every built-in's CPU forward runs without importing the fla package (a fresh process:
    other tests import fla on purpose)."""
    import subprocess
    code = ("import sys, torch\nfrom mixzoo.registry import mixers\n"
            f"for name in {BUILTINS!r}:\n"
            "    mixers()[name].cls(32, num_heads=2)(torch.randn(1, 9, 32))\n"
            "print('fla' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_parallax_with_zero_wr_is_softmax_attention():
    from mixzoo.models.parallax import Parallax
    from mixzoo.models.softmax import SoftmaxAttention
    torch.manual_seed(0)
    p, s = Parallax(32, num_heads=2), SoftmaxAttention(32, num_heads=2)
    s.qkv.load_state_dict(p.qkv.state_dict())
    s.out.load_state_dict(p.out.state_dict())
    x = torch.randn(2, 33, 32)
    assert (p(x) - s(x)).abs().max() > 1e-3              # W_R != 0: a different map
    with torch.no_grad():
        p.r_proj.weight.zero_()
    torch.testing.assert_close(p(x), s(x), atol=1e-5, rtol=1e-5)


def test_parallax_reference_matches_fla_naive():
    from mixzoo.models._fla import naive
    from mixzoo.models.parallax import parallax_reference
    ref = naive("parallax", "naive_parallax")
    if ref is None:
        pytest.skip("fla not installed")
    q, r, k, v = torch.randn(4, 2, 2, 19, 8, dtype=torch.float64)
    tt = lambda t: t.transpose(1, 2)
    want = tt(ref(tt(q), tt(r), tt(k), tt(v)))
    torch.testing.assert_close(parallax_reference(q, r, k, v), want.to(torch.float64), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("chunk", [4, 16, 32, 64])     # 10, 3, 2 and 1 chunks of T = 37
def test_chunked_scans_match_step_recurrences(chunk):
    from mixzoo.models._scan import gated_delta_chunk, gated_delta_recurrent, simple_gla_chunk, simple_gla_recurrent
    g0 = torch.Generator().manual_seed(0)
    B, H, T, K, V = 2, 2, 37, 8, 6
    q, k = torch.randn(B, H, T, K, generator=g0), torch.randn(B, H, T, K, generator=g0)
    k = torch.nn.functional.normalize(k, dim=-1)
    v = torch.randn(B, H, T, V, generator=g0)
    g = -torch.rand(B, H, T, generator=g0) * 0.5
    beta = 2 * torch.rand(B, H, T, generator=g0)                       # negative eigenvalues too
    neg = torch.rand(B, H, T, generator=g0) < 0.3
    torch.testing.assert_close(simple_gla_chunk(q, k, v, g, chunk=chunk), simple_gla_recurrent(q, k, v, g),
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(simple_gla_chunk(q, k, v, g, neg=neg, chunk=chunk),
                               simple_gla_recurrent(q, k, v, g, neg=neg), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gated_delta_chunk(q, k, v, g, beta, chunk=chunk),
                               gated_delta_recurrent(q, k, v, g, beta), atol=1e-4, rtol=1e-4)
    # Mamba-2's SSD form: q and k shared by the heads, the per-head dt as a key scale
    q1, k1 = q[:, :1], k[:, :1]
    dts = torch.rand(B, H, T, generator=g0) + 0.1
    want = simple_gla_recurrent(q1.expand(B, H, T, K), k1 * dts.unsqueeze(-1), v, g, neg=neg)
    torch.testing.assert_close(simple_gla_chunk(q1, k1, v, g, neg=neg, chunk=chunk, k_scale=dts), want,
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(simple_gla_chunk(q1, k1, v, g, chunk=chunk, k_scale=dts),
                               simple_gla_recurrent(q1.expand(B, H, T, K), k1 * dts.unsqueeze(-1), v, g),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("T", [37, 64, 200])           # padded; one chunk; 4 chunks of 64
def test_ssd_form_gradients_match_the_per_head_form(T):
    """Mamba-2's SSD form (q, k shared by the heads, values a view of (B, T, H, V) memory, states carried
    by ``carry_states``) against the general per-head form with k scaled per head: output and every
    gradient in float64, chunks of 16 and 64."""
    from mixzoo.models._scan import simple_gla_chunk
    g0 = torch.Generator().manual_seed(1)
    B, H, K, V = 2, 3, 8, 5
    f64 = dict(dtype=torch.float64)
    q1, k1 = torch.randn(B, 1, T, K, generator=g0, **f64), torch.randn(B, 1, T, K, generator=g0, **f64) * 0.3
    vm = torch.randn(B, T, H, V, generator=g0, **f64)
    g = -torch.rand(B, H, T, generator=g0, **f64) * 0.5
    dts = torch.rand(B, H, T, generator=g0, **f64) + 0.1
    for chunk in (16, 64):
        outs = []
        for ssd in (True, False):
            xs = [t.clone().requires_grad_() for t in (q1, k1, vm, g, dts)]
            q, k = (xs[0], xs[1]) if ssd else (xs[0].expand(B, H, T, K), xs[1] * xs[4].unsqueeze(-1))
            o = simple_gla_chunk(q, k, xs[2].transpose(1, 2), xs[3], chunk=chunk, k_scale=xs[4] if ssd else None)
            outs.append([o, *torch.autograd.grad((o * o.sin()).sum(), xs)])
        for a, b in zip(*outs):
            torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


def test_carry_states_gradient_and_vmap():
    """``carry_states``' hand-written gradient (torch.autograd.gradcheck, float64) and its loop form under
    vmap against a loop over the batch."""
    from torch.func import vmap

    from mixzoo.models._scan import _CarryStates, carry_states
    g0 = torch.Generator().manual_seed(2)
    for M in (1, 2, 5):
        st = torch.randn(2, M, 3, 2, 4, generator=g0, dtype=torch.float64, requires_grad=True)
        d = torch.rand(2, M, 1, 2, 1, generator=g0, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(_CarryStates.apply, (st, d))
        E = carry_states(st, d)
        assert E.shape == (2, M + 1, 3, 2, 4) and not E[:, 0].any()
        torch.testing.assert_close(E[:, -1], (E[:, -2] * d[:, -1] + st[:, -1]) if M > 1 else st[:, 0])
    st, d = torch.randn(3, 2, 4, 3, 2, 5, generator=g0), torch.rand(3, 2, 4, 1, 2, 1, generator=g0)
    torch.testing.assert_close(vmap(carry_states)(st, d), torch.stack([carry_states(a, b) for a, b in zip(st, d)]))


def test_stacked_mamba_carries_states_in_one_folded_call(monkeypatch):
    """Under stacking (vmap with mixzoo.train.vmapfold's folding) Mamba-2's states between chunks are carried
    by one call for the K models (folded into the batch), and the numbers are those of a loop over the models."""
    from torch.func import functional_call, stack_module_state, vmap

    from mixzoo.models import _scan
    from mixzoo.registry import build_mixer, get_mixer
    from mixzoo.train.vmapfold import folding
    calls = []
    apply = _scan._CarryStates.apply
    monkeypatch.setattr(_scan._CarryStates, "apply", lambda *a: calls.append(tuple(a[0].shape)) or apply(*a))
    torch.manual_seed(0)
    ms = [build_mixer(get_mixer("mamba"), 64, num_heads=8, layer_idx=0, l_max=192) for _ in range(2)]
    params, bufs = stack_module_state(ms)
    x = torch.randn(2, 2, 192, 64)
    with folding():
        y = vmap(lambda p, b, xi: functional_call(ms[0], (p, b), (xi,)))(params, bufs, x)
    assert calls == [(4, 2, 64, 8, 16)], calls         # 2 models x 2 sequences; states of chunks 0 and 1
    ref = torch.stack([m(xi) for m, xi in zip(ms, x)])
    torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-5)
    (gy,) = torch.autograd.grad(y.square().sum(), params["A_log"])
    gr = torch.stack(torch.autograd.grad(ref.square().sum(), [m.A_log for m in ms]))
    torch.testing.assert_close(gy, gr, atol=1e-5, rtol=1e-4)


def test_gated_delta_chunk_float32_stable_with_correlated_keys():
    """Keys that point nearly the same way (mean k_t·k_s ~ 0.9, as a short convolution of a
    slowly varying input gives) make the chunk's triangular system ill-suited to series
    inversion; the float32 chunk path must still match float64, values and gradients, at the
    chunk sizes used (β up to 2: negative eigenvalues)."""
    from mixzoo.models._scan import gated_delta_chunk
    g0 = torch.Generator().manual_seed(1)
    B, H, T, K, V = 1, 2, 160, 16, 8
    k = torch.nn.functional.normalize(torch.randn(K, generator=g0) + 0.3 * torch.randn(B, H, T, K, generator=g0), dim=-1)
    assert (k[0, 0] @ k[0, 0].T).mean() > 0.8
    q = torch.nn.functional.normalize(torch.randn(B, H, T, K, generator=g0), dim=-1)
    v = torch.randn(B, H, T, V, generator=g0)
    g = -torch.rand(B, H, T, generator=g0) * 0.01
    beta = 2 * torch.rand(B, H, T, generator=g0)
    w = torch.randn(B, H, T, V, generator=g0, dtype=torch.float64)

    def run(dtype, chunk):
        xs = [t.to(dtype).clone().requires_grad_() for t in (q, k, v, g, beta)]
        o = gated_delta_chunk(*xs, chunk=chunk)
        (o.double() * w).sum().backward()
        return [o.detach().double()] + [x.grad.double() for x in xs]

    ref = run(torch.float64, 16)
    for chunk in (64, 128):
        for name, a, b in zip(("o", "dq", "dk", "dv", "dg", "dbeta"), run(torch.float32, chunk), ref):
            err = ((a - b).norm() / b.norm()).item()
            assert err < 1e-4, f"chunk {chunk} {name}: relative error {err:.1e}"


def test_gated_delta_chunk_matches_fla_reference():
    from mixzoo.models._fla import naive
    from mixzoo.models._scan import gated_delta_chunk
    ref = naive("gated_delta_rule", "naive_recurrent_gated_delta_rule")
    if ref is None:
        pytest.skip("fla not installed")
    B, T, H, K = 2, 70, 2, 8
    q, k, v = (torch.randn(B, T, H, K) for _ in range(3))
    k = torch.nn.functional.normalize(k, dim=-1)
    g, beta = -torch.rand(B, T, H) * 0.2, torch.rand(B, T, H)
    want, _ = ref(q=q, k=k, v=v, beta=beta, g=g, scale=K ** -0.5)
    tt = lambda t: t.transpose(1, 2)
    got = tt(gated_delta_chunk(tt(q), tt(k), tt(v), tt(g), tt(beta), scale=K ** -0.5))
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_mesa_exact_matches_fla_reference():
    from mixzoo.models._fla import naive
    from mixzoo.models.mesa import mesa_exact
    ref = naive("mesa_net", "naive_mesa_net_exact")
    if ref is None:
        pytest.skip("fla not installed")
    B, H, T, D = 2, 2, 70, 8
    q, k, v = (torch.nn.functional.normalize(torch.randn(B, H, T, D), dim=-1) for _ in range(3))
    g, beta, lamb = -torch.rand(B, H, T) * 0.3, torch.rand(B, H, T), torch.rand(H, D) + 0.3
    tt = lambda t: t.transpose(1, 2)
    want, _, _ = ref(tt(q), tt(k), tt(v), g=tt(g), lamb=lamb, beta=tt(beta))
    torch.testing.assert_close(mesa_exact(q, k, v, g, beta, lamb), tt(want), atol=1e-4, rtol=1e-4)


def _mesa_with_stand_in(seen):
    """The mesa layer (width 32 in 4 heads, float64) on the torch-exact path, and the same weights on the fla
    path with a stand-in for fla's op that does what its l2norm flag says and reads out exactly; ``seen`` gets
    (q's shape, the flag, q's norms) of each call."""
    import torch.nn.functional as F

    from mixzoo.models.mesa import mesa_exact
    from mixzoo.registry import build_mixer, get_mixer

    def fla_stand_in(q, k, v, g, beta, lamb, max_CG_iteration, use_qk_l2norm_in_kernel=False):
        seen.append((tuple(q.shape), use_qk_l2norm_in_kernel, q.norm(dim=-1)))
        if use_qk_l2norm_in_kernel:
            q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        tt = lambda t: t.transpose(1, 2)
        return tt(mesa_exact(tt(q), tt(k), tt(v), tt(g), tt(beta), lamb)), None, None

    def build(backend):
        torch.manual_seed(0)
        return build_mixer(get_mixer("mesa"), 32, num_heads=4, layer_idx=0, l_max=37, backend=backend).double()
    ref, fast = build("torch"), build("auto")
    fast._fast = lambda x: fla_stand_in
    return ref, fast


@pytest.mark.parametrize("switch", [None, "fla", "torch"])
def test_mesa_fast_path_hands_fla_unnormalized_q_k_and_asks_it_to_normalize(switch, monkeypatch):
    """By default (and with MIXZOO_MESA_L2NORM=fla) the fla path passes q and k as they come from the
    convolution, padded, with use_qk_l2norm_in_kernel=True (fla normalizes them inside the call); with
    MIXZOO_MESA_L2NORM=torch normalized before the call, with the flag off. With a stand-in for fla's op
    that does what its flag says and reads out exactly, the layer equals the torch-exact path either way,
    values and gradients, at a head of 8 padded to 16 (MIXZOO_FLA_PAD=16) and a length padded to 64."""
    monkeypatch.setenv("MIXZOO_FLA_PAD", "16")
    if switch:
        monkeypatch.setenv("MIXZOO_MESA_L2NORM", switch)
    else:
        monkeypatch.delenv("MIXZOO_MESA_L2NORM", raising=False)
    seen = []
    ref, fast = _mesa_with_stand_in(seen)
    x = torch.randn(2, 37, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    xs = [x.clone().requires_grad_() for _ in range(2)]
    ys = [m(xi) for m, xi in zip((ref, fast), xs)]
    in_call = switch != "torch"
    assert (ref.backend, fast.backend) == ("torch-exact", "fla-chunk" + ("+fla-l2norm" if in_call else ""))
    (shape, flag, norms), = seen
    assert shape == (2, 64, 4, 16) and flag == in_call
    off = (norms[:, :37] - 1).abs().max()
    assert off > 1e-2 if in_call else off < 1e-12          # normalized by fla inside the call, or before it
    torch.testing.assert_close(ys[1], ys[0], atol=1e-10, rtol=1e-8)
    w = torch.randn_like(ys[0])
    gs = [torch.autograd.grad((y * w).sum(), [xi, *m.parameters()]) for y, xi, m in zip(ys, xs, (ref, fast))]
    for a, b in zip(gs[1], gs[0]):        # the layer computes its gates in float32 (.float()): 1e-7 apart
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_cores_match_their_definitions():
    from mixzoo.models.gdn import gdn_core
    from mixzoo.models.linear import linear_core
    from mixzoo.models.mesa import mesa_core
    g0 = torch.Generator().manual_seed(1)
    T, D = 12, 4
    q, k, v = (torch.randn(T, D, generator=g0, dtype=torch.float64) for _ in range(3))
    lam, gam, beta = 0.5, 0.9, 0.7
    S = torch.zeros(D, D, dtype=torch.float64)
    for i in range(T):
        w = torch.tensor([gam ** (i - j) for j in range(i + 1)], dtype=torch.float64)
        kk = (w[:, None, None] * k[: i + 1, :, None] * k[: i + 1, None, :]).sum(0)
        vk = (w[:, None, None] * v[: i + 1, :, None] * k[: i + 1, None, :]).sum(0)
        want = vk @ torch.linalg.solve(kk + lam * torch.eye(D, dtype=torch.float64), q[i])
        torch.testing.assert_close(mesa_core(q, k, v, ridge=lam, decay=gam)[i], want)
        torch.testing.assert_close(linear_core(q, k, v)[i], (v[: i + 1].T @ k[: i + 1]) @ q[i])
        S = gam * S
        S = S + beta / k[i].dot(k[i]) * torch.outer(v[i] - S @ k[i], k[i])
        torch.testing.assert_close(gdn_core(q, k, v, beta=beta, decay=gam)[i], S @ q[i])


def test_hyena_direct_and_fft_convolutions_agree():
    """The Toeplitz product and the FFT convolution are the same causal sums, with the same gradients:
    both equal the sums written out in float64, to their float32 rounding."""
    from mixzoo.models.hyena import direct_causal_conv, fft_causal_conv
    g0 = torch.Generator().manual_seed(0)
    for T in (1, 7, 64):
        u = torch.randn(3, 5, T, generator=g0, dtype=torch.float64, requires_grad=True)
        h = torch.randn(5, T, generator=g0, dtype=torch.float64, requires_grad=True)
        want = torch.stack([sum(h[:, t - s] * u[..., s] for s in range(t + 1)) for t in range(T)], -1)
        for fn in (direct_causal_conv, fft_causal_conv):
            got = fn(u.double(), h.double()).double()
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        dy = torch.randn(3, 5, T, generator=g0, dtype=torch.float64)
        g1 = torch.autograd.grad(direct_causal_conv(u, h), (u, h), dy)
        g2 = torch.autograd.grad(want, (u, h), dy)
        for a, b in zip(g1, g2):
            torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-5)


def test_hyena_path_switch_picks_the_convolution_by_length(monkeypatch):
    """MIXZOO_HYENA_PATH: Toeplitz products up to DIRECT_MAX_LEN and FFTs beyond by default; ``fft`` and ``toeplitz``
    take one path at every length (to time them against each other), and the layer reports what it ran."""
    from mixzoo.models.hyena import DIRECT_MAX_LEN, Hyena, direct
    for path, short, long in ((None, True, False), ("by-length", True, False), ("fft", False, False),
                              ("toeplitz", True, True)):
        if path is None:
            monkeypatch.delenv("MIXZOO_HYENA_PATH", raising=False)
        else:
            monkeypatch.setenv("MIXZOO_HYENA_PATH", path)
        assert (direct(DIRECT_MAX_LEN), direct(DIRECT_MAX_LEN + 1)) == (short, long)
    m = Hyena(8, filter_width=8)
    m(torch.randn(1, DIRECT_MAX_LEN + 4, 8))
    assert m.backend == "torch-toeplitz"


def test_hyena_in_float64_is_a_float64_reference():
    """A float64 Hyena (the GPU tests' reference) computes its filters and convolutions in float64 on both paths
    (Toeplitz at 200, FFT at 300), within float32 rounding of the float32 layer."""
    from mixzoo.models.hyena import Hyena
    torch.manual_seed(0)
    m = Hyena(16)
    md = copy.deepcopy(m).double()
    for T in (200, 300):
        x = torch.randn(2, T, 16, generator=torch.Generator().manual_seed(T))
        with torch.no_grad():
            y, yd = m(x), md(x.double())
        assert yd.dtype == torch.float64 and md.filter(T, x.device).dtype == torch.float64
        assert float((y.double() - yd).norm() / yd.norm()) < 1e-5


def test_hyena_is_causal_and_length_consistent_at_long_length():
    from mixzoo.models.hyena import Hyena
    torch.manual_seed(0)
    m = Hyena(16, num_heads=2)
    x = torch.randn(1, 300, 16)
    with torch.no_grad():
        y = m(x)
        x2 = x.clone()
        x2[:, 150:] = torch.randn(1, 150, 16) * 5
        assert (m(x2)[:, :150] - y[:, :150]).abs().max() < 1e-4
        assert (m(x[:, :40]) - y[:, :40]).abs().max() < 1e-4


def test_mamba_negative_option_gives_signed_transitions():
    from mixzoo.models.mamba import _signed
    log_a = torch.log(torch.tensor([0.1, 0.5, 0.9]))
    mag, neg = _signed(log_a, True)
    signed = torch.where(neg, -mag.exp(), mag.exp())
    torch.testing.assert_close(signed, 2 * log_a.exp() - 1, atol=1e-5, rtol=0)
    assert neg.tolist() == [True, False, False]


def test_mesa_core_decayed_prefix_matches_the_quadratic_form():
    from mixzoo.models.mesa import mesa_core
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 150, 8, generator=g, dtype=torch.float64) for _ in range(3))
    T = q.shape[-2]
    i = torch.arange(T, dtype=q.dtype)
    lag = i[:, None] - i[None, :]
    for decay in (1.0, 0.99, 0.9):
        w = torch.where(lag >= 0, decay ** lag.clamp_min(0), torch.zeros_like(lag))
        hkk = torch.einsum("ij,...jd,...je->...ide", w, k, k) + 0.1 * torch.eye(8, dtype=q.dtype)
        hvk = torch.einsum("ij,...jd,...je->...ide", w, v, k)
        ref = (hvk @ torch.linalg.solve(hkk, q.unsqueeze(-1))).squeeze(-1)
        assert torch.allclose(mesa_core(q, k, v, ridge=0.1, decay=decay), ref, atol=1e-10)


def test_lla_precision_level_without_per_step_device_reads(monkeypatch):
    """The kernel's precision level: for a fixed ridge computed once per change of the stored
    value; for a learned ridge from the previous step's min λ (halved), never read synchronously
    after the first step."""
    pytest.importorskip("triton")
    import math

    from mixzoo.kernels.lla import triton_lla
    from mixzoo.models.lla import MIN_LEARNED_RIDGE, LocalLinearAttention
    calls = []
    real = triton_lla.precision_level
    monkeypatch.setattr(triton_lla, "precision_level", lambda x: calls.append(x) or real(x))

    m = LocalLinearAttention(16, num_heads=2, ridge=0.5)
    assert m.precision(m.ridge()) == real(0.5) and m.precision(m.ridge()) == real(0.5)
    assert len(calls) == 1                                   # cached while the ridge is unchanged
    with torch.no_grad():
        m.ridge_raw.fill_(math.log(math.expm1(20.0)))        # e.g. a loaded checkpoint
    assert m.precision(m.ridge()) == real(20.0) == 0 and len(calls) == 2

    m = LocalLinearAttention(16, num_heads=2, ridge=20.0, learn_ridge=True)
    assert m.precision(m.ridge()) == real(10.0)              # first step: halved margin
    with torch.no_grad():
        m.ridge_raw.fill_(-20.0)                             # λ -> floor
    assert float(m.ridge().min()) == pytest.approx(MIN_LEARNED_RIDGE)
    assert m.precision(m.ridge()) == real(10.0)              # one step behind
    assert m.precision(m.ridge()) == real(0.5 * MIN_LEARNED_RIDGE) == 3




def test_mixzoo_sdpa_switch(monkeypatch, capsys):
    from mixzoo.cli import main
    from mixzoo.kernels import SDPA_BACKENDS
    from mixzoo.models.softmax import SoftmaxAttention
    torch.manual_seed(0)
    x = torch.randn(2, 9, 32)
    m = SoftmaxAttention(32, num_heads=2)
    ref = m(x)
    for b in SDPA_BACKENDS:             # off the GPU the switch is not read: PyTorch's own choice
        monkeypatch.setenv("MIXZOO_SDPA", b)
        assert torch.equal(m(x), ref)
    monkeypatch.setenv("MIXZOO_SDPA", "fast")           # bad input: one line, exit code 2, before any command
    assert main(["reproduce", "--list"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["mixzoo: error: MIXZOO_SDPA='fast'; allowed: flash, efficient, cudnn, math (or unset)"], err


def test_mesa_cg_steps_by_head_width():
    from mixzoo.models.mesa import MesaNet, default_cg_steps
    assert MesaNet(128, num_heads=16).cg == default_cg_steps(8) == 10          # the mad recipe's heads of 8
    assert MesaNet(32, num_heads=2).cg == default_cg_steps(16) == 10
    assert MesaNet(128, num_heads=2).cg == default_cg_steps(64) == 30          # fla's own count above 16
    assert MesaNet(128, num_heads=16, cg_steps=30).cg == 30
    with pytest.raises(ValueError, match="cg_steps"):
        MesaNet(128, num_heads=16, cg_steps=0)


@pytest.mark.parametrize("pad", [None, "16", "none"])
def test_fla_head_padding_switch(pad, monkeypatch):
    """MIXZOO_FLA_PAD: gdn's, GLA's and MesaNet's heads go to fla padded to 16 ("16") or as they are ("none",
    backend "+unpadded"); unset, each mechanism's default: padded for gdn and GLA, unpadded for MesaNet's heads
    narrower than 16. With a stand-in for fla's MesaNet op that reads out exactly, the layer equals the
    torch-exact path either way."""
    if pad:
        monkeypatch.setenv("MIXZOO_FLA_PAD", pad)
    else:
        monkeypatch.delenv("MIXZOO_FLA_PAD", raising=False)
    from mixzoo.models import _fla
    want = 0 if pad == "none" else 16
    assert _fla.fla_pad_width() == want
    t = torch.randn(2, 3, 4, 8).transpose(1, 2)                      # a strided view, heads of 8
    p = _fla.pad_heads(t, width=_fla.fla_pad_width())
    assert p.is_contiguous() and p.shape[-1] == (8 if pad == "none" else 16)
    assert torch.equal(p[..., :8], t) and (p[..., 8:] == 0).all()
    assert _fla.unpadded_suffix(8) == ("+unpadded" if pad == "none" else "") and _fla.unpadded_suffix(16) == ""
    seen = []
    ref, fast = _mesa_with_stand_in(seen)
    x = torch.randn(2, 37, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(fast(x), ref(x))
    mesa_unpadded = pad != "16"                     # MesaNet's heads of 8: unpadded unless asked for "16"
    assert [c[0] for c in seen] == [(2, 64, 4, 8 if mesa_unpadded else 16)]
    assert fast.backend.endswith("+unpadded") == mesa_unpadded


def test_mesa_pads_only_heads_of_16_or_more_by_default():
    """Unset, MesaNet hands heads narrower than 16 to fla unpadded (measured at 8) and keeps padding wider ones
    (32 -> 64) to FLA_HEAD_DIMS."""
    from mixzoo.models import _fla
    from mixzoo.models.mesa import MesaNet
    assert MesaNet(128, num_heads=16)._pad_default() == "none"
    assert MesaNet(128, num_heads=4)._pad_default() == "16" and _fla.fla_pad_width("16") == 16


def test_fla_head_padding_switch_is_checked_at_the_edge(monkeypatch):
    from mixzoo import kernels
    monkeypatch.setenv("MIXZOO_FLA_PAD", "8")
    assert "MIXZOO_FLA_PAD" in kernels.switch_error()


def test_gla_one_matmul_projection_matches_five(monkeypatch):
    """GLA's input projections as one matmul over the concatenated weights give the five projections' output and
    gradients (float64, the CPU path), and keep five parameter matrices (initialization, Muon, checkpoints)."""
    from mixzoo.models.gla import GatedLinearAttention
    pytest.importorskip("fla")
    torch.manual_seed(0)
    m = GatedLinearAttention(32, num_heads=4).double()
    assert {n for n, _ in m.named_parameters()} >= {"q_proj.weight", "k_proj.weight", "v_proj.weight",
                                                    "g_proj.weight", "gk.0.weight", "gk.1.weight", "gk.1.bias"}
    x = torch.randn(2, 11, 32, dtype=torch.float64)
    outs = {}
    for form in ("fused", "separate"):
        monkeypatch.setenv("MIXZOO_GLA_PROJ", form)
        m.zero_grad()
        xx = x.clone().requires_grad_()
        y = m(xx)
        y.pow(2).sum().backward()
        outs[form] = (y.detach(), xx.grad, {n: p.grad.clone() for n, p in m.named_parameters()})
    (y1, dx1, g1), (y2, dx2, g2) = outs["fused"], outs["separate"]
    torch.testing.assert_close(y1, y2, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dx1, dx2, rtol=1e-12, atol=1e-12)
    for n in g1:
        torch.testing.assert_close(g1[n], g2[n], rtol=1e-12, atol=1e-12, msg=n)
