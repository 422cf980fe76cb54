"""Find where a training run goes non-finite, and why: train with the per-step capture
(``mixzoo.train.capture.NonFiniteCapture``), then, on the captured step, compare every mixer's fast
path with its float64 reference and, for LLA, describe the estimator (query and key norms, how
peaked the softmax is, the smallest eigenvalue of the weighted key covariance, the boundary
amplification η = (k̄ - q)ᵀ(Σ_KK + λI)⁻¹(k̄ - q), the L1 norm of the effective value weights).

    python benchmarks/divergence.py CASE [--model M] [--steps N] [--out DIR] [--hp k=v ...]

Cases (the configurations of the GPU reports; ``--hp`` overrides any key):
  mqar512   mqar V=8192 L=512 kv=32, zoology recipe, d_model 128, 2 heads, batch 128, lr 3e-3, 4000 steps
  state48   state-tracking N=48, d_model 128, 2 layers, batch 128, lr 1e-3, 10000 steps
  selcopy   mad-selective-copy, mad recipe, lr 1e-3, 4000 steps (mamba's NaN)
Prints one summary; writes the capture and a JSON report under --out.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from pathlib import Path

import torch

from mixzoo.api import make_task, split_hparams
from mixzoo.commands import literal, parse_pairs
from mixzoo.models import build_model, mixers_of
from mixzoo.train import train
from mixzoo.train.capture import NonFiniteCapture, replay_mixer

CASES = {
    "mqar512": dict(task="mqar", knobs=dict(V=8192, L=512, kv=32), recipe="zoology",
                    hp=dict(d_model=128, num_heads=2, batch_size=128, lr=3e-3, steps=4000, eval_every=250)),
    "state48": dict(task="state-tracking", knobs=dict(N=48), recipe="zoology",
                    hp=dict(d_model=128, num_heads=2, n_layers=2, batch_size=128, lr=1e-3, steps=10000,
                            eval_every=500)),
    "selcopy": dict(task="mad-selective-copy", knobs={}, recipe="mad",
                    hp=dict(lr=1e-3, steps=4000, eval_every=250)),
}


def quantiles(t: torch.Tensor) -> dict[str, float]:
    t = t.double().flatten()
    t = t[torch.isfinite(t)]
    if t.numel() == 0:
        return {}
    if t.numel() > 1_000_000:
        t = t[torch.randperm(t.numel(), device=t.device)[:1_000_000]]
    qs = torch.quantile(t, torch.tensor([0.5, 0.99], dtype=t.dtype, device=t.device))
    return {"p50": float(qs[0]), "p99": float(qs[1]), "max": float(t.max()), "min": float(t.min())}


@torch.no_grad()
def lla_estimator_stats(layer, x: torch.Tensor, n_seq: int = 4) -> dict[str, dict]:
    """The estimator at the captured input, in float64, for the first ``n_seq`` sequences of ``x``."""
    from mixzoo.kernels.lla.reference import _causal_softmax, _solve_directions
    from mixzoo.models.common import rope, split_heads
    m = copy.deepcopy(layer).double()
    x = x[:n_seq].double()
    q, k, v = (split_heads(t, m.h) for t in m.qkv(x).chunk(3, dim=-1))
    if m.use_rope:
        q, k = rope(q), rope(k)
    lam = m.ridge().double()[None, :, None]
    D = q.shape[-1]
    a = _causal_softmax(q, k, D ** -0.5, 0)                                   # (B, H, T, T)
    y, kbar = _solve_directions(q, k, a, lam)
    kk = (k.unsqueeze(-1) * k.unsqueeze(-2)).flatten(-2)
    cov = (a @ kk).unflatten(-1, (D, D)) - kbar.unsqueeze(-1) * kbar.unsqueeze(-2)
    cov = 0.5 * (cov + cov.transpose(-1, -2))
    fin = torch.isfinite(cov).all(-1).all(-1)
    try:
        eig_min = torch.linalg.eigvalsh(cov[fin])[..., 0]
    except RuntimeError:                      # eigh itself can fail on wild matrices: say so
        eig_min = torch.full((1,), float("nan"))
    eta = ((kbar - q) * y).sum(-1)
    w = a * (1 - (k @ y.transpose(-1, -2)).transpose(-1, -2) + (kbar * y).sum(-1, keepdim=True))
    vbar = a @ v
    o = w @ v
    return {"ridge": quantiles(lam), "q_norm": quantiles(q.norm(dim=-1)), "k_norm": quantiles(k.norm(dim=-1)),
            "v_norm": quantiles(v.norm(dim=-1)),
            "nonfinite_cov_rows": {"n": float((~fin).sum())}, "a_max": quantiles(a.max(-1).values),
            "kbar_minus_q": quantiles((kbar - q).norm(dim=-1)), "cov_eig_min": quantiles(eig_min),
            "eta": quantiles(eta), "y_norm": quantiles(y.norm(dim=-1)), "weights_l1": quantiles(w.abs().sum(-1)),
            "o_over_vbar": quantiles(o.norm(dim=-1) / vbar.norm(dim=-1).clamp_min(1e-30))}


def lla_kernel_hunt(layer, x: torch.Tensor, grad_out: torch.Tensor, device, save: Path, chunk: int = 16) -> dict:
    """LLA's kernel on every captured sequence, ``chunk`` sequences a launch, as trained (bf16 autocast):
    the (sequence, head) with the largest |dq|, |dk| or |dv|; there, the kernel against the float64
    estimator row by row. The inputs of that (sequence, head) are saved to ``save`` for replaying the
    kernel elsewhere. (2026-12-01, H200: at chunk 16 every sequence matched float64 while the training
    step's full-batch launch gave gradients of 1e18: hunt at both sizes.)"""
    import torch.nn.functional as F

    from mixzoo.kernels.lla import lla_reference
    from mixzoo.kernels.lla.triton_lla import lla
    from mixzoo.models.common import rope, split_heads
    m = layer.to(device)
    lam = m.ridge().detach()
    prec = m.precision(lam)
    worst = (-1.0, None)
    for s0 in range(0, len(x), chunk):
        xb, gb = x[s0:s0 + chunk].to(device), grad_out[s0:s0 + chunk].to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            qkv = F.linear(xb, m.qkv.weight)
        q, k, v = (split_heads(t, m.h) for t in qkv.chunk(3, dim=-1))
        if m.use_rope:
            q, k = rope(q), rope(k)
        q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
        o = lla(q, k, v, ridge=lam[None, :, None].expand(len(xb), -1, x.shape[1]), prec=prec)
        go = split_heads(gb.to(torch.float32) @ m.out.weight.float(), m.h)      # d loss / d o
        o.backward(go.to(o.dtype))
        for name, t in (("dq", q.grad), ("dk", k.grad), ("dv", v.grad)):
            mx = t.float().abs().nan_to_num(float("inf")).amax((-1, -2))        # (b, H)
            val, idx = mx.flatten().max(0)
            if float(val) > worst[0]:
                b, h = divmod(int(idx), m.h)
                worst = (float(val), (s0 + b, h, name, q[b, h].detach(), k[b, h].detach(), v[b, h].detach(),
                                      go[b, h].detach(), q.grad[b, h], k.grad[b, h], v.grad[b, h]))
    val, (b, h, name, q1, k1, v1, g1, dq, dk, dv) = worst
    torch.save({"q": q1.cpu(), "k": k1.cpu(), "v": v1.cpu(), "g": g1.cpu(), "ridge": float(lam[h]), "prec": prec,
                "kernel": {"dq": dq.cpu(), "dk": dk.cpu(), "dv": dv.cpu()}}, save)
    qq, kk, vv = (t.double().requires_grad_(True) for t in (q1, k1, v1))
    o64 = lla_reference(qq[None], kk[None], vv[None], ridge=float(lam[h]))[0]
    o64.backward(g1.double())
    out = {"sequence": b, "head": h, "largest": name, "value": val, "ridge": float(lam[h]), "prec": prec,
           "chunk": chunk}
    for nm, kern, ref in (("dq", dq, qq.grad), ("dk", dk, kk.grad), ("dv", dv, vv.grad)):
        row_k, row_r = kern.double().norm(dim=-1), ref.norm(dim=-1)
        err = (kern.double() - ref).norm(dim=-1)
        top = err.nan_to_num(float("inf")).argsort(descending=True)[:5].tolist()
        out[nm] = {"rel": float((kern.double() - ref).norm() / ref.norm()), "max_kernel": float(row_k.max()),
                   "max_ref": float(row_r.max()), "rows": {t: (float(row_k[t]), float(row_r[t])) for t in top}}
    return out


def analyse(capture_path: Path, case: dict, model_name: str, knobs: dict, device) -> dict:
    rec = torch.load(capture_path, weights_only=False)
    task = make_task(case["task"], case["knobs"])
    _, mcfg, mix = split_hparams(case["hp"], case["recipe"])
    model = build_model(task.backbone, model_name, {**mix, **knobs}, mcfg,
                        vocab=task.vocab_size if task.kind == "classification" else 0,
                        d_in=task.d_in, d_out=task.d_out)
    model.load_state_dict(rec["state_dict"])
    out = {"step": rec["step"], "loss": rec["loss"], "first_forward": rec["forward"],
           "first_backward": rec["backward"], "nonfinite_grads": rec["nonfinite_grads_in_step"][:20],
           "forward_max_abs": dict(sorted(rec["forward_max_abs"].items(), key=lambda kv: -kv[1])[:12]),
           "backward_max_abs": dict(sorted(rec["backward_max_abs"].items(), key=lambda kv: -kv[1])[:12]),
           "grad_norms_in_step": dict(sorted(rec["grad_norms_in_step"].items(), key=lambda kv: -kv[1])[:12]),
           "grad_norms_replay": dict(sorted(rec["grad_norms"].items(), key=lambda kv: -kv[1])[:12]),
           "mixers": []}
    for i, mixer in enumerate(mixers_of(model)):
        if i not in rec["mixer_in"] or i not in rec["mixer_grad_out"]:
            continue
        x, g = rec["mixer_in"][i], rec["mixer_grad_out"][i]
        r = {"layer": i, "input_finite": bool(torch.isfinite(x).all()), "grad_out_finite": bool(torch.isfinite(g).all())}
        worst = list(range(min(4, len(x))))
        if model_name == "lla":
            for chunk in (len(x), 16):           # the training step's launch, then small launches
                key = "kernel_hunt" if chunk == len(x) else "kernel_hunt_small"
                try:
                    r[key] = lla_kernel_hunt(mixer, x, g, device, capture_path.parent / f"lla-worst-layer{i}-c{chunk}.pt",
                                             chunk=chunk)
                except Exception as e:
                    r[key + "_error"] = f"{type(e).__name__}: {e}"
            if "kernel_hunt" in r:
                worst = [r["kernel_hunt"]["sequence"]]
        try:
            n = min(16, len(x)) if model_name == "lla" else len(x)   # the float64 LLA estimator on 128: OOM
            pick = (worst + [j for j in range(len(x)) if j not in worst])[:n]
            rp = r["replay"] = replay_mixer(mixer, x[pick], g[pick], device=device)
            fast = torch.tensor(rp["fast_dx_max_per_example"])
            if model_name != "lla":
                worst = fast.nan_to_num(float("inf")).argsort(descending=True)[:4].tolist()
            r["worst_examples"] = {i: (rp["fast_dx_max_per_example"][i], rp["f64_dx_max_per_example"][i])
                                   for i in worst}
        except Exception as e:  # the report says what failed rather than stopping the analysis
            r["replay_error"] = f"{type(e).__name__}: {e}"
        if model_name == "lla":
            r["estimator"] = lla_estimator_stats(mixer.to(device), x.to(device))
            r["estimator_worst"] = lla_estimator_stats(mixer.to(device), x[worst].to(device))
        out["mixers"].append(r)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("case", choices=sorted(CASES))
    p.add_argument("--model", default="lla")
    p.add_argument("--steps", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hp", action="append", metavar="K=V", help="override a hyperparameter or mechanism knob")
    p.add_argument("--out", default="divergence-out")
    a = p.parse_args(argv)
    case = copy.deepcopy(CASES[a.case])
    case["hp"].update({k: literal(v) for k, v in parse_pairs(a.hp, "--hp").items()})
    if a.steps:
        case["hp"]["steps"] = a.steps
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    task = make_task(case["task"], case["knobs"])
    tcfg, mcfg, mix = split_hparams(case["hp"], case["recipe"])
    out_dir = Path(a.out) / f"{a.case}-{a.model}-s{a.seed}"
    cap = NonFiniteCapture(out_dir, meta={"case": a.case, "model": a.model, "seed": a.seed, **case})
    t0 = time.time()
    tag = f"[{a.case} {a.model} seed {a.seed}]"
    res = train(task, a.model, mix, mcfg, tcfg, seed=a.seed, device=str(dev), callbacks=[cap],
                log=lambda s: print(tag, s, flush=True))
    report = {"case": a.case, "model": a.model, "seed": a.seed, "hp": case["hp"], "state": res.state,
              "reason": res.reason, "steps": res.steps, "backend": res.backend, "test": res.test,
              "steps_per_s": res.steps_per_s, "wall_s": time.time() - t0,
              "history": [{k: h[k] for k in ("step", "train_loss", task.primary.name) if k in h} for h in res.history]}
    if cap.path is not None:
        report["analysis"] = analyse(cap.path, case, a.model, {}, dev)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "report.json").write_text(json.dumps(report, indent=1, default=str))
    print(tag, f"state {res.state} after {res.steps} steps ({res.backend}, {res.steps_per_s:.1f} steps/s); "
          f"test {task.primary.name} {res.test.get(task.primary.name, math.nan):.4f}; {res.reason}")
    if "analysis" in report:
        an = report["analysis"]
        print(tag, f"first non-finite forward: {an['first_forward']}; backward: {an['first_backward']}; "
              f"grads: {an['nonfinite_grads'][:4]}")
        for key in ("grad_norms_in_step", "grad_norms_replay", "backward_max_abs", "forward_max_abs"):
            print(tag, key + ": " + ", ".join(f"{k} {v:.3g}" for k, v in list(an[key].items())[:6]))
        for r in an["mixers"]:
            rp = r.get("replay", {})
            print(tag, f"layer {r['layer']}: input finite {r['input_finite']}, grad_out finite {r['grad_out_finite']}; "
                  f"fast ({rp.get('fast_backend')}) vs f64: out finite {rp.get('out_finite')} "
                  f"rel {rp.get('out_rel', math.nan):.3g}, "
                  f"dx finite {rp.get('dx_finite')} rel {rp.get('dx_rel', math.nan):.3g}; f64 out finite "
                  f"{rp.get('ref_out_finite')}, dx finite {rp.get('ref_dx_finite')} {r.get('replay_error', '')}")
            for key in ("kernel_hunt", "kernel_hunt_small"):
                if key in r:
                    kh = r[key]
                    print(tag, f"    kernel hunt, {kh['chunk']} sequences a launch: sequence {kh['sequence']} head "
                          f"{kh['head']} largest {kh['largest']} {kh['value']:.3g} (ridge {kh['ridge']}, prec {kh['prec']})")
                    for nm in ("dq", "dk", "dv"):
                        print(tag, f"      {nm}: rel {kh[nm]['rel']:.3g}, max row norm kernel {kh[nm]['max_kernel']:.3g} "
                              f"f64 {kh[nm]['max_ref']:.3g}; worst rows (kernel, f64): " +
                              ", ".join(f"{t}: {a:.3g}/{b:.3g}" for t, (a, b) in kh[nm]["rows"].items()))
                if key + "_error" in r:
                    print(tag, f"    {key} failed:", r[key + "_error"])
            if "worst_examples" in r:
                print(tag, "    worst examples (max |dx| fast, f64): " + ", ".join(
                    f"{i}: {a:.3g} / {b:.3g}" for i, (a, b) in r["worst_examples"].items()))
            for which in ("estimator", "estimator_worst"):
                for name, st in r.get(which, {}).items():
                    print(tag, f"    {which[9:] or 'first'} {name:<14} " + " ".join(f"{k} {v:.3g}" for k, v in st.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
